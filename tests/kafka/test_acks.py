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
    gaps,
    prefetch_key,
    ranges_digest,
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
        (lambda s: add_partition(s, "p0", 3), "partition 'p0' is already tracked at 10"),
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
