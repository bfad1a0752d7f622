"""How a shard's table schema may change: pure rules over Spark schema JSON.

A schema is Spark's StructType JSON (``{"type": "struct", "fields": [...]}``); a field is
``{"name", "type", "nullable", "metadata"}``. Every rule here takes schemas and returns a new
schema or raises :class:`SchemaChangeRefused` naming the column, its old and new type and
what to do; none reads a store (engine/table/schema_changes.py records what they decide).
"""

from __future__ import annotations

import json
from typing import Any

from airflow_upsert_provider.engine.config import INTERNAL_COLUMNS
from airflow_upsert_provider.engine.errors import SchemaChangeRefused


def type_name(spark_type: Any) -> str:
    """A field's type as a message shows it: ``long``, ``decimal(10,2)``, or the JSON of a
    nested type."""
    return spark_type if isinstance(spark_type, str) else json.dumps(spark_type, sort_keys=True)


def schema_fields(schema: str) -> list[dict[str, Any]]:
    return json.loads(schema)["fields"]


def add_column(schema: str, field: dict[str, Any], *, shard_id: str) -> str | None:
    """``schema`` with ``field`` appended as a new nullable column; None when ``schema``
    already has exactly that column (the change was made: nothing to do).

    Refused: a name the schema has with another type (or case), a name the engine reserves,
    a column that is NOT NULL (the rows written before it have no value for it)."""
    name, new_type = field["name"], field["type"]
    details = {"shard": shard_id, "column": name, "new_type": type_name(new_type), "field": "column"}
    if name in INTERNAL_COLUMNS:
        raise SchemaChangeRefused(
            f"cannot add column {name!r} to shard {shard_id!r}: the name is reserved by the engine; "
            "choose another name", **details, old_type=None,
        )
    if not field.get("nullable", True):
        raise SchemaChangeRefused(
            f"cannot add column {name!r} {type_name(new_type)} NOT NULL to shard {shard_id!r}: the rows written "
            "before it have no value for it, so a new column is nullable; add it without NOT NULL",
            **details, old_type=None,
        )
    fields = schema_fields(schema)
    for existing in fields:
        if existing["name"].lower() != name.lower():
            continue
        if existing["name"] == name and existing["type"] == new_type:
            return None
        raise SchemaChangeRefused(
            f"cannot add column {name!r} {type_name(new_type)} to shard {shard_id!r}: it has column "
            f"{existing['name']!r} {type_name(existing['type'])} (names are compared case-insensitively); a "
            "column's type is never changed in place: add a column of another name",
            **details, old_type=type_name(existing["type"]),
        )
    added = {"name": name, "type": new_type, "nullable": True, "metadata": field.get("metadata") or {}}
    return json.dumps({**json.loads(schema), "fields": [*fields, added]})
