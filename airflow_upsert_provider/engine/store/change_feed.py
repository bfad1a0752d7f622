"""The change feed's rows in consensus: each shard's change retention, and the cursors of its
incremental consumers (docs/changes.md).

- ``upsert_change_retention``: one row per shard that keeps its batches for a feed, with the
  period in seconds. Compaction reads it and does not advance since past the batches committed
  within that period (table/change_rules.py ``retained_since``). No row: no retention.
- ``upsert_change_cursors``: one row per (shard, consumer): the first ts the consumer has not
  consumed, with a version. A consumer advances it by compare-and-set from the cursor it read
  (one conditional UPDATE checked by its rowcount, or one INSERT that a peer's makes fail), so
  two runs of one consumer that read the same range never both deliver it.
"""

from __future__ import annotations

import time

import sqlalchemy as sa

from airflow_upsert_provider.engine.errors import ConfigurationError, ShardNotFound
from airflow_upsert_provider.engine.store.consensus import Consensus, insert_ignore, shard_exists
from airflow_upsert_provider.engine.store.tables import metadata

change_retention_table = sa.Table(
    "upsert_change_retention",
    metadata,
    sa.Column("shard_id", sa.String(128), primary_key=True),
    sa.Column("keep_seconds", sa.Float, nullable=False),
    sa.Column("changed_at", sa.Float, nullable=False),
)

change_cursors_table = sa.Table(
    "upsert_change_cursors",
    metadata,
    sa.Column("shard_id", sa.String(128), primary_key=True),
    sa.Column("consumer", sa.String(250), primary_key=True),
    # The first ts this consumer has not consumed.
    sa.Column("position", sa.BigInteger, nullable=False),
    sa.Column("version", sa.BigInteger, nullable=False),
    sa.Column("changed_at", sa.Float, nullable=False),
)


def _known_shard(conn, shard_id: str) -> None:
    if not shard_exists(conn, shard_id):
        raise ShardNotFound(f"unknown shard {shard_id!r}", shard=shard_id)


def change_retention(consensus: Consensus, shard_id: str) -> float | None:
    """The change retention of ``shard_id`` in seconds, None when it has none."""
    return consensus.read_in_snapshot(
        lambda conn: conn.execute(
            sa.select(change_retention_table.c.keep_seconds).where(change_retention_table.c.shard_id == shard_id)
        ).scalar()
    )


def set_change_retention(consensus: Consensus, shard_id: str, keep_seconds: float | None) -> None:
    """Set (or, with None, remove) the change retention of ``shard_id``."""
    if keep_seconds is not None and not keep_seconds > 0:
        raise ConfigurationError(f"change retention must be longer than zero, got {keep_seconds!r}", field="keep")

    def txn(conn):
        _known_shard(conn, shard_id)
        conn.execute(sa.delete(change_retention_table).where(change_retention_table.c.shard_id == shard_id))
        if keep_seconds is not None:
            conn.execute(sa.insert(change_retention_table).values(
                shard_id=shard_id, keep_seconds=float(keep_seconds), changed_at=time.time()))

    consensus.run_in_transaction(txn)


def _check_consumer(consumer: str) -> str:
    if not isinstance(consumer, str) or not consumer.strip() or len(consumer) > 250:
        raise ConfigurationError(f"a consumer name is 1 to 250 characters, got {consumer!r}", field="consumer")
    return consumer


def read_cursor(consensus: Consensus, shard_id: str, consumer: str) -> int | None:
    """The cursor of ``consumer`` on ``shard_id`` (the first ts it has not consumed), None
    before its first advance."""
    _check_consumer(consumer)
    return consensus.read_in_snapshot(
        lambda conn: conn.execute(
            sa.select(change_cursors_table.c.position).where(
                change_cursors_table.c.shard_id == shard_id, change_cursors_table.c.consumer == consumer)
        ).scalar()
    )


def advance_cursor(consensus: Consensus, shard_id: str, consumer: str, expected: int | None, position: int) -> bool:
    """Move the cursor of ``consumer`` from ``expected`` (None: it has none yet) to
    ``position``, iff it is still ``expected``; True if this call moved it. A cursor only
    advances."""
    _check_consumer(consumer)
    if expected is not None and position <= expected:
        raise ConfigurationError(f"a consumer cursor only advances: {expected} -> {position}", field="position")

    def txn(conn):
        _known_shard(conn, shard_id)
        if expected is None:
            return insert_ignore(conn, change_cursors_table, shard_id=shard_id, consumer=consumer,
                                 position=position, version=1, changed_at=time.time())
        return conn.execute(
            sa.update(change_cursors_table)
            .where(change_cursors_table.c.shard_id == shard_id, change_cursors_table.c.consumer == consumer,
                   change_cursors_table.c.position == expected)
            .values(position=position, version=change_cursors_table.c.version + 1, changed_at=time.time())
        ).rowcount == 1

    return consensus.run_in_transaction(txn)
