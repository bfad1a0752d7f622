"""Upstream offset acknowledgement and prefetch keying as pure decisions (invariants 12 and 13).

Offsets committed upstream (a Kafka consumer group) are only ever the end of a contiguous
acknowledged range. ``AckState`` tracks, per partition, that end (``committed``: the next
offset to read, as a group offset means it) and the acknowledged ranges above it, all under
one recovery epoch. ``acknowledge`` moves ``committed`` only when an acknowledgement makes
the range contiguous; acknowledgements from an earlier epoch or wholly below ``committed``
are ignored and can never fake contiguity. A gap (acknowledged offsets above a missing one)
records since when it exists, so that one that persists turns into an alert instead of a
silent block (``GroupCommitter`` in group_offsets.py).

A recovery starts a new epoch (the committer tracks from the seek's positions again): a late
acknowledgement from before it is refused by its epoch.

Prefetched data is keyed by ``PrefetchKey(epoch, ts, ranges digest)``; ``usable`` says
whether it may be consumed for the current epoch and binding, and why not. Data fetched
before a seek never matches the epoch after it; data fetched after it always does.

Ranges are half-open ``[from_offset, to_offset)``, as in a binding. Times are seconds passed
in by the caller; nothing here reads a clock or touches a store.
"""

from __future__ import annotations

import enum
import hashlib
import json
from dataclasses import dataclass, replace
from typing import Any, Mapping, Protocol

Range = tuple[int, int]


def _offset(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an integer offset, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return value


def _epoch(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer epoch, got {value!r}")
    return value


def _time(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds, got {value!r}")
    return float(value)


def _partition(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"partition must be a non-empty string, got {value!r}")
    return value


@dataclass(frozen=True)
class PartitionAcks:
    """One partition: the contiguous end and the acknowledged ranges above it.

    ``ranges`` are disjoint, sorted, not adjacent to each other and all start above
    ``committed`` (a range reaching ``committed`` is absorbed into it). ``gap_since`` is when
    the current gap opened (None while ``ranges`` is empty)."""

    partition: str
    committed: int
    ranges: tuple[Range, ...] = ()
    gap_since: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "committed": self.committed,
            "acknowledged_above": [list(r) for r in self.ranges],
            "gap_since": self.gap_since,
        }


@dataclass(frozen=True)
class AckState:
    """Every tracked partition of one source, under one recovery epoch. Immutable: every
    function returns a new state."""

    epoch: int
    partitions: tuple[PartitionAcks, ...] = ()
    # Where the epoch began: the positions of its seek (or of ``track``), sorted by partition.
    started: tuple[tuple[str, int], ...] = ()

    def get(self, partition: str) -> PartitionAcks:
        for p in self.partitions:
            if p.partition == partition:
                return p
        raise KeyError(f"partition {partition!r} is not tracked (tracked: {self.names()})")

    def names(self) -> list[str]:
        return [p.partition for p in self.partitions]

    def to_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "started": dict(self.started),
                "partitions": [p.to_dict() for p in self.partitions]}


def _with(state: AckState, updated: PartitionAcks) -> AckState:
    others = [p for p in state.partitions if p.partition != updated.partition]
    return replace(state, partitions=tuple(sorted([*others, updated], key=lambda p: p.partition)))


def track(epoch: int, positions: Mapping[str, int]) -> AckState:
    """A new state in ``epoch`` with each partition committed at its position (the group's
    committed offset, or the shard's upper)."""
    _epoch("epoch", epoch)
    state = AckState(epoch)
    for partition, position in positions.items():
        state = add_partition(state, partition, position)
    return replace(state, started=tuple(sorted(positions.items())))


def add_partition(state: AckState, partition: str, committed: int) -> AckState:
    """Start tracking a partition that appeared (a topic grew) at ``committed``."""
    _partition(partition)
    _offset(f"committed offset of partition {partition!r}", committed)
    if partition in state.names():
        raise ValueError(f"partition {partition!r} is already tracked at {state.get(partition).committed}")
    return _with(state, PartitionAcks(partition, committed))


def committed(state: AckState, partition: str) -> int:
    """The group offset of ``partition``: the end of its contiguous acknowledged range."""
    return state.get(partition).committed


def committed_offsets(state: AckState) -> dict[str, int]:
    """Every partition's group offset, ready to commit as a whole."""
    return {p.partition: p.committed for p in state.partitions}


class Ignored(str, enum.Enum):
    """Why an acknowledgement changed nothing."""

    EARLIER_EPOCH = "earlier-epoch"
    BELOW_COMMITTED = "below-committed"
    ALREADY_ACKNOWLEDGED = "already-acknowledged"
    EMPTY = "empty-range"


@dataclass(frozen=True)
class Acknowledged:
    """What one acknowledgement did. ``commit`` is the partition's new group offset when the
    acknowledgement moved the contiguous end, else None (nothing new is safe to commit)."""

    state: AckState
    partition: str
    commit: int | None
    ignored: Ignored | None = None

    @property
    def offsets(self) -> dict[str, int]:
        """The offsets now safe to commit, as a group commit takes them (empty if none)."""
        return {} if self.commit is None else {self.partition: self.commit}


def _merge(ranges: tuple[Range, ...], new: Range) -> tuple[Range, ...]:
    merged: list[Range] = []
    lo, hi = new
    for a, b in ranges:
        if b < lo or a > hi:  # disjoint and not adjacent
            merged.append((a, b))
        else:
            lo, hi = min(lo, a), max(hi, b)
    merged.append((lo, hi))
    return tuple(sorted(merged))


def acknowledge(state: AckState, partition: str, from_offset: int, to_offset: int, epoch: int,
                *, now: float) -> Acknowledged:
    """Record that ``[from_offset, to_offset)`` of ``partition`` was processed in ``epoch``.

    An acknowledgement from a later epoch than the state's is refused (ValueError): the seek
    that began that epoch must be applied first, or its offsets would count against the old
    position."""
    _partition(partition)
    _offset("from_offset", from_offset)
    _offset("to_offset", to_offset)
    _epoch("epoch", epoch)
    now = _time("now", now)
    if to_offset < from_offset:
        raise ValueError(f"to_offset {to_offset} is below from_offset {from_offset} for partition {partition!r}")
    if epoch > state.epoch:
        raise ValueError(
            f"acknowledgement of partition {partition!r} [{from_offset}, {to_offset}) is from epoch {epoch}, "
            f"ahead of the tracked epoch {state.epoch}: apply that epoch's seek first"
        )
    current = state.get(partition)

    def unchanged(why: Ignored) -> Acknowledged:
        return Acknowledged(state, partition, None, why)

    if epoch < state.epoch:
        # Fetched before a seek: those offsets are read again in this epoch.
        return unchanged(Ignored.EARLIER_EPOCH)
    if from_offset == to_offset:
        return unchanged(Ignored.EMPTY)
    if to_offset <= current.committed:
        return unchanged(Ignored.BELOW_COMMITTED)
    lo = max(from_offset, current.committed)
    if any(a <= lo and to_offset <= b for a, b in current.ranges):
        return unchanged(Ignored.ALREADY_ACKNOWLEDGED)

    ranges = _merge(current.ranges, (lo, to_offset))
    end = current.committed
    if ranges[0][0] <= end:
        end = ranges[0][1]
        ranges = ranges[1:]
    if end > current.committed:
        # The frontier moved: a gap left above it is a new one, timed from now.
        since = now if ranges else None
    else:
        since = current.gap_since if current.gap_since is not None else now
    updated = PartitionAcks(partition, end, ranges, since)
    return Acknowledged(_with(state, updated), partition, end if end > current.committed else None)


@dataclass(frozen=True)
class Gap:
    """Acknowledged offsets above a missing one: the group offset cannot move past
    ``committed`` until ``[committed, first_acknowledged)`` is acknowledged."""

    partition: str
    committed: int
    first_acknowledged: int
    since: float

    @property
    def missing(self) -> int:
        return self.first_acknowledged - self.committed

    def age(self, now: float) -> float:
        return now - self.since

    def describe(self, now: float | None = None) -> str:
        text = (f"partition {self.partition}: committed offset {self.committed}, "
                f"offsets acknowledged from {self.first_acknowledged} "
                f"({self.missing} unacknowledged in between)")
        if now is not None:
            text += f", blocked for {self.age(now):.0f}s"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "committed": self.committed,
            "first_acknowledged": self.first_acknowledged,
            "missing": self.missing,
            "since": self.since,
        }


def gaps(state: AckState) -> list[Gap]:
    """Every partition whose group offset is held back by a missing acknowledgement."""
    return [
        Gap(p.partition, p.committed, p.ranges[0][0], p.gap_since if p.gap_since is not None else 0.0)
        for p in state.partitions
        if p.ranges
    ]


class BindingLike(Protocol):
    ts: int
    ranges: Mapping[str, Mapping[str, Any]]


def ranges_digest(ranges: Mapping[str, Mapping[str, Any]]) -> str:
    """A digest of what a binding reads: each partition's ``[from, to)``."""
    canonical = {str(p): [int(r["from"]), int(r["to"])] for p, r in ranges.items()}
    return hashlib.sha256(json.dumps(canonical, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class PrefetchKey:
    """What prefetched data was fetched for: the recovery epoch and the binding."""

    epoch: int
    ts: int
    ranges_digest: str

    def to_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "ts": self.ts, "ranges_digest": self.ranges_digest}


def prefetch_key(epoch: int, binding: BindingLike) -> PrefetchKey:
    """The key to store with data fetched for ``binding`` in ``epoch``."""
    _epoch("epoch", epoch)
    return PrefetchKey(epoch, binding.ts, ranges_digest(binding.ranges))


class Unusable(str, enum.Enum):
    EPOCH_CHANGED = "epoch-changed"
    OTHER_BATCH = "other-batch"
    OTHER_RANGES = "other-ranges"
    NO_BINDING = "no-binding"


@dataclass(frozen=True)
class Usability:
    usable: bool
    reason: Unusable | None = None
    message: str = ""


def usable(prefetched_key: PrefetchKey, current_epoch: int, current_binding: BindingLike | None) -> Usability:
    """Whether data prefetched under ``prefetched_key`` may be consumed now, and why not.

    The epoch is compared first: after a seek the same binding may be read again, and only
    the epoch tells data fetched before the seek from data fetched after it."""
    _epoch("current_epoch", current_epoch)
    if prefetched_key.epoch != current_epoch:
        return Usability(False, Unusable.EPOCH_CHANGED,
                         f"prefetched in epoch {prefetched_key.epoch}, the stream is in epoch {current_epoch} "
                         "(a seek happened in between): read it again")
    if current_binding is None:
        return Usability(False, Unusable.NO_BINDING,
                         f"prefetched for batch {prefetched_key.ts}, but no batch is bound")
    if prefetched_key.ts != current_binding.ts:
        return Usability(False, Unusable.OTHER_BATCH,
                         f"prefetched for batch {prefetched_key.ts}, the batch bound now is {current_binding.ts}")
    if prefetched_key.ranges_digest != ranges_digest(current_binding.ranges):
        return Usability(False, Unusable.OTHER_RANGES,
                         f"prefetched for other ranges of batch {prefetched_key.ts} than its binding holds")
    return Usability(True)
