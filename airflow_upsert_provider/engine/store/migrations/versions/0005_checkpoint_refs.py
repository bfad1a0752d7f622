"""The files each retained checkpoint's manifest names, indexed (engine/store/checkpoint_refs.py),
so that GC does not read every manifest of every shard.

No data moves here (a migration reads no blob): the table starts empty, and the first GC
reads each retained manifest once and records its row.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if "upsert_checkpoint_refs" not in set(sa.inspect(op.get_bind()).get_table_names()):
        op.create_table(
            "upsert_checkpoint_refs",
            sa.Column("shard_id", sa.String(128), primary_key=True),
            sa.Column("checkpoint_id", sa.String(128), primary_key=True),
            sa.Column("manifest_sha256", sa.String(64), nullable=False),
            sa.Column("files", sa.Text, nullable=False),
            sa.Column("indexed_at", sa.Float, nullable=False),
        )


def downgrade() -> None:
    # Downgrades are not supported: a store goes forward only (docs/upgrading.md).
    raise NotImplementedError("downgrading the consensus store is not supported")
