"""Batch history rollups: the audit summary of batch and binding rows truncated below since.

GC rolls up and truncates a shard's batch history (store/history.py); this table keeps one
row per truncated range.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if "upsert_batch_rollups" in set(sa.inspect(op.get_bind()).get_table_names()):
        return
    op.create_table(
        "upsert_batch_rollups",
        sa.Column("shard_id", sa.String(128), primary_key=True),
        sa.Column("from_ts", sa.BigInteger, primary_key=True),
        sa.Column("to_ts", sa.BigInteger, nullable=False),
        sa.Column("batches", sa.BigInteger, nullable=False),
        sa.Column("rows_in", sa.BigInteger, nullable=False),
        sa.Column("rows_out", sa.BigInteger, nullable=False),
        sa.Column("rejected", sa.BigInteger, nullable=False),
        sa.Column("first_committed_at", sa.Float, nullable=True),
        sa.Column("last_committed_at", sa.Float, nullable=True),
        sa.Column("rolled_up_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    # Downgrades are not supported: a store goes forward only (docs/upgrading.md).
    raise NotImplementedError("downgrading the consensus store is not supported")
