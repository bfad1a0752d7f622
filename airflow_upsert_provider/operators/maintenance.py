"""Maintenance operators: compaction, checkpoint commit, garbage collection and restore.

Thin: each parses its parameters, calls the engine through ``UpsertShardHook`` and returns
the engine's report (pushed to XCom as ``return_value``). Engine errors are mapped by
``to_airflow_error`` on their ``retryable`` flag: bad input, integrity violations (a corrupt
catalog, a checkpoint whose files do not verify) and configuration errors fail without retry;
an unreachable consensus or an unknown outcome is retried.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from airflow_upsert_provider.engine.common.metrics import Metric, live_runs_metrics, maintenance_metrics
from airflow_upsert_provider.engine.errors import ConfigurationError, UpsertError
from airflow_upsert_provider.hooks.upsert import DEFAULT_CONN_ID, UpsertShardHook
from airflow_upsert_provider.lineage import capture, operator_lineage
from airflow_upsert_provider.links import ShardPageLink
from airflow_upsert_provider.metrics import send as send_metrics
from airflow_upsert_provider.operators.arguments import is_unset, parse_bool, parse_int, parse_seconds
from airflow_upsert_provider.operators.errors import to_airflow_error

if TYPE_CHECKING:
    from airflow.sdk import Context


class _ShardMaintenanceOperator(BaseOperator):
    """Builds the hook, runs :meth:`run` and maps engine errors; subclasses hold the call."""

    template_fields: Sequence[str] = ("shard",)
    ui_color = "#e8e2f4"
    operator_extra_links = (ShardPageLink(),)

    def __init__(self, *, shard: str, upsert_conn_id: str = DEFAULT_CONN_ID, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.shard = shard
        self.upsert_conn_id = upsert_conn_id

    # The maintenance metric of this step (engine/common/metrics.py MAINTENANCE_OPERATIONS); None: none.
    metric_operation: str | None = None

    def execute(self, context: Context) -> dict[str, Any]:
        hook = UpsertShardHook(upsert_conn_id=self.upsert_conn_id)
        started = time.monotonic()
        try:
            result = self.run(hook)
            self._lineage = capture(self, hook, result)
            if self.metric_operation is not None:
                send_metrics(lambda: self.step_metrics(hook, time.monotonic() - started))
        except UpsertError as exc:
            raise to_airflow_error(exc, hook) from None
        finally:
            hook.close()
        self.log.info("%s of shard %s: %s", self.task_type, self.shard, result)
        return result

    def run(self, hook: UpsertShardHook) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage: what the task read and wrote, the shard's frontier (docs/lineage.md)."""
        return operator_lineage(getattr(self, "_lineage", None))

    def step_metrics(self, hook: UpsertShardHook, seconds: float) -> list[Metric]:
        """The step's duration; after a compaction, the live runs too."""
        found = maintenance_metrics(self.shard, self.metric_operation, seconds)
        if self.metric_operation == "compact":
            found += live_runs_metrics(self.shard, len(hook.open_shard(self.shard).live_runs()))
        return found


class CompactShardOperator(_ShardMaintenanceOperator):
    """Merge the shard's batches below a new since with its compacted runs of similar size and
    advance since. Safe beside running writers. Returns the compaction report (``outcome``,
    ``since_before``, ``since``, ``runs_merged``, ``runs_below_since``, ``full``, ``rows``,
    ``files``, ``bytes``, ``attempts``, ``seconds``).

    :param shard: the shard id (templated).
    :param since: the new since (templated); default the shard's upper. Reads as of a ts
        below it fail afterwards.
    :param full: merge every compacted run and batch below since into one run, a rewrite of
        the table (templated; default False).
    :param max_runs: at most this many compacted runs stay below since for a read to merge
        (templated; default 10).
    :param buckets: write with this many hash buckets, a whole multiple of the shard's current
        count (a full merge when it grows; templated); default the current count, doubled when
        the shard's ``target_bucket_bytes`` is exceeded.
    :param upsert_conn_id: the `upsert` connection.
    :param spark_conf: Spark settings for the in-process session (templated).
    """

    metric_operation = "compact"

    template_fields: Sequence[str] = ("shard", "since", "full", "max_runs", "buckets", "spark_conf")
    template_fields_renderers = {"spark_conf": "json"}

    def __init__(
        self,
        *,
        shard: str,
        since: int | str | None = None,
        full: bool | str = False,
        max_runs: int | str | None = None,
        buckets: int | str | None = None,
        upsert_conn_id: str = DEFAULT_CONN_ID,
        spark_conf: dict[str, str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(shard=shard, upsert_conn_id=upsert_conn_id, **kwargs)
        self.since = since
        self.full = full
        self.max_runs = max_runs
        self.buckets = buckets
        self.spark_conf = spark_conf or {}

    def run(self, hook: UpsertShardHook) -> dict[str, Any]:
        from pyspark.sql import SparkSession

        from airflow_upsert_provider.engine.maintenance.compaction import check_before_spark, compact
        from airflow_upsert_provider.engine.maintenance.compaction_policy import DEFAULT_MAX_RUNS, check_max_runs

        since = parse_int(self.since, "since")
        full = parse_bool(self.full, "full")
        max_runs = parse_int(self.max_runs, "max_runs")
        buckets = parse_int(self.buckets, "buckets")
        max_runs = DEFAULT_MAX_RUNS if max_runs is None else max_runs
        check_max_runs(max_runs)
        shard = hook.open_shard(self.shard)
        # A bad argument fails the task in seconds, not after a Spark session has started.
        check_before_spark(shard, since=since, buckets=buckets)
        owned = SparkSession.getActiveSession() is None
        spark = hook.get_spark(app_name=f"compact-{self.shard}", conf=self.spark_conf)
        try:
            return compact(spark, shard, since=since, full=full,
                           max_runs=max_runs, buckets=buckets).to_dict()
        finally:
            if owned:
                spark.stop()


class CheckpointCommitOperator(_ShardMaintenanceOperator):
    """Checkpoint the shard at its upper (a manifest of its files, no data copy), add it to
    the catalog, then apply retention. Returns the catalog entry (``id``, ``upper``,
    ``since``, ``files``, ``bytes``, ``created_at``, ``manifest_sha256``).

    :param shard: the shard id (templated).
    :param keep_last: keep only the last N checkpoints (templated); default keep all.
    :param keep_within: keep only checkpoints newer than this, in seconds or a timedelta
        (templated); with ``keep_last`` a checkpoint either rule keeps is kept, and the
        newest is always kept.
    :param full: read every file whole (a full verify of what the checkpoint lists), instead of
        only the files no earlier checkpoint hashed (templated; default False).
    :param upsert_conn_id: the `upsert` connection.
    """

    metric_operation = "checkpoint"

    template_fields: Sequence[str] = ("shard", "keep_last", "keep_within", "full")

    def __init__(
        self,
        *,
        shard: str,
        keep_last: int | str | None = None,
        keep_within: Any = None,
        full: bool | str = False,
        upsert_conn_id: str = DEFAULT_CONN_ID,
        **kwargs: Any,
    ) -> None:
        super().__init__(shard=shard, upsert_conn_id=upsert_conn_id, **kwargs)
        self.keep_last = keep_last
        self.keep_within = keep_within
        self.full = full

    def run(self, hook: UpsertShardHook) -> dict[str, Any]:
        from airflow_upsert_provider.engine.maintenance.checkpoint import create_checkpoint

        keep_last = parse_int(self.keep_last, "keep_last")
        keep_within = parse_seconds(self.keep_within, "keep_within")
        full = parse_bool(self.full, "full")
        entry = create_checkpoint(hook.open_shard(self.shard), keep_last=keep_last, keep_within=keep_within, full=full)
        return entry.to_dict()


class GarbageCollectOperator(_ShardMaintenanceOperator):
    """Delete the shard's files that no live state, no retained checkpoint and no in-flight
    writer reference: with ``sweep`` (the default) from a listing of the shard's directory,
    without it only the runs the consensus store recorded as replaced. Aborts before any
    deletion on unreadable checkpoint metadata. Returns the GC report (what was, or would be,
    deleted and its bytes).

    :param shard: the shard id (templated).
    :param grace_seconds: files younger than this are kept (templated; seconds or a
        timedelta); it must exceed the longest a writer takes from staging to commit.
    :param rejects_retention_seconds: quarantined records of batches below since are deleted
        once older than this (templated; seconds or a timedelta; default 30 days; 0 keeps
        them forever).
    :param dry_run: only report what would be deleted (templated).
    :param sweep: list the shard's directory and delete every file no state names (templated;
        default true). False deletes only the recorded replaced runs, with requests that follow
        the garbage: run that each cycle and the sweep on a slower cadence.
    :param upsert_conn_id: the `upsert` connection.
    """

    metric_operation = "gc"

    template_fields: Sequence[str] = ("shard", "grace_seconds", "rejects_retention_seconds", "dry_run", "sweep")

    def __init__(
        self,
        *,
        shard: str,
        grace_seconds: Any = None,
        rejects_retention_seconds: Any = None,
        dry_run: bool | str = False,
        sweep: bool | str = True,
        upsert_conn_id: str = DEFAULT_CONN_ID,
        **kwargs: Any,
    ) -> None:
        super().__init__(shard=shard, upsert_conn_id=upsert_conn_id, **kwargs)
        self.grace_seconds = grace_seconds
        self.rejects_retention_seconds = rejects_retention_seconds
        self.dry_run = dry_run
        self.sweep = sweep

    def run(self, hook: UpsertShardHook) -> dict[str, Any]:
        from airflow_upsert_provider.engine.maintenance.gc import (
            DEFAULT_GRACE_SECONDS,
            DEFAULT_REJECTS_RETENTION_SECONDS,
            collect_garbage,
        )

        grace = parse_seconds(self.grace_seconds, "grace_seconds")
        retention = parse_seconds(self.rejects_retention_seconds, "rejects_retention_seconds")
        # Parsed before any engine call: a typo must not turn a dry run into deletions.
        dry_run = parse_bool(self.dry_run, "dry_run")
        sweep = parse_bool(self.sweep, "sweep")
        report = collect_garbage(
            hook.get_consensus(),
            hook.get_blob(),
            self.shard,
            grace_seconds=DEFAULT_GRACE_SECONDS if grace is None else grace,
            rejects_retention_seconds=DEFAULT_REJECTS_RETENTION_SECONDS if retention is None else retention,
            dry_run=dry_run,
            sweep=sweep,
        )
        return report.to_dict()


class RestoreCheckpointOperator(_ShardMaintenanceOperator):
    """Rebuild a shard's consensus state from a checkpoint, after verifying every file it
    lists (present, size, checksum, parses). Never over an existing shard: restore into an
    empty consensus, or under a new shard id. The restored shard's stream is RECOVERING in a
    new epoch: nothing writes to it until a seek of that epoch (``SeekSourceOperator``) and
    the resume (``ResumeAfterRecoveryOperator``) have run. Returns ``shard``, ``checkpoint``,
    ``upper`` and ``since`` of the restored shard, and its ``stream`` (``status``, ``epoch``,
    who restored it, when): pass ``['stream']['epoch']`` to the seek and the resume.

    :param shard: the shard whose catalog holds the checkpoint (templated).
    :param checkpoint_id: the checkpoint (templated); unset or ``latest``: the latest in the
        catalog.
    :param target_shard: restore under this shard id (templated); default ``shard``.
    :param upsert_conn_id: the `upsert` connection.
    """

    template_fields: Sequence[str] = ("shard", "checkpoint_id", "target_shard")

    def __init__(
        self,
        *,
        shard: str,
        checkpoint_id: str | None = None,
        target_shard: str | None = None,
        upsert_conn_id: str = DEFAULT_CONN_ID,
        **kwargs: Any,
    ) -> None:
        super().__init__(shard=shard, upsert_conn_id=upsert_conn_id, **kwargs)
        self.checkpoint_id = checkpoint_id
        self.target_shard = target_shard
        self._actor = ""

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_upsert_provider.operators.lifecycle import actor_for

        # The stream's history records which task try restored the shard.
        self._actor = actor_for(context, self)
        return super().execute(context)

    def run(self, hook: UpsertShardHook) -> dict[str, Any]:
        from airflow_upsert_provider.engine.maintenance.checkpoint_catalog import Catalog
        from airflow_upsert_provider.engine.maintenance.checkpoint_restore import restore_checkpoint
        from airflow_upsert_provider.engine.store.streams import read_stream

        blob = hook.get_blob()
        checkpoint_id = None if is_unset(self.checkpoint_id) or self.checkpoint_id == "latest" else self.checkpoint_id
        if checkpoint_id is None:
            latest = Catalog.load(blob, self.shard).latest()
            if latest is None:
                raise AirflowFailException(f"shard {self.shard!r} has no checkpoint to restore")
            checkpoint_id = latest.id
        target = None if is_unset(self.target_shard) else self.target_shard
        consensus = hook.get_consensus()
        record = restore_checkpoint(consensus, blob, self.shard, checkpoint_id, target_shard_id=target,
                                    actor=self._actor)
        stream = read_stream(consensus, record.shard_id)
        return {"shard": record.shard_id, "checkpoint": checkpoint_id, "upper": record.upper, "since": record.since,
                "stream": stream.to_dict()}


class PublishIcebergOperator(_ShardMaintenanceOperator):
    """Publish the shard's table as of its since (the state the last compaction fixed) as
    one new snapshot of an Apache Iceberg table, read without Spark; run it after
    ``CompactShardOperator``. Idempotent: a since already published adds nothing. Returns the
    publish report (``outcome``: ``published`` or ``nothing_to_publish``, ``table``,
    ``snapshot_id``, ``since``, ``upper``, ``rows``, ``files``, ``bytes``, ``attempts``,
    ``seconds``, ``reason``). docs/readers.md, "Iceberg".

    :param shard: the shard id (templated).
    :param table: the Iceberg table, ``NAMESPACE.TABLE`` (templated); created on the first
        publish with the shard's schema.
    :param iceberg_conn_id: an `iceberg_catalog` connection naming the catalog: its extra holds
        PyIceberg catalog properties (``uri``, ``warehouse``, ...), its password the secret (a
        REST catalog's client secret or token, a SQL catalog's database password), which then
        stays out of DAG code. Default: the SQL catalog in the `upsert` connection's consensus
        store, tables under ``<blob root>/_iceberg``.
    :param catalog_uri: a REST catalog's URL (``http[s]://...``) or a SQL catalog's database
        URL without a password (one that needs a secret belongs in ``iceberg_conn_id``); not
        with ``iceberg_conn_id``. Not templated, and never logged.
    :param keep_last: after the publish, keep the newest this many snapshots of the table
        (default 10, at least 1) and those younger than ``keep_within``; the older ones and
        the files only they used are deleted (docs/readers.md, "Snapshot expiry").
    :param keep_within: also keep snapshots younger than this many seconds (default 0).
    :param expire: False keeps every snapshot (an expiry elsewhere bounds the storage).
    :param spark: True: the data files are merged and written by Spark's executors (the
        connection's master; the table on a filesystem path every executor reaches, or on
        object storage, which each executor reaches with its own credentials), committed as
        one snapshot here; False (default): read and written in this process, without Spark.
    :param spark_conf: Spark settings for the session when ``spark`` is True.
    :param upsert_conn_id: the `upsert` connection.
    """

    metric_operation = "publish"

    template_fields: Sequence[str] = ("shard", "table")

    def __init__(
        self,
        *,
        shard: str,
        table: str,
        iceberg_conn_id: str | None = None,
        catalog_uri: str | None = None,
        keep_last: int | None = None,
        keep_within: float | None = None,
        expire: bool = True,
        spark: bool = False,
        spark_conf: dict[str, str] | None = None,
        upsert_conn_id: str = DEFAULT_CONN_ID,
        **kwargs: Any,
    ) -> None:
        super().__init__(shard=shard, upsert_conn_id=upsert_conn_id, **kwargs)
        self.table = table
        self.spark = spark
        self.spark_conf = spark_conf or {}
        self.iceberg_conn_id = iceberg_conn_id
        self.catalog_uri = catalog_uri
        self.keep_last = keep_last
        self.keep_within = keep_within
        self.expire = expire

    def run(self, hook: UpsertShardHook) -> dict[str, Any]:
        from airflow_upsert_provider.engine.maintenance.iceberg import publish_to_catalog
        from airflow_upsert_provider.engine.maintenance.iceberg_expiry import retention
        from airflow_upsert_provider.engine.maintenance.iceberg_names import parse_table_identifier

        parse_table_identifier(self.table)  # before the shard is opened: a typo is the likely failure
        policy = retention(self.keep_last, self.keep_within)
        if self.iceberg_conn_id and self.catalog_uri:
            raise ConfigurationError("give the Iceberg catalog once: iceberg_conn_id or catalog_uri, not both",
                                     field="catalog_uri")
        properties = None
        if self.iceberg_conn_id:
            from airflow_upsert_provider.hooks.iceberg import IcebergCatalogHook

            properties = IcebergCatalogHook(self.iceberg_conn_id).catalog_properties(
                hook.settings.consensus_url, hook.settings.blob_root)
        shard = hook.open_shard(self.shard)
        if not self.spark:
            return publish_to_catalog(
                shard, self.table, consensus_url=hook.settings.consensus_url, blob_root=hook.settings.blob_root,
                catalog_uri=self.catalog_uri or None, properties=properties, retention=policy if self.expire else None,
            ).to_dict()
        from pyspark.sql import SparkSession

        owned = SparkSession.getActiveSession() is None
        spark = hook.get_spark(app_name=f"publish-{self.shard}", conf=self.spark_conf)
        try:
            return publish_to_catalog(
                shard, self.table, consensus_url=hook.settings.consensus_url, blob_root=hook.settings.blob_root,
                catalog_uri=self.catalog_uri or None, properties=properties, retention=policy if self.expire else None,
                spark=spark,
            ).to_dict()
        finally:
            if owned:
                spark.stop()
