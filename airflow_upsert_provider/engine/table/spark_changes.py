"""The change feed as a Spark DataFrame: the same rows as the Arrow feed
(engine/table/changes.py), computed by Spark over the same runs (docs/changes.md).

The range's batch runs are what changed; the runs as of ``from_ts`` are semi-joined with the
changed keys, so only those keys' rows are merged; per key the winners as of ``from_ts`` and
``to_ts`` are merged by the engine's rule (``runs.merge_rows``) and compared. Without
pre-images the values as of ``from_ts`` are never selected, so Spark reads only the other
columns of those runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from airflow_upsert_provider.engine.table import run_io
from airflow_upsert_provider.engine.table.arrow_reader import output_columns
from airflow_upsert_provider.engine.table.change_rules import (
    CHANGE_TYPE,
    COMMIT_TIMESTAMP,
    COMMIT_VERSION,
    DELETE,
    INSERT,
    UPDATE_POSTIMAGE,
    UPDATE_PREIMAGE,
)
from airflow_upsert_provider.engine.table.changes import plan_changes
from airflow_upsert_provider.engine.table.runs import merge_rows, run_schema, scan_run_files, table_columns

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from airflow_upsert_provider.engine.table.shard import Shard


def read_changes_spark(
    spark: "SparkSession", shard: "Shard", from_ts: int, to_ts: int | None = None,
    *, columns: Sequence[str] | None = None, preimages: bool = False,
) -> "DataFrame":
    """The net change per key of ``shard``'s table over the batches ``from_ts <= ts < to_ts``
    (default: to the upper) as a DataFrame: the table's columns (``columns``, default keys then
    values), ``_change_type``, ``_commit_version`` (LONG) and ``_commit_timestamp``. The range is
    checked and its runs chosen now; every listed file is checked to exist (one listing), as
    :meth:`Shard.read` checks, since whoever collects the frame runs the read. ``preimages`` as
    for :func:`changes.read_changes`: the same rows."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType, LongType, StructField, StructType

    config, blob = shard.config, shard.blob
    plan = plan_changes(shard, from_ts, to_ts)
    shard.check_run_files_listed(plan.runs)
    out = output_columns(config, columns)
    keys = list(config.keys)
    values = [c for c in table_columns(config) if c not in keys]
    schema = run_schema(config)
    executor = run_io.executor_io(blob.root)
    changes = scan_run_files(spark, schema, blob, [f for b in plan.batches for f in b.run["files"]],
                             executor=executor)
    changed_keys = changes.select(*keys).distinct()
    before = scan_run_files(spark, schema, blob, [f for run in plan.before_runs for f in run["files"]],
                            executor=executor).join(changed_keys, keys, "left_semi")
    at_from = merge_rows(before, config)
    at_to = merge_rows(at_from.unionByName(changes.select(*at_from.columns)), config)
    types = {f.name: f.dataType for f in schema.fields}
    prior = at_from.where(~F.col("_deleted")).select(
        *keys, *[(F.col(c) if preimages else F.lit(None).cast(types[c])).alias(f"__from_{c}") for c in values],
        F.col("_ts").alias("__from_ts"), F.lit(True).alias("__in_from"))
    joined = at_to.join(prior, keys, "left")
    in_from = F.coalesce(F.col("__in_from"), F.lit(False))
    in_to = ~F.coalesce(F.col("_deleted"), F.lit(False))
    unchanged = F.coalesce(F.col("_ts") == F.col("__from_ts"), F.lit(False))
    same_values = F.lit(True)
    for c in values:
        same_values = same_values & F.col(c).eqNullSafe(F.col(f"__from_{c}"))
    deleted = in_from & ~in_to
    updated = in_from & in_to & ~(unchanged | same_values if preimages else unchanged)
    inserted = ~in_from & in_to
    # One pass over the join: each changed key's rows come out of one array (a pre-image before
    # its post-image), each value taken from the side its change type shows.
    kinds = (F.when(deleted, F.array(F.lit(DELETE)))
             .when(updated, F.array(*([F.lit(UPDATE_PREIMAGE)] if preimages else []), F.lit(UPDATE_POSTIMAGE)))
             .when(inserted, F.array(F.lit(INSERT))))
    exploded = joined.where(kinds.isNotNull()).withColumn(CHANGE_TYPE, F.explode(kinds))
    prior_side = F.col(CHANGE_TYPE).isin(DELETE, UPDATE_PREIMAGE)
    feed = exploded.select(
        *[F.col(c) if c in keys else F.when(prior_side, F.col(f"__from_{c}")).otherwise(F.col(c)).alias(c)
          for c in out],
        CHANGE_TYPE, F.col("_ts").cast("long").alias(COMMIT_VERSION))
    times = spark.createDataFrame(
        [(b.ts, float(b.committed_at)) for b in plan.batches],
        StructType([StructField(COMMIT_VERSION, LongType()), StructField("__at", DoubleType())]))
    stamped = feed.join(F.broadcast(times), COMMIT_VERSION, "left").withColumn(
        COMMIT_TIMESTAMP, F.timestamp_micros(F.floor(F.col("__at") * 1_000_000).cast("long")))
    return stamped.select(*out, CHANGE_TYPE, COMMIT_VERSION, COMMIT_TIMESTAMP)
