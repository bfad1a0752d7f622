"""`upsertctl db`: the consensus store's schema: its revision, size and upgrade
(docs/upgrading.md). Needs no shard and no blob root, and opens the store whatever its schema
revision: these are the commands that act on a store the others refuse."""

from __future__ import annotations

import argparse
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

    consensus = open_consensus(consensus_url(args), create=False, check_schema=False)
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
