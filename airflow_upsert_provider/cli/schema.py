"""The ``schema`` command: the versions of a shard's table schema, adding a column, and the
shard's schema evolution policy."""

from __future__ import annotations

import argparse
import json
from typing import Any

from airflow_upsert_provider.cli.context import Context
from airflow_upsert_provider.cli.options import actor_of
from airflow_upsert_provider.cli.output import iso, printable
from airflow_upsert_provider.engine.errors import ConfigurationError

USAGE = ("upsertctl schema [show] SHARD | upsertctl schema add-column SHARD NAME TYPE | "
         "upsertctl schema policy SHARD {none,add_columns,add_and_widen}")
ACTIONS = {"show": 1, "add-column": 3, "policy": 2}


def add_schema_commands(commands, common: argparse.ArgumentParser) -> None:
    schema = commands.add_parser(
        "schema", parents=[common], usage=USAGE,
        help="the versions of a shard's table schema (show), add a nullable column (add-column), or set the "
             "schema evolution policy (policy)",
        description="`schema SHARD` lists every version of the shard's table schema and its evolution policy; "
                    "`schema add-column SHARD NAME TYPE` adds a nullable column of a Spark DDL type (e.g. BIGINT, "
                    "DECIMAL(10,2)) as a new version; `schema policy SHARD POLICY` sets which changes its batches "
                    "make: none, add_columns or add_and_widen (docs/schema.md).",
    )
    schema.add_argument("words", nargs="+", metavar="ARG",
                        help="[show] SHARD, add-column SHARD NAME TYPE, or policy SHARD POLICY")
    schema.add_argument("--actor", help="who the change is recorded as (default upsertctl:<host>:<pid>)")
    schema.add_argument("--json", action="store_true")


def cmd_schema(ctx: Context, args: argparse.Namespace) -> dict[str, Any]:
    words = list(args.words)
    action = words.pop(0) if words[0] in ACTIONS and len(words) > 1 else "show"
    if len(words) != ACTIONS[action]:
        raise ConfigurationError(f"usage: {USAGE}", field="schema")
    if action == "add-column":
        return _add_column(ctx, args, *words)
    if action == "policy":
        return _set_policy(ctx, args, *words)
    return _show(ctx, args, words[0])


def _show(ctx: Context, args: argparse.Namespace, shard_id: str) -> dict[str, Any]:
    from airflow_upsert_provider.engine.store.table_schemas import schema_history
    from airflow_upsert_provider.engine.table.schema_apply import schema_policy

    shard = ctx.shard(shard_id)
    init_schema = json.loads(ctx.consensus.get_shard(shard_id).config)["schema"]
    versions = [v.to_dict() for v in schema_history(ctx.consensus, shard_id, init_schema)]
    policy = schema_policy(shard)
    if args.json:
        return {"shard": shard_id, "version": shard.config.schema_version, "schema_evolution": policy,
                "versions": versions}
    for v in versions:
        columns = ", ".join(f"{f['name']} {_ddl_type(f['type'])}{'' if f['nullable'] else ' NOT NULL'}"
                            for f in v["schema"]["fields"])
        made = "init" if v["change"].get("init") else f"{json.dumps(v['change'])} by {v['created_by']} at {iso(v['created_at'])}"
        print(printable(f"v{v['version']}  {made}"))
        print(printable(f"    {columns}"))
    print(f"shard {shard_id}: schema version {shard.config.schema_version}, schema evolution {policy}")
    return {}


def _set_policy(ctx: Context, args: argparse.Namespace, shard_id: str, policy: str) -> dict[str, Any]:
    from airflow_upsert_provider.engine.table.schema_apply import set_schema_policy

    set_schema_policy(ctx.shard(shard_id), policy, actor_of(args))
    if not args.json:
        print(printable(f"shard {shard_id}: schema evolution {policy}"))
        return {}
    return {"shard": shard_id, "schema_evolution": policy}


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
