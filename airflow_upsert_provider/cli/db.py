"""`upsertctl db`: the consensus store's schema: its revision, size and upgrade
(docs/upgrading.md). Needs no shard and no blob root, and opens the store whatever its schema
revision: these are the commands that act on a store the others refuse."""

from __future__ import annotations

import argparse
import os
from typing import Any

from airflow_upsert_provider.cli.context import consensus_url


def add_db_commands(commands, common: argparse.ArgumentParser) -> None:
    db = commands.add_parser("db", parents=[common],
                             help="the consensus store's schema revision, size and upgrade (docs/upgrading.md)")
    actions = db.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    upgrade = actions.add_parser("upgrade", parents=[common],
                                 help="migrate the store's schema to this provider's revision (idempotent; "
                                      "stop the store's writers first)")
    upgrade.add_argument("--json", action="store_true")
    status = actions.add_parser("status", parents=[common],
                                help="the store's schema revision and the provider's, whether an upgrade is "
                                     "needed, and rows and bytes per table")
    status.add_argument("--json", action="store_true")


def cmd_db(ctx: None, args: argparse.Namespace) -> dict[str, Any]:
    from airflow_upsert_provider.engine.store import migrations
    from airflow_upsert_provider.engine.store.registry import open_consensus

    url = consensus_url(args)
    if args.db_command == "status":
        _check_sqlite_file_exists(url)
    consensus = open_consensus(url, create=False, check_schema=False)
    try:
        if args.db_command == "upgrade":
            result = migrations.upgrade(consensus).to_dict()
            if not args.json:
                before = result["from_revision"] or "none (no schema version)"
                if result["upgraded"]:
                    print(f"consensus store upgraded from schema revision {before} to {result['to_revision']}")
                else:
                    print(f"consensus store is at schema revision {result['to_revision']} already: nothing to do")
                return {}
            return result
        status = migrations.schema_status(consensus)
    finally:
        consensus.dispose()
    if not args.json:
        _print_status(status)
        return {}
    return status


def _check_sqlite_file_exists(url: str) -> None:
    """Refuse a status of a SQLite store whose file does not exist: opening it would create
    the file and its directories, and a status changes nothing."""
    from sqlalchemy.engine import make_url

    from airflow_upsert_provider.engine.errors import ConfigurationError
    from airflow_upsert_provider.engine.store.urls import normalize_url

    parsed = make_url(normalize_url(url))
    path = parsed.database
    if parsed.get_backend_name() == "sqlite" and path and path != ":memory:" and not os.path.exists(path):
        raise ConfigurationError(f"no consensus store at {path}: the SQLite file does not exist (nothing was "
                                 "created; the first command that opens the store, e.g. upsertctl init, "
                                 "creates it)", field="consensus")


def _print_status(status: dict[str, Any]) -> None:
    print(f"consensus: {status['consensus']}")
    print(f"store schema revision: {status['store_revision'] or 'none'}")
    print(f"code schema revision: {status['code_revision']}")
    if status["upgrade_needed"]:
        print("upgrade needed: yes (upsertctl db upgrade)")
    elif status["state"] == "newer":
        print("upgrade needed: the store is newer than this provider: upgrade the provider")
    elif status["state"] == "create":
        print("upgrade needed: no (no tables yet: the first command that opens the store creates them)")
    else:
        print("upgrade needed: no")
    for name, table in status["tables"].items():
        size = "" if table["bytes"] is None else f", {table['bytes']} bytes"
        print(f"  {name}: {table['rows']} rows{size}")
    if "file_bytes" in status:
        print(f"file: {status['file_bytes']} bytes")
    else:
        print(f"total: {status['total_bytes']} bytes")
