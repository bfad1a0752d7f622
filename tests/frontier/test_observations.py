"""Frontier observations and the alert state in consensus (engine/frontier/observations.py), on real
SQLite and PostgreSQL stores.

Most cases need no Spark: a shard made in the store, its batches bound and committed with
empty runs, is all an observation looks at. One test runs a real writer to show that every
step leaves an observation and that a failure to record one does not fail the batch.
"""

from __future__ import annotations

import glob
import logging
import os
import time
from dataclasses import replace

import pytest

from airflow_upsert_provider.engine.frontier import observations
from airflow_upsert_provider.engine.store import streams
from airflow_upsert_provider.engine.frontier.alerts import AlertState
from airflow_upsert_provider.engine.frontier.model import FrontierStatus, Observation, StallSettings
from airflow_upsert_provider.engine.write.writer import COMMITTED, NOTHING_TO_DO, Writer
from airflow_upsert_provider.sample_data import SampleSpec
from tests.helpers import batch, make_shard

# Offsets 0, 10, 20, 30 in p0 and p1; two files a batch: batch ts binds offset 10*ts in both.
SPEC = SampleSpec(records=160, keys=40, partitions=2, segments_per_partition=4, seed=5)


def commit(shard, ts: int) -> None:
    """Bind batch ``ts`` and commit it with an empty run."""
    assert shard.mint_binding(ts, minted_by="test") is not None
    assert shard.compare_and_append(ts, ts + 1, batch(ts, token=f"t{ts}"), epoch=0).upper == ts + 1


def land_at(landing: str, times: dict[str, float]) -> None:
    """Set the landing time (mtime) of segments named ``partition/offset``."""
    for name, at in times.items():
        os.utime(os.path.join(landing, f"{name}.jsonl"), (at, at))


def obs(shard_id: str, at: float, *, upper: int = 0, hw: int = 10, observer: str = "test",
        outcome: str | None = None) -> Observation:
    return Observation(shard_id=shard_id, observed_at=at, upper=upper, last_commit_at=None,
                       high_watermark={"p0": hw}, bound={"p0": upper}, stream_status="READY",
                       stream_changed_at=0.0, lag=max(0, hw - upper), lag_unit="records", lag_seconds=None,
                       observer=observer, writer_outcome=outcome)


def test_observe_a_shard_without_spark(consensus, blob, tmp_path):
    shard = make_shard(consensus, blob, tmp_path, spec=SPEC, max_files_per_batch=2)
    landing = str(tmp_path / "landing")
    assert sorted(os.path.relpath(p, landing) for p in glob.glob(f"{landing}/*/*.jsonl"))[:2] == \
        ["p0/0.jsonl", "p0/10.jsonl"]
    # p1's first segment landed before p0's: the oldest pending record is p1's.
    land_at(landing, {"p0/0": 1000.0, "p1/0": 900.0, "p0/10": 2000.0, "p1/10": 2500.0,
                      "p0/20": 3000.0, "p1/20": 3000.0, "p0/30": 3000.0, "p1/30": 3000.0})

    first = observations.observe(shard, observer="test:1", now=5000.0)
    assert (first.upper, first.last_commit_at, first.bound) == (0, None, {})
    assert first.high_watermark == {"p0": 31, "p1": 31}
    # 8 segment files pending (offsets 0 to 30 by tens in two partitions), not the 62 offsets between
    # the bound and the high watermarks.
    assert (first.lag, first.lag_unit) == (8, "segments")
    assert first.lag_seconds == pytest.approx(5000.0 - 900.0)
    assert (first.stream_status, first.stream_changed_at, first.observer, first.writer_outcome) == \
        ("READY", 0.0, "test:1", None)

    commit(shard, 0)
    committed_at = consensus.get_batch("orders", 0).committed_at
    second = observations.observe(shard, observer="writer:w", writer_outcome=COMMITTED, now=6000.0)
    assert (second.upper, second.bound, second.lag, second.lag_unit) == (1, {"p0": 1, "p1": 1}, 6, "segments")
    assert second.last_commit_at == committed_at
    # The first unbound segments are now offset 10: p0's landed at 2000, p1's at 2500.
    assert second.lag_seconds == pytest.approx(6000.0 - 2000.0)
    assert second.writer_outcome == COMMITTED

    for ts in (1, 2, 3):
        commit(shard, ts)
    stopped = streams.stop(consensus, "orders", "test", "maintenance").state
    caught_up = observations.observe(shard, observer="test:1", now=7000.0)
    assert (caught_up.upper, caught_up.lag, caught_up.lag_seconds) == (4, 0, None)
    assert caught_up.bound == caught_up.high_watermark == {"p0": 31, "p1": 31}
    assert (caught_up.stream_status, caught_up.stream_changed_at) == ("STOPPING", stopped.changed_at)

    # What is recorded is what is read back.
    observations.record_observation(consensus, caught_up)
    assert observations.observation_window(consensus, "orders", 0.0) == [caught_up]


def test_recording_prunes_by_count_and_age_per_shard(consensus, monkeypatch):
    monkeypatch.setattr(observations, "MAX_OBSERVATIONS_PER_SHARD", 5)
    monkeypatch.setattr(observations, "OBSERVATION_RETENTION_SECONDS", 100.0)
    for i in range(12):
        observations.record_observation(consensus, obs("a", 1000.0 + i))
    observations.record_observation(consensus, obs("b", 1000.0))
    # Count: the newest five of shard a; shard b is not pruned by a's records.
    assert observations.observation_count(consensus, "a") == 5
    assert [o.observed_at for o in observations.observation_window(consensus, "a", 0.0)] == \
        [1007.0, 1008.0, 1009.0, 1010.0, 1011.0]
    # Age: an observation 100 s past the others prunes them (shard a only).
    observations.record_observation(consensus, obs("a", 1109.5))
    assert [o.observed_at for o in observations.observation_window(consensus, "a", 0.0)] == \
        [1010.0, 1011.0, 1109.5]
    assert observations.observation_count(consensus, "b") == 1


def test_recording_costs_the_same_statements_whatever_the_table_holds(consensus, monkeypatch):
    """The prune is index ranges: the statements of one record do not grow with the history."""
    import sqlalchemy as sa

    monkeypatch.setattr(observations, "MAX_OBSERVATIONS_PER_SHARD", 50)
    statements: list[str] = []

    def count(conn, cursor, statement, *args):
        statements.append(statement)

    sa.event.listen(consensus.engine, "before_cursor_execute", count)
    try:
        costs = []
        for i in range(120):
            statements.clear()
            observations.record_observation(consensus, obs("a", 1000.0 + i))
            costs.append(len([s for s in statements if "upsert_frontier_observations" in s]))
    finally:
        sa.event.remove(consensus.engine, "before_cursor_execute", count)
    # insert, age prune, oldest kept; and the count prune once the shard holds the maximum:
    # the same four statements with 50 rows as with 70 pruned before.
    assert costs == [3] * 49 + [4] * 71
    assert observations.observation_count(consensus, "a") == 50


def test_window_is_oldest_first_between_start_and_end(consensus):
    # Recorded out of time order (writers and sensors have their own clocks).
    for at, who in ((30.0, "x"), (10.0, "first"), (20.0, "y"), (10.0, "second"), (40.0, "z")):
        observations.record_observation(consensus, obs("a", at, observer=who))
    assert [(o.observed_at, o.observer) for o in observations.observation_window(consensus, "a", 0.0)] == \
        [(10.0, "first"), (10.0, "second"), (20.0, "y"), (30.0, "x"), (40.0, "z")]
    assert [o.observed_at for o in observations.observation_window(consensus, "a", 15.0, 30.0)] == [20.0, 30.0]
    assert observations.observation_window(consensus, "other", 0.0) == []


def test_a_recorded_observation_keeps_its_unit_and_rows_from_before_units_read_as_offsets(consensus):
    import json

    import sqlalchemy as sa

    from airflow_upsert_provider.engine.store.observation_tables import observations_table

    observations.record_observation(consensus, replace(obs("a", 10.0, hw=13), lag_unit="segments"))
    # A row an earlier version recorded: its lag counted the distance between offsets.
    legacy = obs("a", 20.0, hw=250).to_dict()
    del legacy["lag"], legacy["lag_unit"]
    legacy["lag_records"] = 240
    consensus.run_in_transaction(lambda conn: conn.execute(sa.insert(observations_table).values(
        shard_id="a", observed_at=20.0, observer="test", payload=json.dumps(legacy))))
    assert [(o.lag, o.lag_unit) for o in observations.observation_window(consensus, "a", 0.0)] == \
        [(13, "segments"), (240, "offsets")]
    # An earlier version sharing the store requires lag_records: the new row still carries it.
    payloads = consensus.read_in_snapshot(lambda conn: conn.execute(
        sa.select(observations_table.c.payload).order_by(observations_table.c.observed_at)).scalars().all())
    assert {k: json.loads(payloads[0])[k] for k in ("lag", "lag_unit", "lag_records")} == \
        {"lag": 13, "lag_unit": "segments", "lag_records": 13}


def test_alert_state_compare_and_set(consensus):
    fresh, version = observations.load_alert_state(consensus, "a")
    assert (fresh, version) == (AlertState(shard_id="a"), 0)
    first = AlertState(shard_id="a", consecutive_breaches=1, last_status="STALLED", max_upper=3,
                       max_high_watermark={"p0": 40})
    assert observations.save_alert_state(consensus, first, 0)
    # A second insert at version 0 loses: the row exists.
    assert not observations.save_alert_state(consensus, AlertState(shard_id="a", pages_sent=9), 0)
    assert observations.load_alert_state(consensus, "a") == (first, 1)
    second = AlertState(shard_id="a", consecutive_breaches=2, firing=True, pages_sent=1)
    assert observations.save_alert_state(consensus, second, 1)
    assert not observations.save_alert_state(consensus, first, 1)  # stale version
    assert observations.load_alert_state(consensus, "a") == (second, 2)
    assert observations.load_alert_state(consensus, "b") == (AlertState(shard_id="b"), 0)


STALL = StallSettings(window_seconds=900.0, cadence_seconds=60.0, min_stall_seconds=300.0,
                      consecutive_breaches=1)


def triggers(state: AlertState) -> int:
    """The triggers a shard's outbox holds: pages decided (pages_sent counts delivered ones)."""
    return sum(1 for entry in state.outbox if entry["event"]["action"] == "trigger")


def record_stall(consensus, shard_id: str, until: float) -> None:
    """Ten minutes of a writer running and committing nothing while the source grows."""
    for i in range(11):
        at = until - 600.0 + 60.0 * i
        observations.record_observation(consensus, obs(shard_id, at, upper=0, hw=20 + i,
                                                       observer="writer:w1", outcome=NOTHING_TO_DO))


def test_two_evaluators_racing_page_once(consensus, blob, tmp_path, monkeypatch):
    """Evaluator 1 reads the alert state; evaluator 2 runs a whole round before 1 saves. 2's
    compare-and-set wins and returns the page; 1's loses, it re-reads, and returns none."""
    make_shard(consensus, blob, tmp_path, spec=SPEC)
    now = 100_000.0
    record_stall(consensus, "orders", now)
    rounds = {}

    def second_evaluator(shard_id, state, version):
        monkeypatch.setattr(observations, "between_load_and_save", None)
        assert (state, version) == (AlertState(shard_id="orders"), 0)
        rounds["second"] = observations.evaluate_shard(consensus, blob, "orders", STALL, observer="sensor:2",
                                                       now=now)

    monkeypatch.setattr(observations, "between_load_and_save", second_evaluator)
    rounds["first"] = observations.evaluate_shard(consensus, blob, "orders", STALL, observer="sensor:1", now=now)

    assert rounds["second"].evaluation.status is FrontierStatus.STALLED
    assert rounds["second"].evaluation.writers_running is True
    assert [rounds["second"].action, rounds["first"].action] == ["trigger", None]
    # The loser reports what is stored: the winner's state, one page queued.
    state, version = observations.load_alert_state(consensus, "orders")
    assert version == 1
    assert state.firing and triggers(state) == 1 and state.consecutive_breaches == 1
    assert rounds["first"].state == state
    assert rounds["first"].evaluation.status is FrontierStatus.STALLED
    # Both observed the real shard and both observations are recorded, the loser's too (it
    # went in with the compare-and-set that lost).
    recorded = [o for o in observations.observation_window(consensus, "orders", now)
                if o.observer.startswith("sensor:")]
    assert sorted(o.observer for o in recorded) == ["sensor:1", "sensor:2"]
    assert {(o.upper, o.lag, o.lag_unit) for o in recorded} == {(0, 8, "segments")}

    # The next round at a later moment is still STALLED and does not page again.
    later = observations.evaluate_shard(consensus, blob, "orders", STALL, observer="sensor:1",
                                        now=now + 30.0, observe_first=False)
    assert (later.evaluation.status, later.action) == (FrontierStatus.STALLED, None)
    assert observations.load_alert_state(consensus, "orders")[1] == 2


def evaluate_after_barrier(url: str, blob_root: str, now: float, barrier, out) -> None:
    """A sensor in its own process: it loads the alert state, waits at ``barrier`` until the
    other process has loaded it too, then saves."""
    from airflow_upsert_provider.engine.blob.files import open_blob
    from airflow_upsert_provider.engine.store.registry import open_consensus

    consensus = open_consensus(url)
    waited = []

    def both_loaded(shard_id, state, version):
        if not waited:  # only the first attempt: a re-read after a lost write goes on alone
            waited.append(version)
            barrier.wait(TIMEOUT)

    observations.between_load_and_save = both_loaded
    result = observations.evaluate_shard(consensus, open_blob(blob_root), "orders", STALL,
                                         observer=f"sensor:{os.getpid()}", now=now, observe_first=False)
    out.put((result.action, result.evaluation.status.value, triggers(result.state), waited))
    consensus.dispose()


TIMEOUT = 60


def test_two_evaluators_in_separate_processes_page_once(consensus_url, blob, tmp_path):
    import multiprocessing

    from airflow_upsert_provider.engine.store.registry import open_consensus

    consensus = open_consensus(consensus_url)
    try:
        make_shard(consensus, blob, tmp_path, spec=SPEC)
        now = 100_000.0
        record_stall(consensus, "orders", now)
        ctx = multiprocessing.get_context("spawn")
        barrier, out = ctx.Barrier(2), ctx.Queue()
        racers = [ctx.Process(target=evaluate_after_barrier, args=(consensus_url, blob.root, now, barrier, out))
                  for _ in range(2)]
        for racer in racers:
            racer.start()
        results = [out.get(timeout=TIMEOUT) for _ in racers]
        for racer in racers:
            racer.join(TIMEOUT)
        assert [r.exitcode for r in racers] == [0, 0]
        # Both read version 0 before either wrote; one write won and only it pages.
        assert sorted(r[3] for r in results) == [[0], [0]]
        assert sorted((r[0] or "", r[1], r[2]) for r in results) == [("", "STALLED", 1), ("trigger", "STALLED", 1)]
        state, version = observations.load_alert_state(consensus, "orders")
        assert (state.firing, triggers(state), version) == (True, 1, 1)
    finally:
        consensus.dispose()


def test_a_loser_at_a_later_moment_decides_again(consensus, blob, tmp_path, monkeypatch):
    """A racer evaluating a later moment than the winner is a new evaluation: re-read, decide
    on the winner's state, write by compare-and-set. Here the winner did not page (its
    breach was the first of two needed) and the loser's breach is the second: it pages."""
    make_shard(consensus, blob, tmp_path, spec=SPEC)
    now = 100_000.0
    record_stall(consensus, "orders", now + 30.0)
    two = StallSettings(window_seconds=900.0, cadence_seconds=60.0, min_stall_seconds=300.0,
                        consecutive_breaches=2)
    rounds = {}

    def earlier_evaluator(shard_id, state, version):
        monkeypatch.setattr(observations, "between_load_and_save", None)
        rounds["earlier"] = observations.evaluate_shard(consensus, blob, "orders", two, observer="sensor:2",
                                                        now=now, observe_first=False)

    monkeypatch.setattr(observations, "between_load_and_save", earlier_evaluator)
    rounds["later"] = observations.evaluate_shard(consensus, blob, "orders", two, observer="sensor:1",
                                                  now=now + 30.0, observe_first=False)
    assert [rounds["earlier"].action, rounds["later"].action] == [None, "trigger"]
    state, version = observations.load_alert_state(consensus, "orders")
    assert (state.consecutive_breaches, triggers(state), version) == (2, 1, 2)


def test_a_round_observes_records_and_resolves(consensus, blob, tmp_path):
    """evaluate_shard with observe_first records an observation of the real shard; the page
    fired on a stall is resolved by the first round that sees the upper move."""
    shard = make_shard(consensus, blob, tmp_path, spec=SPEC, max_files_per_batch=2)
    # Real time: the observation this round makes dates the last commit by the store's clock.
    now = time.time() + 1.0
    record_stall(consensus, "orders", now - 60.0)
    fired = observations.evaluate_shard(consensus, blob, "orders", STALL, observer="sensor:1",
                                        now=now - 60.0, observe_first=False)
    assert fired.action == "trigger"
    for ts in range(4):
        commit(shard, ts)
    moved = observations.evaluate_shard(consensus, blob, "orders", STALL, observer="sensor:1", now=now)
    assert moved.observation is not None and moved.observation.upper == 4
    assert moved.observation.observer == "sensor:1"
    assert observations.observation_window(consensus, "orders", now)[-1] == moved.observation
    assert moved.evaluation.status is not FrontierStatus.STALLED
    assert moved.action == "resolve"
    assert not observations.load_alert_state(consensus, "orders")[0].firing
    assert moved.to_dict()["action"] == "resolve" and moved.to_dict()["observation"]["upper"] == 4


def test_an_unknown_shard_is_not_found_and_leaves_no_row(consensus, blob):
    result = observations.evaluate_shard(consensus, blob, "nope", STALL, observer="sensor:1", now=1000.0)
    assert (result.evaluation.status, result.action, result.observation) == (FrontierStatus.NOT_FOUND, None, None)
    assert observations.load_alert_state(consensus, "nope")[1] == 0
    assert observations.observation_count(consensus, "nope") == 0


def test_evaluate_shards_covers_every_shard(consensus, blob, tmp_path):
    make_shard(consensus, blob, tmp_path, spec=SPEC, shard_id="a")
    make_shard(consensus, blob, tmp_path, spec=SPEC, shard_id="b")
    rounds = observations.evaluate_shards(consensus, blob, None, STALL, "sensor:all")
    assert [r.shard_id for r in rounds] == ["a", "b"]
    assert [observations.observation_count(consensus, s) for s in ("a", "b")] == [1, 1]
    # One sample is no trend: STALE, never extrapolated.
    assert {r.evaluation.status for r in rounds} == {FrontierStatus.STALE}


def test_writer_records_an_observation_per_step_and_never_fails_for_it(sqlite_url, blob, tmp_path, spark,
                                                                       monkeypatch, caplog):
    from airflow_upsert_provider.engine.store.registry import open_consensus

    consensus = open_consensus(sqlite_url)
    try:
        shard = make_shard(consensus, blob, tmp_path, spec=SPEC, max_files_per_batch=4)

        def broken(*args, **kwargs):
            raise RuntimeError("observation store is down")

        # A failure to record: the batch commits all the same, the failure is logged.
        monkeypatch.setattr(observations, "record_observation", broken)
        with caplog.at_level(logging.WARNING, logger="airflow_upsert_provider.engine.write.writer"):
            report = Writer(shard, "w1", spark_factory=lambda: spark).run(max_batches=1)
        assert [r.outcome for r in report.results] == [COMMITTED]
        assert (report.results[0].lag, report.results[0].lag_unit) == (4, "segments")  # 4 of 8 files bound
        assert shard.state().upper == 1
        assert "frontier observation after batch 0 not recorded (RuntimeError: observation store is down)" \
            in caplog.text
        monkeypatch.undo()
        assert observations.observation_count(consensus, "orders") == 0

        report = Writer(shard, "w2", spark_factory=lambda: spark).run(max_batches=None, until_caught_up=True)
        assert [r.outcome for r in report.results] == [COMMITTED, NOTHING_TO_DO]
        # Each step's result carries the lag after it, in the source's unit: every file is bound.
        assert [(r.lag, r.lag_unit) for r in report.results] == [(0, "segments"), (0, "segments")]
        recorded = observations.observation_window(consensus, "orders", 0.0)
        assert [(o.observer, o.writer_outcome, o.upper, o.lag) for o in recorded] == [
            ("writer:w2", COMMITTED, 2, 0),
            ("writer:w2", NOTHING_TO_DO, 2, 0),
        ]
        assert recorded[0].last_commit_at == consensus.get_batch("orders", 1).committed_at
        assert recorded[-1].lag_seconds is None
    finally:
        consensus.dispose()


def test_a_writer_step_that_fails_is_recorded_with_its_error_class_and_the_page_names_it(sqlite_url, blob, tmp_path):
    from airflow_upsert_provider.engine.store.registry import open_consensus
    from airflow_upsert_provider.engine.errors import SparkUnavailable

    consensus = open_consensus(sqlite_url)
    try:
        shard = make_shard(consensus, blob, tmp_path, spec=SPEC, max_files_per_batch=2)

        def no_spark():
            raise SparkUnavailable("the Spark Connect server at sc://127.0.0.1:1 did not answer")

        started = time.time()
        for attempt in range(3):
            with pytest.raises(SparkUnavailable):
                Writer(shard, f"failing-{attempt}", spark_factory=no_spark).run(max_batches=1)
        recorded = observations.observation_window(consensus, "orders", started - 1)
        assert [(o.observer, o.writer_outcome, o.upper, o.lag) for o in recorded] == [
            (f"writer:failing-{i}", "failed:SparkUnavailable", 0, 8) for i in range(3)]
        # A look past the stall threshold after the first failure: the page says what fails.
        settings = StallSettings(cadence_seconds=1, min_stall_seconds=1)
        evaluation = observations.peek_shard(consensus, blob, "orders", settings, observer="test",
                                             now=recorded[0].observed_at + 5).evaluation
        assert evaluation.status is FrontierStatus.STALLED, evaluation.rule
        assert any(r.startswith("writer failing: SparkUnavailable (3 failed run(s)") for r in evaluation.reasons), \
            evaluation.reasons
        assert not any("no writer observed" in r for r in evaluation.reasons)
    finally:
        consensus.dispose()


def test_a_resumed_stream_is_not_stalled_by_the_time_it_spent_stopped(sqlite_url, blob, tmp_path):
    from airflow_upsert_provider.engine.store.registry import open_consensus

    consensus = open_consensus(sqlite_url)
    try:
        shard = make_shard(consensus, blob, tmp_path, spec=SPEC, max_files_per_batch=2)
        # Stopped with records pending; a sensor looks every minute for an hour.
        streams.stop(consensus, "orders", "test", "maintenance")
        streams.finalize_stop(consensus, streams.read_stream(consensus, "orders"), "test")
        stopped_looks = time.time()
        for minutes in range(60, 0, -1):
            observations.record_observation(consensus, observations.observe(
                shard, observer="sensor:1", now=stopped_looks - 60 * minutes))
        resumed = streams.resume(consensus, "orders", "test").state
        assert resumed.status.value == "READY" and resumed.changed_at >= stopped_looks
        # 19 s after the resume, with a 20 s threshold: not stalled, whatever the hour stopped.
        settings = StallSettings(cadence_seconds=5, stall_multiplier=4, min_stall_seconds=20, window_seconds=7200)
        round_ = observations.evaluate_shard(consensus, blob, "orders", settings, observer="sensor:1",
                                             now=resumed.changed_at + 19)
        assert round_.observation.stream_status == "READY" and round_.observation.lag == 8
        assert round_.evaluation.status is FrontierStatus.OK, round_.evaluation.rule
        assert round_.action is None and not round_.state.consecutive_breaches
        # 21 s after it: stalled, counted from the resume.
        later = observations.evaluate_shard(consensus, blob, "orders", settings, observer="sensor:1",
                                            now=resumed.changed_at + 21)
        assert later.evaluation.status is FrontierStatus.STALLED
        assert later.evaluation.thresholds["stall_started_at"] == resumed.changed_at
        assert later.evaluation.window["samples"] == 62  # the hour stopped is in the window
    finally:
        consensus.dispose()


def test_a_stall_longer_than_the_window_is_dated_by_the_look_before_it(consensus, blob, tmp_path):
    """A writer stuck for three hours on a five-minute cadence: a monitor's first round, and a
    look by hand, see only the window from the store, and the look before it dates the stall."""
    make_shard(consensus, blob, tmp_path, spec=SPEC)
    settings = StallSettings(cadence_seconds=300, consecutive_breaches=1)  # window 1500 s
    now = 100_000.0
    for i in range(37):  # every 300 s for three hours, records pending the whole time
        at = now - 3 * 3600 + 300.0 * i
        observations.record_observation(consensus, replace(obs("orders", at, upper=0, hw=20 + i),
                                                           lag_seconds=at - (now - 3 * 3600)))
    window = observations.judging_window(consensus, "orders", settings, now)
    assert window[0].observed_at == now - settings.window_seconds - 300  # the look before the window
    peeked = observations.peek_shard(consensus, blob, "orders", settings, observer="test", now=now,
                                     observe_first=False).evaluation
    judged = observations.evaluate_shard(consensus, blob, "orders", settings, observer="test", now=now,
                                         observe_first=False)
    for evaluation in (peeked, judged.evaluation):
        assert evaluation.status is FrontierStatus.STALLED, evaluation.rule
        assert evaluation.stuck_seconds == pytest.approx(3 * 3600)
    assert (judged.state.stall_upper, judged.state.pending_since) == (0, now - 3 * 3600)


def test_a_round_without_a_sender_still_queues_the_page_it_marks_firing(consensus, blob, tmp_path):
    """evaluate_shards (no composer of its own) marks a page firing: the same round puts it into
    the outbox, so a sensor's later round delivers it (one path decides and enqueues)."""
    make_shard(consensus, blob, tmp_path, spec=SPEC)
    now = 100_000.0
    record_stall(consensus, "orders", now)
    [round_] = observations.evaluate_shards(consensus, blob, ["orders"], STALL, "sensor:all", now=now)
    assert round_.action == "trigger" and round_.state.firing
    state, _ = observations.load_alert_state(consensus, "orders")
    assert [(e["event"]["action"], e["event"]["dedup_key"]) for e in state.outbox] == \
        [("trigger", "airflow-upsert//orders")]
    assert round_.page == state.outbox[0]["event"] and round_.pages[0]["id"] == state.outbox[0]["id"]


def test_a_monitor_page_sent_by_an_ended_run_is_resolved_by_the_next_round_of_its_shard_only(
        consensus, blob, tmp_path):
    """Issue 34 item 3: the monitor's own page has one key per namespace and shard and is kept
    in the alert state: a later run's first working round resolves it (through the outbox), and
    resolves no other shard's."""
    from airflow_upsert_provider.engine.frontier.blind import BlindState, blind_dedup_key

    make_shard(consensus, blob, tmp_path, spec=SPEC, shard_id="orders")
    make_shard(consensus, blob, tmp_path, spec=SPEC, shard_id="events")
    paged = BlindState(since=100.0, paged=True, error="ConsensusUnavailable: cannot reach consensus store")
    for shard_id in ("orders", "events"):
        assert observations.record_blind(consensus, shard_id, paged)
    round_ = observations.evaluate_shard(consensus, blob, "orders", STALL, observer="sensor:r2", now=1000.0,
                                         namespace="prod")
    monitor_pages = [p["event"] for p in round_.pages if p["event"]["dedup_key"].endswith("#monitor")]
    assert [(e["action"], e["dedup_key"]) for e in monitor_pages] == [("resolve", blind_dedup_key("prod", "orders"))]
    assert monitor_pages[0]["summary"] == "RESOLVED: the frontier monitor evaluates shard orders again"
    assert observations.load_alert_state(consensus, "orders")[0].blind is None
    assert observations.load_alert_state(consensus, "events")[0].blind == {**paged.__dict__}
    assert blind_dedup_key("prod", "orders") != blind_dedup_key("prod", "events") != blind_dedup_key("prod")
    # Delivered, a later round has nothing more to resolve.
    observations.settle_outbox(consensus, "orders", delivered=[p["id"] for p in round_.pages], sent_at=1001.0)
    again = observations.evaluate_shard(consensus, blob, "orders", STALL, observer="sensor:r2", now=1060.0,
                                        namespace="prod")
    assert not [p for p in again.pages if p["event"]["dedup_key"].endswith("#monitor")]
