"""Incremental consumers of the change feed: the pure decision (which range a run reads, from
its cursor and the events that triggered it) swept over random event sequences, and consumer
runs against a real store and shard over random histories of overlapping, retried, backfilled
and lost producer events, with consumer runs that die after their claim or inside their
delivery and runs that overlap: the delivered files never overlap and, once a last run is
triggered, cover every committed batch exactly once. No Spark is started in this module."""

from __future__ import annotations

import os
import random
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest

from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.engine.store import change_feed
from airflow_upsert_provider.engine.store.change_feed import ConsumerCursor, claim_range, complete_range, read_cursor
from airflow_upsert_provider.engine.table import change_consumer
from airflow_upsert_provider.engine.table.change_consumer import changes_file_name, consume_changes, parquet_files_in
from airflow_upsert_provider.engine.table.change_rules import event_range, plan_consumer_read
from tests.arrow_runs import commit_batch
from tests.changes.test_feed_oracle import expected_feed, feed_rows, random_rows
from tests.conftest import sqlite_only
from tests.helpers import make_shard


def event(from_ts: int, to_ts: int) -> dict:
    return {"upper_before": from_ts, "upper": to_ts, "from_ts": from_ts, "to_ts": to_ts, "committed": 1,
            "rows_in": 1, "rows_out": 1, "schema_version": None}


def random_events(rng: random.Random, upper: int) -> list[dict]:
    """Events whose ranges lie below ``upper``: overlapping, repeated, out of order."""
    events = []
    for _ in range(rng.randrange(0, 5)):
        low = rng.randrange(0, upper + 1)
        events.append(event(low, rng.randrange(low, upper + 1)))
    return events


def test_a_run_reads_from_its_cursor_to_the_newest_end_any_event_names():
    rng = random.Random(1)
    for _ in range(5000):
        upper = rng.randrange(0, 30)
        events = random_events(rng, upper)
        position = rng.choice([None, rng.randrange(0, upper + 1)])
        plan = plan_consumer_read(position, None, events)
        ends = [e["to_ts"] for e in events]
        if position is None:
            assert plan.from_ts == min((e["from_ts"] for e in events), default=0)
        else:
            assert plan.from_ts == position
        assert plan.to_ts == max([plan.from_ts, *ends])
        assert not plan.claimed
        # Nothing below the cursor is read again; nothing an event names above it is left.
        assert all(plan.to_ts >= end for end in ends)
        # A claimed range is read again as it is, whatever the events.
        if position is not None:
            pending = position + rng.randrange(1, 5)
            again = plan_consumer_read(position, pending, events)
            assert (again.from_ts, again.to_ts, again.claimed) == (position, pending, True)


def test_event_ranges_come_from_the_contract_keys_or_the_uppers_of_older_events():
    assert event_range({"from_ts": 2, "to_ts": 5, "upper_before": 0, "upper": 9}) == (2, 5)
    assert event_range({"upper_before": 3, "upper": 4}) == (3, 4)
    assert event_range({"from_ts": None, "to_ts": 5}) is None
    assert event_range({"other": 1}) is None
    assert event_range({"from_ts": True, "to_ts": 5}) is None


@sqlite_only
def test_the_cursor_is_claimed_and_completed_by_compare_and_set(consensus, blob, tmp_path):
    make_shard(consensus, blob, tmp_path)
    assert read_cursor(consensus, "orders", "c") is None
    assert claim_range(consensus, "orders", "c", None, 0, 3)
    assert not claim_range(consensus, "orders", "c", None, 0, 4)  # a peer's first claim lost
    claimed = read_cursor(consensus, "orders", "c")
    assert claimed == ConsumerCursor(0, 3)
    with pytest.raises(ConfigurationError, match="cannot claim"):
        claim_range(consensus, "orders", "c", claimed, 0, 5)
    assert complete_range(consensus, "orders", "c", claimed)
    assert not complete_range(consensus, "orders", "c", claimed)  # completed once
    assert read_cursor(consensus, "orders", "c") == ConsumerCursor(3, None)
    assert not claim_range(consensus, "orders", "c", ConsumerCursor(2, None), 2, 5)  # a stale cursor
    assert read_cursor(consensus, "orders", "other") is None  # per consumer
    with pytest.raises(ConfigurationError, match="unknown shard"):
        claim_range(consensus, "nope", "c", None, 0, 1)


class Died(Exception):
    """A consumer run that died (its worker was lost) at some step."""


def delivered_ranges(directory: str) -> list[tuple[int, int]]:
    names = sorted(n for n in os.listdir(directory) if not n.startswith(".")) if os.path.isdir(directory) else []
    ranges = []
    for name in names:
        low, high = name[len("changes-"):-len(".parquet")].split("-")
        ranges.append((int(low), int(high)))
    return ranges


@sqlite_only
@pytest.mark.parametrize("seed", range(6))
def test_consumer_runs_deliver_every_batch_exactly_once(consensus, blob, tmp_path, monkeypatch, seed):
    rng = random.Random(seed)
    shard = make_shard(consensus, blob, tmp_path, buckets=2, order_by=None)
    out = str(tmp_path / "out")
    history: list[dict] = []
    queued: list[dict] = []  # events not yet handed to a consumer run
    deliveries: list[tuple[int, int]] = []
    real_deliver = parquet_files_in(out)
    real_complete = change_feed.complete_range

    def run_consumer(events: list[dict], *, die: str | None = None, nested: list[dict] | None = None) -> None:
        def deliver(from_ts, to_ts, reader):
            if die == "delivering":
                raise Died
            if nested is not None:
                # Another run of the consumer (a retry beside a zombie) starts while this delivers.
                consume_changes(shard, "report", nested, recording(real_deliver))
            real_deliver(from_ts, to_ts, reader)
            deliveries.append((from_ts, to_ts))

        def complete(*args):
            if die == "completing":
                raise Died
            return real_complete(*args)

        monkeypatch.setattr(change_consumer, "complete_range", complete)
        try:
            consume_changes(shard, "report", events, deliver)
        except Died:
            pass
        finally:
            monkeypatch.setattr(change_consumer, "complete_range", real_complete)

    def recording(inner):
        def deliver(from_ts, to_ts, reader):
            inner(from_ts, to_ts, reader)
            deliveries.append((from_ts, to_ts))
        return deliver

    for _ in range(rng.randrange(6, 14)):
        step = rng.random()
        if step < 0.55:
            # A producer run commits 1-3 batches; its event may repeat (a retry), be lost (it died
            # after committing), or stand for an overlapping producer's range (from an older upper).
            before = shard.state().upper
            for _ in range(rng.randrange(1, 4)):
                rows = random_rows(rng, 8, order=False)
                ts = commit_batch(shard, rows)
                history += [{**r, "_ts": ts} for r in rows]
            after = shard.state().upper
            fate = rng.random()
            if fate < 0.15:
                continue  # lost
            low = rng.randrange(0, before + 1) if fate < 0.4 else before  # overlapping / backfilled
            queued.append(event(low, after))
            if fate > 0.85:
                queued.append(event(before, after))  # the retry's event repeats the range
        else:
            # A consumer run, triggered by some of the queued events, in any order.
            rng.shuffle(queued)
            count = rng.randrange(0, len(queued) + 1)
            taken, queued = queued[:count], queued[count:]
            die = rng.choice([None, None, "delivering", "completing"])
            nested = list(taken) if rng.random() < 0.2 else None
            run_consumer(taken, die=die, nested=nested)
        ranges = delivered_ranges(out)
        assert all(a[1] <= b[0] for a, b in zip(ranges, ranges[1:])), (seed, ranges)  # never overlapping
    # The next event (any producer's) triggers a run that catches up.
    upper = shard.state().upper
    run_consumer([event(upper - 1, upper)] if upper else [])
    ranges = delivered_ranges(out)
    cursor = read_cursor(consensus, shard.shard_id, "report")
    if not ranges:
        assert upper == 0 or cursor is None or cursor.position == upper
        return
    # Contiguous and disjoint from the first delivered ts to the upper: every batch once.
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:])), (seed, ranges)
    assert ranges[-1][1] == upper and cursor == ConsumerCursor(upper, None)
    # Each file holds the feed of its range; a range delivered twice (a run that died before
    # completing, a peer beside it) was written under the same name with the same rows.
    committed_at = {b.ts: b.committed_at for b in shard.batches()}
    for low, high in ranges:
        table = pq.read_table(os.path.join(out, changes_file_name(low, high)))
        assert feed_rows(SimpleNamespace(read_all=lambda: table)) == expected_feed(
            shard.config, history, low, high, committed_at, preimages=False)
    # Every delivery wrote one of those files: none of another range was ever written.
    assert set(deliveries) <= set(ranges)


@sqlite_only
def test_a_consumer_given_a_start_delivers_a_batch_below_its_first_events(consensus, blob, tmp_path):
    # ts 0 was committed by a producer try that died before its event; a peer's event names
    # [1, 2) only and triggers each consumer's first run.
    shard = make_shard(consensus, blob, tmp_path, buckets=2, order_by=None)
    rng = random.Random(5)
    for _ in range(2):
        commit_batch(shard, random_rows(rng, 8, order=False))
    peer = [event(1, 2)]
    started = str(tmp_path / "started")
    assert consume_changes(shard, "from_start", peer, parquet_files_in(started), start_ts=0) == [(0, 2)]
    assert delivered_ranges(started) == [(0, 2)]
    # Without a start, the first read begins at the lowest from_ts of its events: ts 0 is not its.
    assert consume_changes(shard, "from_events", peer, parquet_files_in(str(tmp_path / "events"))) == [(1, 2)]
    # Once a cursor exists the start is ignored: nothing is delivered twice.
    assert consume_changes(shard, "from_start", peer, parquet_files_in(started), start_ts=0) == []
    for bad in (-1, "0", True):
        with pytest.raises(ConfigurationError, match="start_ts"):
            consume_changes(shard, "bad", peer, parquet_files_in(started), start_ts=bad)
