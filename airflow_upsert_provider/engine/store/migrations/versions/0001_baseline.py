"""Baseline: the consensus schema as it was before schema versions.

Creates each table (and its indexes) that the store lacks, so that this one revision stamps a
store created before schema versions (which has them all, or those of the release that last
opened it) and creates an empty one. Frozen: later changes to the tables are later revisions.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _tables() -> list[tuple[str, list[sa.Column], list[tuple[str, list[str]]]]]:
    """(name, columns, indexes as (name, columns)) of every table of the baseline."""
    return [
        ("upsert_shards", [
            sa.Column("shard_id", sa.String(128), primary_key=True),
            sa.Column("upper", sa.BigInteger, nullable=False),
            sa.Column("since", sa.BigInteger, nullable=False),
            sa.Column("seqno", sa.BigInteger, nullable=False),
            sa.Column("config", sa.Text, nullable=False),
            sa.Column("created_at", sa.Float, nullable=False),
        ], []),
        ("upsert_bindings", [
            sa.Column("shard_id", sa.String(128), primary_key=True),
            sa.Column("ts", sa.BigInteger, primary_key=True),
            sa.Column("ranges", sa.Text, nullable=False),
            sa.Column("minted_by", sa.String(512), nullable=False),
            sa.Column("minted_at", sa.Float, nullable=False),
        ], []),
        ("upsert_batches", [
            sa.Column("shard_id", sa.String(128), primary_key=True),
            sa.Column("ts", sa.BigInteger, primary_key=True),
            sa.Column("writer_id", sa.String(512), nullable=False),
            sa.Column("token", sa.String(64), nullable=False),
            sa.Column("run", sa.Text, nullable=False),
            sa.Column("stats", sa.Text, nullable=False),
            sa.Column("committed_at", sa.Float, nullable=False),
        ], []),
        ("upsert_quarantined_files", [
            sa.Column("shard_id", sa.String(128), primary_key=True),
            sa.Column("file", sa.String(2048), primary_key=True),
            sa.Column("reason", sa.Text, nullable=False),
            sa.Column("ts", sa.BigInteger, nullable=False),
        ], []),
        ("upsert_compactions", [
            sa.Column("shard_id", sa.String(128), primary_key=True),
            sa.Column("since", sa.BigInteger, nullable=False),
            sa.Column("run", sa.Text, nullable=False),
            sa.Column("compacted_at", sa.Float, nullable=False),
        ], []),
        ("upsert_catalog_locks", [
            sa.Column("shard_id", sa.String(128), primary_key=True),
            sa.Column("version", sa.BigInteger, nullable=False),
            sa.Column("changed_at", sa.Float, nullable=False),
        ], []),
        ("upsert_gc_claims", [
            sa.Column("path", sa.String(1024), primary_key=True),
            sa.Column("shard_id", sa.String(128), nullable=False),
            sa.Column("claimed_at", sa.Float, nullable=False),
        ], [("ix_upsert_gc_claims_shard_id", ["shard_id"])]),
        ("upsert_replaced_runs", [
            sa.Column("shard_id", sa.String(128), primary_key=True),
            sa.Column("path", sa.String(1024), primary_key=True),
            sa.Column("replaced_at", sa.Float, nullable=False),
        ], []),
        ("upsert_blob_owners", [
            sa.Column("shard_id", sa.String(128), primary_key=True),
            sa.Column("generation", sa.String(64), nullable=False),
            sa.Column("taken_at", sa.Float, nullable=False),
        ], []),
        ("upsert_source_settled", [
            sa.Column("shard_id", sa.String(128), primary_key=True),
            sa.Column("partition", sa.String(512), primary_key=True),
            sa.Column("through_ts", sa.BigInteger, nullable=False),
            sa.Column("binding_digest", sa.String(64), nullable=False),
            sa.Column("names", sa.Text, nullable=False),
        ], []),
        ("upsert_streams", [
            sa.Column("shard_id", sa.String(128), primary_key=True),
            sa.Column("status", sa.String(16), nullable=False),
            sa.Column("version", sa.BigInteger, nullable=False),
            sa.Column("epoch", sa.BigInteger, nullable=False),
            sa.Column("seeked_epoch", sa.BigInteger, nullable=True),
            sa.Column("seek_position", sa.Text, nullable=True),
            sa.Column("changed_by", sa.String(512), nullable=False),
            sa.Column("changed_at", sa.Float, nullable=False),
            sa.Column("reason", sa.Text, nullable=False),
        ], []),
        ("upsert_stream_history", [
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("shard_id", sa.String(128), nullable=False),
            sa.Column("version", sa.BigInteger, nullable=False),
            sa.Column("action", sa.String(32), nullable=False),
            sa.Column("from_status", sa.String(16), nullable=True),
            sa.Column("to_status", sa.String(16), nullable=False),
            sa.Column("epoch", sa.BigInteger, nullable=False),
            sa.Column("actor", sa.String(512), nullable=False),
            sa.Column("at", sa.Float, nullable=False),
            sa.Column("reason", sa.Text, nullable=False),
        ], [("ix_upsert_stream_history_shard_id", ["shard_id"])]),
        ("upsert_frontier_observations", [
            sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
            sa.Column("shard_id", sa.String(128), nullable=False),
            sa.Column("observed_at", sa.Float, nullable=False),
            sa.Column("observer", sa.String(512), nullable=False),
            sa.Column("payload", sa.Text, nullable=False),
        ], [
            ("ix_upsert_frontier_observations_shard_time", ["shard_id", "observed_at"]),
            ("ix_upsert_frontier_observations_shard_id", ["shard_id"]),
        ]),
        ("upsert_frontier_alerts", [
            sa.Column("shard_id", sa.String(128), primary_key=True),
            sa.Column("version", sa.BigInteger, nullable=False),
            sa.Column("state", sa.Text, nullable=False),
        ], []),
    ]


def upgrade() -> None:
    inspector = sa.inspect(op.get_bind())
    present = set(inspector.get_table_names())
    for name, columns, indexes in _tables():
        if name not in present:
            op.create_table(name, *columns)
            existing = set()
        else:
            existing = {index["name"] for index in inspector.get_indexes(name)}
        for index_name, index_columns in indexes:
            if index_name not in existing:
                op.create_index(index_name, name, index_columns)


def downgrade() -> None:
    # Downgrades are not supported: a store goes forward only (docs/upgrading.md).
    raise NotImplementedError("downgrading the consensus store is not supported")
