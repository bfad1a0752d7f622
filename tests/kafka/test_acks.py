"""Contiguous upstream offsets and prefetch keying (engine/lifecycle/acks.py), as pure decisions
(invariant 13 and the Faust #596 failure: a gap must never block commits silently, and data
fetched before a seek must never be consumed after it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from airflow_upsert_provider.engine.lifecycle.acks import (
    AckState,
    Ignored,
    PrefetchKey,
    Unusable,
    acknowledge,
    add_partition,
    committed,
    committed_offsets,
    gap_alerts,
    gaps,
    prefetch_key,
    ranges_digest,
    seek,
    track,
    usable,
)

EPOCH = 1_700_000_000_000
T0 = 1_800_000_000.0


def ack(state: AckState, partition: str, lo: int, hi: int, epoch: int = EPOCH, now: float = T0):
    return acknowledge(state, partition, lo, hi, epoch, now=now)


def ack_all(state: AckState, acks: list[tuple[int, int]], epoch: int = EPOCH) -> tuple[AckState, list[int | None]]:
    commits = []
    for lo, hi in acks:
        result = ack(state, "p0", lo, hi, epoch)
        state = result.state
        commits.append(result.commit)
    return state, commits


def test_the_issues_contiguity_case() -> None:
    state = track(EPOCH, {"p0": 10})
    first = ack(state, "p0", 11, 12)
    second = ack(first.state, "p0", 12, 13)
    assert (first.commit, second.commit) == (None, None)
    assert first.offsets == second.offsets == {}
    assert committed(second.state, "p0") == 10

    closing = ack(second.state, "p0", 10, 11)
    assert closing.commit == 13
    assert closing.offsets == {"p0": 13}
    assert committed(closing.state, "p0") == 13
    assert closing.state.get("p0").ranges == ()
    assert gaps(closing.state) == []


def test_state_is_never_changed_in_place() -> None:
    state = track(EPOCH, {"p0": 10})
    after = ack(state, "p0", 10, 20).state
    assert committed(state, "p0") == 10
    assert committed(after, "p0") == 20


@pytest.mark.parametrize(
    ("acks", "commits", "end", "above"),
    [
        # overlapping ranges merge; the one reaching the end closes the whole run
        ([(12, 15), (14, 18), (10, 13)], [None, None, 18], 18, ()),
        # a range reaching below the committed offset is clipped to it and still counts
        ([(5, 12)], [12], 12, ()),
        # an exact duplicate above the end changes nothing
        ([(12, 14), (12, 14)], [None, None], 10, ((12, 14),)),
        # a range inside an acknowledged one changes nothing
        ([(12, 20), (13, 15)], [None, None], 10, ((12, 20),)),
        # a duplicate of an already committed range changes nothing
        ([(10, 14), (10, 14), (11, 13)], [14, None, None], 14, ()),
        # adjacent ranges above the end join into one
        ([(12, 14), (14, 16)], [None, None], 10, ((12, 16),)),
        # a range spanning two separate ones joins them, and the end stays until 10..12 arrives
        ([(12, 13), (16, 18), (12, 17), (10, 12)], [None, None, None, 18], 18, ()),
        # closing only the lowest gap commits up to the next one
        ([(11, 12), (13, 14), (10, 11)], [None, None, 12], 12, ((13, 14),)),
    ],
)
def test_overlapping_and_duplicate_acknowledgements(acks, commits, end, above) -> None:
    state, seen = ack_all(track(EPOCH, {"p0": 10}), acks)
    assert seen == commits
    assert committed(state, "p0") == end
    assert state.get("p0").ranges == above


@pytest.mark.parametrize(
    ("lo", "hi", "epoch", "why"),
    [
        (10, 11, EPOCH - 1, Ignored.EARLIER_EPOCH),  # would close the gap, but from before the seek
        (5, 10, EPOCH, Ignored.BELOW_COMMITTED),
        (0, 3, EPOCH, Ignored.BELOW_COMMITTED),
        (11, 11, EPOCH, Ignored.EMPTY),
        (11, 12, EPOCH, Ignored.ALREADY_ACKNOWLEDGED),
    ],
)
def test_ignored_acknowledgements_never_fake_contiguity(lo, hi, epoch, why) -> None:
    state = ack(track(EPOCH, {"p0": 10}), "p0", 11, 13).state
    result = ack(state, "p0", lo, hi, epoch)
    assert result.ignored is why
    assert result.commit is None
    assert result.state == state
    # Only a real acknowledgement of 10 in this epoch moves the offset.
    assert ack(result.state, "p0", 10, 11).commit == 13


def test_partitions_are_independent() -> None:
    state = track(EPOCH, {"p0": 10, "p1": 0, "p2": 7})
    state = ack(state, "p0", 11, 20).state  # gap at 10 on p0
    moved = ack(state, "p1", 0, 5)
    assert moved.offsets == {"p1": 5}
    state = ack(moved.state, "p2", 7, 9).state
    assert committed_offsets(state) == {"p0": 10, "p1": 5, "p2": 9}
    assert [g.partition for g in gaps(state)] == ["p0"]
    # Closing p0's gap moves p0 only.
    closed = ack(state, "p0", 10, 11)
    assert closed.offsets == {"p0": 20}
    assert committed_offsets(closed.state) == {"p0": 20, "p1": 5, "p2": 9}


def test_gap_alert_fires_only_after_the_limit_and_names_partition_and_offsets() -> None:
    state = track(EPOCH, {"p0": 10, "p1": 4})
    state = ack(state, "p0", 12, 15, now=T0).state
    # A later acknowledgement that leaves the gap open keeps its start time.
    state = ack(state, "p0", 15, 16, now=T0 + 30).state
    state = ack(state, "p1", 4, 9, now=T0 + 30).state  # contiguous: no gap
    limit = 60.0
    assert gap_alerts(state, T0 + 59, limit) == []
    assert gap_alerts(state, T0 + 60, limit) == []  # exactly the limit is not longer than it
    [alert] = gap_alerts(state, T0 + 61, limit)
    assert alert.to_dict() == {"partition": "p0", "committed": 10, "first_acknowledged": 12,
                               "missing": 2, "since": T0}
    assert alert.describe(T0 + 61) == (
        "partition p0: committed offset 10, offsets acknowledged from 12 (2 unacknowledged in between), "
        "blocked for 61s"
    )
    # Closing part of the gap moves the frontier; the gap left above is timed anew.
    state = ack(state, "p0", 10, 11, now=T0 + 100).state
    assert gap_alerts(state, T0 + 120, limit) == []
    [later] = gap_alerts(state, T0 + 161, limit)
    assert (later.committed, later.first_acknowledged, later.since) == (11, 12, T0 + 100)
    # Closed: no gap, no alert however long.
    state = ack(state, "p0", 11, 12, now=T0 + 200).state
    assert committed(state, "p0") == 16
    assert gaps(state) == [] and gap_alerts(state, T0 + 10_000, limit) == []


def test_seek_resets_by_epoch_and_a_repeat_keeps_what_was_acknowledged_since() -> None:
    state = track(EPOCH, {"p0": 10, "p1": 3})
    state = ack(state, "p0", 10, 20).state
    state = ack(state, "p0", 25, 30).state  # acknowledged above a gap in the old epoch
    state = ack(state, "p1", 8, 9).state

    new_epoch = EPOCH + 1
    sought = seek(state, new_epoch, {"p0": 15})
    assert sought.changed and sought.positions == {"p0": 15}
    state = sought.state
    assert state.epoch == new_epoch
    assert committed_offsets(state) == {"p0": 15, "p1": 3}
    # Acknowledgements of the old epoch are gone on every partition: they are read again.
    assert state.get("p0").ranges == () and state.get("p1").ranges == ()
    assert gaps(state) == []

    # A late acknowledgement from before the seek is refused by its epoch.
    assert ack(state, "p0", 15, 40, EPOCH).ignored is Ignored.EARLIER_EPOCH
    state = ack(state, "p0", 17, 19, new_epoch).state

    # The same seek applied again (a resume after it) changes nothing.
    again = seek(state, new_epoch, {"p0": 15})
    assert not again.changed and again.state == state
    assert "already" in again.reason
    # A stale seek changes nothing either.
    stale = seek(state, EPOCH, {"p0": 0})
    assert not stale.changed and stale.state == state
    # A contradicting seek in the same epoch is refused, naming the positions.
    with pytest.raises(ValueError, match=r"began at \{'p0': 15\}.*'p0': 12"):
        seek(state, new_epoch, {"p0": 12})

    assert ack(state, "p0", 15, 17, new_epoch).commit == 19


def test_acknowledgement_ahead_of_the_tracked_epoch_is_refused() -> None:
    state = track(EPOCH, {"p0": 10})
    with pytest.raises(ValueError, match=f"from epoch {EPOCH + 1}, ahead of the tracked epoch {EPOCH}"):
        ack(state, "p0", 10, 11, EPOCH + 1)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda s: acknowledge(s, "p0", 12, 11, EPOCH, now=T0), "to_offset 11 is below from_offset 12"),
        (lambda s: acknowledge(s, "p0", -1, 11, EPOCH, now=T0), "from_offset must be >= 0"),
        (lambda s: acknowledge(s, "p0", 1, "2", EPOCH, now=T0), "to_offset must be an integer"),
        (lambda s: acknowledge(s, "p9", 1, 2, EPOCH, now=T0), "partition 'p9' is not tracked"),
        (lambda s: acknowledge(s, "", 1, 2, EPOCH, now=T0), "partition must be a non-empty string"),
        (lambda s: acknowledge(s, "p0", 1, 2, EPOCH, now="soon"), "now must be a number"),
        (lambda s: gap_alerts(s, T0, -1), "limit must be >= 0"),
        (lambda s: add_partition(s, "p0", 3), "partition 'p0' is already tracked at 10"),
        (lambda s: seek(s, EPOCH + 1, {"p0": -4}), "seek position of partition 'p0' must be >= 0"),
        (lambda s: track(-1, {}), "epoch must be a non-negative integer"),
    ],
)
def test_bad_input_names_the_field(call, message) -> None:
    with pytest.raises((ValueError, TypeError, KeyError), match=message):
        call(track(EPOCH, {"p0": 10}))


def test_a_partition_that_appears_is_tracked_from_its_position() -> None:
    state = add_partition(track(EPOCH, {"p0": 10}), "p1", 0)
    assert ack(state, "p1", 0, 4).offsets == {"p1": 4}


# --- prefetch keying -------------------------------------------------------------------


@dataclass(frozen=True)
class FakeBinding:
    ts: int
    ranges: dict[str, dict[str, Any]]


def binding(ts: int, **ranges: tuple[int, int]) -> FakeBinding:
    return FakeBinding(ts, {p: {"from": lo, "to": hi, "count": hi - lo} for p, (lo, hi) in ranges.items()})


def test_ranges_digest_depends_on_from_and_to_only() -> None:
    a = binding(3, p0=(0, 5), p1=(2, 4))
    same = FakeBinding(3, {"p1": {"from": 2, "to": 4}, "p0": {"from": 0, "to": 5, "files": [[0, "x"]]}})
    assert ranges_digest(a.ranges) == ranges_digest(same.ranges)
    assert ranges_digest(a.ranges) != ranges_digest(binding(3, p0=(0, 6), p1=(2, 4)).ranges)


@pytest.mark.parametrize(
    ("epoch", "current", "reason"),
    [
        (EPOCH, binding(3, p0=(0, 5)), None),
        (EPOCH + 1, binding(3, p0=(0, 5)), Unusable.EPOCH_CHANGED),  # same binding after a seek
        (EPOCH - 1, binding(3, p0=(0, 5)), Unusable.EPOCH_CHANGED),
        (EPOCH, binding(4, p0=(5, 9)), Unusable.OTHER_BATCH),
        (EPOCH, binding(3, p0=(0, 6)), Unusable.OTHER_RANGES),
        (EPOCH, None, Unusable.NO_BINDING),
    ],
)
def test_prefetch_usable(epoch, current, reason) -> None:
    key = prefetch_key(EPOCH, binding(3, p0=(0, 5)))
    verdict = usable(key, epoch, current)
    assert verdict.usable is (reason is None)
    assert verdict.reason is reason
    if reason is Unusable.EPOCH_CHANGED:
        assert f"prefetched in epoch {EPOCH}, the stream is in epoch {epoch}" in verdict.message


# --- Faust #596, driven step by step ---------------------------------------------------


@dataclass
class Consumer:
    """A consumer loop reduced to its decisions: a prefetch slot keyed by (epoch, binding),
    acknowledgements into the tracker, and a record of every offset it processed."""

    acks: AckState
    prefetch: tuple[PrefetchKey, list[int]] | None = None
    processed: list[tuple[int, int]] = field(default_factory=list)  # (epoch, offset)
    group_commits: list[int] = field(default_factory=list)
    dropped: list[Unusable] = field(default_factory=list)

    def fetch(self, epoch: int, b: FakeBinding) -> None:
        lo, hi = b.ranges["p0"]["from"], b.ranges["p0"]["to"]
        self.prefetch = (prefetch_key(epoch, b), list(range(lo, hi)))

    def run_batch(self, epoch: int, b: FakeBinding, now: float) -> None:
        """Consume the bound slice: the prefetch if its key still matches, else fetch again."""
        if self.prefetch is not None:
            verdict = usable(self.prefetch[0], epoch, b)
            if not verdict.usable:
                self.dropped.append(verdict.reason)
                self.prefetch = None
        if self.prefetch is None:
            self.fetch(epoch, b)
        _, offsets = self.prefetch
        self.prefetch = None
        self.processed += [(epoch, o) for o in offsets]
        done = acknowledge(self.acks, "p0", b.ranges["p0"]["from"], b.ranges["p0"]["to"], epoch, now=now)
        self.acks = done.state
        if done.commit is not None:
            self.group_commits.append(done.commit)


def test_faust_596_prefetch_across_a_seek() -> None:
    high_watermark = 20
    e, e1 = EPOCH, EPOCH + 1
    c = Consumer(track(e, {"p0": 0}))
    b1, b2, b3, b4 = binding(1, p0=(0, 5)), binding(2, p0=(5, 10)), binding(3, p0=(10, 15)), binding(4, p0=(15, 20))

    # Epoch e: batch 1 runs, batch 2 is prefetched while batch 1 commits.
    c.run_batch(e, b1, T0)
    c.fetch(e, b2)
    assert c.group_commits == [5]

    # A recovery: new epoch, the seek positions the source at the shard's upper (binding 1's end).
    sought = seek(c.acks, e1, {"p0": 5})
    assert sought.changed
    c.acks = sought.state
    # An acknowledgement of the old prefetch still in flight is refused by its epoch.
    assert acknowledge(c.acks, "p0", 5, 10, e, now=T0 + 1).ignored is Ignored.EARLIER_EPOCH

    # Resume reads batch 2 again; the data fetched before the seek is unusable, for that reason.
    stale_key = c.prefetch[0]
    assert usable(stale_key, e1, b2).reason is Unusable.EPOCH_CHANGED
    c.run_batch(e1, b2, T0 + 2)
    assert c.dropped == [Unusable.EPOCH_CHANGED]

    # Batch 3 is prefetched under the new epoch, then the resume's re-applied seek runs after
    # the fetch (the #596 order): nothing fetched or acknowledged since the seek is lost.
    c.fetch(e1, b3)
    resumed = seek(c.acks, e1, {"p0": 5})
    assert not resumed.changed
    c.acks = resumed.state
    assert usable(c.prefetch[0], e1, b3).usable
    c.run_batch(e1, b3, T0 + 3)
    c.run_batch(e1, b4, T0 + 4)
    assert c.dropped == [Unusable.EPOCH_CHANGED]  # the new-epoch prefetch was consumed, not discarded

    # Every offset at or above the seek point processed exactly once in the new epoch.
    after_seek = [o for epoch, o in c.processed if epoch == e1]
    assert after_seek == list(range(5, high_watermark))
    assert [o for epoch, o in c.processed if epoch == e] == list(range(0, 5))
    # Group commits advance to the high watermark, with no gap left behind.
    assert c.group_commits == [5, 10, 15, 20]
    assert committed(c.acks, "p0") == high_watermark
    assert gaps(c.acks) == []
