"""A Kafka shard's consumer group follows the writer's commits (invariant 13).

The glue between a writer and its :class:`GroupCommitter`: when the writer starts (or starts
again in a new epoch) the committer tracks the shard's bound offsets at the upper; after each
step that moved the upper, every batch from the last one acknowledged up to the new upper is
acknowledged in ts order, including batches a peer committed (the upper can move by several
at once). Acknowledging only the writer's own batch would leave a hole the contiguous end
never passes, the silent block invariant 13 forbids.
"""

from __future__ import annotations

import logging
from typing import Protocol

from airflow_upsert_provider.engine.lifecycle.group_offsets import GroupCommitter
from airflow_upsert_provider.engine.table.shard import Shard

log = logging.getLogger(__name__)


class Committed(Protocol):
    """What a writer reports after a commit step (its BatchResult): the shard's upper then."""

    upper: int


class UpperFollower:
    """Acknowledges the batches below the shard's upper to a group committer, once each."""

    def __init__(self, shard: Shard, committer: GroupCommitter) -> None:
        self.shard = shard
        self.committer = committer
        self.acknowledged_upper: int | None = None

    def start(self, epoch: int) -> None:
        """Track from the upper as it is now, in ``epoch``."""
        shard = self.shard
        upper = shard.state().upper
        self.committer.start(epoch, shard.bound_offsets(upper))
        self.acknowledged_upper = upper

    def __call__(self, result: Committed, epoch: int) -> None:
        if self.acknowledged_upper is None or epoch != self.committer.epoch:
            self.start(epoch)
            return
        shard = self.shard
        for ts in range(self.acknowledged_upper, result.upper):
            binding = shard.binding(ts)
            if binding is None:  # cannot happen below the upper; never fake contiguity
                log.error("shard %s: batch %s is below the upper but has no binding", shard.shard_id, ts)
                return
            self.committer.acknowledge(epoch, binding.ranges)
            self.acknowledged_upper = ts + 1


def follow_upper(shard: Shard) -> UpperFollower:
    """A group committer for ``shard`` (a Kafka shard's) that follows its upper; the writer calls
    it after each commit step."""
    return UpperFollower(shard, GroupCommitter.for_shard(shard))
