"""The rules of the change feed, pure functions of state (docs/changes.md).

A feed of ``[A, B)`` is, per key, the net change between the table as of ``A`` and as of ``B``:
the batches ``A <= ts < B`` are runs of exactly the keys they changed, and the table as of
``A`` says whether such a key existed before. Both are answerable while ``since <= A``: the
batches from since on are runs of their own (compaction merges only those below since) and a
read as of any ts >= since is possible. The change retention keeps since from passing the
batches committed within its period (:func:`retained_since`), so a feed of that period stays
answerable whatever the compactions; GC never deletes a live run, and the history keeps every
batch row from since - 1 on.

Also here: which range an incremental consumer reads next, from its durable cursor and the
Asset events that triggered it (:func:`plan_consumer_read`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_upsert_provider.engine.common.time_text import parse_duration
from airflow_upsert_provider.engine.errors import ConfigurationError, IntegrityError

# The column names of Spark 4.2's change queries (and Delta's change data feed).
CHANGE_TYPE = "_change_type"
COMMIT_VERSION = "_commit_version"
COMMIT_TIMESTAMP = "_commit_timestamp"
CHANGE_COLUMNS = (CHANGE_TYPE, COMMIT_VERSION, COMMIT_TIMESTAMP)
INSERT = "insert"
UPDATE_PREIMAGE = "update_preimage"
UPDATE_POSTIMAGE = "update_postimage"
DELETE = "delete"
CHANGE_TYPES = (INSERT, UPDATE_PREIMAGE, UPDATE_POSTIMAGE, DELETE)

_DAYS = re.compile(r"(\d+)([dw])")


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_changes_range(shard_id: str, from_ts: Any, to_ts: Any, *, since: int, upper: int) -> tuple[int, int]:
    """``(from_ts, to_ts)`` when the feed of ``[from_ts, to_ts)`` is answerable: whole numbers
    with ``since <= from_ts <= to_ts <= upper``; else a :class:`ConfigurationError` naming the
    range, the shard's since and upper, and what to do."""
    for name, value in (("from_ts", from_ts), ("to_ts", to_ts)):
        if not _whole(value) or value < 0:
            raise ConfigurationError(f"{name} must be a batch ts (a whole number >= 0), got {value!r}", field=name)
    shown = f"[{from_ts}, {to_ts})"
    if from_ts > to_ts:
        raise ConfigurationError(f"the change range {shown} of shard {shard_id!r} ends before it starts",
                                 field="from_ts", shard=shard_id)
    if to_ts > upper:
        raise ConfigurationError(
            f"the change range {shown} of shard {shard_id!r} ends past its upper {upper}: batches up to "
            f"{upper - 1} are committed (to_ts is exclusive; leave it out to read up to the upper)",
            field="to_ts", shard=shard_id, from_ts=from_ts, to_ts=to_ts, upper=upper,
        )
    if from_ts < since:
        raise ConfigurationError(
            f"the change range {shown} of shard {shard_id!r} is no longer answerable: compaction merged the "
            f"batches below since {since} (the table as of a ts below it is gone). Read from {since} on, or "
            "keep the batches a feed needs with a change retention (`upsertctl changes retention "
            f"{shard_id} --keep 7d`) before they are compacted",
            field="from_ts", shard=shard_id, from_ts=from_ts, to_ts=to_ts, since=since, upper=upper,
        )
    return from_ts, to_ts


def range_batches(batches: Sequence[Any], from_ts: int, to_ts: int, shard_id: str) -> list[Any]:
    """The batch records (``.ts``, ``.run``, ``.committed_at``) of ``[from_ts, to_ts)`` out of
    ``batches``, in ts order: one per ts. A ts without its batch is an :class:`IntegrityError`
    (invariant 2: every ts below the upper has one)."""
    chosen = sorted((b for b in batches if from_ts <= b.ts < to_ts), key=lambda b: b.ts)
    found = [b.ts for b in chosen]
    expected = list(range(from_ts, to_ts))
    if found != expected:
        missing = next(ts for ts in expected if ts not in set(found))
        raise IntegrityError(
            f"shard {shard_id!r} has no batch record for ts {missing}, inside the change range "
            f"[{from_ts}, {to_ts}) below its upper",
            shard=shard_id, ts=missing,
        )
    return chosen


def net_change(before: Any, after: Any, *, preimages: bool = True, rewritten: bool = True) -> tuple[str, ...]:
    """The change types a key's rows come out with, given its row as of A (``before``) and as
    of B (``after``), each None when the key is absent (or a tombstone) there.

    With ``preimages``: nothing when the row is the same (a rewrite to equal values, or an
    insert deleted again within the range), ``insert``, ``delete`` (with the row as of A), or
    ``update_preimage`` (as of A) then ``update_postimage`` (as of B).

    Without (the values as of A unread): ``rewritten`` says whether a row of the range won as
    of B (False: every one lost to the row as of A, by order value); a present key a range row
    rewrote is an ``update_postimage`` alone, equal values or not, and ``delete`` carries only
    the key."""
    if before is None and after is None:
        return ()
    if before is None:
        return (INSERT,)
    if after is None:
        return (DELETE,)
    if not preimages:
        return (UPDATE_POSTIMAGE,) if rewritten else ()
    return () if before == after else (UPDATE_PREIMAGE, UPDATE_POSTIMAGE)


# -- change retention ------------------------------------------------------------------------


def parse_keep(text: Any, *, field: str = "keep") -> float:
    """Seconds of change retention from ``7d``, ``2w``, ``36h``, ``90m`` or ``3600`` (>0);
    a :class:`ConfigurationError` naming ``field`` and the value otherwise."""
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise ConfigurationError(f"{field}: {text!r} is not a duration (e.g. 7d, 2w, 36h, 90m)", field=field)
    cleaned = str(text).strip().lower()
    match = _DAYS.fullmatch(cleaned)
    if match is not None:
        seconds = int(match.group(1)) * (7 if match.group(2) == "w" else 1) * 86400
        if seconds <= 0:
            raise ConfigurationError(f"{field}: {text!r} must be longer than zero", field=field)
        return float(seconds)
    return parse_duration(cleaned, field=field)


def retention_start(batch_times: Iterable[tuple[int, float]], now: float, keep_seconds: float | None) -> int | None:
    """The lowest ts whose batch was committed within the last ``keep_seconds`` before ``now``,
    among ``batch_times`` (ts, committed_at); None without retention or without such a batch."""
    if keep_seconds is None:
        return None
    cutoff = now - keep_seconds
    held = [ts for ts, committed_at in batch_times if committed_at >= cutoff]
    return min(held) if held else None


def retained_since(target: int, batch_times: Iterable[tuple[int, float]], now: float,
                   keep_seconds: float | None) -> int:
    """The since a compaction aiming at ``target`` may advance to under a change retention of
    ``keep_seconds``: ``target``, or the first ts committed within the period when that is
    lower (its batch and every later one stay runs of their own, above since)."""
    start = retention_start(batch_times, now, keep_seconds)
    return target if start is None else min(target, start)


# -- incremental consumers -------------------------------------------------------------------


@dataclass(frozen=True)
class ConsumerRead:
    """What a consumer run reads: the batches ``[from_ts, to_ts)`` (none when they are equal);
    ``claimed`` when that range was claimed by an earlier run and is delivered again as it is."""

    from_ts: int
    to_ts: int
    claimed: bool = False

    @property
    def empty(self) -> bool:
        return self.from_ts >= self.to_ts


def event_range(extra: Mapping[str, Any]) -> tuple[int, int] | None:
    """The committed ts range ``[from_ts, to_ts)`` an upsert Asset event's extra carries
    (``from_ts``/``to_ts``, or ``upper_before``/``upper`` of events older than those keys); None
    when it carries neither (an event of another producer)."""
    for low, high in (("from_ts", "to_ts"), ("upper_before", "upper")):
        if _whole(extra.get(low)) and _whole(extra.get(high)):
            return int(extra[low]), int(extra[high])
    return None


def plan_consumer_read(position: int | None, pending_to: int | None,
                       events: Iterable[Mapping[str, Any]]) -> ConsumerRead:
    """The range a consumer run reads, from its durable cursor (``position``: the first ts it
    has not consumed, None before its first read; ``pending_to``: the end of a range a run
    claimed and did not complete) and the extras of the Asset events that triggered it.

    A claimed range is read again exactly (its delivery is idempotent: the same range gives the
    same rows under the same name). Otherwise it reads from the cursor up to the highest
    ``to_ts`` any event names: events of overlapping producers carry overlapping ranges, a
    retried producer's event repeats or extends an earlier one, a backfill's may arrive late or
    out of order, and an event may be lost (a producer that committed, then failed before its
    event); reading from the cursor to the newest end covers every one exactly once. A first
    read starts at the lowest ``from_ts`` of its events. Events wholly below the cursor add
    nothing: they were consumed."""
    if position is not None and pending_to is not None:
        return ConsumerRead(position, pending_to, claimed=True)
    ranges = [r for r in (event_range(e) for e in events) if r is not None]
    start = position if position is not None else min((low for low, _ in ranges), default=0)
    end = max((high for _, high in ranges), default=start)
    return ConsumerRead(start, max(start, end))
