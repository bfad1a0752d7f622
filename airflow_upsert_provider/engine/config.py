"""Shard configuration: what a shard is keyed on and where its source lives."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_upsert_provider.engine.errors import ConfigurationError

SHARD_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
SOURCE_FORMATS = ("jsonl", "parquet")
DEFAULT_BUCKETS = 8
# The most hash buckets a shard's runs are split into (at init, and after its count grew).
MAX_BUCKETS = 4096
DEFAULT_MAX_FILES_PER_BATCH = 64
# Columns the engine adds to runs or uses while staging; user columns may not use these names.
INTERNAL_COLUMNS = (
    "_ts", "_deleted", "_bucket", "_partition", "_offset", "_line", "_file", "_raw", "_reason",
    "_corrupt", "_pos", "_r", "_m", "_w", "_delete", "_srcpos", "_map_reason",
)


def validate_shard_id(shard_id: str) -> str:
    # fullmatch: with match, "$" also matches before a final newline ("abc\n" passed).
    if not isinstance(shard_id, str) or not SHARD_ID_PATTERN.fullmatch(shard_id):
        raise ConfigurationError(
            f"invalid shard id {shard_id!r}: use letters, digits, '_', '.', '-' (max 128), "
            "starting with a letter or digit",
            field="shard",
        )
    return shard_id


@dataclass(frozen=True)
class ShardConfig:
    """Immutable definition of a shard, stored in consensus at `init`.

    :param source: source URI, ``dir:/path/to/landing`` or ``kafka:TOPIC``.
    :param keys: key column(s).
    :param schema: Spark StructType as JSON; the types every record is validated against.
    :param order_by: optional order column; within a key the highest wins, then
        (partition, offset, line).
    :param delete_marker: optional boolean column; a record with it true deletes the key.
    :param source_format: ``jsonl`` or ``parquet`` segment files.
    :param buckets: number of hash buckets runs are split into at first; a compaction may
        multiply it (the count now is the compacted run's, ``runs.current_buckets``).
    :param target_bucket_bytes: when a compaction finds the runs below its since above this
        many bytes per bucket on average, it doubles the bucket count (None: never by size).
    :param max_files_per_batch: how many segment files one batch binds at most.
    :param extra: further options; a Kafka shard's are under ``"kafka"`` (``KafkaShardOptions``).
    :param schema_version: which version of the shard's table schema ``schema`` is (1: the
        schema of ``init``; later ones are recorded in consensus, engine/store/table_schemas.py).
        Not stored with the config: the config in consensus is always version 1.
    """

    source: str
    keys: tuple[str, ...]
    schema: str
    order_by: str | None = None
    delete_marker: str | None = None
    source_format: str = "jsonl"
    buckets: int = DEFAULT_BUCKETS
    max_files_per_batch: int = DEFAULT_MAX_FILES_PER_BATCH
    extra: dict[str, Any] = field(default_factory=dict)
    target_bucket_bytes: int | None = None
    schema_version: int = 1

    def __post_init__(self) -> None:
        if not self.keys:
            raise ConfigurationError("a shard needs at least one key column", field="key")
        if self.source_format not in SOURCE_FORMATS:
            raise ConfigurationError(
                f"unknown source format {self.source_format!r}; expected one of {SOURCE_FORMATS}",
                field="format",
            )
        if not 1 <= self.buckets <= MAX_BUCKETS:
            raise ConfigurationError(f"buckets must be between 1 and {MAX_BUCKETS}", field="buckets")
        if self.target_bucket_bytes is not None and (
            isinstance(self.target_bucket_bytes, bool) or not isinstance(self.target_bucket_bytes, int)
            or self.target_bucket_bytes < 1
        ):
            raise ConfigurationError(
                f"target_bucket_bytes must be a whole number of bytes >= 1, got {self.target_bucket_bytes!r}",
                field="target_bucket_bytes",
            )
        if self.max_files_per_batch < 1:
            raise ConfigurationError("max files per batch must be >= 1", field="max_files_per_batch")
        columns = self.column_names()
        # Spark resolves column names case-insensitively: `id` and `ID` are one column to it.
        seen: set[str] = set()
        duplicates = [c for c in columns if c.lower() in seen or seen.add(c.lower())]
        if duplicates:
            raise ConfigurationError(
                f"duplicate column(s) in the schema: {', '.join(map(repr, duplicates))} "
                "(names are compared case-insensitively)",
                field="schema",
            )
        for name in (*self.keys, self.order_by, self.delete_marker):
            if name is not None and name not in columns:
                raise ConfigurationError(
                    f"column {name!r} is not in the schema (columns: {', '.join(columns)})",
                    field="schema",
                )
        if self.delete_marker is not None:
            marker_type = next(f["type"] for f in self.schema_fields() if f["name"] == self.delete_marker)
            if marker_type != "boolean":
                raise ConfigurationError(
                    f"delete marker {self.delete_marker!r} must be a BOOLEAN column, not {marker_type}",
                    field="delete_marker",
                )
        if self.source.partition(":")[0] == "kafka":
            # Validated here so that a shard is never stored with options no run can use.
            from airflow_upsert_provider.engine.sources.kafka_options import KafkaShardOptions

            KafkaShardOptions.from_extra(self.extra)
        clash = sorted(set(columns) & set(INTERNAL_COLUMNS))
        if clash:
            raise ConfigurationError(
                f"column name(s) {clash} are reserved by the engine", field="schema"
            )

    def schema_fields(self) -> list[dict[str, Any]]:
        return json.loads(self.schema)["fields"]

    def column_names(self) -> list[str]:
        return [f["name"] for f in self.schema_fields()]

    def to_json(self) -> str:
        data = asdict(self)
        data["keys"] = list(self.keys)
        # What consensus stores at init is the schema of version 1; later versions have rows
        # of their own (engine/store/table_schemas.py).
        del data["schema_version"]
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ShardConfig":
        data = json.loads(text)
        data["keys"] = tuple(data["keys"])
        return cls(**data)
