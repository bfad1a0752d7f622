"""Versions of a shard's table schema, in consensus.

Not the store's own schema revision (store/schema_version.py): these are the versions of the
columns of one shard's table. Version 1 is the schema of ``init``, stored with the shard's
config; every later version is a row here, inserted once by compare-and-set on the version
before it and never updated (as bindings are minted), so writers racing to make the same
change converge on one version. A run records the version it was written with (a run
without one was written with version 1: no run is rewritten when versions begin).
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from airflow_upsert_provider.engine.config import ShardConfig
from airflow_upsert_provider.engine.errors import IntegrityError, SchemaVersionConflict, ShardNotFound
from airflow_upsert_provider.engine.store.consensus import Consensus, insert_ignore, shard_exists
from airflow_upsert_provider.engine.store.tables import table_schemas_table

# The version of the schema a shard is created with (held by its config, not by a row here).
INIT_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class TableSchema:
    """One version of a shard's table schema: ``schema`` is Spark StructType JSON."""

    version: int
    schema: str
    change: dict[str, Any]
    created_by: str | None
    created_at: float | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "schema": json.loads(self.schema),
            "change": self.change,
            "created_by": self.created_by,
            "created_at": self.created_at,
        }


def run_schema_version(run: dict[str, Any]) -> int:
    """The schema version ``run`` was written with: what it records, else version 1 (a run
    written before versions, when every shard was at the schema of ``init``). Pure."""
    return int(run.get("schema_version", INIT_SCHEMA_VERSION))


def newest_run_version(runs: list[dict[str, Any]]) -> int:
    """The newest schema version among ``runs`` (1 for none). Pure."""
    return max((run_schema_version(run) for run in runs), default=INIT_SCHEMA_VERSION)


def config_at(config: ShardConfig, version: TableSchema) -> ShardConfig:
    """``config`` with the columns of schema version ``version``: what a writer validates
    records against and a read returns."""
    if config.schema_version == version.version and config.schema == version.schema:
        return config
    return dataclasses.replace(config, schema=version.schema, schema_version=version.version)


def init_schema(config_schema: str) -> TableSchema:
    """Version 1: the schema the shard's config holds since ``init``."""
    return TableSchema(INIT_SCHEMA_VERSION, config_schema, {"init": True}, None, None)


def _from_row(row: Any) -> TableSchema:
    return TableSchema(int(row.version), row.schema, json.loads(row.change), row.created_by, row.created_at)


def latest_schema(conn: sa.Connection, shard_id: str) -> TableSchema | None:
    """The newest recorded version of ``shard_id`` (None: still the schema of ``init``),
    inside the caller's transaction."""
    row = conn.execute(
        sa.select(table_schemas_table)
        .where(table_schemas_table.c.shard_id == shard_id)
        .order_by(table_schemas_table.c.version.desc())
        .limit(1)
    ).first()
    return None if row is None else _from_row(row)


def current_schema(consensus: Consensus, shard_id: str, config_schema: str) -> TableSchema:
    """The shard's schema now: its newest version, else version 1 (``config_schema``)."""
    latest = consensus.read_in_snapshot(lambda conn: latest_schema(conn, shard_id))
    return init_schema(config_schema) if latest is None else latest


def current_version(consensus: Consensus, shard_id: str) -> int:
    """The number of the shard's newest schema version (1 when none was added since ``init``)."""
    latest = consensus.read_in_snapshot(lambda conn: latest_schema(conn, shard_id))
    return INIT_SCHEMA_VERSION if latest is None else latest.version


def schema_version_of(consensus: Consensus, shard_id: str, version: int, config_schema: str) -> TableSchema:
    """Version ``version`` of the shard's schema (1: ``config_schema``). A version that is not
    recorded is an error: runs name only versions that were minted before them."""
    if version == INIT_SCHEMA_VERSION:
        return init_schema(config_schema)
    row = consensus.read_in_snapshot(
        lambda conn: conn.execute(
            sa.select(table_schemas_table).where(
                table_schemas_table.c.shard_id == shard_id, table_schemas_table.c.version == version
            )
        ).first()
    )
    if row is None:
        raise IntegrityError(
            f"shard {shard_id!r} has no schema version {version}, which one of its runs was written with",
            shard=shard_id, schema_version=version,
        )
    return _from_row(row)


def schema_history(consensus: Consensus, shard_id: str, config_schema: str) -> list[TableSchema]:
    """Every version of the shard's schema, version 1 first."""
    rows = consensus.read_in_snapshot(
        lambda conn: conn.execute(
            sa.select(table_schemas_table)
            .where(table_schemas_table.c.shard_id == shard_id)
            .order_by(table_schemas_table.c.version)
        ).all()
    )
    return [init_schema(config_schema), *(_from_row(r) for r in rows)]


def mint_schema_version(
    consensus: Consensus, shard_id: str, expected_version: int, schema: str, change: dict[str, Any],
    created_by: str,
) -> TableSchema:
    """Record ``schema`` as version ``expected_version + 1`` if the shard's schema is still at
    ``expected_version`` (compare-and-set); return the version that is authoritative.

    A peer that made the same change first (the next version holds exactly ``schema``) is not
    a conflict: its version is returned, so writers racing through one change mint one
    version. Any other move of the version is :class:`SchemaVersionConflict`, nothing changed."""
    wanted = expected_version + 1

    def txn(conn: sa.Connection) -> TableSchema:
        if not shard_exists(conn, shard_id):
            raise ShardNotFound(f"unknown shard {shard_id!r}", shard=shard_id)
        latest = latest_schema(conn, shard_id)
        current = INIT_SCHEMA_VERSION if latest is None else latest.version
        if current == expected_version:
            insert_ignore(
                conn, table_schemas_table, shard_id=shard_id, version=wanted, schema=schema,
                change=json.dumps(change, sort_keys=True), created_by=created_by, created_at=time.time(),
            )
        row = conn.execute(
            sa.select(table_schemas_table).where(
                table_schemas_table.c.shard_id == shard_id, table_schemas_table.c.version == wanted
            )
        ).first()
        if row is not None and json.loads(row.schema) == json.loads(schema):
            return _from_row(row)
        raise SchemaVersionConflict(
            f"the schema of shard {shard_id!r} changed meanwhile: it is at version {current}, this change was "
            f"planned on version {expected_version}; nothing was changed: look at `upsertctl schema {shard_id}` "
            "and make the change again if it is still needed",
            shard=shard_id, expected_version=expected_version, schema_version=current,
        )

    return consensus.run_in_transaction(txn)
