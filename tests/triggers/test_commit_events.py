"""The commit event decision (engine/common/commit_events.py), pure: over seeded histories of
uppers a trigger sees (commits one or many at a time, polls that see nothing new, uppers that
fall back after a restore, history rolled up below since), the events cover every ts from the
start to the highest upper exactly once, in order, with the rows of the batches they cover."""

from __future__ import annotations

import random

from airflow_upsert_provider.engine.common.commit_events import (
    CONTRACT_KEYS,
    CommittedBatch,
    committed_batch,
    next_commit_event,
)

SEEDS = range(400)


def history(rng: random.Random) -> tuple[list[int], dict[int, CommittedBatch], int]:
    """(the uppers seen at each poll, the batch records the store holds, the first ts kept)."""
    uppers, upper = [], rng.randint(0, 5)
    for _ in range(rng.randint(1, 30)):
        step = rng.choice([0, 0, 1, 1, 2, 5])
        upper += step
        if rng.random() < 0.05:
            uppers.append(max(0, upper - rng.randint(1, 4)))  # a restore to an older checkpoint, seen once
        uppers.append(upper)
    truncated_below = rng.choice([0, 0, 0, rng.randint(0, upper)])
    records = {ts: CommittedBatch(ts, rng.randint(0, 50), rng.randint(0, 40), 1000.0 + ts)
               for ts in range(truncated_below, upper + 10)}
    return uppers, records, truncated_below


def replay(start: int, uppers: list[int], records: dict[int, CommittedBatch]) -> list[dict]:
    events, reported = [], start
    for upper in uppers:
        held = [records[ts] for ts in range(reported, upper) if ts in records]
        event = next_commit_event("s", reported, upper, held)
        if event is not None:
            reported = event["to_ts"]
            events.append(event)
    return events


def test_events_cover_every_ts_from_the_start_to_the_highest_upper_once_in_order():
    for seed in SEEDS:
        rng = random.Random(seed)
        uppers, records, kept_from = history(rng)
        start = rng.randint(0, 3)
        events = replay(start, uppers, records)
        covered = [ts for e in events for ts in range(e["from_ts"], e["to_ts"])]
        top = max([start, *uppers])
        assert covered == list(range(start, top)), seed  # each ts once, none skipped, in order
        for before, after in zip(events, events[1:]):
            assert after["from_ts"] == before["to_ts"], seed
        for e in events:
            assert set(CONTRACT_KEYS) <= set(e) and e["schema_version"] is None
            assert (e["upper"], e["upper_before"], e["committed"]) == (e["to_ts"], e["from_ts"],
                                                                       e["to_ts"] - e["from_ts"])
            if e["from_ts"] >= kept_from:
                assert e["rows_out"] == sum(records[ts].rows_out for ts in range(e["from_ts"], e["to_ts"]))
                assert e["rows_in"] == sum(records[ts].rows_in for ts in range(e["from_ts"], e["to_ts"]))
                assert e["committed_at"] == records[e["to_ts"] - 1].committed_at
            else:
                # A batch of the range has no record any more: no sum that leaves it out.
                assert e["rows_out"] is None and e["rows_in"] is None, seed


def test_a_restart_from_the_reported_upper_fires_the_same_events_as_no_restart():
    for seed in SEEDS:
        rng = random.Random(seed)
        uppers, records, _ = history(rng)
        whole = replay(0, uppers, records)
        cut = rng.randint(0, len(uppers))
        first = replay(0, uppers[:cut], records)
        resumed_from = first[-1]["to_ts"] if first else 0
        assert first + replay(resumed_from, uppers[cut:], records) == whole, seed


def test_no_event_while_the_upper_has_not_passed_the_reported_one():
    for reported in range(6):
        for upper in range(reported + 1):
            assert next_commit_event("s", reported, upper, [CommittedBatch(t, 1, 1, 0.0) for t in range(9)]) is None


def test_records_outside_the_range_are_ignored_and_a_missing_one_voids_the_sums():
    batches = [CommittedBatch(t, 10, 1, float(t)) for t in range(0, 8)]
    event = next_commit_event("s", 3, 6, batches)
    assert (event["from_ts"], event["to_ts"], event["rows_out"], event["rows_in"]) == (3, 6, 3, 30)
    event = next_commit_event("s", 3, 6, [b for b in batches if b.ts != 4])
    assert event["rows_out"] is None and event["committed_at"] == 5.0


def test_a_batch_records_stats_are_read_as_numbers_or_none():
    assert committed_batch(3, {"rows_in": "7", "rows_out": 5}, 9.5) == CommittedBatch(3, 7, 5, 9.5)
    assert committed_batch(3, {}, None) == CommittedBatch(3, None, None, None)
    event = next_commit_event("s", 3, 4, [committed_batch(3, {"rows_in": 2}, 1.0)])
    assert event["rows_in"] == 2 and event["rows_out"] is None
