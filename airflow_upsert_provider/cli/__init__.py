"""`upsertctl`: the engine for humans and scripts.

Exit codes (docs/errors.md): 0 ok; 2 nothing was changed (usage, configuration, an
unreachable store, a full or read-only blob root); 3 bad input data (nothing committed);
4 integrity violation; 5 outcome unknown (safe to retry); 6 the stream is not writable (not
READY, or a commit was fenced); 7 a stream transition was refused; 1 anything unexpected;
141 the reader of stdout went away.
"""

from __future__ import annotations

import argparse
import atexit
import csv
import json
import math
import os
import re
import socket
import sys
import threading
import time
import uuid
from typing import Any, Callable, NoReturn, Sequence

from airflow_upsert_provider.engine.errors import BlobWriteFailed, ConfigurationError, SparkUnavailable, UpsertError

DEFAULT_CONSENSUS_URL = "sqlite:///./.upsert/consensus.db"
DEFAULT_BLOB_ROOT = "./.upsert/blob"

EPILOG = """exit codes: 0 ok; 2 nothing was changed (usage, configuration, unreachable store,
full or read-only blob root); 3 bad input data (nothing committed); 4 integrity violation;
5 outcome unknown (safe to retry); 6 stream not writable (not READY: stopped or recovering;
or the commit was fenced); 7 stream transition refused (e.g. recover resume before seek);
1 unexpected (UPSERT_DEBUG=1 shows the traceback)
docs: errors.md, recovery.md (stop, resume, recovery), frontier.md (stall paging),
      maintenance.md; also served by the Airflow api-server at /upsert-provider/docs/

defaults: --consensus from UPSERT_CONSENSUS_URL, else sqlite:///./.upsert/consensus.db;
          --blob-root from UPSERT_BLOB_ROOT, else ./.upsert/blob;
          --master from UPSERT_SPARK_MASTER, else local[*];
          --remote from UPSERT_SPARK_REMOTE, else none (Spark runs in this process)"""


def _common_options() -> argparse.ArgumentParser:
    # Accepted before or after the command: `upsertctl --consensus X status s` and
    # `upsertctl status s --consensus X` mean the same.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--consensus", default=argparse.SUPPRESS, metavar="URL", help="consensus store URL")
    common.add_argument("--blob-root", default=argparse.SUPPRESS, metavar="PATH", help="root of runs and checkpoints")
    common.add_argument("--master", default=argparse.SUPPRESS, help="Spark master (default local[*])")
    common.add_argument("--remote", default=argparse.SUPPRESS, metavar="sc://HOST:PORT",
                        help="run Spark through this Spark Connect server instead of in this process "
                             "(default from UPSERT_SPARK_REMOTE; see upsertctl spark-server)")
    common.add_argument("--kafka-config", default=argparse.SUPPRESS, metavar="FILE",
                        help="Kafka client config of a kafka:TOPIC shard: a JSON object of librdkafka properties "
                             "(bootstrap.servers required); default from UPSERT_KAFKA_CONFIG")
    return common


def _spark_conf_option() -> argparse.ArgumentParser:
    # On the commands that run Spark only, after the command: a setting given to a command
    # that starts no session would be ignored without a word.
    option = argparse.ArgumentParser(add_help=False)
    option.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", dest="spark_conf",
                        help="a Spark setting for this command's session, e.g. spark.sql.shuffle.partitions=4 "
                             "(repeatable); with --remote the command gets a server session of its own")
    return option


def parse_key_values(items: Sequence[str], option: str) -> dict[str, str]:
    """``KEY=VALUE`` items of a repeatable option as a dict (the value may hold '=')."""
    settings = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigurationError(f"{option} takes KEY=VALUE, not {item!r}", field=option.lstrip("-"))
        settings[key.strip()] = value
    return settings


# Integers go to SQLite / PostgreSQL BIGINT columns and Spark longs: 64 bits, signed.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

# The argparse ``type=`` functions below raise ConfigurationError, which argparse lets through
# (it turns only ValueError and TypeError into a usage line): a bad value is then reported as
# every bad value is (exit 2, the option named, an error object with --json), before any store,
# blob root or Spark session is opened.


def _shown(text: str) -> str:
    """A value as an error message quotes it: repr (control characters escaped), cut short."""
    return repr(text) if len(text) <= 40 else f"{text[:20]!r}... ({len(text)} characters)"


def _field(option: str) -> str:
    return option.lstrip("-").replace("-", "_")


def integer_option(option: str, minimum: int = INT64_MIN, maximum: int = INT64_MAX) -> Callable[[str], int]:
    """The ``type=`` of every integer option: an integer from ``minimum`` to ``maximum``,
    never beyond 64 bits (what the store and Spark hold)."""
    low = "-2**63" if minimum == INT64_MIN else str(minimum)
    high = "2**63-1" if maximum == INT64_MAX else str(maximum)

    def integer(text: str) -> int:
        try:
            value: int | None = int(text)
        except ValueError:
            value = None  # not an integer, or more digits than int() converts (far beyond 64 bits)
        if value is None or not minimum <= value <= maximum:
            raise ConfigurationError(f"{option} takes an integer from {low} to {high}, not {_shown(text)}",
                                     field=_field(option))
        return value

    return integer


def finite_number(option: str, *, above_zero: bool) -> Callable[[str], float]:
    """The ``type=`` of every option of seconds: a finite number, above zero or zero or more.
    ``nan`` compares false with every bound, and ``inf`` (also what float() makes of a number
    with too many digits) never ends a wait."""
    wanted = f"a finite number of seconds {'above zero' if above_zero else '>= 0'}"

    def number(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0 or (above_zero and value == 0):
            raise ConfigurationError(f"{option} takes {wanted}, not {_shown(text)}", field=_field(option))
        return value

    return number


def duration_option(option: str) -> Callable[[str], float]:
    """The ``type=`` of an option of a duration (``90``, ``90s``, ``10m``, ``1h30m``):
    :func:`~airflow_upsert_provider.engine.config.parse_duration`, positive and finite."""

    def duration(text: str) -> float:
        from airflow_upsert_provider.engine.config import parse_duration

        return parse_duration(text, field=option)

    return duration


def build_parser() -> argparse.ArgumentParser:
    common = _common_options()
    spark_conf = _spark_conf_option()
    parser = argparse.ArgumentParser(
        prog="upsertctl",
        description="Micro-batch upserts on Spark into a keyed table with a durable frontier.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[common],
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    init = commands.add_parser("init", parents=[common, spark_conf], help="create a shard")
    init.add_argument("shard")
    init.add_argument("--source", required=True, help="dir:/path/to/landing or kafka:TOPIC (with --kafka-config)")
    init.add_argument("--key", action="append", required=True, help="key column (repeat for a compound key)")
    init.add_argument("--order-by", help="order column: within a key the highest wins")
    init.add_argument("--delete-marker", help="boolean column: true deletes the key")
    init.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl", dest="source_format")
    init.add_argument("--buckets", type=integer_option("--buckets", 1, 4096), default=None)
    init.add_argument("--max-files-per-batch", type=integer_option("--max-files-per-batch", 1), default=None)
    init.add_argument("--schema", help="column types as DDL ('id BIGINT, name STRING'); inferred from the source if omitted")
    init.add_argument("--envelope", choices=("json", "debezium"), default=None,
                      help="kafka: each message value is the record (json, default) or a Debezium change event")
    init.add_argument("--max-records-per-batch", type=integer_option("--max-records-per-batch", 1), default=None,
                      help="kafka: offsets one batch reads at most over all partitions (default 100000)")
    init.add_argument("--group-id", default=None,
                      help="kafka: consumer group whose offsets follow the shard (default: the config's group.id, "
                           "else upsert-SHARD)")
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
    read.add_argument("--format", choices=("jsonl", "csv"), default="jsonl", dest="output_format")
    read.add_argument("--out", help="write to this file instead of stdout")
    _add_maintenance_commands(commands, common, spark_conf)
    _add_frontier_commands(commands, common)
    _add_spark_server_commands(commands, common)
    _add_spark_archive_commands(commands, common)
    return parser


def _add_maintenance_commands(commands, common: argparse.ArgumentParser, spark_conf: argparse.ArgumentParser) -> None:
    compact = commands.add_parser("compact", parents=[common, spark_conf], help="merge runs below a new since into one run per bucket")
    compact.add_argument("shard")
    compact.add_argument("--since", type=integer_option("--since", 0), default=None, help="the new since (default: the upper)")
    compact.add_argument("--json", action="store_true")

    checkpoint = commands.add_parser("checkpoint", parents=[common], help="create, list, verify or restore checkpoints")
    actions = checkpoint.add_subparsers(dest="checkpoint_command", required=True, metavar="ACTION")
    create = actions.add_parser("create", parents=[common], help="checkpoint the shard at its upper (metadata only)")
    create.add_argument("shard")
    create.add_argument("--keep-last", type=integer_option("--keep-last", 1), default=None, metavar="N", help="then keep only the last N checkpoints")
    create.add_argument("--keep-within", type=finite_number("--keep-within", above_zero=True), default=None, metavar="SECONDS",
                        help="then keep only checkpoints newer than this (with --keep-last: either keeps)")
    create.add_argument("--json", action="store_true")
    listing = actions.add_parser("list", parents=[common], help="the checkpoints in the shard's catalog")
    listing.add_argument("shard")
    listing.add_argument("--json", action="store_true")
    verify = actions.add_parser("verify", parents=[common], help="check every file a checkpoint lists")
    verify.add_argument("shard")
    verify.add_argument("checkpoint", nargs="?", help="checkpoint id (default: every checkpoint in the catalog)")
    verify.add_argument("--json", action="store_true")
    restore = actions.add_parser("restore", parents=[common], help="rebuild a shard's consensus state from a checkpoint")
    restore.add_argument("shard", help="the shard whose catalog holds the checkpoint")
    restore.add_argument("checkpoint", nargs="?", help="checkpoint id (default: the latest)")
    restore.add_argument("--as", dest="target", metavar="SHARD", help="restore under this new shard id (default: the same id, into an empty consensus)")
    restore.add_argument("--actor", help="who is recorded in the stream's history (default upsertctl:<host>:<pid>)")
    restore.add_argument("--json", action="store_true")

    gc = commands.add_parser("gc", parents=[common], help="delete files nothing references")
    gc.add_argument("shard")
    gc.add_argument("--dry-run", action="store_true", help="list what would go and its bytes; delete nothing")
    gc.add_argument("--grace", type=finite_number("--grace", above_zero=False), default=None, metavar="SECONDS",
                    help="keep files younger than this whatever references them (default 6 hours)")
    gc.add_argument("--json", action="store_true")
    _add_lifecycle_commands(commands, common)


def _add_lifecycle_commands(commands, common: argparse.ArgumentParser) -> None:
    from airflow_upsert_provider.engine.store.stream_rules import DEFAULT_DRAIN_SECONDS

    shared = argparse.ArgumentParser(add_help=False)
    shared.add_argument("shard")
    shared.add_argument("--json", action="store_true")
    acting = argparse.ArgumentParser(add_help=False)
    acting.add_argument("--actor", help="who is recorded in the stream's history (default upsertctl:<host>:<pid>)")
    reason = argparse.ArgumentParser(add_help=False)
    reason.add_argument("--reason", default="", help="why, recorded in the stream's history")
    epoch = argparse.ArgumentParser(add_help=False)
    epoch.add_argument("--epoch", type=integer_option("--epoch", 0), default=None,
                       help="the recovery epoch you began (default: the open one); another epoch is refused")

    stream = commands.add_parser("stream", parents=[common], help="stop, resume or inspect a shard's stream")
    actions = stream.add_subparsers(dest="stream_command", required=True, metavar="ACTION")
    stop = actions.add_parser("stop", parents=[common, shared, acting, reason],
                              help="let the batch in hand commit, start no other, then STOPPED")
    stop.add_argument("--drain", type=finite_number("--drain", above_zero=False), default=DEFAULT_DRAIN_SECONDS, metavar="SECONDS",
                      help=f"wait at most this long for the batch in hand (default {DEFAULT_DRAIN_SECONDS:g})")
    stop.add_argument("--no-wait", action="store_true", help="leave the stream STOPPING; do not finalize")
    actions.add_parser("resume", parents=[common, shared, acting, reason], help="STOPPED -> READY")
    actions.add_parser("status", parents=[common, shared], help="the stream's status, epoch, who set it, when, why")
    history = actions.add_parser("history", parents=[common, shared], help="every change of the stream, oldest first")
    history.add_argument("--limit", type=integer_option("--limit", 1), default=None, metavar="N", help="only the last N changes")

    recover = commands.add_parser("recover", parents=[common], help="recovery in order: begin, seek, resume")
    steps = recover.add_subparsers(dest="recover_command", required=True, metavar="ACTION")
    steps.add_parser("begin", parents=[common, shared, acting, reason],
                     help="READY|STOPPED -> RECOVERING in a new epoch (fences every running writer)")
    steps.add_parser("seek", parents=[common, shared, acting, epoch],
                     help="position the source at the upper and check every segment still needed is there")
    steps.add_parser("resume", parents=[common, shared, acting, epoch],
                     help="RECOVERING -> READY, once the seek of the same epoch completed")
    steps.add_parser("status", parents=[common, shared], help="the stream, the upper and the next recovery step")

    source = commands.add_parser("source", parents=[common], help="the shard's landing directory")
    source_actions = source.add_subparsers(dest="source_command", required=True, metavar="ACTION")
    prune = source_actions.add_parser("prune", parents=[common, shared],
                                      help="delete the source segments the shard no longer needs (logged first)")
    prune.add_argument("--below", choices=("checkpoint", "committed"), default="checkpoint",
                       help="checkpoint (default): keep what the oldest checkpoint needs; committed: keep "
                            "only what the shard has not committed (a shard that will never be restored)")
    prune.add_argument("--dry-run", action="store_true", help="report what would go; delete nothing")


def _add_frontier_commands(commands, common: argparse.ArgumentParser) -> None:
    frontier = commands.add_parser("frontier", parents=[common],
                                   help="observe shards' frontiers; evaluate the stall rules (docs/frontier.md)")
    actions = frontier.add_subparsers(dest="frontier_command", required=True, metavar="ACTION")
    observe = actions.add_parser("observe", parents=[common],
                                 help="record one observation of each shard (every shard without arguments)")
    observe.add_argument("shards", nargs="*", metavar="SHARD")
    observe.add_argument("--json", action="store_true")
    status = actions.add_parser("status", parents=[common],
                                help="observe the shard, then print its status, the rule, the reasons and the "
                                     "window; exit 2 if the shard does not exist (status NOT_FOUND)")
    status.add_argument("shard")
    status.add_argument("--json", action="store_true")
    status.add_argument("--no-observe", action="store_true",
                        help="evaluate the recorded observations only; record none")
    settings = status.add_argument_group("stall rules (defaults in docs/frontier.md)")
    for option, field, kind, help_text in FRONTIER_SETTING_OPTIONS:
        if kind is bool:
            settings.add_argument(option, dest=field, action="store_true", default=None, help=help_text)
        else:
            settings.add_argument(option, dest=field, type=kind, default=None, metavar="N", help=help_text)


# (option, StallSettings field, type, help) of `upsertctl frontier status`.
# StallSettings checks each value (finite, in range) and names its field; the integer is
# kept to 64 bits here, as every integer option is.
FRONTIER_SETTING_OPTIONS = (
    ("--window", "window_seconds", float, "seconds of observations looked at"),
    ("--cadence", "cadence_seconds", float, "seconds between the batches the schedule runs"),
    ("--stall-multiplier", "stall_multiplier", float, "stalled after this many cadences without an advance"),
    ("--min-stall", "min_stall_seconds", float, "stalled after at least these seconds"),
    ("--stale-after", "stale_after_seconds", float, "STALE when the newest observation is older"),
    ("--lag-objective", "lag_seconds_objective", float, "LAGGING when lag_seconds is above it"),
    ("--page-on-lagging", "page_on_lagging", bool, "LAGGING breaches (pages) too"),
    ("--max-stopped", "max_stopped_seconds", float, "STOPPED/RECOVERING longer than this breaches"),
    ("--consecutive-breaches", "consecutive_breaches", integer_option("--consecutive-breaches"),
     "breaching evaluations in a row before a page"),
)


def blob_access(args: argparse.Namespace) -> str:
    """How a command uses the blob root: ``create`` it (init), ``write`` below it, or only
    ``read`` (a missing root is then left to the command: an unknown shard says so)."""
    if args.command == "init":
        return "create"
    if args.command in ("run-batch", "compact") or (args.command == "gc" and not args.dry_run):
        return "write"
    if args.command == "checkpoint" and args.checkpoint_command == "create":
        return "write"
    return "read"


def _blob_root(args: argparse.Namespace) -> str:
    return getattr(args, "blob_root", None) or os.environ.get("UPSERT_BLOB_ROOT") or DEFAULT_BLOB_ROOT


class Context:
    """Engine objects built from the global options, Spark only on demand."""

    def __init__(self, args: argparse.Namespace) -> None:
        from airflow_upsert_provider.engine.blob.files import open_blob
        from airflow_upsert_provider.engine.store.registry import open_consensus

        # A malformed setting is a usage error, found before the store or the blob root is touched.
        self.spark_conf = parse_key_values(getattr(args, "spark_conf", []), "--conf")
        url = getattr(args, "consensus", None) or os.environ.get("UPSERT_CONSENSUS_URL") or DEFAULT_CONSENSUS_URL
        self.blob = open_blob(_blob_root(args))
        # Checked up front, with a message naming the root, before any Spark job writes there.
        access = blob_access(args)
        if access == "create":
            self.blob.ensure_root()
        if access in ("create", "write"):
            self.blob.check_root()
        elif os.path.exists(self.blob.root):
            self.blob.check_root(writable=False)
        self.consensus = open_consensus(url)
        self.master = getattr(args, "master", None)
        self.remote = getattr(args, "remote", None)
        self._spark = None
        path = getattr(args, "kafka_config", None) or os.environ.get("UPSERT_KAFKA_CONFIG")
        self.kafka_config_path = path or None
        self._kafka_config = None

    def spark(self):
        if self._spark is None:
            from airflow_upsert_provider.engine.spark.session import get_spark

            # A Kafka client config with secrets is registered in the session with the slice
            # reader: then the session is this run's own, not the shared Connect one.
            secrets = self._kafka_config is not None and bool(self._kafka_config.secret_values())
            self._spark = get_spark(self.master, conf=self.spark_conf or None, remote=self.remote, private=secrets)
        return self._spark

    def kafka_config(self):
        """The Kafka client config from --kafka-config (or UPSERT_KAFKA_CONFIG); None if
        neither is given (a Kafka shard then says how to give one when it needs it)."""
        if self._kafka_config is None and self.kafka_config_path:
            from airflow_upsert_provider.engine.sources.kafka_options import load_kafka_config

            self._kafka_config = load_kafka_config(self.kafka_config_path)
        return self._kafka_config

    def shard(self, shard_id: str):
        from airflow_upsert_provider.engine.table.shard import Shard

        shard = Shard.open(self.consensus, self.blob, shard_id)
        if shard.is_kafka and self.kafka_config_path:
            # Read only for a Kafka shard: a directory shard does not depend on a Kafka setting.
            shard = Shard(self.consensus, self.blob, shard_id, shard.config, kafka_config=self.kafka_config())
        return shard


def cmd_init(ctx: Context, args: argparse.Namespace) -> dict[str, Any]:
    from airflow_upsert_provider.engine.config import (
        DEFAULT_BUCKETS,
        DEFAULT_MAX_FILES_PER_BATCH,
        ShardConfig,
        validate_shard_id,
    )
    from airflow_upsert_provider.engine.table.shard import Shard
    from airflow_upsert_provider.engine.sources import is_kafka_uri, open_source
    from airflow_upsert_provider.engine.write.upsert import infer_schema, parse_schema

    validate_shard_id(args.shard)
    source = open_source(args.source, args.source_format,
                         kafka_config=ctx.kafka_config() if is_kafka_uri(args.source) else None)
    extra = _kafka_init_options(args, is_kafka_uri(source.uri))
    source.check()
    spark = ctx.spark()
    if args.schema:
        schema = parse_schema(spark, args.schema)
    elif extra:
        from airflow_upsert_provider.engine.write.kafka_records import infer_kafka_schema

        schema = infer_kafka_schema(spark, source, envelope=extra["kafka"]["envelope"], keys=tuple(args.key))
    else:
        schema = infer_schema(spark, source)
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
    )
    shard = Shard.create(ctx.consensus, ctx.blob, args.shard, config,
                         kafka_config=ctx.kafka_config() if is_kafka_uri(source.uri) else None)
    return {"shard": shard.shard_id, "config": json.loads(config.to_json()), "upper": 0}


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
    out = shard.status(None if args.no_rows else ctx.spark()).to_dict()
    if shard.is_kafka:
        from airflow_upsert_provider.engine.lifecycle.group_offsets import group_status

        # What lag tools see: the consumer group against the shard's frontier.
        out["group"] = group_status(shard)
    return out


def cmd_run_batch(ctx: Context, args: argparse.Namespace) -> dict[str, Any]:
    from airflow_upsert_provider.engine.write.writer import Writer

    if args.continuous != (args.run_for is not None):
        raise ConfigurationError("--continuous and --for DURATION go together", field="--for")
    run_for = args.run_for if args.continuous else None
    shard = ctx.shard(args.shard)
    writer_id = args.writer_id or f"{_actor(args)}:{uuid.uuid4().hex[:8]}"
    writer = Writer(shard, writer_id, spark_factory=ctx.spark, on_bad_record=args.on_bad_record)
    tty = sys.stderr.isatty()
    done = 0

    def on_result(result) -> None:
        nonlocal done
        if not result.progressed:
            return
        done += 1
        lag = sum(result.lag_offsets.values())
        line = (
            f"batch ts={result.ts} {result.outcome}: rows in {result.rows_in}, out {result.rows_out}, "
            f"rejected {result.rejected}, {result.seconds:.2f}s; {done} done, lag {lag} offsets"
        )
        if tty:
            print("\r\033[K" + line, end="", file=sys.stderr, flush=True)
        elif not args.json:
            print(line, flush=True)

    if args.continuous:
        from airflow_upsert_provider.engine.write.continuous import run_continuous

        report = run_continuous(writer, duration_seconds=run_for, on_result=on_result)
    else:
        report = writer.run(
            max_batches=None if args.until_caught_up else args.max_batches,
            until_caught_up=args.until_caught_up,
            on_result=on_result,
        )
    if tty and done:
        print(file=sys.stderr)
    out = {"shard": shard.shard_id, "writer_id": writer_id, **report.to_dict()}
    if not args.json:
        print(f"upper: {report.upper} ({out['committed']} committed, {len(report.results)} step(s))")
        if report.stopped_because:
            print(_printable(f"stopped early: {report.stopped_because}; no further batch started"))
        return {}
    return out


def cmd_read(ctx: Context, args: argparse.Namespace) -> dict[str, Any]:
    from airflow_upsert_provider.engine.table.runs import read_runs, table_columns

    shard = ctx.shard(args.shard)
    handle = _open_output(args.out) if args.out else sys.stdout
    runs = shard.live_runs(args.as_of)
    frame = read_runs(ctx.spark(), shard.config, shard.blob, runs).orderBy(*shard.config.keys)
    columns = table_columns(shard.config)
    try:
        # A run file damaged in place fails inside Spark: exit 4 naming it, as a missing one.
        with shard.reading(runs):
            if args.output_format == "csv":
                writer = csv.writer(handle)
                writer.writerow(columns)
                for row in frame.toLocalIterator():
                    writer.writerow(["" if row[c] is None else row[c] for c in columns])
            else:
                for row in frame.toLocalIterator():
                    handle.write(json.dumps(row.asDict(), default=str, sort_keys=False) + "\n")
    finally:
        if args.out:
            handle.close()
    return {}


def _open_output(path: str):
    # Opened before Spark starts, so that a bad path fails at once and clearly.
    try:
        return open(path, "w", newline="", encoding="utf-8")
    except OSError as exc:
        raise ConfigurationError(f"cannot write --out {path}: {exc.strerror}", field="out") from None


def cmd_compact(ctx: Context, args: argparse.Namespace) -> dict[str, Any]:
    from airflow_upsert_provider.engine.maintenance.compaction import compact

    return compact(ctx.spark(), ctx.shard(args.shard), since=args.since).to_dict()


def cmd_checkpoint(ctx: Context, args: argparse.Namespace) -> dict[str, Any]:
    from airflow_upsert_provider.engine.maintenance import checkpoint as ckpt
    from airflow_upsert_provider.engine.store import streams
    from airflow_upsert_provider.engine.errors import ConfigurationError, ShardNotFound

    if args.checkpoint_command == "create":
        shard = ctx.shard(args.shard)
        entry = ckpt.create_checkpoint(shard, keep_last=args.keep_last, keep_within=args.keep_within)
        return {"shard": shard.shard_id, "checkpoint": entry.to_dict()}
    # list, verify and restore read the blob only: a restore runs against an empty consensus.
    shard_id = args.shard
    if not ctx.blob.is_dir(ckpt.checkpoints_root(ctx.blob, shard_id)):
        try:
            ctx.consensus.get_shard(shard_id)
        except ShardNotFound:
            raise ConfigurationError(
                f"no shard {shard_id!r} in the consensus and no checkpoints of it in {ctx.blob.root}",
                shard=shard_id,
            ) from None

    catalog = ckpt.Catalog.load(ctx.blob, shard_id)
    if args.checkpoint_command == "list":
        entries = [e.to_dict() for e in catalog.entries]
        if not args.json:
            for e in entries:
                print(f"{e['id']}  upper {e['upper']}  since {e['since']}  {e['files']} files  {e['bytes']} bytes")
            print(f"{len(entries)} checkpoint(s)")
            return {}
        return {"shard": shard_id, "checkpoints": entries}
    if args.checkpoint_command == "verify":
        ids = [args.checkpoint] if args.checkpoint else [e.id for e in catalog.entries]
        verified = []
        for checkpoint_id in ids:
            manifest = ckpt.verify_checkpoint(ctx.blob, shard_id, checkpoint_id)
            verified.append({"id": checkpoint_id, "files": len(manifest["files"]), "ok": True})
        return {"shard": shard_id, "verified": verified}
    latest = catalog.latest()
    checkpoint_id = args.checkpoint or (latest.id if latest else None)
    if checkpoint_id is None:
        raise ConfigurationError(f"shard {shard_id!r} has no checkpoint to restore", shard=shard_id)
    record = ckpt.restore_checkpoint(ctx.consensus, ctx.blob, shard_id, checkpoint_id, target_shard_id=args.target,
                                     actor=_actor(args))
    state = streams.read_stream(ctx.consensus, record.shard_id)
    next_step = f"upsertctl recover seek {record.shard_id}"
    if not args.json:
        print(f"restored shard {record.shard_id} from checkpoint {checkpoint_id} of shard {shard_id}: "
              f"upper {record.upper}, since {record.since}")
        print(_printable(f"shard {record.shard_id}: {state.describe()}"))
        print(f"next: {next_step}, then upsertctl recover resume {record.shard_id} (docs/recovery.md)")
        return {}
    return {"shard": record.shard_id, "checkpoint": checkpoint_id, "upper": record.upper, "since": record.since,
            "stream": state.to_dict(), "next_step": next_step}


def cmd_gc(ctx: Context, args: argparse.Namespace) -> dict[str, Any]:
    from airflow_upsert_provider.engine.maintenance.gc import DEFAULT_GRACE_SECONDS, collect_garbage

    grace = DEFAULT_GRACE_SECONDS if args.grace is None else args.grace
    report = collect_garbage(ctx.consensus, ctx.blob, args.shard, grace_seconds=grace, dry_run=args.dry_run)
    if not args.json:
        verb = "would delete" if args.dry_run else "deleted"
        for item in report.items:
            print(f"{verb} {item.kind} {item.path} ({item.files} files, {item.bytes} bytes)")
        for skipped in report.skipped:
            print(f"skipped {skipped['path']}: {skipped['reason']}")
        print(f"{verb} {len(report.items)} item(s), {report.files} files, {report.bytes} bytes; "
              f"kept {report.kept_referenced} referenced and {report.kept_in_grace} in the grace period")
        return {}
    return report.to_dict()


def _actor(args: argparse.Namespace) -> str:
    """Who a change is recorded as: ``--actor``, else this process (as a writer id starts)."""
    return getattr(args, "actor", None) or f"upsertctl:{socket.gethostname()}:{os.getpid()}"


def _stream_line(state: dict[str, Any]) -> str:
    """``shard orders: STOPPED (epoch 0), set by ... at ...: why``, from a stream's dict."""
    from airflow_upsert_provider.engine.store.stream_rules import Status, StreamState

    described = StreamState(
        shard_id=state["shard"], status=Status(state["status"]), version=state["version"], epoch=state["epoch"],
        changed_by=state["changed_by"], changed_at=state["changed_at"], reason=state["reason"],
    ).describe()
    return _printable(f"shard {state['shard']}: {described}")


def _print_transition(result: dict[str, Any]) -> None:
    print(_stream_line(result))
    if not result["changed"]:
        print(f"{result['action']}: nothing changed, the stream already was {result['status']}")


def cmd_stream(ctx: Context, args: argparse.Namespace) -> dict[str, Any]:
    from airflow_upsert_provider.engine.store import streams

    shard_id, action = args.shard, args.stream_command
    if action == "status":
        out = streams.read_stream(ctx.consensus, shard_id).to_dict()
        if not args.json:
            print(_stream_line(out))
            return {}
        return out
    if action == "history":
        rows = streams.stream_history(ctx.consensus, shard_id, limit=args.limit)
        if not args.json:
            for row in rows:
                print(_history_line(row))
            print(f"{len(rows)} change(s)")
            return {}
        return {"shard": shard_id, "history": rows}
    if action == "resume":
        out = streams.resume(ctx.consensus, shard_id, _actor(args), args.reason).to_dict()
        if not args.json:
            _print_transition(out)
            return {}
        return out
    return _stop(ctx, args)


def _history_line(row: dict[str, Any]) -> str:
    line = (f"{_iso(row['at'])}  v{row['version']}  {row['action']}: {row['from'] or '-'} -> {row['to']} "
            f"(epoch {row['epoch']}) by {row['actor']}")
    return _printable(line + (f": {row['reason']}" if row["reason"] else ""))


def _stop(ctx: Context, args: argparse.Namespace) -> dict[str, Any]:
    from airflow_upsert_provider.engine.store import streams
    from airflow_upsert_provider.engine.store.stream_rules import Status

    actor = _actor(args)
    if args.no_wait:
        out = streams.stop(ctx.consensus, args.shard, actor, args.reason).to_dict()
        if not args.json:
            _print_transition(out)
            if out["status"] == Status.STOPPING.value:
                print(f"left STOPPING: writers finish the batch in hand and start no other; "
                      f"`upsertctl stream stop {args.shard}` finalizes")
            return {}
        return {**out, "finalized": False, "batch_in_hand": None}
    tty = sys.stderr.isatty()
    waited = False

    def on_wait(remaining: float) -> None:
        nonlocal waited
        waited = True
        if tty:
            print(f"\r\033[Kwaiting up to {remaining:.0f}s for the batch in hand", end="", file=sys.stderr, flush=True)

    # time.sleep looked up now, not when the engine was imported: tests drive the drain.
    result = streams.stop_and_finalize(ctx.consensus, args.shard, actor, args.reason,
                                       drain_seconds=args.drain, sleep=time.sleep, on_wait=on_wait,
                                       staging_written_at=streams.staging_written_at(ctx.blob, args.shard))
    if tty and waited:
        print(file=sys.stderr)
    out = result.to_dict()
    stopped = result.state.status is Status.STOPPED
    # A writer still holding a batch when the drain ended is fenced at its commit.
    in_hand = stopped and streams.batch_in_hand(ctx.consensus, args.shard)
    if not args.json:
        _print_transition(out)
        if in_hand:
            print("a batch was still in hand when the drain ended: its commit will be fenced; nothing is "
                  "lost, the batch runs after the resume")
        if not stopped:
            print(f"the stop did not finish: the stream moved on to {result.state.status.value} meanwhile")
        return {}
    return {**out, "finalized": stopped, "batch_in_hand": in_hand}


def cmd_recover(ctx: Context, args: argparse.Namespace) -> dict[str, Any]:
    from airflow_upsert_provider.engine.lifecycle import recovery
    from airflow_upsert_provider.engine.store import streams

    shard_id, action = args.shard, args.recover_command
    if action == "begin":
        out = streams.begin_recovery(ctx.consensus, shard_id, _actor(args), args.reason).to_dict()
        next_step = f"upsertctl recover seek {shard_id}"
    elif action == "seek":
        seek = recovery.seek(ctx.shard(shard_id), epoch=args.epoch, actor=_actor(args))
        out = seek.to_dict()
        next_step = f"upsertctl recover resume {shard_id}"
        if not args.json:
            position = ", ".join(f"{p} from offset {o}" for p, o in sorted(seek.position.items())) or "every partition from offset 0"
            print(f"shard {shard_id}: seek of recovery epoch {seek.epoch} done at upper {seek.upper}")
            print(f"position: {position}")
            print(f"segments: {seek.segments_ahead} present from there on; {seek.checked} known segments checked")
            print(f"next: {next_step}")
            return {}
        return {**out, "next_step": next_step}
    elif action == "resume":
        out = streams.resume_after_recovery(ctx.consensus, shard_id, args.epoch, _actor(args)).to_dict()
        next_step = f"upsertctl run-batch {shard_id} --until-caught-up"
    else:
        out = recovery.recovery_status(ctx.shard(shard_id))
        steps = {"seek": f"upsertctl recover seek {shard_id}", "resume": f"upsertctl recover resume {shard_id}"}
        next_step = steps.get(out["next_step"])
        if not args.json:
            print(_stream_line(out))
            print(f"upper: {out['upper']}")
            print(f"next: {next_step}" if next_step else "no recovery is open")
            return {}
        return out
    if not args.json:
        _print_transition(out)
        print(f"next: {next_step}")
        return {}
    return {**out, "next_step": next_step}


def cmd_source(ctx: Context, args: argparse.Namespace) -> dict[str, Any]:
    from airflow_upsert_provider.engine.maintenance.retention import prune

    report = prune(ctx.shard(args.shard), below=args.below, dry_run=args.dry_run)
    if not args.json:
        verb = "would delete" if args.dry_run else "deleted"
        held = (f"the oldest retained checkpoint, {report.checkpoint}" if report.checkpoint
                else "the shard's committed batches")
        for plan in report.partitions:
            line = f"{verb} {len(plan.delete)} files, {plan.bytes} bytes of partition {plan.partition} below offset {plan.bound}"
            if plan.kept_unbound:
                line += f"; kept {plan.kept_unbound} file(s) below it that no batch bound"
            print(line)
        if report.shared_with:
            print(f"held back also by shard(s) reading the same directory: {', '.join(report.shared_with)}")
        print(f"{verb} {report.files} files, {report.bytes} bytes, below the bound offsets of {held}"
              + ("" if args.dry_run or not report.files else "; each recorded in its partition's .retention.jsonl"))
        return {}
    return report.to_dict()


def _iso(at: float | None) -> str:
    import datetime

    if at is None:
        return "never"
    return datetime.datetime.fromtimestamp(at, datetime.timezone.utc).isoformat(timespec="seconds")


def _observation_line(obs: dict[str, Any]) -> str:
    lag = f"{obs['lag_records']} offsets behind"
    if obs["lag_seconds"] is not None:
        lag += f", oldest pending record landed {obs['lag_seconds']:.0f}s ago"
    return (f"shard {obs['shard_id']}: upper {obs['upper']}, last commit {_iso(obs['last_commit_at'])}, "
            f"{lag}, stream {obs['stream_status']}")


def cmd_frontier(ctx: Context, args: argparse.Namespace) -> dict[str, Any]:
    from airflow_upsert_provider.engine.frontier import observations

    if args.frontier_command == "observe":
        report = observations.observe_shards(ctx.consensus, ctx.blob, args.shards or None, observer=_actor(args),
                                             open_shard=ctx.shard)
        out = [o.to_dict() for o in report.observations]
        if report.unobservable:
            # Every other shard was observed and recorded; these are named, and the exit says so.
            for shard_id, reason in report.unobservable.items():
                print(f"upsertctl: shard {shard_id}: not observable: {reason}", file=sys.stderr)
            args.exit_code = 2
        if not args.json:
            for obs in out:
                print(_observation_line(obs))
            print(f"{len(out)} observation(s) recorded"
                  + (f", {len(report.unobservable)} shard(s) not observable" if report.unobservable else ""))
            return {}
        return {"observations": out, "unobservable": report.unobservable}
    from airflow_upsert_provider.engine.frontier.rules import StallSettings

    given = {field: getattr(args, field) for _, field, _, _ in FRONTIER_SETTING_OPTIONS
             if getattr(args, field) is not None}
    settings = StallSettings(**given)
    result = observations.peek_shard(ctx.consensus, ctx.blob, args.shard, settings, observer=_actor(args),
                                     observe_first=not args.no_observe, open_shard=ctx.shard)
    out = result.to_dict()
    if result.evaluation.status.value == "NOT_FOUND":
        # The same shape as for a known shard (status NOT_FOUND), and exit 2: nothing to watch.
        print(f"upsertctl: unknown shard {args.shard!r} in the consensus store", file=sys.stderr)
        args.exit_code = 2
    if not args.json:
        _print_frontier_status(out)
        return {}
    return out


def _print_frontier_status(out: dict[str, Any]) -> None:
    ev, state = out["evaluation"], out["state"]
    pages = "pages" if ev["breach"] else "does not page"
    print(f"shard {out['shard']}: {ev['status']}" + (f" ({ev['severity']}, {pages})" if ev["severity"] else ""))
    print(f"rule: {ev['rule']}")
    for reason in ev["reasons"]:
        print(f"  - {reason}")
    if ev["upper"] is not None:
        stuck = "" if ev["stuck_seconds"] is None else f", stuck {ev['stuck_seconds']:.0f}s"
        print(f"upper: {ev['upper']}, last advance {_iso(ev['last_advance_at'])}{stuck}")
    if ev["lag_records"] is not None:
        seconds = "" if ev["lag_seconds"] is None else f", {ev['lag_seconds']:.0f}s"
        print(f"lag: {ev['lag_records']} offsets{seconds}")
    window = ev["window"] or {}
    if window:
        print(f"window: {window.get('samples')} observation(s) from {_iso(window.get('start'))} to "
              f"{_iso(window.get('end'))} ({window.get('seconds')}s looked at)")
    if state.get("firing"):
        print(f"alert: firing ({state.get('firing_status')}) since {_iso(state.get('incident_started_at'))}")


def _add_spark_server_commands(commands, common: argparse.ArgumentParser) -> None:
    from airflow_upsert_provider.engine.spark.server import DEFAULT_PORT, START_TIMEOUT_SECONDS

    server = commands.add_parser(
        "spark-server", parents=[common],
        help="start, stop or check a local Spark Connect server on loopback (for --remote)",
    )
    actions = server.add_subparsers(dest="server_command", required=True, metavar="ACTION")
    shared = argparse.ArgumentParser(add_help=False)
    shared.add_argument("--state-dir", default=None, metavar="DIR",
                        help="pid, port, log and lock under DIR/spark-server (default UPSERT_STATE_DIR, else ./.upsert)")
    shared.add_argument("--json", action="store_true")
    start = actions.add_parser("start", parents=[common, shared],
                               help="start the server unless it runs (then report it); safe to run at once from many tasks")
    start.add_argument("--port", type=integer_option("--port", 1, 65535), default=DEFAULT_PORT, help=f"port on 127.0.0.1 (default {DEFAULT_PORT})")
    start.add_argument("--memory", default=None, metavar="SIZE",
                       help="driver memory, e.g. 4g (default: a third of the machine's RAM, at most 8g)")
    start.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="Spark setting of the server")
    start.add_argument("--timeout", type=finite_number("--timeout", above_zero=True), default=START_TIMEOUT_SECONDS, metavar="SECONDS",
                       help=f"wait this long for the port to accept (default {START_TIMEOUT_SECONDS:g})")
    status = actions.add_parser("status", parents=[common, shared],
                                help="whether the recorded server runs and its port answers (exit 2 if not)")
    status.add_argument("--query", action="store_true", help="also run spark.range(1).count() through Connect")
    actions.add_parser("stop", parents=[common, shared], help="terminate the server and remove its record")


def cmd_spark_server(ctx: Context | None, args: argparse.Namespace) -> dict[str, Any]:
    from airflow_upsert_provider.engine.spark.server import SparkServer

    server = SparkServer(args.state_dir)
    if args.server_command == "start":
        conf = parse_key_values(args.conf, "--conf")
        out = server.start(port=args.port, memory=args.memory, conf=conf, timeout=args.timeout)
    elif args.server_command == "stop":
        out = server.stop()
    else:
        out = server.status(query=args.query)
        if not out["answering"]:
            args.exit_code = 2
    if not args.json:
        _print_spark_server(args.server_command, out)
        return {}
    return out


def _print_spark_server(action: str, out: dict[str, Any]) -> None:
    if action == "stop":
        print(f"stopped the server at {out['address']} (pid {out['pid']})" if out.get("stopped")
              else "no Spark Connect server was running")
        return
    if action == "start":
        verb = "started" if out.get("started") else "already running:"
        print(f"{verb} {out['address']} (pid {out['pid']}, driver memory {out['driver_memory']}); log {out['log']}")
        if out.get("note"):
            print(out["note"])
        return
    if not out.get("running"):
        print("no Spark Connect server runs" + (" (its record was stale)" if out.get("stale") else "")
              + f"; state in {out['state_dir']}")
        return
    answer = "answers" if out["answering"] else "does NOT answer on its port"
    timing = f", a query took {out['query_seconds']}s" if "query_seconds" in out else ""
    print(f"{out['address']} (pid {out['pid']}) {answer}{timing}; log {out['log']}")


def _add_spark_archive_commands(commands, common: argparse.ArgumentParser) -> None:
    archive = commands.add_parser(
        "spark-archive", parents=[common],
        help="build, check or remove the driver JVM's class-data-sharing archive (a faster cold task)",
    )
    actions = archive.add_subparsers(dest="archive_command", required=True, metavar="ACTION")
    shared = argparse.ArgumentParser(add_help=False)
    shared.add_argument("--state-dir", default=None, metavar="DIR",
                        help="archive under DIR/class-archive (default UPSERT_STATE_DIR, else ./.upsert; "
                             "UPSERT_CLASS_ARCHIVE=PATH names the file, =off disables it)")
    shared.add_argument("--json", action="store_true")
    build = actions.add_parser("build", parents=[common, shared],
                               help="run a sample batch that records the classes it loads (about 30 s); "
                                    "safe to run at once from many processes")
    build.add_argument("--force", action="store_true", help="rebuild even if a usable archive exists")
    actions.add_parser("status", parents=[common, shared],
                       help="the archive's path, size, Java version and whether new sessions use it (exit 2 if not)")
    actions.add_parser("remove", parents=[common, shared], help="delete the archive and its sidecar")


def cmd_spark_archive(ctx: Context | None, args: argparse.Namespace) -> dict[str, Any]:
    from airflow_upsert_provider.engine.spark import class_archive

    if args.archive_command == "build":
        out = class_archive.build_archive(args.state_dir, force=args.force,
                                          progress=lambda line: print(line, file=sys.stderr, flush=True))
    elif args.archive_command == "remove":
        out = class_archive.remove_archive(args.state_dir)
    else:
        out = class_archive.archive_status(args.state_dir)
        if not out["used"]:
            args.exit_code = 2
    if not args.json:
        _print_spark_archive(args.archive_command, out)
        return {}
    return out


def _print_spark_archive(action: str, out: dict[str, Any]) -> None:
    if action == "remove":
        print(f"removed {out['path']}" if out.get("removed") else f"no archive to remove ({out.get('reason', 'none')})")
        return
    if out["path"] is None:
        print(f"no class-data-sharing archive: {out['reason']}")
        return
    size = f"{out['size'] / 2**20:.0f} MB" if out["size"] else "missing"
    used = "used by new sessions" if out["used"] else f"NOT used: {out['reason']}"
    print(f"{out['path']} ({size}, Java {out['java_version'] or '?'}, pyspark {out['pyspark'] or '?'}): {used}")


COMMANDS = {
    "init": cmd_init,
    "status": cmd_status,
    "run-batch": cmd_run_batch,
    "read": cmd_read,
    "compact": cmd_compact,
    "checkpoint": cmd_checkpoint,
    "gc": cmd_gc,
    "stream": cmd_stream,
    "recover": cmd_recover,
    "source": cmd_source,
    "frontier": cmd_frontier,
    "spark-server": cmd_spark_server,
    "spark-archive": cmd_spark_archive,
}


# Commands that open no shard, no store and no blob root.
NO_STORE_COMMANDS = ("spark-server", "spark-archive")


def failed_write_path(exc: BaseException) -> str | None:
    """The file or directory whose write failed for a reason of the filesystem: the filename
    of an ``OSError`` in the exception chain, or the path a JVM error names in java.io's
    ``<path> (<reason>)`` form; None if neither names one."""
    from airflow_upsert_provider.engine.write.writer import BLOB_WRITE_FAILURES

    java_path = re.compile(r"(\S+) \((?:" + "|".join(map(re.escape, BLOB_WRITE_FAILURES.values())) + r")\)")
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in BLOB_WRITE_FAILURES and current.filename:
            return os.fsdecode(current.filename)
        match = java_path.search(str(current))
        if match:
            return match.group(1)
        current = current.__cause__ or current.__context__
    return None


def write_failure_line(exc: BaseException, cause: str, args: argparse.Namespace) -> str:
    """What a write that hit the filesystem's limits (full, over quota, read-only) reports:
    the path that failed, which may be under the blob root (a compaction's output, a
    checkpoint's manifest) or not (a source's retention log, a state directory)."""
    path = failed_write_path(exc)
    if path is not None:
        what = f"writing {path} failed: {cause}"
    elif args.command in NO_STORE_COMMANDS:
        what = f"a write failed: {cause} (no path was named)"
    else:
        what = (f"a write failed: {cause} (no path was named: Spark writes under the blob root "
                f"{_blob_root(args)} and its local directories)")
    # Every command writes its files before the commit that names them.
    return f"{what}; nothing was committed: free space or fix the mount, then run again"


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except ConfigurationError as exc:
        # A bad option value (the type= functions above); the command is not known yet.
        return _report(exc, "--json" in (sys.argv[1:] if argv is None else argv))
    as_json = getattr(args, "json", False)
    try:
        ctx = Context(args) if args.command not in NO_STORE_COMMANDS else None
        result = COMMANDS[args.command](ctx, args)
    except UpsertError as exc:
        return _report(exc, as_json)
    except KeyboardInterrupt:
        print("upsertctl: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return _reader_went_away()
    except Exception as exc:
        if os.environ.get("UPSERT_DEBUG"):
            raise
        from airflow_upsert_provider.engine.spark.server import display_remote, server_gone
        from airflow_upsert_provider.engine.write.writer import blob_write_failure

        remote = getattr(args, "remote", None) or os.environ.get("UPSERT_SPARK_REMOTE")
        if remote and server_gone(exc):
            # Outside a batch's staging (which raises SparkUnavailable itself): a read, a
            # compaction, a status. Every command writes its files before the commit naming them.
            print(f"upsertctl: the Spark Connect server at {display_remote(remote)} stopped answering: "
                  f"{_first_line(exc)[:200]}; nothing was committed: run again when it answers "
                  "(upsertctl spark-server status)", file=sys.stderr)
            return SparkUnavailable.exit_code
        cause = blob_write_failure(exc)
        if cause is not None:
            print(f"upsertctl: {_printable(write_failure_line(exc, cause, args))}", file=sys.stderr)
            return BlobWriteFailed.exit_code
        print(f"upsertctl: unexpected error: {type(exc).__name__}: {_first_line(exc)} "
              "(a bug or an unmapped failure: set UPSERT_DEBUG=1 for the traceback and report it; "
              "see docs/errors.md)", file=sys.stderr)
        return 1
    try:
        if result:
            if as_json:
                print(json.dumps(result, default=str))
            else:
                _print_human(result)
        sys.stdout.flush()
    except BrokenPipeError:
        return _reader_went_away()
    # A command that printed its result may still exit non-zero (frontier status NOT_FOUND).
    return getattr(args, "exit_code", 0)


def _report(exc: UpsertError, as_json: bool) -> int:
    """Print an error as errors.md describes (the object on stdout with --json, one line on
    stderr) and return its exit code."""
    payload = exc.to_dict()
    if as_json:
        print(json.dumps(payload, default=str))
    # One line, as errors.md promises, whatever file name or reason the message quotes.
    print(f"upsertctl: {_printable(exc.message)}", file=sys.stderr)
    for item in payload.get("records", [])[:5]:
        print(f"  {json.dumps(item, default=str)}", file=sys.stderr)
    return exc.exit_code


def run() -> NoReturn:
    """The ``upsertctl`` program: :func:`main`, then an exit that skips tearing down the
    interpreter's modules.

    That teardown frees everything PySpark's client, pandas, pyarrow and SQLAlchemy built,
    object by object: about 0.15-0.25 s after the command is done, which a task waiting for
    the process pays on every batch (docs/performance.md). Nothing of ours waits on it:
    every file a command writes is closed, and fsynced before the commit that names it.
    What a normal exit does that matters still happens, in its order: other non-daemon
    threads are waited for (if there are any, this is a normal exit), the ``atexit``
    handlers run (logging's flush, PySpark's client close), and stdout and stderr are
    flushed.
    """
    code = main()
    if any(t is not threading.main_thread() and not t.daemon and t.is_alive() for t in threading.enumerate()):
        sys.exit(code)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # a reader that went away, or a stream closed by the command
    os._exit(code)


# Exit status of a process that wrote to a pipe whose reader closed it (128 + SIGPIPE).
EXIT_BROKEN_PIPE = 128 + 13


def _reader_went_away() -> int:
    """The reader of stdout closed it (`upsertctl read s | head -2`): stop quietly, as Unix
    tools do. Point stdout at /dev/null so that the interpreter's final flush fails no more."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_BROKEN_PIPE


def _printable(text: str) -> str:
    """``text`` with control and other unprintable characters escaped as Python writes them
    (``\\n``, ``\\x1b``): a file name, a reason or an actor given by someone else cannot
    forge a line of output or move the terminal's cursor."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return (lines[0] if lines else "")[:300]


def _print_human(result: dict[str, Any]) -> None:
    for key, value in result.items():
        if isinstance(value, dict):
            print(f"{key}:")
            for k, v in value.items():
                print(f"  {k}: {json.dumps(v, default=str) if isinstance(v, (dict, list)) else v}")
        else:
            print(f"{key}: {value}")

