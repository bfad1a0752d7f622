"""Each shard's schema evolution policy, in consensus (docs/schema.md).

One row per shard whose policy was set (at ``init`` or by ``upsertctl schema policy``): which
changes of the table's schema its batches may make. No row: the shard was created before
policies existed and has the default (`schema_evolution.effective_policy` decides it; the names and
rules are engine/table/schema_evolution.py's). A setting, not state: a batch reads it, never
writes it.
"""

from __future__ import annotations

import time

import sqlalchemy as sa

from airflow_upsert_provider.engine.errors import ShardNotFound
from airflow_upsert_provider.engine.store.consensus import Consensus, shard_exists
from airflow_upsert_provider.engine.store.tables import metadata

schema_policies_table = sa.Table(
    "upsert_schema_policies",
    metadata,
    sa.Column("shard_id", sa.String(128), primary_key=True),
    sa.Column("policy", sa.String(32), nullable=False),
    sa.Column("changed_by", sa.String(512), nullable=False),
    sa.Column("changed_at", sa.Float, nullable=False),
)


def stored_schema_policy(consensus: Consensus, shard_id: str) -> str | None:
    """The policy stored for ``shard_id``; None when none was ever set."""
    return consensus.read_in_snapshot(
        lambda conn: conn.execute(
            sa.select(schema_policies_table.c.policy).where(schema_policies_table.c.shard_id == shard_id)
        ).scalar()
    )


def store_schema_policy(consensus: Consensus, shard_id: str, policy: str, changed_by: str) -> None:
    """Set the policy of ``shard_id`` (already checked by the caller), replacing any before."""

    def txn(conn: sa.Connection) -> None:
        if not shard_exists(conn, shard_id):
            raise ShardNotFound(f"unknown shard {shard_id!r}", shard=shard_id)
        conn.execute(sa.delete(schema_policies_table).where(schema_policies_table.c.shard_id == shard_id))
        conn.execute(sa.insert(schema_policies_table).values(
            shard_id=shard_id, policy=policy, changed_by=changed_by, changed_at=time.time()))

    consensus.run_in_transaction(txn)
