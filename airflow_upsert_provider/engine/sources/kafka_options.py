"""How a shard reads its Kafka topic: the options stored with the shard, and the client
config given at run time.

The options (envelope, records per batch, consumer group) live in the shard's configuration
in consensus, under ``extra["kafka"]``. The client config (brokers, credentials) never does:
it comes from an Airflow ``kafka`` connection or, for ``upsertctl``, a JSON file, each time a
shard is opened, so that secrets stay where their owner keeps them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.engine.sources.kafka import KafkaConfig

ENVELOPES = ("json", "debezium")
DEFAULT_MAX_RECORDS_PER_BATCH = 100_000
OPTION_NAMES = ("envelope", "max_records_per_batch", "group_id")


@dataclass(frozen=True)
class KafkaShardOptions:
    """:param envelope: ``json`` (each value is the record) or ``debezium`` (change events).
    :param max_records_per_batch: offsets one batch binds at most, over all partitions.
    :param group_id: the consumer group whose offsets follow the shard's frontier (default:
        the client config's ``group.id``, else ``upsert-<shard>``)."""

    envelope: str = "json"
    max_records_per_batch: int = DEFAULT_MAX_RECORDS_PER_BATCH
    group_id: str | None = None

    def __post_init__(self) -> None:
        if self.envelope not in ENVELOPES:
            raise ConfigurationError(
                f"unknown kafka envelope {self.envelope!r}; expected one of {ENVELOPES}", field="envelope"
            )
        size = self.max_records_per_batch
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ConfigurationError(
                f"kafka max_records_per_batch must be an integer >= 1, not {size!r}", field="max_records_per_batch"
            )
        if self.group_id is not None and (not isinstance(self.group_id, str) or not self.group_id.strip()):
            raise ConfigurationError(f"kafka group_id must be a non-empty string, not {self.group_id!r}", field="group_id")

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any]) -> "KafkaShardOptions":
        raw = extra.get("kafka") or {}
        if not isinstance(raw, Mapping):
            raise ConfigurationError("shard config extra['kafka'] must be an object", field="kafka")
        unknown = sorted(set(raw) - set(OPTION_NAMES))
        if unknown:
            raise ConfigurationError(
                f"unknown kafka shard option(s) {unknown}; expected {list(OPTION_NAMES)}", field="kafka"
            )
        return cls(**raw)

    def to_extra(self) -> dict[str, Any]:
        return {"kafka": {"envelope": self.envelope, "max_records_per_batch": self.max_records_per_batch,
                          "group_id": self.group_id}}


def load_kafka_config(path: str) -> KafkaConfig:
    """A client config from a JSON file of librdkafka properties (the same object an Airflow
    ``kafka`` connection's extra holds). Errors name the file, never a value."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise ConfigurationError(
            f"kafka client config {path}: cannot read it ({exc.strerror or exc})", field="kafka_config"
        ) from None
    except UnicodeDecodeError as exc:
        # The byte's position only: the text around it could be a password.
        raise ConfigurationError(
            f"kafka client config {path}: not valid UTF-8 (byte {exc.start}); save it as UTF-8 JSON",
            field="kafka_config",
        ) from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        # The position only: a message quoting the text could quote a password.
        raise ConfigurationError(
            f"kafka client config {path}: not valid JSON (line {exc.lineno}, column {exc.colno})",
            field="kafka_config",
        ) from None
    try:
        return KafkaConfig.from_dict(raw)
    except ConfigurationError as exc:
        raise ConfigurationError(f"{path}: {exc.message}", field=exc.details.get("field", "kafka_config")) from None
