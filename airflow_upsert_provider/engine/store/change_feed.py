"""The change feed's rows in consensus: each shard's change retention, and the cursors of its
incremental consumers (docs/changes.md).

- ``upsert_change_retention``: one row per shard that keeps its batches for a feed, with the
  period in seconds. Compaction reads it and does not advance since past the batches committed
  within that period (table/change_rules.py ``retained_since``). No row: no retention.
- ``upsert_change_cursors``: one row per (shard, consumer): the first ts the consumer has not
  consumed, and the range a run claimed and is delivering. A run claims ``[position, B)`` by
  compare-and-set (one conditional UPDATE checked by its rowcount, or one INSERT that a peer's
  makes fail), delivers it (idempotently: the same range gives the same rows, under the same
  name) and completes it by compare-and-set; a run that finds a claimed range delivers that
  same range and completes it. So ranges are delivered one after the other, never two that
  overlap, and a run that dies after its claim leaves the range to the next one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

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
    # The end of the range [position, pending_to) a run claimed and is delivering; null when
    # none is (every run that finds it set delivers that same range, then completes it).
    sa.Column("pending_to", sa.BigInteger, nullable=True),
    sa.Column("version", sa.BigInteger, nullable=False),
    sa.Column("changed_at", sa.Float, nullable=False),
)


@dataclass(frozen=True)
class ConsumerCursor:
    """A consumer's cursor: ``position`` (the first ts not consumed) and the end of the range a
    run claimed and is delivering (``pending_to``, None when none is)."""

    position: int
    pending_to: int | None


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


def read_cursor(consensus: Consensus, shard_id: str, consumer: str) -> ConsumerCursor | None:
    """The cursor of ``consumer`` on ``shard_id``, None before its first claim."""
    _check_consumer(consumer)
    row = consensus.read_in_snapshot(
        lambda conn: conn.execute(
            sa.select(change_cursors_table.c.position, change_cursors_table.c.pending_to).where(
                change_cursors_table.c.shard_id == shard_id, change_cursors_table.c.consumer == consumer)
        ).first()
    )
    return None if row is None else ConsumerCursor(row.position, row.pending_to)


def claim_range(consensus: Consensus, shard_id: str, consumer: str, expected: ConsumerCursor | None,
                from_ts: int, to_ts: int) -> bool:
    """Claim the range ``[from_ts, to_ts)`` for delivery, iff the cursor is still ``expected``
    with nothing pending (None: a consumer without a cursor yet, whose first range starts at
    ``from_ts``); True if this call claimed it. One conditional UPDATE (or INSERT)."""
    _check_consumer(consumer)
    if to_ts <= from_ts or (expected is not None and (expected.pending_to is not None
                                                      or expected.position != from_ts)):
        raise ConfigurationError(f"cannot claim [{from_ts}, {to_ts}) from cursor {expected}", field="position")

    def txn(conn):
        _known_shard(conn, shard_id)
        if expected is None:
            return insert_ignore(conn, change_cursors_table, shard_id=shard_id, consumer=consumer, position=from_ts,
                                 pending_to=to_ts, version=1, changed_at=time.time())
        return _update_cursor(conn, shard_id, consumer, expected, ConsumerCursor(expected.position, to_ts))

    return consensus.run_in_transaction(txn)


def complete_range(consensus: Consensus, shard_id: str, consumer: str, claimed: ConsumerCursor) -> bool:
    """Move the cursor past the delivered range of ``claimed`` (its ``pending_to``), iff it is
    still ``claimed``; True if this call moved it."""
    _check_consumer(consumer)
    if claimed.pending_to is None:
        raise ConfigurationError(f"cursor {claimed} has no claimed range to complete", field="position")

    def txn(conn):
        return _update_cursor(conn, shard_id, consumer, claimed, ConsumerCursor(claimed.pending_to, None))

    return consensus.run_in_transaction(txn)


def _update_cursor(conn, shard_id: str, consumer: str, expected: ConsumerCursor, new: ConsumerCursor) -> bool:
    table = change_cursors_table
    pending = table.c.pending_to.is_(None) if expected.pending_to is None else table.c.pending_to == expected.pending_to
    return conn.execute(
        sa.update(table)
        .where(table.c.shard_id == shard_id, table.c.consumer == consumer, table.c.position == expected.position,
               pending)
        .values(position=new.position, pending_to=new.pending_to, version=table.c.version + 1,
                changed_at=time.time())
    ).rowcount == 1
