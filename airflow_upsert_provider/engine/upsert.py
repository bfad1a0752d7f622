"""One upsert batch on Spark.

A batch reads exactly the segment files its binding lists, validates every record, keeps the
latest record per key by (order column, partition, offset, line), hashes keys into buckets and
writes one sorted Parquet file per bucket under a staging path unique to (writer, ts, attempt).
It never reads the table: a write costs O(batch), never O(table).
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_upsert_provider.engine.config import ShardConfig
from airflow_upsert_provider.engine.consensus import Binding
from airflow_upsert_provider.engine.errors import BadInputError, ConfigurationError
from airflow_upsert_provider.engine.runs import (
    bucket_column,
    describe_run,
    sync_data_files,
    table_columns,
    user_schema,
    write_bucketed,
)
from airflow_upsert_provider.engine.shard import MAX_REPORTED, Shard
from airflow_upsert_provider.engine.sources import DirectorySource, Segment

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# How much of a bad value an error message quotes.
QUOTE_CHARS = 80


@dataclass(frozen=True)
class StagedOutput:
    run: dict[str, Any]
    rejects: dict[str, Any] | None
    rows_in: int
    rows_out: int
    rejected: int
    # Seconds spent reading and validating the segments, and writing the runs.
    timings: dict[str, float] = field(default_factory=dict)


def stage_batch(
    spark: "SparkSession",
    shard: Shard,
    binding: Binding,
    *,
    run_dir: str,
    rejects_dir: str,
    on_bad_record: str,
) -> StagedOutput:
    """Write the runs of batch ``binding.ts`` under ``run_dir``; nothing is committed here."""
    from pyspark.sql import functions as F

    config = shard.config
    segments = shard.segment_paths(binding)
    missing = [s.path for s in segments if not os.path.isfile(s.path)]
    if missing:
        raise BadInputError(
            f"{len(missing)} segment file(s) bound to batch {binding.ts} are missing; first: "
            f"{missing[0]} (a bound segment must stay in place until its batch commits)",
            records=[{"file": p, "reason": "missing"} for p in missing[:MAX_REPORTED]],
            count=len(missing),
        )
    # An empty segment holds no record, and Spark lists no split for it: a job over empty
    # files only runs no task and reports no totals.
    segments = [s for s in segments if os.path.getsize(s.path) > 0]
    if not segments:
        return StagedOutput({"path": _relative(shard, run_dir), "files": [], "rows": 0}, None, 0, 0, 0)

    job_started = time.monotonic()
    if config.source_format == "jsonl":
        # Spark's JSON reader only tells a clean batch from one that holds something bad; a
        # bad batch is redone with exact line numbers and reasons (see _jsonl_records_fast).
        rows_in, rejected = _write_run(_jsonl_records_fast(spark, config, segments), config, binding.ts, run_dir)
        if rejected:
            # Only the exact records decide what is bad, so every writer agrees.
            shard.blob.delete_tree(run_dir)
            records = _jsonl_records(spark, config, segments)
            rows_in, rejected = _write_run(records, config, binding.ts, run_dir)
    else:
        records = _parquet_records(spark, shard, segments)
        rows_in, rejected = _write_run(records, config, binding.ts, run_dir)
    job_seconds = time.monotonic() - job_started
    rejects = None
    if rejected:
        bad = records.where(F.col("_reason").isNotNull())
        if on_bad_record == "fail":
            # Never appended, so the outcome is known: these files can go at once.
            shard.blob.delete_tree(run_dir)
            sample = (
                bad.select("_file", "_line", "_reason")
                .orderBy("_partition", "_offset", "_line")
                .limit(MAX_REPORTED)
                .collect()
            )
            listed = [{"file": _local_path(r["_file"]), "line": r["_line"], "reason": r["_reason"]} for r in sample]
            first = listed[0]
            raise BadInputError(
                f"{rejected} bad record(s) in batch {binding.ts}; first: {first['file']} "
                f"line {first['line']}: {first['reason']} (nothing was committed; fix the "
                "data or run with --on-bad-record quarantine)",
                records=listed,
                count=rejected,
                ts=binding.ts,
            )
        (
            bad.select(
                F.regexp_replace("_file", "^file:(//)?", "").alias("file"),
                F.col("_line").alias("line"),
                F.col("_reason").alias("reason"),
                F.col("_raw").alias("record"),
            )
            .coalesce(1)
            .write.mode("errorifexists")
            .json(rejects_dir)
        )
        sync_data_files(shard.blob, rejects_dir)
        rejects = {"path": _relative(shard, rejects_dir), "rows": rejected}
    describe_started = time.monotonic()
    run = describe_run(shard.blob, run_dir)
    rows_out = run["rows"]
    # Reading, validating, reducing and writing are one fused Spark job: they cannot be
    # timed apart. "describe" is listing the written files and checksumming them.
    timings = {"spark_job": job_seconds, "describe": time.monotonic() - describe_started}
    return StagedOutput(run, rejects, rows_in, rows_out, rejected, timings)


def _write_run(records: "DataFrame", config: ShardConfig, ts: int, run_dir: str) -> tuple[int, int]:
    """Reduce ``records`` to the latest per key and write them as the run of batch ``ts``;
    return (records read, records rejected).

    One Spark job: the records are validated, reduced and written in a single pass, and the
    totals are observed on the way instead of counted by a pre-pass.
    """
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    totals = Observation(f"batch-{ts}-{uuid.uuid4().hex[:8]}")
    observed = records.observe(totals, F.count(F.lit(1)).alias("rows_in"), F.count("_reason").alias("rejected"))
    latest = _latest_per_key(observed.where(F.col("_reason").isNull()), config, ts)
    write_bucketed(latest, config, run_dir, partitioned=True)
    metrics = totals.get
    return int(metrics["rows_in"]), int(metrics["rejected"])


# -- record parsing ---------------------------------------------------------------------------


def _jsonl_records_fast(spark: "SparkSession", config: ShardConfig, segments: list[Segment]) -> "DataFrame":
    """Records of clean JSON lines, read by Spark's JSON reader (about three times faster than
    parsing lines as expressions). ``_reason`` only marks a record as bad (malformed, a value of
    the wrong type, a missing or null key); :func:`_jsonl_records` says exactly why.

    ``_line`` is a position, not a line number: ``monotonically_increasing_id`` grows with the
    line within a file however files are split or packed into tasks, and ties within a key are
    only ever broken between lines of one file (after partition and offset), so every writer
    orders records exactly as by line number.
    """
    from pyspark.sql.types import StringType, StructField, StructType

    schema = user_schema(config)
    read_schema = StructType([*schema.fields, StructField("_corrupt", StringType())])
    bad = " OR ".join(["_corrupt IS NOT NULL", *[f"{_sql_name(k)} IS NULL" for k in config.keys]])
    return (
        spark.read.schema(read_schema)
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", "_corrupt")
        .json([s.path for s in segments])
        .selectExpr(
            "_metadata.file_path AS _file",
            *[f"{expr} AS {name}" for name, expr in _segment_columns("_metadata.file_path").items()],
            "monotonically_increasing_id() AS _line",
            *[_sql_name(f.name) for f in schema.fields],
            f"CASE WHEN {bad} THEN 'bad record' END AS _reason",
        )
    )


def _jsonl_records(spark: "SparkSession", config: ShardConfig, segments: list[Segment]) -> "DataFrame":
    """One row per non-blank line: position, raw text, typed columns and why it is bad."""
    from pyspark.sql import functions as F

    schema = user_schema(config)
    # Partition and offset are taken from the path once per file, before it is split into lines.
    files = (
        spark.read.text([s.path for s in segments], wholetext=True)
        .select(F.col("_metadata.file_path").alias("_file"), "value")
        .withColumns({name: F.expr(expr) for name, expr in _segment_columns("_file").items()})
    )
    lines = files.select(
        "_file", "_partition", "_offset", F.posexplode(F.split(F.col("value"), "\r?\n")).alias("_pos", "_raw")
    )
    parsed = lines.where(F.trim(F.col("_raw")) != "").select(
        "_file",
        "_partition",
        "_offset",
        (F.col("_pos") + 1).alias("_line"),
        "_raw",
        F.from_json("_raw", schema).alias("_r"),
        F.from_json("_raw", "MAP<STRING,STRING>").alias("_m"),
    )
    # The checks are one SQL expression: built column by column they cost a py4j round trip
    # per call, a noticeable share of a small batch's latency.
    reasons = ["CASE WHEN _m IS NULL THEN 'malformed JSON: not a JSON object' END"]
    for key in config.keys:
        reasons.append(f"CASE WHEN NOT map_contains_key(_m, {_sql_string(key)}) THEN {_sql_string(f'missing key column {key!r}')} END")
        # A JSON null; a value of the wrong type is reported by the field checks below.
        reasons.append(f"CASE WHEN _m[{_sql_string(key)}] IS NULL THEN {_sql_string(f'null key column {key!r}')} END")
    for spec in schema.fields:
        raw = f"_m[{_sql_string(spec.name)}]"
        expected = _sql_string(f"field {spec.name!r}: expected {spec.dataType.simpleString()}, got ")
        reasons.append(
            f"CASE WHEN {raw} IS NOT NULL AND _r.{_sql_name(spec.name)} IS NULL "
            f"THEN concat({expected}, substring({raw}, 1, {QUOTE_CHARS})) END"
        )
    return parsed.selectExpr(
        "_file",
        "_partition",
        "_offset",
        "_line",
        "_raw",
        *[f"_r.{_sql_name(f.name)} AS {_sql_name(f.name)}" for f in schema.fields],
        f"coalesce({', '.join(reasons)}) AS _reason",
    )


def _sql_string(text: str) -> str:
    """``text`` as a Spark SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _sql_name(name: str) -> str:
    """A column name quoted for Spark SQL."""
    return "`" + name.replace("`", "``") + "`"


def _parquet_records(spark: "SparkSession", shard: Shard, segments: list[Segment]) -> "DataFrame":
    """Parquet segments. Their schemas were checked when the batch was bound (a missing key
    column or an incompatible type is a whole-file problem); here null keys are bad records."""
    from pyspark.sql import functions as F

    config = shard.config
    schema = user_schema(config)
    df = spark.read.schema(schema).parquet(*[s.path for s in segments])
    df = df.select(
        F.col("_metadata.file_path").alias("_file"),
        (F.col("_metadata.row_index") + 1).alias("_line"),
        F.to_json(F.struct(*[F.col(f"`{f.name}`") for f in schema.fields])).alias("_raw"),
        *[F.col(f"`{f.name}`") for f in schema.fields],
    ).withColumns({name: F.expr(expr) for name, expr in _segment_columns("_file").items()})
    reasons = [F.when(F.col(f"`{k}`").isNull(), F.lit(f"null key column '{k}'")) for k in config.keys]
    return df.select(
        "_file", "_partition", "_offset", "_line", "_raw",
        *[F.col(f"`{f.name}`") for f in schema.fields],
        F.coalesce(*reasons).alias("_reason"),
    )


def _segment_columns(file_column: str) -> dict[str, str]:
    """Partition and offset of a segment as SQL expressions over its path
    ``.../<partition>/<seq>.<ext>`` (both validated when the batch was bound). substring_index
    is used because a regular expression per record costs more than parsing the record."""
    return {
        "_partition": f"substring_index(substring_index({file_column}, '/', -2), '/', 1)",
        "_offset": f"CAST(substring_index(substring_index({file_column}, '/', -1), '.', 1) AS BIGINT)",
    }


def _latest_per_key(good: "DataFrame", config: ShardConfig, ts: int) -> "DataFrame":
    """Within a key the latest record wins by (order column, partition, offset, line):
    the same total order on every writer (invariant 5)."""
    from pyspark.sql import functions as F

    keys = list(config.keys)
    columns = table_columns(config)
    values = [c for c in columns if c not in keys]
    deleted = (
        F.coalesce(F.col(f"`{config.delete_marker}`"), F.lit(False)) if config.delete_marker else F.lit(False)
    )
    rank = [F.col("_partition"), F.col("_offset"), F.col("_line")]
    if config.order_by:
        rank.insert(0, F.col(f"`{config.order_by}`"))
    # Shuffle once, by bucket: a hash partitioning on _bucket already clusters every key, so
    # the per-key aggregate and the one-file-per-bucket write need no further exchange.
    by_bucket = good.withColumn("_bucket", bucket_column(config)).repartition(config.buckets, "_bucket")
    latest = by_bucket.groupBy("_bucket", *keys).agg(
        F.max_by(F.struct(*[F.col(f"`{v}`") for v in values], deleted.alias("_deleted")), F.struct(*rank)).alias("_w")
    )
    return latest.select(
        *keys,
        *[F.col(f"_w.`{v}`").alias(v) for v in values],
        F.col("_w._deleted").alias("_deleted"),
        F.lit(ts).cast("long").alias("_ts"),
        "_bucket",
    )


def _relative(shard: Shard, path: str) -> str:
    return os.path.relpath(path, shard.blob.root)


def _local_path(uri: str) -> str:
    """A path Spark reports (``file:/x`` or ``file:///x``, URL-quoted) as a plain path."""
    from urllib.parse import unquote

    return unquote(re.sub(r"^file:(//)?", "", uri))


def parse_schema(spark: "SparkSession", ddl: str) -> str:
    """A DDL string (``id BIGINT, name STRING``) as the schema JSON a shard stores."""
    from pyspark.sql.types import StructType, _parse_datatype_string

    del spark  # required only so that an active SparkContext exists for the parser
    try:
        parsed = _parse_datatype_string(ddl)
    except Exception as exc:
        raise ConfigurationError(f"invalid --schema {ddl!r}: {str(exc).splitlines()[0]}", field="schema") from None
    if not isinstance(parsed, StructType):
        raise ConfigurationError(f"--schema {ddl!r} is not a list of columns", field="schema")
    return parsed.json()


def infer_schema(spark: "SparkSession", source: DirectorySource, *, sample_files: int = 8) -> str:
    """Infer the schema from the first segments of the source (columns in the order of
    the first record, not alphabetical)."""
    from pyspark.sql.types import StructType

    segments: list[Segment] = []
    for partition in source.partitions():
        found, _ = source.scan(partition)
        segments += found[:sample_files]
    segments = sorted(segments)[:sample_files]
    if not segments:
        raise ConfigurationError(
            f"source {source.root} holds no segments to infer a schema from; pass --schema",
            field="schema",
        )
    paths = [s.path for s in segments]
    if source.source_format == "parquet":
        return spark.read.parquet(*paths).schema.json()
    inferred = spark.read.option("mode", "PERMISSIVE").json(paths).schema
    fields = {f.name: f for f in inferred.fields if f.name != "_corrupt_record"}
    order: list[str] = []
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if isinstance(record, dict):
                    order += [k for k in record if k in fields and k not in order]
    order += [name for name in fields if name not in order]
    return StructType([fields[name] for name in order]).json()
