"""The change feed: each shard's change retention and the cursors of its incremental consumers
(engine/store/change_feed.py).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    present = set(sa.inspect(op.get_bind()).get_table_names())
    if "upsert_change_retention" not in present:
        op.create_table(
            "upsert_change_retention",
            sa.Column("shard_id", sa.String(128), primary_key=True),
            sa.Column("keep_seconds", sa.Float, nullable=False),
            sa.Column("changed_at", sa.Float, nullable=False),
        )
    if "upsert_change_cursors" not in present:
        op.create_table(
            "upsert_change_cursors",
            sa.Column("shard_id", sa.String(128), primary_key=True),
            sa.Column("consumer", sa.String(250), primary_key=True),
            sa.Column("position", sa.BigInteger, nullable=False),
            sa.Column("pending_to", sa.BigInteger, nullable=True),
            sa.Column("version", sa.BigInteger, nullable=False),
            sa.Column("changed_at", sa.Float, nullable=False),
        )


def downgrade() -> None:
    # Downgrades are not supported: a store goes forward only (docs/upgrading.md).
    raise NotImplementedError("downgrading the consensus store is not supported")
