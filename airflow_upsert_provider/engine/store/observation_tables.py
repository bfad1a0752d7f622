"""The tables of frontier observations and of the frontier alert state (frontier/observations.py
reads and writes them); declared here so that the store's registry lists them with the others."""

from __future__ import annotations

import sqlalchemy as sa

from airflow_upsert_provider.engine.store.tables import metadata

observations_table = sa.Table(
    "upsert_frontier_observations",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("shard_id", sa.String(128), nullable=False, index=True),
    sa.Column("observed_at", sa.Float, nullable=False),
    sa.Column("observer", sa.String(512), nullable=False),
    sa.Column("payload", sa.Text, nullable=False),
    # The window read and both prunes are ranges of this index: (shard, time).
    sa.Index("ix_upsert_frontier_observations_shard_time", "shard_id", "observed_at"),
)

alerts_table = sa.Table(
    "upsert_frontier_alerts",
    metadata,
    sa.Column("shard_id", sa.String(128), primary_key=True),
    sa.Column("version", sa.BigInteger, nullable=False),
    sa.Column("state", sa.Text, nullable=False),
)
