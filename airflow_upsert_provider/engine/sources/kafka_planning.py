"""Planning binding(ts) of a Kafka source: pure decisions over offsets, no broker or store.

A Kafka binding's range of a partition is ``{"from": f, "to": t, "count": t - f}``, the
half-open offsets ``[f, t)`` batch ts reads. It starts where binding(ts-1) ended (a partition
no binding named yet starts at its low watermark: the first offset the topic still holds) and
ends at most at the high watermark. A batch binds at most ``max_records`` offsets over all
partitions, shared so that every partition with a backlog advances in every batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class LostOffsets:
    """Offsets the shard still has to read that retention already deleted."""

    partition: str
    start: int
    low_watermark: int


def start_offsets(previous: Mapping[str, Mapping[str, Any]], marks: Mapping[str, tuple[int, int]]) -> dict[str, int]:
    """Where each partition's next range starts: binding(ts-1)'s ``to``; a partition no
    binding names yet (a new shard, or a partition added to the topic) starts at its low
    watermark. Partitions a binding names keep their frontier even if the topic stops listing
    them."""
    starts = {p: int(r["to"]) for p, r in previous.items()}
    for partition, (low, _) in marks.items():
        starts.setdefault(partition, low)
    return dict(sorted(starts.items(), key=lambda item: partition_order(item[0])))


def lost_offsets(starts: Mapping[str, int], marks: Mapping[str, tuple[int, int]]) -> list[LostOffsets]:
    """Partitions whose next offset is below the low watermark: records the shard never read
    are gone. Binding past them would skip them silently; the caller refuses instead."""
    return [
        LostOffsets(p, start, marks[p][0])
        for p, start in starts.items()
        if p in marks and start < marks[p][0]
    ]


def share_budget(backlog: Mapping[str, int], budget: int) -> dict[str, int]:
    """How many offsets each partition binds out of ``budget``: an equal share each, and what
    a partition with a smaller backlog leaves over goes to the others (water filling).
    Deterministic: any remainder goes to the lowest partitions first."""
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    taken = {p: 0 for p in backlog}
    waiting = sorted((p for p, n in backlog.items() if n > 0), key=partition_order)
    left = budget
    while waiting and left > 0:
        share, extra = divmod(left, len(waiting))
        still = []
        for i, partition in enumerate(waiting):
            want = backlog[partition] - taken[partition]
            give = min(want, share + (1 if i < extra else 0))
            taken[partition] += give
            left -= give
            if taken[partition] < backlog[partition]:
                still.append(partition)
        if len(still) == len(waiting):
            break  # every partition took its full share: the budget is spent
        waiting = still
    return taken


def plan_ranges(
    previous: Mapping[str, Mapping[str, Any]],
    marks: Mapping[str, tuple[int, int]],
    max_records: int,
) -> dict[str, dict[str, int]] | None:
    """The ranges of the next binding, or None when no partition holds anything beyond
    ``previous``. ``marks`` is ``{partition: (low, high)}``; the caller has refused
    :func:`lost_offsets` first."""
    starts = start_offsets(previous, marks)
    backlog = {p: max(0, marks[p][1] - start) if p in marks else 0 for p, start in starts.items()}
    taken = share_budget(backlog, max_records)
    if not any(taken.values()):
        return None
    return {p: {"from": start, "to": start + taken[p], "count": taken[p]} for p, start in starts.items()}


def partition_order(partition: str) -> tuple[int, str]:
    """Kafka partitions are numbers: 2 sorts before 10."""
    return (int(partition), partition) if partition.isdigit() else (1 << 62, partition)
