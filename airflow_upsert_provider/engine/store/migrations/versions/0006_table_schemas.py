"""Versions of each shard's table schema: one row per version after the schema of ``init``.

No data moves: every existing shard is at version 1, the schema its config holds, and a run
that records no version was written with version 1 (engine/store/table_schemas.py). No run is
rewritten.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if "upsert_table_schemas" in set(sa.inspect(op.get_bind()).get_table_names()):
        return
    op.create_table(
        "upsert_table_schemas",
        sa.Column("shard_id", sa.String(128), primary_key=True),
        sa.Column("version", sa.BigInteger, primary_key=True),
        sa.Column("schema", sa.Text, nullable=False),
        sa.Column("change", sa.Text, nullable=False),
        sa.Column("created_by", sa.String(512), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    # Downgrades are not supported: a store goes forward only (docs/upgrading.md).
    raise NotImplementedError("downgrading the consensus store is not supported")
