"""OpenLineage for the operators: what each one read and wrote, named by the conventions.

Three parts, so that the rules are pure and the effects thin:

- naming and description (pure): a directory source is a dataset of its filesystem
  (``file://HOST`` and the path, ``s3://BUCKET`` and the key), a Kafka topic one of
  ``kafka://BOOTSTRAP``, the shard one of its blob root's filesystem named by the shard's
  directory (``<blob root>/<shard id>``), a checkpoint its directory under the shard's, an
  Iceberg table one of its catalog (the catalog URI without credentials) named
  ``NAMESPACE.TABLE``. :func:`describe` turns what a task captured into datasets and facets as
  plain data (:class:`Lineage`);
- capture (effects, in the task's own process): :func:`capture` reads the shard's config,
  frontier and stream once the task's work is done, only when the OpenLineage provider is
  installed and enabled. The listener asks for facets in a forked process that shares the
  task's connection to its supervisor: nothing there may look up a connection or open a store,
  so everything is captured before;
- :func:`operator_lineage`: the provider's ``OperatorLineage`` of a captured task
  (``lineage/facets.py``, imported only then).

Without the provider nothing here imports it: :func:`lineage_enabled` is False and nothing
is captured.
"""

from __future__ import annotations

import json
import logging
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from airflow_upsert_provider.engine.table.shard import Shard
    from airflow_upsert_provider.hooks.upsert import UpsertShardHook

log = logging.getLogger(__name__)

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
    what else naming needs (``table_namespace`` of a publish, ``bytes_written`` of an upsert,
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
    exclusive; ``schema_version`` null until the shard has schema versions), or None when it
    committed nothing. Batches a peer persisted are not this task's writes."""
    own = [b for b in result.get("batches") or [] if b.get("outcome") in OWN_COMMITS]
    if not own:
        return None
    return {
        "from_ts": min(int(b["ts"]) for b in own),
        "to_ts": max(int(b["ts"]) for b in own) + 1,
        "rows_out": sum(int(b.get("rows_out") or 0) for b in own),
        "schema_version": None,
    }


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
                              bytes=int(extra.get("bytes_written") or 0), batches=batches)
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


# -- capture (effects, in the task's process) ------------------------------------------------


def lineage_enabled() -> bool:
    """Whether the OpenLineage provider is installed and not disabled (it is disabled when no
    transport is configured). Imports nothing of it when it is absent."""
    try:
        from airflow.providers.openlineage import conf
    except ImportError:
        return False
    return not conf.is_disabled()


def shard_facts(hook: UpsertShardHook, shard: Shard) -> ShardFacts:
    """Read what lineage needs of an open shard: config, frontier and stream status."""
    from airflow_upsert_provider.engine.errors import ConfigurationError
    from airflow_upsert_provider.engine.sources.kafka import KafkaSource
    from airflow_upsert_provider.engine.store.streams import read_stream

    state = shard.state()
    bootstrap = None
    if isinstance(shard.source, KafkaSource):
        try:
            bootstrap = shard.source.config.bootstrap_servers
        except ConfigurationError:
            pass  # opened without a client config: the topic is not named (source_dataset)
    return ShardFacts(
        shard=shard.shard_id, blob_root=hook.settings.blob_root, host=socket.getfqdn(), source=shard.config.source,
        kafka_bootstrap=bootstrap, fields=tuple(schema_fields(shard.config.schema)), upper=state.upper,
        since=state.since, status=read_stream(shard.consensus, shard.shard_id).status.value,
    )


def capture(operator: Any, hook: UpsertShardHook, result: Mapping[str, Any], *, shard: Shard | None = None,
            **extra: Any) -> Captured | None:
    """What ``operator``'s lineage needs, read after its work (``shard``: the one it opened,
    else its shard is opened); None when lineage is off, and when reading fails (logged): a
    lineage read never fails a task."""
    kind = KINDS_BY_OPERATOR.get(type(operator).__name__)
    if kind is None or not lineage_enabled():
        return None
    try:
        if kind == RESTORE:
            extra["from_shard"] = operator.shard
            shard = hook.open_shard(str(result["shard"]))
        elif shard is None:
            shard = hook.open_shard(operator.shard)
        if kind == UPSERT:
            extra["bytes_written"] = _bytes_written(shard, result)
        if kind == PUBLISH:
            extra["table_namespace"] = catalog_namespace(_catalog_uri(operator, hook))
        return Captured(kind, shard_facts(hook, shard), dict(result), extra)
    except Exception as exc:  # noqa: BLE001 - lineage is best effort; the task's own work is done
        from airflow_upsert_provider.engine.errors import first_line

        log.warning("OpenLineage: the lineage of shard %s was not read: %s: %s", operator.shard,
                    type(exc).__name__, first_line(str(exc)))
        return None


def _bytes_written(shard: Shard, result: Mapping[str, Any]) -> int:
    """Bytes of the run files of the batches this task committed itself."""
    total = 0
    for batch in result.get("batches") or []:
        if batch.get("outcome") in OWN_COMMITS:
            record = shard.consensus.get_batch(shard.shard_id, int(batch["ts"]))
            total += sum(int(f.get("bytes") or 0) for f in ((record.run or {}).get("files") or []) if record)
    return total


def _catalog_uri(operator: Any, hook: UpsertShardHook) -> str:
    """The URI of the catalog a publish wrote to (its credentials are cut by the caller)."""
    if operator.iceberg_conn_id:
        from airflow_upsert_provider.hooks.iceberg import IcebergCatalogHook

        properties = IcebergCatalogHook(operator.iceberg_conn_id).catalog_properties(
            hook.settings.consensus_url, hook.settings.blob_root)
        return str(properties.get("uri") or "")
    from airflow_upsert_provider.engine.maintenance.iceberg_catalog import catalog_properties

    return catalog_properties(hook.settings.consensus_url, hook.settings.blob_root, operator.catalog_uri or None)["uri"]


def operator_lineage(captured: Captured | None) -> Any:
    """The provider's ``OperatorLineage`` of a captured task; None when nothing was captured
    (the listener then reports the task without datasets)."""
    if captured is None:
        return None
    from airflow_upsert_provider.lineage.facets import to_operator_lineage

    return to_operator_lineage(describe(captured))


def parent_job_spark_conf(conf: dict[str, str], context: Mapping[str, Any]) -> dict[str, str]:
    """``conf`` with the OpenLineage parent-job properties (``spark.openlineage.parent*``,
    ``rootParent*``) the Spark provider's ``SparkSubmitOperator`` injects, when
    ``[openlineage] spark_inject_parent_job_info`` is on: an OpenLineage Spark listener in the
    job then names the task as its parent. Properties the user set win. Transport information
    is never injected: it may hold an API key, which would reach spark-submit's command line."""
    from airflow.configuration import conf as airflow_conf

    if not airflow_conf.getboolean("openlineage", "spark_inject_parent_job_info", fallback=False):
        return conf
    if not lineage_enabled():
        return conf
    from airflow.providers.common.compat.openlineage.utils.spark import (
        inject_parent_job_information_into_spark_properties,
    )

    return inject_parent_job_information_into_spark_properties(dict(conf), context)
