"""Commands of the local Spark machinery: spark-server (a Spark Connect server on loopback)
and spark-archive (the driver JVM's class-data-sharing archive)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from airflow_upsert_provider.cli.context import Context
from airflow_upsert_provider.cli.options import finite_number, integer_option, parse_key_values


def add_spark_server_commands(commands, common: argparse.ArgumentParser) -> None:
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
    from airflow_upsert_provider.engine.spark.session import check_session_settings

    server = SparkServer(args.state_dir)
    if args.server_command == "start":
        conf = parse_key_values(args.conf, "--conf")
        # Every session of the server is built on its settings: one a session refuses would
        # start a server that refuses every client, and logs the value each time.
        check_session_settings(conf)
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


def add_spark_archive_commands(commands, common: argparse.ArgumentParser) -> None:
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

