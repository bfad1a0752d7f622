"""Changes of a shard's table schema: the thin shell that reads the current version, applies a
rule of engine/table/schema_evolution.py and records the result by compare-and-set
(engine/store/table_schemas.py)."""

from __future__ import annotations

from typing import Any

from airflow_upsert_provider.engine.table.schema_evolution import add_column as planned_add_column
from airflow_upsert_provider.engine.table.schema_evolution import type_name
from airflow_upsert_provider.engine.store.table_schemas import TableSchema, current_schema, mint_schema_version
from airflow_upsert_provider.engine.table.shard import Shard


def add_column(shard: Shard, field: dict[str, Any], created_by: str) -> tuple[TableSchema, bool]:
    """Add ``field`` (a Spark StructField as JSON) to the table of ``shard`` as a nullable
    column: (the schema version now, whether this call added it). A column the schema already
    has, of the same type, is no change. Compare-and-set on the version the change was planned
    on: a schema changed meanwhile by someone else is :class:`SchemaVersionConflict`."""
    config = shard.config
    current = current_schema(shard.consensus, shard.shard_id, config.schema)
    schema = planned_add_column(current.schema, field, shard_id=shard.shard_id)
    if schema is None:
        return current, False
    change = {"add": [{"name": field["name"], "type": type_name(field["type"])}]}
    return mint_schema_version(shard.consensus, shard.shard_id, current.version, schema, change, created_by), True
