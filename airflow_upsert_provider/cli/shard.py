"""Commands on a shard's table: init, status, run-batch and read."""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import os
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any, BinaryIO

from airflow_upsert_provider.cli.context import Context
from airflow_upsert_provider.cli.options import actor_of, duration_option, integer_option
from airflow_upsert_provider.cli.output import printable
from airflow_upsert_provider.engine.common.metrics import batch_metrics, outcome_unknown_metrics, send_quietly
from airflow_upsert_provider.engine.errors import ConfigurationError, OutcomeUnknown
from airflow_upsert_provider.engine.table.schema_evolution import POLICIES as SCHEMA_POLICIES

# Formats `read` writes without Spark, through the Arrow reader.
ARROW_FORMATS = ("parquet", "arrow")


def add_shard_commands(commands, common: argparse.ArgumentParser, spark_conf: argparse.ArgumentParser) -> None:
    init = commands.add_parser("init", parents=[common, spark_conf], help="create a shard")
    init.add_argument("shard")
    init.add_argument("--source", required=True, help="dir:/path/to/landing or kafka:TOPIC (with --kafka-config)")
    init.add_argument("--key", action="append", required=True, help="key column (repeat for a compound key)")
    init.add_argument("--order-by", help="order column: within a key the highest wins")
    init.add_argument("--delete-marker", help="boolean column: true deletes the key")
    init.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl", dest="source_format")
    init.add_argument("--buckets", type=integer_option("--buckets", 1, 4096), default=None)
    init.add_argument("--target-bucket-bytes", type=integer_option("--target-bucket-bytes", 1), default=None,
                      metavar="BYTES", help="a compaction doubles the bucket count when the runs below its since "
                                            "hold more than this per bucket on average (default: never by size)")
    init.add_argument("--max-files-per-batch", type=integer_option("--max-files-per-batch", 1), default=None)
    init.add_argument("--schema", help="column types as DDL ('id BIGINT, name STRING'); inferred from the source if omitted")
    init.add_argument("--envelope", choices=("json", "debezium"), default=None,
                      help="kafka: each message value is the record (json, default) or a Debezium change event")
    init.add_argument("--max-records-per-batch", type=integer_option("--max-records-per-batch", 1), default=None,
                      help="kafka: offsets one batch reads at most over all partitions (default 100000)")
    init.add_argument("--group-id", default=None,
                      help="kafka: consumer group whose offsets follow the shard (default: the config's group.id, "
                           "else upsert-SHARD)")
    init.add_argument("--change-retention", metavar="PERIOD", default=None,
                      help="keep the batches of this period (e.g. 7d) for the change feed (docs/changes.md)")
    init.add_argument("--schema-evolution", choices=SCHEMA_POLICIES, default=None, metavar="POLICY",
                      help="which schema changes batches make: none, add_columns (default) or add_and_widen "
                           "(docs/schema.md)")
    init.add_argument("--json", action="store_true")

    status = commands.add_parser("status", parents=[common, spark_conf], help="frontier, source lag and row count")
    status.add_argument("shard")
    status.add_argument("--json", action="store_true")
    status.add_argument("--no-rows", action="store_true", help="skip the row count (no Spark job)")

    run = commands.add_parser("run-batch", parents=[common, spark_conf], help="run micro-batches")
    run.add_argument("shard")
    amount = run.add_mutually_exclusive_group()
    amount.add_argument("--max-batches", type=integer_option("--max-batches", 1), default=1)
    amount.add_argument("--until-caught-up", action="store_true")
    amount.add_argument("--continuous", action="store_true",
                        help="one Spark session, batches back to back (the next slice fetched while one commits) "
                             "until --for ends or a stop or recovery is requested")
    run.add_argument("--for", dest="run_for", metavar="DURATION", default=None, type=duration_option("--for"),
                     help="how long --continuous runs: seconds, or e.g. 90s, 10m, 1h")
    run.add_argument("--writer-id", help="identity recorded with each commit (default: host, pid and a random part)")
    run.add_argument("--on-bad-record", choices=("fail", "quarantine"), default="fail")
    run.add_argument("--json", action="store_true")

    read = commands.add_parser("read", parents=[common, spark_conf], help="print the table, sorted by key")
    read.add_argument("shard")
    read.add_argument("--as-of", type=integer_option("--as-of", 0), default=None)
    read.add_argument("--format", choices=("jsonl", "csv", *ARROW_FORMATS), default="jsonl", dest="output_format",
                      help="jsonl, csv (on Spark, sorted by key), or parquet, arrow (an Arrow IPC file; read "
                           "without Spark, bucket by bucket: docs/readers.md; --out required)")
    read.add_argument("--out", help="write to this file instead of stdout")


def cmd_init(ctx: Context, args: argparse.Namespace) -> dict[str, Any]:
    from airflow_upsert_provider.engine.config import (
        DEFAULT_BUCKETS,
        DEFAULT_MAX_FILES_PER_BATCH,
        ShardConfig,
        validate_shard_id,
    )
    from airflow_upsert_provider.engine.table.shard import Shard
    from airflow_upsert_provider.engine.sources import is_kafka_uri, open_source
    from airflow_upsert_provider.engine.store.change_feed import set_change_retention
    from airflow_upsert_provider.engine.table.change_rules import parse_keep
    from airflow_upsert_provider.engine.table.schema_apply import DEFAULT_POLICY, set_schema_policy
    from airflow_upsert_provider.engine.write.upsert import infer_schema, parse_schema

    validate_shard_id(args.shard)
    keep = None if args.change_retention is None else parse_keep(args.change_retention, field="--change-retention")
    source = open_source(args.source, args.source_format,
                         kafka_config=ctx.kafka_config() if is_kafka_uri(args.source) else None)
    extra = _kafka_init_options(args, is_kafka_uri(source.uri))
    source.check()
    if args.schema:
        schema = parse_schema(args.schema, ctx.spark)
    elif extra:
        from airflow_upsert_provider.engine.write.kafka_records import infer_kafka_schema

        schema = infer_kafka_schema(ctx.spark(), source, envelope=extra["kafka"]["envelope"], keys=tuple(args.key))
    else:
        schema = infer_schema(ctx.spark(), source)
    config = ShardConfig(
        source=source.uri,
        keys=tuple(args.key),
        schema=schema,
        order_by=args.order_by,
        delete_marker=args.delete_marker,
        source_format=args.source_format,
        # `is None`, not `or`: an explicit 0 is refused by ShardConfig, never replaced.
        buckets=DEFAULT_BUCKETS if args.buckets is None else args.buckets,
        max_files_per_batch=(
            DEFAULT_MAX_FILES_PER_BATCH if args.max_files_per_batch is None else args.max_files_per_batch
        ),
        extra=extra,
        target_bucket_bytes=args.target_bucket_bytes,
    )
    shard = Shard.create(ctx.consensus, ctx.blob, args.shard, config,
                         kafka_config=ctx.kafka_config() if is_kafka_uri(source.uri) else None)
    if keep is not None:
        set_change_retention(ctx.consensus, shard.shard_id, keep)
    policy = set_schema_policy(shard, args.schema_evolution or DEFAULT_POLICY, actor_of(args))
    return {"shard": shard.shard_id, "config": json.loads(config.to_json()), "upper": 0, "schema_evolution": policy,
            **({"change_retention_seconds": keep} if keep is not None else {})}


def _kafka_init_options(args: argparse.Namespace, is_kafka: bool) -> dict[str, Any]:
    """``extra`` of a new shard: the Kafka options for a kafka:TOPIC source; refused for a
    directory source, where they would mean nothing."""
    from airflow_upsert_provider.engine.sources.kafka_options import DEFAULT_MAX_RECORDS_PER_BATCH, KafkaShardOptions

    given = {"--envelope": args.envelope, "--max-records-per-batch": args.max_records_per_batch, "--group-id": args.group_id}
    if not is_kafka:
        named = [flag for flag, value in given.items() if value is not None]
        if named:
            raise ConfigurationError(f"{', '.join(named)} apply to kafka:TOPIC sources only", field="source")
        return {}
    return KafkaShardOptions(
        envelope=args.envelope or "json",
        max_records_per_batch=(DEFAULT_MAX_RECORDS_PER_BATCH if args.max_records_per_batch is None
                               else args.max_records_per_batch),
        group_id=args.group_id,
    ).to_extra()


def cmd_status(ctx: Context, args: argparse.Namespace) -> dict[str, Any]:
    shard = ctx.shard(args.shard)
    if not args.no_rows:
        # Before Spark starts (seconds): a missing run file, from one listing of the runs.
        shard.check_run_files_listed(shard.live_runs())
    out = shard.status(None if args.no_rows else ctx.spark()).to_dict()
    if shard.is_kafka:
        from airflow_upsert_provider.engine.lifecycle.group_offsets import group_status

        # What lag tools see: the consumer group against the shard's frontier.
        out["group"] = group_status(shard)
    from airflow_upsert_provider.engine.maintenance.change_retention import retention_cost

    # What the change retention holds above since (docs/changes.md); absent without one.
    cost = retention_cost(shard.consensus, shard.shard_id)
    if cost.keep_seconds is not None:
        out["change_retention"] = cost.to_dict()
    from airflow_upsert_provider.engine.table.schema_apply import schema_policy

    out["schema_evolution"] = schema_policy(shard)
    return out


def cmd_run_batch(ctx: Context, args: argparse.Namespace) -> dict[str, Any]:
    from airflow_upsert_provider.engine.write.writer import Writer

    if args.continuous != (args.run_for is not None):
        raise ConfigurationError("--continuous and --for DURATION go together", field="--for")
    run_for = args.run_for if args.continuous else None
    shard = ctx.shard(args.shard)
    writer_id = args.writer_id or f"{actor_of(args)}:{uuid.uuid4().hex[:8]}"
    writer = Writer(shard, writer_id, spark_factory=ctx.spark, on_bad_record=args.on_bad_record)
    tty = sys.stderr.isatty()
    done = 0

    def on_result(result) -> None:
        nonlocal done
        send_quietly(ctx.metrics, batch_metrics(shard.shard_id, result.to_dict()) if ctx.metrics else ())
        if not result.progressed:
            return
        done += 1
        from airflow_upsert_provider.engine.sources.lag import format_lag

        line = (
            f"batch ts={result.ts} {result.outcome}: rows in {result.rows_in}, out {result.rows_out}, "
            f"rejected {result.rejected}, {result.seconds:.2f}s; {done} done, "
            f"lag {format_lag(result.lag, result.lag_unit or '')}"
        )
        if tty:
            print("\r\033[K" + line, end="", file=sys.stderr, flush=True)
        elif not args.json:
            print(line, flush=True)

    started = time.monotonic()
    try:
        if args.continuous:
            from airflow_upsert_provider.engine.write.continuous import run_continuous

            report = run_continuous(writer, duration_seconds=run_for, on_result=on_result)
        else:
            report = writer.run(
                max_batches=None if args.until_caught_up else args.max_batches,
                until_caught_up=args.until_caught_up,
                on_result=on_result,
            )
    except OutcomeUnknown:
        send_quietly(ctx.metrics, outcome_unknown_metrics(shard.shard_id, time.monotonic() - started))
        raise
    if tty and done:
        print(file=sys.stderr)
    out = {"shard": shard.shard_id, "writer_id": writer_id, **report.to_dict()}
    if not args.json:
        print(f"upper: {report.upper} ({out['committed']} committed, {len(report.results)} step(s))")
        if report.stopped_because:
            print(printable(f"stopped early: {report.stopped_because}; no further batch started"))
        return {}
    return out


def cmd_read(ctx: Context, args: argparse.Namespace) -> dict[str, Any]:
    from airflow_upsert_provider.engine.table.runs import read_runs, table_columns

    if args.output_format in ARROW_FORMATS:
        return _read_arrow(ctx, args)
    # `--out -` is stdout, as for other Unix tools: jsonl and csv are text.
    out = None if args.out in (None, STDOUT) else args.out
    _check_out_path(out)
    shard = ctx.shard(args.shard)
    runs = shard.live_runs(args.as_of)
    config = shard.config_for_runs(runs)
    columns = table_columns(config)
    with _writes_to(out), contextlib.ExitStack() as stack:
        # The file is begun before Spark starts, so that a bad path fails at once and clearly.
        handle = sys.stdout if out is None else _text(stack, _replacing_out(stack, out))
        # A run file damaged in place fails inside Spark: exit 4 naming it, as a missing one;
        # one lost to compaction and GC since the runs were chosen: exit 2, read again.
        with shard.reading(runs):
            frame = read_runs(ctx.spark(), config, shard.blob, runs).orderBy(*config.keys)
            if args.output_format == "csv":
                writer = csv.writer(handle)
                writer.writerow(columns)
                for row in frame.toLocalIterator():
                    writer.writerow(["" if row[c] is None else row[c] for c in columns])
            else:
                for row in frame.toLocalIterator():
                    handle.write(json.dumps(row.asDict(), default=str, sort_keys=False) + "\n")
    return {}


def _read_arrow(ctx: Context, args: argparse.Namespace) -> dict[str, Any]:
    """``read --format parquet|arrow``: the table read without Spark (engine/table/arrow_reader.py),
    written to a temporary file beside ``--out`` and renamed into place once complete, as every
    ``read --out`` is."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_upsert_provider.engine.table.arrow_reader import read_table

    if not args.out:
        raise ConfigurationError(f"read --format {args.output_format} writes a file: give --out PATH", field="out")
    if args.out == STDOUT:
        # A binary file is built to be renamed into place complete, never streamed half-made.
        raise ConfigurationError(f"read --format {args.output_format} writes a file, not stdout: --out - is "
                                 "refused; give a file's path (./- for a file named -)", field="out")
    _check_out_path(args.out)
    shard = ctx.shard(args.shard)
    reader = read_table(shard, args.as_of)  # what to read is decided, and checked, before --out is touched
    with _writes_to(args.out), contextlib.ExitStack() as stack:
        handle = _replacing_out(stack, args.out)
        if args.output_format == "parquet":
            with pq.ParquetWriter(handle, reader.schema) as writer:
                for batch in reader:
                    writer.write_batch(batch)
        else:
            with pa.ipc.new_file(handle, reader.schema) as writer:
                for batch in reader:
                    writer.write_batch(batch)
    return {}


# What `read --out` takes for stdout.
STDOUT = "-"


def _check_out_path(path: str | None) -> None:
    if path is not None and os.path.isdir(path):
        # The rename into place would fail only once the whole table was read.
        raise _out_is_a_directory(path)


def _replacing_out(stack: contextlib.ExitStack, path: str) -> BinaryIO:
    """A handle on a temporary file beside ``--out`` (``path``), renamed into place when
    ``stack`` closes without an error and removed otherwise: a failed read leaves no partial
    file another program would take for the table, and an earlier file stays whole."""
    from airflow_upsert_provider.engine.common.atomic_file import replacing

    try:
        # Not fsynced: a file handed to another program at once, not state the project trusts later.
        return stack.enter_context(replacing(path, durable=False, hidden=True))
    except OSError as exc:
        raise ConfigurationError(f"cannot write --out {path}: {exc.strerror}", field="out") from None


def _text(stack: contextlib.ExitStack, handle: BinaryIO) -> io.TextIOWrapper:
    """A UTF-8 text handle over ``handle``, flushed into it (and detached, leaving it open for
    its own close) before ``stack`` closes it."""
    text = io.TextIOWrapper(handle, encoding="utf-8", newline="")
    stack.callback(text.detach)
    return text


def _out_is_a_directory(path: str) -> ConfigurationError:
    return ConfigurationError(f"cannot write --out {path}: it is a directory; give a file's path", field="out")


@contextlib.contextmanager
def _writes_to(path: str | None) -> Iterator[None]:
    """Failures of writing ``--out`` (``path``; None: stdout) reported naming it: a directory
    (a ConfigurationError), a full or read-only filesystem (an error with the path, which the
    one mapping, cli/errors.py, reports as such: the OS names no file for a write on an open
    handle). Any other failure unchanged."""
    from airflow_upsert_provider.engine.write.writer import BLOB_WRITE_FAILURES

    try:
        yield
    except IsADirectoryError:
        if path is None:
            raise
        raise _out_is_a_directory(path) from None  # it became one while the table was read
    except OSError as exc:
        if path is None or exc.errno not in BLOB_WRITE_FAILURES:
            raise
        raise OSError(exc.errno, exc.strerror, path) from None
