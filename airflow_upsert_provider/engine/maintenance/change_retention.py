"""The change retention of a shard: compaction keeps the batches a change feed needs for a
period as runs of their own (docs/changes.md).

A feed of ``[A, B)`` needs ``A >= since`` (change_rules.py). With a retention of ``keep``
seconds, compaction advances since at most to the first batch committed within the last
``keep`` seconds (:func:`held_since`), so every batch of the period stays above since: a live
run, which GC never deletes, whose batch row the history keeps (it keeps every row from
since - 1 on). What it costs is those runs: a read merges them until they age out, and their
files stay on disk (:func:`retention_cost`).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Sequence

from airflow_upsert_provider.engine.store.change_feed import change_retention
from airflow_upsert_provider.engine.store.consensus import Consensus
from airflow_upsert_provider.engine.store.records import BatchRecord
from airflow_upsert_provider.engine.table.change_rules import retained_since, retention_start


def held_since(consensus: Consensus, shard_id: str, batches: Sequence[BatchRecord], target: int,
               now: float | None = None) -> int:
    """The since a compaction of ``shard_id`` aiming at ``target`` may advance to: ``target``,
    or lower when the shard's change retention holds the batches committed within its period
    (``batches``: those from the current since up to ``target`` at least)."""
    keep = change_retention(consensus, shard_id)
    return retained_since(target, [(b.ts, b.committed_at) for b in batches],
                          time.time() if now is None else now, keep)


@dataclass(frozen=True)
class RetentionCost:
    """What a shard's change retention holds now: the batches from ``held_from`` on (None:
    none) that compaction may not merge, their runs and bytes."""

    keep_seconds: float | None
    held_from: int | None
    runs: int
    bytes: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def retention_cost(consensus: Consensus, shard_id: str, now: float | None = None) -> RetentionCost:
    """The change retention of ``shard_id`` and what it holds now (one snapshot of the batches
    above since)."""
    keep = change_retention(consensus, shard_id)
    if keep is None:
        return RetentionCost(None, None, 0, 0)  # nothing held: the batches are not read
    batches = consensus.live_view(shard_id).batches
    start = retention_start([(b.ts, b.committed_at) for b in batches], time.time() if now is None else now, keep)
    held = [] if start is None else [b for b in batches if b.ts >= start]
    return RetentionCost(keep, start, len(held), sum(f["bytes"] for b in held for f in b.run.get("files", [])))
