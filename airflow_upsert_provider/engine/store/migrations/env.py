"""Alembic's environment for the consensus store: run the migrations on the connection the
caller hands over (``config.attributes["connection"]``), inside the caller's transaction. Only
online mode: a store's schema is migrated by ``upsertctl db upgrade`` (store/migrations/)."""

from __future__ import annotations

from alembic import context

from airflow_upsert_provider.engine.store.migrations import VERSION_TABLE
from airflow_upsert_provider.engine.store.registry import STORE_SCHEMA


def run_migrations() -> None:
    connection = context.config.attributes.get("connection")
    if connection is None or context.is_offline_mode():
        raise RuntimeError("the consensus store's migrations run on a connection: use store.migrations.upgrade")
    context.configure(
        connection=connection,
        # Every table of the registry (they share one MetaData): what autogenerate compares with.
        target_metadata=STORE_SCHEMA.tables[0].metadata,
        version_table=VERSION_TABLE,
        # SQLite lacks most ALTERs: op.batch_alter_table copies the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


# Alembic runs this file with its context set up; imported otherwise (a walk of the package's
# modules), it does nothing.
if hasattr(context, "config"):
    run_migrations()
