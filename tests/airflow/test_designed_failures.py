"""A designed failure (a stream that refuses a run, a fenced commit, a superseded stop, a page
or a shard the monitor cannot find) fails the task with a short block and a short traceback:
no chained engine traceback, no frames of the sensor machinery (in process, no Spark)."""

from __future__ import annotations

import json
import traceback
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_upsert_provider.engine.store import streams
from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.operators.upsert import MicroBatchUpsertOperator
from airflow_upsert_provider.sensors.frontier import FrontierStallSensor
from airflow_upsert_provider.sensors.frontier_rounds import describe_breach
from tests.helpers import make_shard


def _context(task_id: str) -> dict:
    ti = SimpleNamespace(dag_id="d", run_id="r", task_id=task_id, map_index=-1, try_number=1, log_url=None)
    return {"ti": ti, "run_id": "r"}


def _frames(exc: BaseException) -> list[str]:
    """Every frame the task log would print for ``exc``, its chained causes included."""
    text = "".join(traceback.format_exception(exc))
    return [line for line in text.splitlines() if line.startswith("  File ")]


@pytest.fixture
def store(sqlite_url, blob, tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_UPSERT_DEFAULT", json.dumps(
        {"conn_type": "upsert", "extra": {"consensus_url": sqlite_url, "blob_root": blob.root}}))
    consensus = open_consensus(sqlite_url)
    make_shard(consensus, blob, tmp_path)
    yield consensus
    consensus.dispose()


def test_a_refused_run_fails_without_the_engine_traceback(store):
    streams.stop(store, "orders", "ops", "disk check")
    with pytest.raises(AirflowFailException) as failed:
        MicroBatchUpsertOperator(task_id="upsert", shard="orders").execute(_context("upsert"))
    exc = failed.value
    assert str(exc).startswith("stream refused: shard 'orders' is not READY: the stream is ")
    assert exc.__cause__ is None and exc.__suppress_context__
    # This test's frame, Airflow's execute wrapper, the operator's execute and the helper that
    # raises it: nothing of the engine.
    assert len(_frames(exc)) <= 4, _frames(exc)


def test_a_shard_the_monitor_cannot_find_fails_with_a_short_traceback(store, monkeypatch):
    logged: list[str] = []
    sensor = FrontierStallSensor(task_id="watch", shard="ordres", poke_interval=0.01)
    monkeypatch.setattr(FrontierStallSensor, "log", SimpleNamespace(
        error=lambda fmt, *args: logged.append(fmt % args), info=lambda *a: None, warning=lambda *a: None,
        debug=lambda *a: None))
    with pytest.raises(AirflowFailException) as failed:
        sensor.execute(_context("watch"))
    exc = failed.value
    assert "shard 'ordres' does not exist" in str(exc)
    # This test's frame, Airflow's execute wrapper and the sensor's execute: not the sensor
    # machinery's poke loop.
    assert len(_frames(exc)) <= 3, _frames(exc)
    # The block is logged before the task fails.
    assert logged == [str(exc)]


def test_a_breach_reads_as_a_short_block_with_formatted_times():
    text = describe_breach({
        "shard_id": "orders", "status": "STALLED", "upper": 7, "stuck_seconds": 160, "last_advance_at": 0.0,
        "lag": 75_000, "lag_unit": "records", "lag_seconds": 160.4, "rule": "stalled: source grew, upper unmoved",
        "window": {"seconds": 3600, "start": 0.0, "end": 3600.0, "samples": 12}, "reasons": ["writer w idle"],
    })
    lines = text.splitlines()
    assert lines[0].startswith("shard orders: frontier STALLED; upper 7 stuck since ")
    assert lines[1:] == [
        "  behind: 75,000 records pending, the oldest for 2m40s",
        "  window 1h00m00s from 1970-01-01T00:00:00Z to 1970-01-01T01:00:00Z (12 samples)",
        "  rule: stalled: source grew, upper unmoved",
        "  why: writer w idle",
    ]


def test_a_batch_log_line_shows_its_times_formatted():
    from airflow_upsert_provider.operators.upsert import batch_line

    line = batch_line({"ts": 4, "outcome": "committed", "rows_in": 120, "rows_out": 118, "rejected": 0,
                       "lag_offsets": {"p0": 20, "p1": 10}, "lag": 3, "lag_unit": "segments", "seconds": 2.4367,
                       "timings": {"bind": 0.1234, "stage": 161.9, "commit": 0.41}})
    assert line == ("batch ts=4 committed: rows in 120, out 118, rejected 0, lag 3 segments, 2.4s "
                    "(bind 0.1s, stage 2m42s, commit 0.4s)")
