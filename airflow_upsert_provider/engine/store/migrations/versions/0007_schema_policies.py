"""Each shard's schema evolution policy: one row per shard whose policy was set.

No data moves: a shard created before policies has no row and gets the default policy
(engine/table/schema_apply.py, docs/upgrading.md says which and why).

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if "upsert_schema_policies" in set(sa.inspect(op.get_bind()).get_table_names()):
        return
    op.create_table(
        "upsert_schema_policies",
        sa.Column("shard_id", sa.String(128), primary_key=True),
        sa.Column("policy", sa.String(32), nullable=False),
        sa.Column("changed_by", sa.String(512), nullable=False),
        sa.Column("changed_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    # Downgrades are not supported: a store goes forward only (docs/upgrading.md).
    raise NotImplementedError("downgrading the consensus store is not supported")
