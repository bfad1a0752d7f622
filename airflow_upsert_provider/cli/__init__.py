"""`upsertctl`: the engine for humans and scripts.

Exit codes (docs/errors.md): 0 ok; 2 nothing was changed (usage, configuration, an
unreachable store, a full or read-only blob root); 3 bad input data (nothing committed);
4 integrity violation; 5 outcome unknown (safe to retry); 6 the stream is not writable (not
READY, or a commit was fenced); 7 a stream transition was refused; 1 anything unexpected;
141 the reader of stdout went away.

One module per command group (shard, maintenance, lifecycle, frontier, spark, db); the parser
pieces and option validators in options.py; failures to exit codes in errors.py only.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import sys
import threading
import time
from typing import NoReturn, Sequence

from airflow_upsert_provider.cli import changes, db, frontier, lifecycle, maintenance, schema, shard, spark
from airflow_upsert_provider.cli.connection import apply_connection
from airflow_upsert_provider.cli.context import NO_STORE_COMMANDS, Context
from airflow_upsert_provider.cli.errors import (
    interrupted,
    reader_went_away,
    report,
    report_unexpected,
    with_closest_shard,
)
from airflow_upsert_provider.cli.options import common_options, spark_conf_option
from airflow_upsert_provider.cli.metrics import after_command
from airflow_upsert_provider.cli.output import print_human
from airflow_upsert_provider.engine.errors import ConfigurationError, UpsertError

EPILOG = """exit codes: 0 ok; 2 nothing was changed (usage, configuration, unreachable store,
full or read-only blob root); 3 bad input data (nothing committed); 4 integrity violation;
5 outcome unknown (safe to retry); 6 stream not writable (not READY: stopped or recovering;
or the commit was fenced); 7 stream transition refused (e.g. recover resume before seek);
1 unexpected (UPSERT_DEBUG=1 shows the traceback)
docs: errors.md, recovery.md (stop, resume, recovery), frontier.md (stall paging),
      maintenance.md, upgrading.md (db upgrade); also served by the Airflow api-server at /upsert-provider/docs/

defaults: --consensus from UPSERT_CONSENSUS_URL, else sqlite:///./.upsert/consensus.db;
          --conn-id CONN instead: both from an Airflow connection of type upsert (no password in argv);
          --blob-root from UPSERT_BLOB_ROOT (a path, or s3://BUCKET/PREFIX: storage.md), else ./.upsert/blob;
          --master from UPSERT_SPARK_MASTER, else local[*];
          --remote from UPSERT_SPARK_REMOTE, else none (Spark runs in this process)"""



def build_parser() -> argparse.ArgumentParser:
    common = common_options()
    spark_conf = spark_conf_option()
    parser = argparse.ArgumentParser(
        prog="upsertctl",
        description="Micro-batch upserts on Spark into a keyed table with a durable frontier.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[common],
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    shard.add_shard_commands(commands, common, spark_conf)
    maintenance.add_maintenance_commands(commands, common, spark_conf)
    changes.add_changes_commands(commands, common)
    lifecycle.add_lifecycle_commands(commands, common)
    frontier.add_frontier_commands(commands, common)
    spark.add_spark_server_commands(commands, common)
    spark.add_spark_archive_commands(commands, common)
    db.add_db_commands(commands, common)
    schema.add_schema_commands(commands, common)
    return parser


COMMANDS = {
    "init": shard.cmd_init,
    "status": shard.cmd_status,
    "run-batch": shard.cmd_run_batch,
    "read": shard.cmd_read,
    "compact": maintenance.cmd_compact,
    "checkpoint": maintenance.cmd_checkpoint,
    "gc": maintenance.cmd_gc,
    "publish": maintenance.cmd_publish,
    "changes": changes.cmd_changes,
    "stream": lifecycle.cmd_stream,
    "recover": lifecycle.cmd_recover,
    "source": lifecycle.cmd_source,
    "frontier": frontier.cmd_frontier,
    "spark-server": spark.cmd_spark_server,
    "spark-archive": spark.cmd_spark_archive,
    "db": db.cmd_db,
    "schema": schema.cmd_schema,
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except ConfigurationError as exc:
        # A bad option value (the type= functions of options.py); the command is not known yet.
        return report(exc, "--json" in (sys.argv[1:] if argv is None else argv))
    as_json = getattr(args, "json", False)
    ctx = None
    try:
        apply_connection(args)
        ctx = Context(args) if args.command not in NO_STORE_COMMANDS else None
        started = time.monotonic()
        result = COMMANDS[args.command](ctx, args)
        after_command(ctx, args, started)
    except UpsertError as exc:
        return report(with_closest_shard(exc, ctx), as_json)
    except KeyboardInterrupt:
        return interrupted()
    except BrokenPipeError:
        return reader_went_away()
    except Exception as exc:
        if os.environ.get("UPSERT_DEBUG"):
            raise
        return report_unexpected(exc, args)
    try:
        if result:
            if as_json:
                print(json.dumps(result, default=str))
            else:
                print_human(result)
        sys.stdout.flush()
    except BrokenPipeError:
        return reader_went_away()
    # A command that printed its result may still exit non-zero (frontier status NOT_FOUND).
    return getattr(args, "exit_code", 0)


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
    # Private: no public API runs the atexit handlers without the interpreter's teardown.
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # a reader that went away, or a stream closed by the command
    os._exit(code)

