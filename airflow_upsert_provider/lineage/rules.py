"""The pure part of lineage: dataset names and namespaces by the conventions, what a task
captured, and the datasets and facets it describes (:func:`describe`). Imports nothing of
OpenLineage or Airflow."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping

# The kinds of task that report lineage, by operator class.
UPSERT = "upsert"
COMPACT = "compact"
CHECKPOINT = "checkpoint"
RESTORE = "restore"
SEEK = "seek"
PUBLISH = "publish"
KINDS_BY_OPERATOR = {
    "MicroBatchUpsertOperator": UPSERT,
    "CompactShardOperator": COMPACT,
    "CheckpointCommitOperator": CHECKPOINT,
    "RestoreCheckpointOperator": RESTORE,
    "SeekSourceOperator": SEEK,
    "PublishIcebergOperator": PUBLISH,
}
OWN_COMMITS = ("committed", "already_committed")


# -- naming (pure) ---------------------------------------------------------------------------


def location_dataset(location: str, host: str) -> tuple[str, str]:
    """(namespace, name) of a file or directory: ``("file://HOST", "/abs/path")`` on a local
    filesystem, ``("s3://BUCKET", "key/prefix")`` (and ``gs://``, ``abfs://``, ``hdfs://``
    alike) on a store. Refuses, as the blob layer does, a URI with credentials or an unknown
    scheme (``ConfigurationError`` naming it without them)."""
    from airflow_upsert_provider.engine.blob.filesystems import split_uri

    scheme, authority, path = split_uri(location)
    if not scheme:
        return f"file://{host}", path
    return f"{scheme}://{authority}", path.strip("/") or "/"


def kafka_namespace(bootstrap_servers: str) -> str:
    """``kafka://HOST:PORT`` of the first bootstrap server (a ``PROTOCOL://`` prefix dropped)."""
    first = bootstrap_servers.split(",")[0].strip()
    return f"kafka://{first.rpartition('://')[2]}"


def source_dataset(source: str, host: str, kafka_bootstrap: str | None) -> tuple[str, str] | None:
    """(namespace, name) of a shard's source (``dir:PATH`` or ``kafka:TOPIC``); None for a
    Kafka topic whose bootstrap servers the task did not know (no client config)."""
    kind, _, where = source.partition(":")
    if kind == "dir":
        return location_dataset(where, host)
    if kind == "kafka":
        return None if not kafka_bootstrap else (kafka_namespace(kafka_bootstrap), where)
    raise ValueError(f"unknown source {source!r}")


def shard_dataset(blob_root: str, shard: str, host: str) -> tuple[str, str]:
    """The shard as a dataset: its directory under the blob root."""
    namespace, root = location_dataset(blob_root, host)
    return namespace, f"{root.rstrip('/')}/{shard}" if root != "/" else shard


def checkpoint_dataset(blob_root: str, shard: str, checkpoint_id: str, host: str) -> tuple[str, str]:
    """A checkpoint as a dataset: its directory, ``<shard>/checkpoints/<id>``."""
    namespace, name = shard_dataset(blob_root, shard, host)
    return namespace, f"{name}/checkpoints/{checkpoint_id}"


def catalog_namespace(catalog_uri: str) -> str:
    """An Iceberg catalog's namespace: its URI without user information, password or query
    (a REST catalog's ``https://host/path``, a SQL catalog's ``postgresql://host:5432/db`` or
    ``sqlite:////path/file.db``)."""
    scheme, sep, rest = catalog_uri.partition("://")
    if not sep:
        return catalog_uri
    rest = rest.split("?", 1)[0].split("#", 1)[0]
    authority, slash, path = rest.partition("/")
    return f"{scheme.split('+', 1)[0].lower()}://{authority.rpartition('@')[2]}{slash}{path}"


def schema_fields(schema_json: str) -> list[tuple[str, str]]:
    """(name, type) of each field of a shard's schema (Spark's StructType as JSON): a simple
    type by its name (``long``, ``string``), a nested one by its kind (``struct``, ``array``)."""
    schema = json.loads(schema_json)
    fields = []
    for item in schema.get("fields", []):
        kind = item.get("type")
        fields.append((str(item["name"]), str(kind.get("type") if isinstance(kind, dict) else kind)))
    return fields


# -- what a task captured, and what it describes (pure) --------------------------------------


@dataclass(frozen=True)
class ShardFacts:
    """What lineage needs of one shard, read in the task's process."""

    shard: str
    blob_root: str
    host: str
    source: str
    kafka_bootstrap: str | None
    fields: tuple[tuple[str, str], ...]
    upper: int
    since: int
    status: str | None


@dataclass(frozen=True)
class Captured:
    """One task's facts: its kind, its shard's facts, its result (the XCom return value) and
    what else naming needs (``table_namespace`` of a publish,
    ``from_shard`` of a restore)."""

    kind: str
    shard: ShardFacts
    result: Mapping[str, Any]
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class DatasetSpec:
    namespace: str
    name: str
    fields: tuple[tuple[str, str], ...] = ()
    # outputStatistics: rows, bytes, files (None: not known)
    rows: int | None = None
    bytes: int | None = None
    files: int | None = None
    # The committed batch range of an upsert: {from_ts, to_ts, rows_out, schema_version}.
    batches: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Lineage:
    inputs: tuple[DatasetSpec, ...]
    outputs: tuple[DatasetSpec, ...]
    # The shard's frontier after the task: {shard, upper, since, status}.
    frontier: Mapping[str, Any]


def committed_range(result: Mapping[str, Any]) -> dict[str, Any] | None:
    """The batch range an upsert committed itself, with the commit event's keys (``to_ts``
    exclusive; ``schema_version`` as the result says it, null when it does not), or None when it
    committed nothing. Batches a peer persisted are not this task's writes."""
    own = [b for b in result.get("batches") or [] if b.get("outcome") in OWN_COMMITS]
    if not own:
        return None
    return {
        "from_ts": min(int(b["ts"]) for b in own),
        "to_ts": max(int(b["ts"]) for b in own) + 1,
        "rows_out": sum(int(b.get("rows_out") or 0) for b in own),
        "schema_version": result.get("schema_version"),
    }


def committed_bytes(result: Mapping[str, Any]) -> int:
    """Bytes of the run files of the batches an upsert committed itself, as the writer
    recorded them in each batch's result (``bytes_written``). Pure."""
    return sum(int(b.get("bytes_written") or 0) for b in result.get("batches") or [] if b.get("outcome") in OWN_COMMITS)


def describe(captured: Captured) -> Lineage:
    """The datasets and facets of a captured task. Pure."""
    facts, result, extra = captured.shard, captured.result, captured.extra
    shard = DatasetSpec(*shard_dataset(facts.blob_root, facts.shard, facts.host), fields=facts.fields)
    source_name = source_dataset(facts.source, facts.host, facts.kafka_bootstrap)
    source = () if source_name is None else (DatasetSpec(*source_name, fields=facts.fields),)
    frontier = {"shard": facts.shard, "upper": facts.upper, "since": facts.since, "status": facts.status}
    kind = captured.kind
    if kind == UPSERT:
        batches = committed_range(result)
        written = DatasetSpec(shard.namespace, shard.name, facts.fields,
                              rows=batches["rows_out"] if batches else 0,
                              bytes=committed_bytes(result), batches=batches)
        return Lineage(source, (written,), frontier)
    if kind == COMPACT:
        written = DatasetSpec(shard.namespace, shard.name, facts.fields, rows=result.get("rows"),
                              bytes=result.get("bytes"), files=result.get("files"))
        return Lineage((shard,), (written,), frontier)
    if kind == CHECKPOINT:
        checkpoint = DatasetSpec(*checkpoint_dataset(facts.blob_root, facts.shard, str(result["id"]), facts.host),
                                 fields=facts.fields, bytes=result.get("bytes"), files=result.get("files"))
        return Lineage((shard,), (checkpoint,), frontier)
    if kind == RESTORE:
        checkpoint = DatasetSpec(*checkpoint_dataset(facts.blob_root, str(extra["from_shard"]),
                                                     str(result["checkpoint"]), facts.host), fields=facts.fields)
        return Lineage((checkpoint,), (shard,), frontier)
    if kind == SEEK:
        return Lineage(source, (shard,), frontier)
    if kind == PUBLISH:
        table = DatasetSpec(str(extra["table_namespace"]), str(result["table"]), facts.fields,
                            rows=result.get("rows"), bytes=result.get("bytes"), files=result.get("files"))
        return Lineage((shard,), (table,), frontier)
    raise ValueError(f"unknown lineage kind {kind!r}")
