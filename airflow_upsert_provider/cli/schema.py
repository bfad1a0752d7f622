"""The ``schema`` command: the versions of a shard's table schema, and adding a column."""

from __future__ import annotations

import argparse
import json
from typing import Any

from airflow_upsert_provider.cli.context import Context
from airflow_upsert_provider.cli.options import actor_of
from airflow_upsert_provider.cli.output import iso, printable
from airflow_upsert_provider.engine.errors import ConfigurationError

USAGE = "upsertctl schema [show] SHARD | upsertctl schema add-column SHARD NAME TYPE"


def add_schema_commands(commands, common: argparse.ArgumentParser) -> None:
    schema = commands.add_parser(
        "schema", parents=[common], usage=USAGE,
        help="the versions of a shard's table schema (show), or add a nullable column (add-column)",
        description="`schema SHARD` lists every version of the shard's table schema; `schema add-column SHARD "
                    "NAME TYPE` adds a nullable column of a Spark DDL type (e.g. BIGINT, DECIMAL(10,2)) as a new "
                    "version (docs/schema.md).",
    )
    schema.add_argument("words", nargs="+", metavar="ARG", help="[show] SHARD, or add-column SHARD NAME TYPE")
    schema.add_argument("--actor", help="who the change is recorded as (default upsertctl:<host>:<pid>)")
    schema.add_argument("--json", action="store_true")


def cmd_schema(ctx: Context, args: argparse.Namespace) -> dict[str, Any]:
    words = list(args.words)
    action = words.pop(0) if words[0] in ("show", "add-column") and len(words) > 1 else "show"
    expected = 3 if action == "add-column" else 1
    if len(words) != expected:
        raise ConfigurationError(f"usage: {USAGE}", field="schema")
    if action == "add-column":
        return _add_column(ctx, args, *words)
    return _show(ctx, args, words[0])


def _show(ctx: Context, args: argparse.Namespace, shard_id: str) -> dict[str, Any]:
    from airflow_upsert_provider.engine.store.table_schemas import schema_history

    shard = ctx.shard(shard_id)
    init_schema = json.loads(ctx.consensus.get_shard(shard_id).config)["schema"]
    versions = [v.to_dict() for v in schema_history(ctx.consensus, shard_id, init_schema)]
    if args.json:
        return {"shard": shard_id, "version": shard.config.schema_version, "versions": versions}
    for v in versions:
        columns = ", ".join(f"{f['name']} {_ddl_type(f['type'])}{'' if f['nullable'] else ' NOT NULL'}"
                            for f in v["schema"]["fields"])
        made = "init" if v["change"].get("init") else f"{json.dumps(v['change'])} by {v['created_by']} at {iso(v['created_at'])}"
        print(printable(f"v{v['version']}  {made}"))
        print(printable(f"    {columns}"))
    print(f"shard {shard_id}: schema version {shard.config.schema_version}")
    return {}


def _add_column(ctx: Context, args: argparse.Namespace, shard_id: str, name: str, type_ddl: str) -> dict[str, Any]:
    from airflow_upsert_provider.engine.table.schema_changes import add_column
    from airflow_upsert_provider.engine.write.upsert import parse_schema

    quoted = name.replace("`", "``")
    parsed = json.loads(parse_schema(f"`{quoted}` {type_ddl}", ctx.spark))["fields"]
    if len(parsed) != 1:
        raise ConfigurationError(f"TYPE {type_ddl!r} is not one column type", field="type")
    version, added = add_column(ctx.shard(shard_id), parsed[0], actor_of(args))
    result = {"shard": shard_id, "column": name, "type": _ddl_type(parsed[0]["type"]), "added": added,
              "version": version.version}
    if not args.json:
        print(printable(f"shard {shard_id}: column {name} {result['type']} "
                        f"{'added' if added else 'already there'}; schema version {version.version}"))
        return {}
    return result


def _ddl_type(spark_type: Any) -> str:
    from pyspark.sql.types import StructField

    field = {"name": "c", "type": spark_type, "nullable": True, "metadata": {}}
    return StructField.fromJson(field).dataType.simpleString().upper()
