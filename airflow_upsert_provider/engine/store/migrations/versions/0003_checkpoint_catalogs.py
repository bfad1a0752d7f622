"""Checkpoint catalogs in the store: one header row per shard (its version) and one row per
listed checkpoint.

A change to a catalog was a read-modify-write of its blob file under the catalog lock; it is
now a transaction on these rows, with no blob I/O under the lock (engine/store/catalog_rows.py).
No data moves here (a migration reads no blob): a shard whose catalog is still a
``CATALOG.json`` file has no header row, and its first catalog change imports the file.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    present = set(sa.inspect(op.get_bind()).get_table_names())
    if "upsert_checkpoint_catalogs" not in present:
        op.create_table(
            "upsert_checkpoint_catalogs",
            sa.Column("shard_id", sa.String(128), primary_key=True),
            sa.Column("version", sa.BigInteger, nullable=False),
            sa.Column("changed_at", sa.Float, nullable=False),
        )
    if "upsert_checkpoint_entries" not in present:
        op.create_table(
            "upsert_checkpoint_entries",
            sa.Column("shard_id", sa.String(128), primary_key=True),
            sa.Column("checkpoint_id", sa.String(128), primary_key=True),
            sa.Column("upper", sa.BigInteger, nullable=False),
            sa.Column("since", sa.BigInteger, nullable=False),
            sa.Column("created_at", sa.Float, nullable=False),
            sa.Column("files", sa.BigInteger, nullable=False),
            sa.Column("bytes", sa.BigInteger, nullable=False),
            sa.Column("manifest_sha256", sa.String(64), nullable=False),
        )


def downgrade() -> None:
    # Downgrades are not supported: a store goes forward only (docs/upgrading.md).
    raise NotImplementedError("downgrading the consensus store is not supported")
