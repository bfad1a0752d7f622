"""The run format: how a shard's data is laid out in blob and merged on read.

A run is what one batch (or one compaction) writes: one Parquet file per hash bucket, sorted
by key, holding the table columns (the user schema without the delete marker) and the run
columns ``_deleted`` and ``_ts``. Reads merge runs per key: the row with the highest order
value wins, then the highest ``_ts`` (see :func:`merge_runs`).

Every file of a run is durable before any commit can name it (invariant 17): fsynced with
its directories while the driver describes (checksums) what Spark's writer wrote, or by the
executor that wrote it (engine/table/run_io.py: object storage).

Everything here takes a shard's config and its blob, never a Shard, so the batch writer
(``upsert``), the shard's reads and compaction share it without importing each other.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import TYPE_CHECKING, Any

from airflow_upsert_provider.engine.blob.interface import Blob
from airflow_upsert_provider.engine.config import ShardConfig
from airflow_upsert_provider.engine.errors import first_line
from airflow_upsert_provider.engine.table import run_io

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType


def user_schema(config: ShardConfig) -> "StructType":
    """The schema every record is validated against, as a Spark type."""
    from pyspark.sql.types import StructType

    return StructType.fromJson(json.loads(config.schema))


def table_columns(config: ShardConfig) -> list[str]:
    """The columns a read returns: the schema without the delete marker."""
    return [c for c in config.column_names() if c != config.delete_marker]


def run_schema(config: ShardConfig) -> "StructType":
    """The columns of every run file: table columns, then ``_deleted`` and ``_ts``."""
    from pyspark.sql.types import BooleanType, LongType, StructField, StructType

    schema = user_schema(config)
    return StructType(
        [schema[c] for c in table_columns(config)]
        + [StructField("_deleted", BooleanType()), StructField("_ts", LongType())]
    )


def order_column(config: ShardConfig) -> str | None:
    """The run column holding a row's order value, None without an order column. The order
    column is a table column, so every run row carries its value already, tombstones too
    (a delete record keeps its own values); only an order column that is also the delete
    marker is stored as ``_deleted``."""
    if config.order_by is None:
        return None
    return "_deleted" if config.order_by == config.delete_marker else config.order_by


def bucket_column(config: ShardConfig, buckets: int | None = None) -> "Column":
    """The hash bucket of a row's key among ``buckets`` (default: the count the shard was
    created with): the same function for batches and compaction. A key's bucket among N is
    its bucket among any divisor M of N taken modulo M, which is what lets a shard's count
    grow by a factor (:func:`read_group_count`)."""
    from pyspark.sql import functions as F

    return F.pmod(F.xxhash64(*config.keys), F.lit(config.buckets if buckets is None else buckets))


def run_buckets(run: dict[str, Any], config: ShardConfig) -> int:
    """The bucket count ``run`` was written with: what it records, or (a run written before
    counts were recorded, when no shard's count could change) the count of the shard's ``init``."""
    return int(run.get("buckets", config.buckets))


def current_buckets(config: ShardConfig, compacted_run: dict[str, Any] | None) -> int:
    """The shard's bucket count now: its compacted run's (a compaction changes it, in the swap
    that installs that run), else the count of ``init``."""
    return config.buckets if compacted_run is None else run_buckets(compacted_run, config)


def read_group_count(config: ShardConfig, runs: list[dict[str, Any]]) -> int:
    """How many key groups a bucket-by-bucket read of ``runs`` merges apart: the greatest
    common divisor of their bucket counts (the count of ``init`` for no runs). Every count is
    the previous one times a whole factor, so a key of bucket b among N is in group b mod G of
    every run: a group holds every row of its keys, whichever count each run was written with.
    Pure."""
    return math.gcd(*[run_buckets(run, config) for run in runs]) if runs else config.buckets


def write_bucketed(
    rows: "DataFrame",
    config: ShardConfig,
    blob: Blob,
    run_dir: str,
    *,
    partitioned: bool = False,
    timings: dict[str, float] | None = None,
    buckets: int | None = None,
) -> dict[str, Any]:
    """Write ``rows`` (run columns plus ``_bucket`` among ``buckets``, default the count of
    ``init``) under ``run_dir``: one Parquet file per bucket, sorted by key, durable when this
    returns; return the run as consensus records it (its path, files, row count, bucket
    count and the schema version of ``config``). Batches and compaction write runs the same way.
    ``partitioned`` says the rows are already hash-partitioned by ``_bucket``, so they are
    not shuffled again. ``timings`` gets "describe" added: the seconds the driver spent
    describing the written files (reading a batch, reducing and writing it are one fused
    Spark job, which cannot be timed apart).

    Where :func:`run_io.executor_io` says so, the executors write through pyarrow and report
    what they wrote; elsewhere Spark's Parquet writer writes and the driver describes the
    files (:func:`describe_run`)."""
    count = config.buckets if buckets is None else buckets
    if not partitioned:
        rows = rows.repartition(count, "_bucket")
    rows = rows.sortWithinPartitions("_bucket", *config.keys)
    described = 0.0
    if run_io.executor_io(blob.root):
        # The run directory exists, durably, before a task names a file in it.
        blob.make_dirs(run_dir)
        run = run_io.write_run_files(rows, run_schema(config).fieldNames(), blob, run_dir)
    else:
        rows.write.mode("error").partitionBy("_bucket").parquet(run_dir)  # "error": Spark Connect knows only this name
        started = time.monotonic()
        run = describe_run(blob, run_dir)
        described = time.monotonic() - started
    if timings is not None:
        timings["describe"] = timings.get("describe", 0.0) + described
    # The schema version of ``config``: a read of this run with a newer one fills its
    # missing columns with nulls (engine/store/table_schemas.py).
    return {**run, "buckets": count, "schema_version": config.schema_version}


def describe_run(blob: Blob, run_dir: str) -> dict[str, Any]:
    """A run Spark's Parquet writer wrote, as consensus records it: its path, files and row
    count. Its files are durable when this returns."""
    files = run_files(blob, run_dir)
    rows = parquet_rows([blob.path(f["path"]) for f in files])
    return {"path": os.path.relpath(run_dir, blob.root), "files": files, "rows": rows}


def run_files(blob: Blob, run_dir: str) -> list[dict[str, Any]]:
    """The Parquet files of a written run, relative to the blob root, with their sizes and
    SHA-256, fsynced with their directories. The checksum is taken here, while the files
    are fresh in the page cache, so that a checkpoint lists it without reading the table
    again; the fsync follows the read that brought them there."""
    files = [
        f for f in blob.walk_files(run_dir)
        if f.path.endswith(".parquet") and not os.path.basename(f.path).startswith((".", "_"))
    ]
    listed = [{"path": os.path.relpath(f.path, blob.root), "bytes": f.size, "sha256": blob.checksum(f.path)} for f in files]
    blob.sync_written(f.path for f in files)
    return listed


def sync_data_files(blob: Blob, directory: str) -> None:
    """Make the data files Spark wrote below ``directory`` (e.g. a batch's rejects) durable
    before a commit names it; Spark's hidden and marker files (``.crc``, ``_SUCCESS``) are
    not data."""
    blob.sync_written(
        f.path for f in blob.walk_files(directory) if not os.path.basename(f.path).startswith((".", "_"))
    )


def parquet_rows(paths: list[str]) -> int:
    """Rows in the Parquet files at ``paths``, from their footers."""
    import pyarrow.parquet as pq

    return sum(pq.read_metadata(p).num_rows for p in paths)


def read_runs(spark: "SparkSession", config: ShardConfig, blob: Blob, runs: list[dict[str, Any]]) -> "DataFrame":
    """Merge runs (see :func:`merge_runs`); tombstones removed, user columns only."""
    from pyspark.sql import functions as F

    keys = list(config.keys)
    values = [c for c in table_columns(config) if c not in keys]
    return merge_runs(spark, config, blob, runs).where(~F.col("_deleted")).select(*keys, *values)


def merge_runs(spark: "SparkSession", config: ShardConfig, blob: Blob, runs: list[dict[str, Any]]) -> "DataFrame":
    """Merge runs keeping the run columns: per key the winning row, with its ``_deleted``
    and ``_ts`` (tombstones kept; compaction writes this, reads filter it).

    The winner has the highest order value, then the highest ``_ts``: the order column wins
    across batches as it does within one, so the table does not depend on where batches
    were cut. A null order value ranks below every value, as within a batch. Tombstones
    take part in the same comparison. Without an order column the highest ``_ts`` wins.

    Nothing is checked before reading (no request per listed file): a read that fails is
    explained afterwards by :meth:`Shard.reading` around its action (a missing or damaged
    file an :class:`IntegrityError` naming it, files replaced meanwhile ``ReadOutdated``);
    a caller that hands the frame on checks first (``Shard.check_run_files_listed``).
    """
    schema = run_schema(config)
    files = [f for run in runs for f in run["files"]]
    return merge_rows(scan_run_files(spark, schema, blob, files, executor=run_io.executor_io(blob.root)), config)


def scan_run_files(
    spark: "SparkSession", schema: "StructType", blob: Blob, files: list[dict[str, Any]], *, executor: bool
) -> "DataFrame":
    """The rows of the listed run files in ``schema``, unmerged: read by executors through
    pyarrow (``executor``) or by Spark's Parquet reader."""
    if not files:
        return spark.createDataFrame([], schema)
    if executor:
        return run_io.read_run_files(spark, schema, blob.root, files)
    paths = [blob.path(f["path"]) for f in files]
    return spark.read.schema(schema).option("recursiveFileLookup", "true").parquet(*paths)


def merge_rows(rows: "DataFrame", config: ShardConfig) -> "DataFrame":
    """Per key the winning row of ``rows`` (run columns), as :func:`merge_runs` ranks them."""
    from pyspark.sql import functions as F

    keys = list(config.keys)
    values = [c for c in table_columns(config) if c not in keys]
    order = order_column(config)
    rank = F.struct(F.col(f"`{order}`"), F.col("_ts")) if order else F.col("_ts")
    winner = F.max_by(F.struct(*values, "_deleted", "_ts"), rank).alias("_w")
    merged = rows.groupBy(*keys).agg(winner)
    return merged.select(*keys, *[F.col(f"_w.{v}").alias(v) for v in values + ["_deleted", "_ts"]])


def file_problem(
    blob: Blob, listed: dict[str, Any], recorded_by: str, *, read: bool = True
) -> tuple[str | None, str | None]:
    """One check of a listed run file, for checkpoint ``create`` and ``verify`` and a failed read:
    (SHA-256, None) for a listed file that is present, of the recorded size and checksum
    (a ``sha256`` of None: none was recorded) and readable Parquet; else (None, reason).
    ``recorded_by`` says where the recorded values come from, for the reason. Without ``read``
    only presence and size are checked (one request on object storage), and the recorded
    SHA-256 is returned. The footer is read through the blob, as the size and checksum are: a
    store that keeps failing is its :class:`BlobUnavailable` (retryable), never a bad file."""
    path = blob.path(listed["path"])
    try:
        size = blob.size(path)
        if size != listed["bytes"]:
            return None, f"size {size} bytes, {recorded_by} says {listed['bytes']}"
        if not read:
            return listed["sha256"], None
        digest = blob.checksum(path)
    except FileNotFoundError:
        return None, "missing"
    except OSError as exc:
        return None, f"unreadable: {exc.strerror}"
    if listed["sha256"] is not None and digest != listed["sha256"]:
        return None, f"checksum mismatch: sha256 {digest[:12]}…, {recorded_by} says {listed['sha256'][:12]}…"
    try:
        blob.parquet_metadata(path)
    except FileNotFoundError:
        return None, "missing"
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid (a ValueError) or IOError of a bad footer
        return None, f"not a readable Parquet file: {first_line(exc)}"
    return digest, None
