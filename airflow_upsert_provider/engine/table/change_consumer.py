"""An incremental consumer of a shard's change feed: each run delivers the changes of the
batches it has not delivered yet, exactly once, whatever the events that triggered it
(docs/changes.md, "Incremental consumers").

The decision is pure (``change_rules.plan_consumer_read``); this is its shell around the
consumer's cursor in consensus (store/change_feed.py): claim the range by compare-and-set,
deliver it, complete it by compare-and-set. A delivery is idempotent: the feed of one range is
always the same rows, written under a name made of the range (:func:`changes_file_name`) and
renamed into place whole, so a run that finds a range claimed by a run that died delivers the
same file again, and no two delivered files overlap.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from airflow_upsert_provider.engine.common.atomic_file import replacing
from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.engine.store.change_feed import (
    ConsumerCursor,
    claim_range,
    complete_range,
    read_cursor,
)
from airflow_upsert_provider.engine.table.change_rules import plan_consumer_read
from airflow_upsert_provider.engine.table.changes import read_changes

if TYPE_CHECKING:
    import pyarrow

    from airflow_upsert_provider.engine.table.shard import Shard

# Rounds of claim and delivery one run makes at most: a range an earlier run left claimed,
# then its own, and one more for a peer that claimed in between.
MAX_ROUNDS = 3

Deliver = Callable[[int, int, "pyarrow.RecordBatchReader"], None]


def changes_file_name(from_ts: int, to_ts: int) -> str:
    """The file a range's changes are delivered to: ``changes-<from>-<to>.parquet``, zero-padded
    so that names sort as ranges do."""
    return f"changes-{from_ts:012d}-{to_ts:012d}.parquet"


def parquet_files_in(directory: str) -> Deliver:
    """A delivery that writes a range's changes to :func:`changes_file_name` in ``directory``,
    durable and renamed into place whole."""
    import pyarrow.parquet as pq

    def deliver(from_ts: int, to_ts: int, reader: "pyarrow.RecordBatchReader") -> None:
        os.makedirs(directory, exist_ok=True)
        with replacing(os.path.join(directory, changes_file_name(from_ts, to_ts)), hidden=True) as handle:
            with pq.ParquetWriter(handle, reader.schema) as writer:
                for batch in reader:
                    writer.write_batch(batch)

    return deliver


def consume_changes(shard: "Shard", consumer: str, events: Iterable[Mapping[str, Any]],
                    deliver: Deliver, *, start_ts: int | None = None) -> list[tuple[int, int]]:
    """Deliver the changes ``consumer`` has not delivered, given the extras of the Asset events
    that triggered this run; the ranges this run delivered, in order (none when the events
    name nothing new).

    :param start_ts: where the consumer's first read starts (its cursor's first position): the
        ts its downstream holds everything below, e.g. 0 for a consumer of a new shard. None:
        at the lowest ``from_ts`` of the events that trigger its first run (docs/changes.md,
        "Where a consumer starts"). Ignored once the consumer has a cursor.
    """
    if start_ts is not None and (isinstance(start_ts, bool) or not isinstance(start_ts, int) or start_ts < 0):
        raise ConfigurationError(f"start_ts must be a ts (an integer >= 0), got {start_ts!r}", field="start_ts")
    extras = [dict(e) for e in events]
    delivered: list[tuple[int, int]] = []
    for _ in range(MAX_ROUNDS):
        cursor = read_cursor(shard.consensus, shard.shard_id, consumer)
        plan = plan_consumer_read(cursor.position if cursor else start_ts, cursor.pending_to if cursor else None, extras)
        if plan.empty:
            break
        if plan.claimed:
            claimed = cursor
        elif claim_range(shard.consensus, shard.shard_id, consumer, cursor, plan.from_ts, plan.to_ts):
            claimed = ConsumerCursor(plan.from_ts, plan.to_ts)
        else:
            continue  # a peer run claimed first: deliver what it claimed
        deliver(plan.from_ts, plan.to_ts, read_changes(shard, plan.from_ts, plan.to_ts))
        # False: a peer delivered the same range and completed it first; the file is the same.
        complete_range(shard.consensus, shard.shard_id, consumer, claimed)
        delivered.append((plan.from_ts, plan.to_ts))
    return delivered
