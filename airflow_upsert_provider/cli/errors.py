"""The one mapping from failures to what `upsertctl` prints and its exit code
(docs/errors.md): an engine error exits with its class's code and message; a Spark Connect
server that went away, a write the filesystem refused, an interrupt and a reader of stdout
that went away have their own; anything else is unexpected (1)."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import Any

from airflow_upsert_provider.cli.context import NO_STORE_COMMANDS
from airflow_upsert_provider.cli.options import blob_root
from airflow_upsert_provider.cli.output import printable
from airflow_upsert_provider.engine.errors import (
    BlobWriteFailed,
    SparkUnavailable,
    UpsertError,
    exception_chain,
    first_line,
)

# Exit status of a process that wrote to a pipe whose reader closed it (128 + SIGPIPE).
EXIT_BROKEN_PIPE = 128 + 13
# Exit status of a command interrupted by Ctrl-C (128 + SIGINT).
EXIT_INTERRUPTED = 130


def report(exc: UpsertError, as_json: bool) -> int:
    """Print an error as errors.md describes (the object on stdout with --json, one line on
    stderr) and return its exit code."""
    payload = exc.to_dict()
    if as_json:
        print(json.dumps(payload, default=str))
    # One line, as errors.md promises, whatever file name or reason the message quotes.
    print(f"upsertctl: {printable(exc.message)}", file=sys.stderr)
    for item in payload.get("records", [])[:5]:
        print(f"  {json.dumps(item, default=str)}", file=sys.stderr)
    return exc.exit_code


def with_closest_shard(exc: UpsertError, ctx: Any) -> UpsertError:
    """An unknown shard's error naming the closest existing shard of the store ``ctx`` opened
    (a typo is the usual cause); ``exc`` unchanged otherwise, or when the store cannot list."""
    from airflow_upsert_provider.engine.common.names import with_closest_shard as named
    from airflow_upsert_provider.engine.errors import ShardNotFound

    if not isinstance(exc, ShardNotFound) or ctx is None:
        return exc
    try:
        shard_ids = [record.shard_id for record in ctx.consensus.list_shards()]
    except Exception:  # the error in hand is what the user needs; the hint is a bonus
        return exc
    return named(exc, shard_ids)


def report_unexpected(exc: Exception, args: argparse.Namespace) -> int:
    """Print a failure that is not an engine error and return its exit code: a Spark Connect
    server that stopped answering, a write the filesystem refused, else unexpected (1)."""
    from airflow_upsert_provider.engine.spark.server import display_remote, server_gone
    from airflow_upsert_provider.engine.write.writer import blob_write_failure

    from airflow_upsert_provider.engine.spark.executor_errors import carried_error

    carried = carried_error(exc)  # an executor's request to the store failed (a read): its class
    if carried is not None:
        return report(carried, getattr(args, "json", False))
    remote = getattr(args, "remote", None) or os.environ.get("UPSERT_SPARK_REMOTE")
    if remote and server_gone(exc):
        # Outside a batch's staging (which raises SparkUnavailable itself): a read, a
        # compaction, a status. Every command writes its files before the commit naming them.
        print(f"upsertctl: the Spark Connect server at {display_remote(remote)} stopped answering: "
              f"{first_line(exc)[:200]}; nothing was committed: run again when it answers "
              "(upsertctl spark-server status)", file=sys.stderr)
        return SparkUnavailable.exit_code
    cause = blob_write_failure(exc)
    if cause is not None:
        print(f"upsertctl: {printable(write_failure_line(exc, cause, args))}", file=sys.stderr)
        return BlobWriteFailed.exit_code
    print(f"upsertctl: unexpected error: {type(exc).__name__}: {first_line(exc)} "
          "(a bug or an unmapped failure: set UPSERT_DEBUG=1 for the traceback and report it; "
          "see docs/errors.md)", file=sys.stderr)
    return 1


def interrupted() -> int:
    print("upsertctl: interrupted", file=sys.stderr)
    return EXIT_INTERRUPTED


def failed_write_path(exc: BaseException) -> str | None:
    """The file or directory whose write failed for a reason of the filesystem: the filename
    of an ``OSError`` in the exception chain, or the path a JVM error names in java.io's
    ``<path> (<reason>)`` form; None if neither names one."""
    from airflow_upsert_provider.engine.write.writer import BLOB_WRITE_FAILURES

    java_path = re.compile(r"(\S+) \((?:" + "|".join(map(re.escape, BLOB_WRITE_FAILURES.values())) + r")\)")
    for current in exception_chain(exc):
        if isinstance(current, OSError) and current.errno in BLOB_WRITE_FAILURES and current.filename:
            return os.fsdecode(current.filename)
        match = java_path.search(str(current))
        if match:
            return match.group(1)
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
                f"{blob_root(args)} and its local directories)")
    # Every command writes its files before the commit that names them.
    return f"{what}; nothing was committed: free space or fix the mount, then run again"


def reader_went_away() -> int:
    """The reader of stdout closed it (`upsertctl read s | head -2`): stop quietly, as Unix
    tools do. Point stdout at /dev/null so that the interpreter's final flush fails no more."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_BROKEN_PIPE
