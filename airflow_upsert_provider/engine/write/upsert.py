"""One upsert batch on Spark.

A batch reads exactly the segment files its binding lists, validates every record, keeps the
latest record per key by (order column, partition, offset, line), hashes keys into buckets and
writes one sorted Parquet file per bucket under a staging path unique to (writer, ts, attempt).
It never reads the table: a write costs O(batch), never O(table).
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable

from airflow_upsert_provider.engine.config import ShardConfig
from airflow_upsert_provider.engine.store.records import Binding
from airflow_upsert_provider.engine.errors import BadInputError, ConfigurationError
from airflow_upsert_provider.engine.table import run_io
from airflow_upsert_provider.engine.table.runs import (
    bucket_column,
    sync_data_files,
    table_columns,
    write_bucketed,
)
from airflow_upsert_provider.engine.write.kafka_records import (
    kafka_batch_records,
    kafka_field_counts,
    kafka_observed_fields,
    message_position,
)
from airflow_upsert_provider.engine.write.records import (
    BatchRecords,
    UnknownField,
    jsonl_fast_path_decides,
    jsonl_records,
    jsonl_records_fast,
    local_path,
    observed_jsonl_fields,
    observed_parquet_fields,
    parquet_records,
    unknown_fields,
    unknown_fields_text,
)
from airflow_upsert_provider.engine.table.schema_apply import evolve_batch, schema_policy
from airflow_upsert_provider.engine.table.shard import MAX_REPORTED, Shard
from airflow_upsert_provider.engine.sources import DirectorySource, Segment

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StagedOutput:
    run: dict[str, Any]
    rejects: dict[str, Any] | None
    rows_in: int
    rows_out: int
    rejected: int
    # Seconds spent reading and validating the segments, and writing the runs.
    timings: dict[str, float] = field(default_factory=dict)
    # Fields a Kafka batch's records carry that the shard's schema does not name: ignored,
    # and said so. (A directory batch applies the shard's schema evolution policy instead.)
    unknown_fields: tuple[UnknownField, ...] = ()


def stage_batch(
    spark: "SparkSession",
    shard: Shard,
    binding: Binding,
    *,
    run_dir: str,
    rejects_dir: str,
    on_bad_record: str,
    messages: "DataFrame | None" = None,
) -> StagedOutput:
    """Write the runs of batch ``binding.ts`` under ``run_dir``; nothing is committed here.
    ``messages``: a Kafka batch's slice fetched ahead of time (continuous mode)."""
    # Validated against the schema's version now: a column added since this handle was opened
    # (a continuous writer's) reaches the table from this batch on.
    shard.refresh_schema()
    if shard.is_kafka:
        return _stage_kafka(spark, shard, binding, run_dir=run_dir, rejects_dir=rejects_dir,
                            on_bad_record=on_bad_record, messages=messages)
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
    timings: dict[str, float] = {}
    # The schema this batch is written with, made durable before anything is written: the
    # fields its records carry under the shard's policy (docs/schema.md). Under policy none,
    # a record carrying a field the schema does not name is bad, naming the field.
    policy = schema_policy(shard)
    if config.source_format == "jsonl":
        observed = observed_jsonl_fields(spark, config, segments, policy)
    else:
        observed = observed_parquet_fields(config, segments, policy)
    refused = evolve_batch(shard, observed, ts=binding.ts).unknown
    config = shard.config
    timings["schema"] = time.monotonic() - job_started
    if config.source_format == "jsonl":
        # One verdict per record (engine/write/records.py): Spark's JSON reader stages a batch only
        # when it reads every line as the exact path does, and only if nothing is bad; any
        # other batch is staged by the exact path, which alone says why and where. Spark's
        # JSON reader cannot see a field the schema does not name: such a batch is the exact
        # path's.
        batch = None
        if not refused and jsonl_fast_path_decides(spark, segments):
            batch = jsonl_records_fast(spark, config, segments)
            rows_in, rejected, run = _write_run(batch, shard, binding.ts, run_dir, timings)
            if rejected:
                shard.blob.delete_tree(run_dir)
                batch = None
        if batch is None:
            batch = jsonl_records(spark, config, segments, refused=refused)
            rows_in, rejected, run = _write_run(batch, shard, binding.ts, run_dir, timings)
    else:
        batch = parquet_records(spark, config, segments,
                                refused=[o for o in observed if o.name in set(refused)])
        rows_in, rejected, run = _write_run(batch, shard, binding.ts, run_dir, timings)
    timings["spark_job"] = time.monotonic() - job_started - timings["describe"] - timings["schema"]
    return _finish(shard, binding, batch, rows_in, rejected, run, timings,
                   run_dir=run_dir, rejects_dir=rejects_dir, on_bad_record=on_bad_record)


def _with_unknown_fields(shard: Shard, binding: Binding, output: StagedOutput,
                         counts: list[tuple[str, int, str]]) -> StagedOutput:
    """``output`` with the fields of ``counts`` the shard's schema does not name, logged once."""
    ignored = tuple(unknown_fields(shard.config.column_names(), counts))
    if ignored:
        log.warning("shard %s batch %s: %d field(s) the shard's schema does not name were ignored: %s "
                    "(the table keeps the schema's columns; see docs/input.md)",
                    shard.shard_id, binding.ts, len(ignored), unknown_fields_text(ignored))
    return replace(output, unknown_fields=ignored)


def _stage_kafka(
    spark: "SparkSession",
    shard: Shard,
    binding: Binding,
    *,
    run_dir: str,
    rejects_dir: str,
    on_bad_record: str,
    messages: "DataFrame | None",
) -> StagedOutput:
    """A Kafka batch: the bound slice (prefetched, or read now on the executors), mapped from
    its envelope and judged record by record as JSON lines are.

    The fields the schema does not name are observed, with their types, by the same job that
    writes the run (the messages are parsed once). When there are any, the shard's schema
    evolution policy judges them (:func:`evolve_batch`: a new version is minted before the
    batch commits), and the run is written again with the schema the batch evolved to, the
    records carrying a field policy ``none`` refuses being bad records naming it. A batch
    without such fields, nearly every one, costs no second pass."""
    ranges = {int(p): (int(r["from"]), int(r["to"])) for p, r in binding.ranges.items() if r["to"] > r["from"]}
    if not ranges:
        return StagedOutput({"path": _relative(shard, run_dir), "files": [], "rows": 0}, None, 0, 0, 0)
    job_started = time.monotonic()
    if messages is None:
        messages = shard.source.read_slice(spark, ranges)
    topic, envelope = shard.source.topic, shard.kafka_options.envelope
    known = shard.config.column_names()
    batch = kafka_batch_records(spark, shard.config, messages, topic=topic, envelope=envelope)
    timings: dict[str, float] = {}
    counted: list[dict[str, Any]] = []
    rows_in, rejected, run = _write_run(batch, shard, binding.ts, run_dir, timings, unknown=counted)
    refused: tuple[str, ...] = ()
    try:
        observed = kafka_observed_fields(shard.shard_id, topic, counted)
        evolution = evolve_batch(shard, observed, ts=binding.ts) if observed else None
    except Exception:
        shard.blob.delete_tree(run_dir)  # never appended: a refused batch leaves no files
        raise
    if evolution is not None:
        refused = evolution.unknown
        if refused or shard.config.column_names() != known:
            # Written with a schema that is not the batch's: never appended, so it can go.
            shard.blob.delete_tree(run_dir)
            batch = kafka_batch_records(spark, shard.config, messages, topic=topic, envelope=envelope, refused=refused)
            counted = []
            rows_in, rejected, run = _write_run(batch, shard, binding.ts, run_dir, timings, unknown=counted)
    timings["spark_job"] = time.monotonic() - job_started - timings["describe"]
    output = _finish(shard, binding, batch, rows_in, rejected, run, timings,
                     run_dir=run_dir, rejects_dir=rejects_dir, on_bad_record=on_bad_record)
    # A refused field's records were rejected, not ignored: the rejects say so.
    counts = [c for c in kafka_field_counts(topic, counted) if c[0] not in refused]
    return _with_unknown_fields(shard, binding, output, counts)


def _finish(
    shard: Shard,
    binding: Binding,
    batch: "BatchRecords",
    rows_in: int,
    rejected: int,
    run: dict[str, Any],
    timings: dict[str, float],
    *,
    run_dir: str,
    rejects_dir: str,
    on_bad_record: str,
) -> StagedOutput:
    """Rejects (fail: raise naming the first; quarantine: write them beside the run) and the
    staged output around the description of the run written."""
    from pyspark.sql import functions as F

    rejects = None
    if rejected:
        bad = batch.rejected()
        if on_bad_record == "fail":
            # Never appended, so the outcome is known: these files can go at once.
            shard.blob.delete_tree(run_dir)
            sample = (
                bad.select("_file", "_line", "_reason")
                .orderBy("_partition", "_offset", "_line")
                .limit(MAX_REPORTED)
                .collect()
            )
            listed = [_reject_entry(r["_file"], r["_line"], r["_reason"]) for r in sample]
            raise BadInputError(
                f"{rejected} bad record(s) in batch {binding.ts}; first: {_where(listed[0])}: "
                f"{listed[0]['reason']} (nothing was committed; fix the data or run with "
                "--on-bad-record quarantine)",
                records=listed,
                count=rejected,
                ts=binding.ts,
            )
        quarantined = bad.select(
            F.regexp_replace("_file", "^file:(//)?", "").alias("file"),
            F.col("_line").alias("line"),
            F.col("_reason").alias("reason"),
            F.col("_raw").alias("record"),
        ).coalesce(1)
        if run_io.executor_io(shard.blob.root):
            # Spark's JSON writer cannot reach object storage on a stock PySpark: the executor
            # writes the JSON Lines file straight to its final name and reports it, as runs are.
            shard.blob.make_dirs(rejects_dir)
            written = run_io.write_json_lines_files(quarantined, shard.blob, rejects_dir)
            rejects = {"path": written["path"], "rows": rejected, "files": written["files"]}
        else:
            quarantined.write.mode("error").json(rejects_dir)  # "errorifexists": Spark Connect knows only this name
            sync_data_files(shard.blob, rejects_dir)
            rejects = {"path": _relative(shard, rejects_dir), "rows": rejected}
    return StagedOutput(run, rejects, rows_in, run["rows"], rejected, timings)


def _reject_entry(file: str, line: int, reason: str) -> dict[str, Any]:
    """A rejected record as an error lists it: a Kafka message by topic, partition and
    offset; a line of a segment file by path and line."""
    message = message_position(file)
    if message is not None:
        topic, partition, offset = message
        return {"topic": topic, "partition": partition, "offset": offset, "reason": reason}
    return {"file": local_path(file), "line": line, "reason": reason}


def _where(entry: dict[str, Any]) -> str:
    if "topic" in entry:
        return f"kafka topic {entry['topic']!r} partition {entry['partition']} offset {entry['offset']}"
    return f"{entry['file']} line {entry['line']}"


def _write_run(
    batch: "BatchRecords", shard: Shard, ts: int, run_dir: str, timings: dict[str, float],
    *, unknown: list[dict[str, Any]] | None = None,
) -> tuple[int, int, dict[str, Any]]:
    """Reduce the batch's records to the latest per key and write them as the run of batch
    ``ts``; return (records read, records rejected, the run's description). ``timings``
    gets "describe": the seconds the driver spent describing the written files; ``unknown``
    (a Kafka batch's) the ``_unknown`` entries of its records, observed by the same job.

    One Spark job: the records are validated, reduced and written in a single pass, and the
    totals are observed on the way instead of counted by a pre-pass.
    """
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    config = shard.config
    records = batch.records
    totals = Observation(f"batch-{ts}-{uuid.uuid4().hex[:8]}")
    measures = [F.count(F.lit(1)).alias("rows_in"), F.count("_reason").alias("rejected")]
    if unknown is not None:
        # One entry list per slice batch that holds such a field (null elsewhere): a few rows.
        measures.append(F.collect_list("_unknown").alias("unknown"))
    observed = records.observe(totals, *measures)
    buckets = shard.bucket_count()
    latest = _latest_per_key(observed.where(F.col("_reason").isNull()), config, ts,
                             change_events=batch.change_events, buckets=buckets)
    run = write_bucketed(latest, config, shard.blob, run_dir, partitioned=True, timings=timings, buckets=buckets)
    try:
        metrics = totals.get
        if "rows_in" not in metrics:
            raise LookupError("no observed metrics")  # what Spark Connect answers instead
    except Exception:
        # When every record is rejected, adaptive execution replaces the empty write by an
        # empty relation and the observation with it (Observation.get then fails an
        # assertion, or through Spark Connect returns no metrics): count the records
        # instead, a second pass over a batch with no data.
        # The hash reads every column: Spark's JSON reader parses only the columns a query
        # uses, and a mistyped value in an unread column would not mark its record.
        metrics = records.agg(
            *measures,
            F.max(F.xxhash64(*[F.col(f"`{c}`") for c in config.column_names()])).alias("_all_columns"),
        ).first()
    if unknown is not None:
        unknown.extend(entry.asDict() if hasattr(entry, "asDict") else dict(entry)
                       for entries in metrics["unknown"] or () for entry in entries)
    return int(metrics["rows_in"]), int(metrics["rejected"]), run


def _latest_per_key(
    good: "DataFrame", config: ShardConfig, ts: int, *, change_events: bool, buckets: int | None = None
) -> "DataFrame":
    """Within a key the latest record wins by (order column, partition, offset, line):
    the same total order on every writer (invariant 5). A record whose order column is null
    is older than one that has a value. ``change_events``: the records carry ``_delete`` and
    ``_srcpos`` (:class:`BatchRecords`)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    keys = list(config.keys)
    columns = table_columns(config)
    values = [c for c in columns if c not in keys]
    deleted = (
        F.coalesce(F.col(f"`{config.delete_marker}`"), F.lit(False)) if config.delete_marker else F.lit(False)
    )
    rank = [F.col("_partition"), F.col("_offset"), F.col("_line")]
    if change_events:
        # A Kafka tombstone or a Debezium delete: a delete whatever the marker column says.
        deleted = deleted | F.col("_delete")
        # Debezium's source position (LSN, or binlog file and position) orders a key's changes
        # before the Kafka offset does.
        rank.insert(0, F.col("_srcpos"))
    if config.order_by:
        rank.insert(0, F.col(f"`{config.order_by}`"))
    # Shuffle once, by bucket: a hash partitioning on _bucket already clusters every key, so
    # the per-key window and the one-file-per-bucket write need no further exchange (and the
    # write's sort by key is the window's). No partition count: adaptive execution merges
    # the small partitions of a small batch into fewer tasks (each bucket stays whole in
    # one), as many as the cluster's parallelism asks for.
    # A window over rows sorted by rank, not max_by on a struct, which has no hash aggregate
    # and sorted the batch twice: 17% less for a warm batch (docs/performance.md).
    by_bucket = good.withColumn("_bucket", bucket_column(config, buckets)).repartition("_bucket")
    newest_first = Window.partitionBy("_bucket", *keys).orderBy(*[c.desc_nulls_last() for c in rank])
    latest = by_bucket.withColumn("_newest", F.row_number().over(newest_first)).where(F.col("_newest") == 1)
    return latest.select(
        *keys,
        *[F.col(f"`{v}`") for v in values],
        deleted.alias("_deleted"),
        batch_ts_column(ts).alias("_ts"),
        "_bucket",
    )


def batch_ts_column(ts: int) -> "Column":
    """The batch's ``ts`` on every row, handed to Spark's generated code by reference rather
    than written into it.

    Code generation writes a long literal into the Java source it compiles, so a new ts made
    every batch compile the classes of its last stage again (two, about 0.1 s of a warm batch:
    docs/performance.md). A decimal literal is passed by reference: the same source every
    batch, compiled once per session. Any expression of literals alone would be folded back
    into a long literal: adding ``spark_partition_id() * 0`` (zero on every row, and never
    folded, being nondeterministic) keeps it an expression of a column. The fixed precision
    keeps the source the same when ts gains a digit."""
    from decimal import Decimal

    from pyspark.sql import functions as F

    return (F.lit(Decimal(int(ts))).cast("decimal(20,0)") + F.spark_partition_id() * 0).cast("long")


def _relative(shard: Shard, path: str) -> str:
    return shard.blob.relative(path)


def parse_schema(ddl: str, spark_factory: Callable[[], "SparkSession"]) -> str:
    """A DDL string (``id BIGINT, name STRING``) as the schema JSON a shard stores. Spark is
    started (``spark_factory``) only for DDL outside what :mod:`..spark.ddl` parses alone."""
    from pyspark.sql.types import DataType, StructType

    from airflow_upsert_provider.engine.spark.ddl import parse_column_list

    parsed = parse_column_list(ddl)
    if parsed is None:
        spark_factory()  # Spark's parser needs an active session
        try:
            parsed = DataType.fromDDL(ddl)
        except Exception as exc:
            # Spark's parse errors start with an empty line: the reason is the first line with text.
            reason = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
            raise ConfigurationError(f"invalid --schema {ddl!r}: {reason}", field="schema") from None
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
