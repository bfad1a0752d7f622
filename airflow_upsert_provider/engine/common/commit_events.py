"""A shard's commits as events (docs/events.md): the payload an upsert operator's Asset event
and the commit event trigger both carry, and the trigger's decision of what to fire.

Pure. The contract's keys: ``from_ts`` and ``to_ts`` (the committed ts range, ``to_ts``
exclusive: the upper before and after), ``rows_out``, and ``schema_version`` (the shard's table
schema version at ``to_ts``; None until the store keeps schema versions), beside ``upper``,
``upper_before``, ``committed``, ``rows_in``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

CONTRACT_KEYS = ("from_ts", "to_ts", "rows_out", "schema_version")


def commit_range(from_ts: int, to_ts: int, rows_out: int | None, schema_version: int | None = None) -> dict[str, Any]:
    """The contract's keys for the commits of ts ``from_ts`` to ``to_ts`` (exclusive)."""
    return {"from_ts": from_ts, "to_ts": to_ts, "rows_out": rows_out, "schema_version": schema_version}


class CommittedBatch(NamedTuple):
    """What an event needs of one committed batch (the store's batch record)."""

    ts: int
    rows_in: int | None
    rows_out: int | None
    committed_at: float | None


def next_commit_event(
    shard: str, reported_upper: int, store_upper: int, batches: Sequence[CommittedBatch],
    schema_version: int | None = None,
) -> dict[str, Any] | None:
    """The event to fire for ``shard``, whose events so far covered every ts below
    ``reported_upper``, now that the store's upper is ``store_upper`` and ``batches`` are
    the records it holds of ts in [reported_upper, store_upper): one event for the whole range,
    None when the upper has not passed ``reported_upper`` (an upper lower than it, e.g. a
    shard restored from an older checkpoint, fires nothing: a ts is never reported twice).

    Rows are summed over the range; None when a batch of it has no record any more (history
    rolled up below since) rather than a sum that leaves it out.
    """
    if store_upper <= reported_upper:
        return None
    by_ts = {b.ts: b for b in batches if reported_upper <= b.ts < store_upper}
    complete = len(by_ts) == store_upper - reported_upper

    def total(field: str) -> int | None:
        values = [getattr(b, field) for b in by_ts.values()]
        if not complete or any(v is None for v in values):
            return None
        return sum(int(v) for v in values)

    newest = by_ts.get(store_upper - 1)
    return {
        "shard": shard,
        **commit_range(reported_upper, store_upper, total("rows_out"), schema_version),
        "upper": store_upper,
        "upper_before": reported_upper,
        "committed": store_upper - reported_upper,
        "rows_in": total("rows_in"),
        "committed_at": None if newest is None else newest.committed_at,
    }


def committed_batch(ts: int, stats: Mapping[str, Any], committed_at: float | None) -> CommittedBatch:
    """A batch record's numbers (``BatchRecord.stats``: rows_in, rows_out) as the decision reads them."""
    rows_in, rows_out = stats.get("rows_in"), stats.get("rows_out")
    return CommittedBatch(ts, None if rows_in is None else int(rows_in), None if rows_out is None else int(rows_out),
                          committed_at)
