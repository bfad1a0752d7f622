"""Lifecycle transitions are compare-and-set on (status, version) in consensus (invariant 14).

The race this file is named after: two streams are stopped; a finalizer reads both as
STOPPING and stalls; meanwhile the first is finalized by someone else and resumed. When the
stalled finalizer wakes up with its old reads, it must finalize the second and leave the first
READY: a resume is never overwritten by a stale stop. Store-level, real SQLite and PostgreSQL,
races between processes driven by ``streams.between_read_and_write`` and barriers."""

from __future__ import annotations

import multiprocessing
import os
import time
from dataclasses import replace

import pytest
import sqlalchemy as sa

from airflow_upsert_provider.engine.store import streams
from airflow_upsert_provider.engine.store.tables import shards_table
from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.engine.errors import ShardNotFound, TransitionRefused
from airflow_upsert_provider.engine.store.stream_rules import Status
from tests.helpers import make_shard

TIMEOUT = 120


@pytest.fixture
def two_shards(consensus, blob, tmp_path):
    for shard_id in ("a", "b"):
        make_shard(consensus, blob, tmp_path, shard_id=shard_id)
    return consensus


@pytest.fixture
def no_hook():
    """Whatever a test hangs on ``between_read_and_write`` is removed after it."""
    yield
    streams.between_read_and_write = None


def finalizes(history: list[dict]) -> list[dict]:
    return [h for h in history if (h["from"], h["to"]) == ("STOPPING", "STOPPED")]


def stream_row(consensus, shard_id: str):
    with consensus.engine.connect() as conn:
        return conn.execute(
            sa.select(streams.streams_table).where(streams.streams_table.c.shard_id == shard_id)
        ).first()


# -- in other processes (spawn: a fresh interpreter, no hook of the parent's) ---------------------


def finalize_and_resume(consensus_url: str, shard_id: str) -> None:
    """Another operator: finalize the stop as it is now, then resume the stream."""
    consensus = open_consensus(consensus_url)
    try:
        finalized = streams.finalize_stop(consensus, streams.read_stream(consensus, shard_id), "other-finalizer")
        assert finalized.changed and finalized.state.status is Status.STOPPED
        resumed = streams.resume(consensus, shard_id, "operator", "maintenance over")
        assert resumed.changed and resumed.state.status is Status.READY
    finally:
        consensus.dispose()


def finalize_after_barrier(consensus_url: str, shard_id: str, name: str, barrier, out) -> None:
    """One of N duplicate finalizers: read, wait for the others to have read too, write."""
    consensus = open_consensus(consensus_url)
    streams.between_read_and_write = lambda _action, _state: barrier.wait(TIMEOUT)
    try:
        read = streams.read_stream(consensus, shard_id)
        result = streams.finalize_stop(consensus, read, name)
        out.put((name, result.changed, result.state.status.value, result.state.version))
    finally:
        consensus.dispose()


def begin_after_barrier(consensus_url: str, shard_id: str, name: str, barrier, out) -> None:
    """One of two `recover begin`s: both read READY, then both compare-and-set together."""
    consensus = open_consensus(consensus_url)
    waited = []

    def hold(_action, _state) -> None:
        if not waited:  # only the first attempt; a retry decides on a fresh read alone
            waited.append(True)
            barrier.wait(TIMEOUT)

    streams.between_read_and_write = hold
    try:
        result = streams.begin_recovery(consensus, shard_id, name, "store lost")
        out.put((name, "changed" if result.changed else "same", result.state.epoch, ""))
    except TransitionRefused as refused:
        out.put((name, "refused", refused.details["epoch"], refused.message))
    finally:
        consensus.dispose()


def spawn(target, *args):
    process = multiprocessing.get_context("spawn").Process(target=target, args=args)
    process.start()
    return process


# -- the race ---------------------------------------------------------------------------------


def test_stale_finalizer_leaves_a_resumed_stream_ready_and_finalizes_the_other(two_shards):
    consensus = two_shards
    streams.stop(consensus, "a", "operator", "maintenance")
    streams.stop(consensus, "b", "operator", "maintenance")
    # The finalizer reads both, keeps what it read, and stalls.
    read_a, read_b = streams.read_stream(consensus, "a"), streams.read_stream(consensus, "b")
    assert read_a.status is read_b.status is Status.STOPPING
    # Meanwhile a is finalized by another finalizer and resumed.
    other = streams.finalize_stop(consensus, streams.read_stream(consensus, "a"), "other-finalizer")
    assert other.changed and other.state.status is Status.STOPPED
    assert streams.resume(consensus, "a", "operator").state.status is Status.READY
    ready_a = streams.read_stream(consensus, "a")

    # The stalled finalizer wakes up with its old reads.
    stale_a = streams.finalize_stop(consensus, read_a, "stalled-finalizer")
    stale_b = streams.finalize_stop(consensus, read_b, "stalled-finalizer")

    assert not stale_a.changed and stale_a.state == ready_a
    assert streams.read_stream(consensus, "a") == ready_a
    assert stale_b.changed and stale_b.state.status is Status.STOPPED
    assert streams.read_stream(consensus, "b").status is Status.STOPPED
    history_a = streams.stream_history(consensus, "a")
    assert [(h["action"], h["from"], h["to"]) for h in history_a] == [
        ("stop", "READY", "STOPPING"), ("finalize", "STOPPING", "STOPPED"), ("resume", "STOPPED", "READY")]
    assert [h["actor"] for h in finalizes(history_a)] == ["other-finalizer"]
    assert [h["version"] for h in history_a] == [1, 2, 3]
    assert [(h["action"], h["actor"]) for h in finalizes(streams.stream_history(consensus, "b"))] == [
        ("finalize", "stalled-finalizer")]


def test_a_cached_stopping_over_a_ready_row_changes_nothing(two_shards):
    consensus = two_shards
    # A stream that never changed (no row yet: READY, version 0), and a cache claiming STOPPING.
    cached = replace(streams.read_stream(consensus, "a"), status=Status.STOPPING)
    result = streams.finalize_stop(consensus, cached, "cached-finalizer")
    assert not result.changed and result.state.status is Status.READY
    assert stream_row(consensus, "a") is None and streams.stream_history(consensus, "a") == []

    # A row at the same version as the cache, but READY: the status is part of the compare.
    streams.stop(consensus, "a", "operator")
    streams.finalize_stop(consensus, streams.read_stream(consensus, "a"), "operator")
    streams.resume(consensus, "a", "operator")
    ready = streams.read_stream(consensus, "a")
    result = streams.finalize_stop(consensus, replace(ready, status=Status.STOPPING), "cached-finalizer")
    assert not result.changed and streams.read_stream(consensus, "a") == ready
    assert all(h["actor"] != "cached-finalizer" for h in streams.stream_history(consensus, "a"))


def test_resume_in_another_process_between_the_finalizers_read_and_write(two_shards, consensus_url, no_hook):
    consensus = two_shards
    streams.stop(consensus, "a", "operator", "maintenance")
    landed = []

    def land_the_resume(action: str, read) -> None:
        # The finalizer has read STOPPING (in a transaction that is over: on SQLite the other
        # process can take the write lock) and is about to compare-and-set.
        assert (action, read.status) == ("finalize", Status.STOPPING)
        process = spawn(finalize_and_resume, consensus_url, "a")
        process.join(TIMEOUT)
        landed.append(process.exitcode)

    streams.between_read_and_write = land_the_resume
    result = streams.finalize_stop(consensus, streams.read_stream(consensus, "a"), "stalled-finalizer")

    assert landed == [0]
    assert not result.changed and result.state.status is Status.READY
    history = streams.stream_history(consensus, "a")
    assert [(h["action"], h["actor"]) for h in history] == [
        ("stop", "operator"), ("finalize", "other-finalizer"), ("resume", "operator")]
    assert streams.read_stream(consensus, "a").version == 3


def test_duplicate_finalizers_in_separate_processes_make_one_transition(two_shards, consensus_url):
    consensus = two_shards
    stopped = streams.stop(consensus, "a", "operator").state
    count = 4
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(count), ctx.Queue()
    processes = [spawn(finalize_after_barrier, consensus_url, "a", f"finalizer-{i}", barrier, out)
                 for i in range(count)]
    for process in processes:
        process.join(TIMEOUT)
    assert [p.exitcode for p in processes] == [0] * count
    results = sorted(out.get(timeout=5) for _ in range(count))

    # Every one of them read STOPPING at the stop's version and tried; exactly one wrote.
    winners = [name for name, changed, _status, _version in results if changed]
    assert len(winners) == 1
    assert {(status, version) for _name, _changed, status, version in results} == {("STOPPED", stopped.version + 1)}
    history = streams.stream_history(consensus, "a")
    assert [(h["action"], h["actor"]) for h in finalizes(history)] == [("finalize", winners[0])]
    assert len(history) == 2
    assert streams.read_stream(consensus, "b").status is Status.READY  # the other shard untouched


def test_two_concurrent_recover_begins_open_one_epoch(two_shards, consensus_url):
    consensus = two_shards
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    processes = [spawn(begin_after_barrier, consensus_url, "a", name, barrier, out) for name in ("first", "second")]
    for process in processes:
        process.join(TIMEOUT)
    assert [p.exitcode for p in processes] == [0, 0]
    results = {name: (kind, epoch, message) for name, kind, epoch, message in (out.get(timeout=5) for _ in range(2))}

    kinds = sorted(kind for kind, _epoch, _message in results.values())
    assert kinds == ["changed", "refused"]
    winner = next(name for name, (kind, _e, _m) in results.items() if kind == "changed")
    loser = next(name for name, (kind, _e, _m) in results.items() if kind == "refused")
    state = streams.read_stream(consensus, "a")
    assert state.status is Status.RECOVERING and state.changed_by == winner
    # The loser decided again on a fresh read, saw the winner's epoch open, and was refused.
    assert results[winner][1] == results[loser][1] == state.epoch
    assert f"recovery epoch {state.epoch} is already open" in results[loser][2]
    history = streams.stream_history(consensus, "a")
    assert [(h["action"], h["actor"], h["epoch"]) for h in history] == [("recover begin", winner, state.epoch)]


# -- a shard that is gone ---------------------------------------------------------------------


def delete_shard_rows(consensus, shard_id: str) -> None:
    with consensus.engine.begin() as conn:
        for table in (shards_table, streams.streams_table, streams.stream_history_table):
            conn.execute(sa.delete(table).where(table.c.shard_id == shard_id))


def test_finalizer_of_a_deleted_shard_is_refused_cleanly(two_shards, no_hook):
    consensus = two_shards
    streams.stop(consensus, "a", "operator")
    read = streams.read_stream(consensus, "a")
    delete_shard_rows(consensus, "a")

    with pytest.raises(TransitionRefused) as refused:
        streams.finalize_stop(consensus, read, "late-finalizer")
    assert "finalize of shard 'a' refused: the shard no longer exists" in refused.value.message
    assert refused.value.exit_code == 7
    assert refused.value.details["shard"] == "a" and refused.value.details["status"] == "STOPPING"
    assert stream_row(consensus, "a") is None
    with pytest.raises(ShardNotFound, match="no shard 'a'"):
        streams.read_stream(consensus, "a")

    # Deleted between the finalizer's read and its compare-and-set: nothing is recreated.
    streams.stop(consensus, "b", "operator")
    streams.between_read_and_write = lambda _action, _state: delete_shard_rows(consensus, "b")
    with pytest.raises(ShardNotFound, match="no shard 'b' in the consensus store: nothing to change") as gone:
        streams.finalize_stop(consensus, streams.read_stream(consensus, "b"), "late-finalizer")
    assert gone.value.exit_code == 2
    assert stream_row(consensus, "b") is None


# -- a stop superseded while it drains, and a batch left by a killed writer ---------------------------


class FakeClock:
    """The drain's clock: advanced only by the drain's own sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_a_stop_superseded_while_draining_stops_waiting_and_fails(sqlite_url, blob, tmp_path):
    from airflow_upsert_provider.engine.errors import StopSuperseded
    from tests.test_cli_lifecycle import SPEC

    consensus = open_consensus(sqlite_url)
    shard = make_shard(consensus, blob, tmp_path, spec=SPEC, max_files_per_batch=2)
    shard.mint_binding(0, minted_by="w")  # a writer holds batch 0
    clock = FakeClock()

    def meanwhile(seconds: float) -> None:
        clock.sleep(seconds)
        if len(clock.sleeps) == 1:
            # Someone else finalizes this stop and resumes the stream while it drains.
            streams.finalize_stop(consensus, streams.read_stream(consensus, "orders"), "other")
            streams.resume(consensus, "orders", "other", "done already")

    with pytest.raises(StopSuperseded) as info:
        streams.stop_and_finalize(consensus, "orders", "ops", "maintenance", drain_seconds=600,
                                  sleep=meanwhile, clock=clock)
    assert clock.sleeps == [1.0]  # the next poll saw the resume and stopped waiting
    assert info.value.exit_code == 7 and info.value.details["status"] == "READY"
    assert "superseded" in info.value.message and "writers may run" in info.value.message
    assert streams.read_stream(consensus, "orders").status is Status.READY
    consensus.dispose()


def test_a_batch_left_by_a_killed_writer_does_not_hold_the_stop_for_the_whole_drain(sqlite_url, blob, tmp_path):
    from airflow_upsert_provider.engine.store.stream_rules import DRAIN_IDLE_SECONDS
    from tests.test_cli_lifecycle import SPEC

    consensus = open_consensus(sqlite_url)
    shard = make_shard(consensus, blob, tmp_path, spec=SPEC, max_files_per_batch=2)
    shard.mint_binding(0, minted_by="killed-writer")
    clock = FakeClock()
    later = lambda: time.time() + DRAIN_IDLE_SECONDS  # noqa: E731 - the writer was killed that long ago
    result = streams.stop_and_finalize(consensus, "orders", "ops", drain_seconds=600, sleep=clock.sleep,
                                       clock=clock, wall_clock=later,
                                       staging_written_at=streams.staging_written_at(blob, "orders"))
    assert result.state.status is Status.STOPPED and clock.sleeps == []

    # A writer writing its staging files is waited for, however old its binding.
    streams.resume(consensus, "orders", "ops")
    staging = shard.run_dir(0, "live-writer", "abc")
    os.makedirs(staging)
    with open(os.path.join(staging, "part-0.parquet"), "wb") as handle:
        handle.write(b"x")
    os.utime(os.path.join(staging, "part-0.parquet"), (later(), later()))
    result = streams.stop_and_finalize(consensus, "orders", "ops", drain_seconds=3, sleep=clock.sleep,
                                       clock=clock, wall_clock=later,
                                       staging_written_at=streams.staging_written_at(blob, "orders"))
    assert result.state.status is Status.STOPPED and clock.sleeps == [1.0, 1.0, 1.0]
    consensus.dispose()
