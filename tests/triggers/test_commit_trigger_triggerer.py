"""ShardCommitTrigger run by Airflow itself: `airflow dags reserialize` registers the watcher's
trigger of a DAG scheduled on a watched Asset (tests/triggers/watcher_dags/commit_watcher.py),
an `airflow triggerer` process runs it and stores its events on the Asset, with the Asset state
store the triggerer injects; commits are made by `upsertctl run-batch`. The triggerer needs no
API server: its supervisor serves the trigger's calls (connections, the state store) through an
in-process execution API. Then the scheduler's own step turns the events into a run of the DAG
(tests/airflow/consumer_steps.py).

A trigger that kept its upper only in memory, or saved it under another Asset's state, would
report ts 0-3 again after the restart; one that saved it after yielding would still pass here
(the window is a crash between the two), tests/triggers/test_commit_trigger.py pins the order."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from typing import Iterator

import pytest

from airflow_upsert_provider.sample_data import SAMPLE_SCHEMA_DDL, SampleSpec, generate
from airflow_upsert_provider.triggers.commits import REPORTED_UPPER_KEY
from tests.airflow.conftest import VENV_BIN, AirflowHome, airflow_home, failure_text  # noqa: F401 (fixture)
from tests.conftest import sqlite_only
from tests.helpers import Upsertctl
from tests.pgserver import wait_for

pytestmark = pytest.mark.slow

HERE = os.path.dirname(os.path.abspath(__file__))
WATCHER_DAG = os.path.join(HERE, "watcher_dags", "commit_watcher.py")
STEPS = os.path.join(os.path.dirname(HERE), "airflow", "consumer_steps.py")
DAG_ID = "upsert_commit_watcher"
ASSET = "upsert_commits_orders_test"
SPEC = SampleSpec(records=600, keys=150, partitions=2, segments_per_partition=5, seed=373)
# Bounds of the waits: a triggerer start is a few seconds of CPU, a poll 0.2 s.
START_TIMEOUT = 240
EVENT_TIMEOUT = 180


class Triggerer:
    """An `airflow triggerer` process of ``home``; its output goes to ``log``."""

    def __init__(self, home: AirflowHome, env: dict[str, str], log: str) -> None:
        self.log = log
        with open(log, "a") as out:
            self.proc = subprocess.Popen([os.path.join(VENV_BIN, "airflow"), "triggerer"], env=env, cwd=home.path,
                                         stdout=out, stderr=subprocess.STDOUT)

    def output(self) -> str:
        with open(self.log) as handle:
            return handle.read()[-8000:]

    def stop(self) -> None:
        """SIGTERM, as a deployment's restart does: the triggerer cancels its triggers and ends
        its job, so the next one takes the trigger over at once."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"the triggerer did not stop on SIGTERM:\n{self.output()}")


def _payloads(home: AirflowHome) -> list[dict]:
    """The payloads of the events Airflow stored on the watched Asset, oldest first."""
    rows = home.query("SELECT e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id "
                      "WHERE a.name = ? ORDER BY e.id", ASSET)
    extras = [json.loads(extra) for (extra,) in rows]
    assert all(extra["from_trigger"] is True for extra in extras), extras
    return [extra["payload"] for extra in extras]


def _ranges(home: AirflowHome) -> list[tuple[int, int]]:
    return [(p["from_ts"], p["to_ts"]) for p in _payloads(home)]


def _state_store(home: AirflowHome) -> dict[str, object]:
    rows = home.query("SELECT s.key, s.value FROM asset_state_store s JOIN asset a ON a.id = s.asset_id "
                      "WHERE a.name = ?", ASSET)
    return {key: json.loads(value) for key, value in rows}


@pytest.fixture
def watcher_home(airflow_home: AirflowHome, tmp_path) -> Iterator[AirflowHome]:
    """A home whose DAGs folder holds the watcher DAG only, unpaused at creation: Airflow
    registers the triggers of watched Assets of active, unpaused DAGs only."""
    dags = tmp_path / "dags"
    dags.mkdir()
    shutil.copy(WATCHER_DAG, dags)
    home = airflow_home.clone(str(tmp_path / "home"))
    home.base_env.update(AIRFLOW__CORE__DAGS_FOLDER=str(dags), AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION="False")
    yield home


@sqlite_only
# Two triggerer processes, a scheduler step and five batches: nearly nine minutes on a loaded
# 2-core machine, near the suite's 900 s default per test.
@pytest.mark.timeout(1800)
def test_the_triggerer_stores_one_event_per_range_keeps_the_upper_in_the_asset_state_and_a_restart_reports_no_ts_twice(
        watcher_home, spark, consensus_url, tmp_path, capsys):
    home = watcher_home
    blob_root = str(tmp_path / "blob")
    landing = tmp_path / "landing"
    generate(str(landing), SPEC)
    ctl = Upsertctl(capsys, consensus_url, blob_root)
    ctl.ok("init", "orders", "--source", f"dir:{landing}", "--key", "id", "--order-by", "updated_at",
           "--delete-marker", "deleted", "--schema", SAMPLE_SCHEMA_DDL, "--max-files-per-batch", "2")
    rows_out: dict[int, int] = {}

    def commit(batches: int) -> None:
        report = json.loads(ctl.ok("run-batch", "orders", "--max-batches", str(batches), "--json").strip()
                            .splitlines()[-1])
        committed = [b for b in report["batches"] if b["outcome"] == "committed"]
        assert len(committed) == batches, report
        rows_out.update((b["ts"], b["rows_out"]) for b in committed)

    env = home.env(consensus_url, blob_root)
    proc = home.run([os.path.join(VENV_BIN, "airflow"), "dags", "reserialize"], env)
    assert proc.returncode == 0, failure_text(proc)
    # The watcher's trigger is in the metadata database, with the DAG's arguments.
    registered = home.query("SELECT t.classpath, w.name FROM trigger t JOIN asset_watcher w ON w.trigger_id = t.id "
                            "JOIN asset a ON a.id = w.asset_id WHERE a.name = ?", ASSET)
    assert registered == [("airflow_upsert_provider.triggers.commits.ShardCommitTrigger", "orders_commits")]

    commit(2)  # ts 0-1, before any triggerer runs
    log = str(tmp_path / "triggerer.log")
    triggerer = Triggerer(home, env, log)
    try:
        assert wait_for(lambda: _ranges(home) == [(0, 2)] or triggerer.proc.poll() is not None,
                        timeout=START_TIMEOUT, interval=0.5), (_ranges(home), triggerer.output())
        assert triggerer.proc.poll() is None, triggerer.output()
        commit(1)  # ts 2
        assert wait_for(lambda: len(_ranges(home)) >= 2, timeout=EVENT_TIMEOUT, interval=0.5), triggerer.output()
        assert _ranges(home) == [(0, 2), (2, 3)]
    finally:
        triggerer.stop()
    # Airflow's own state store of the Asset holds what was reported.
    assert _state_store(home) == {REPORTED_UPPER_KEY: 3}

    commit(1)  # ts 3, while no triggerer runs
    triggerer = Triggerer(home, env, log)
    try:
        # The restarted triggerer resumes at 3: its first event is [3, 4), not [0, 4).
        assert wait_for(lambda: len(_ranges(home)) >= 3 or triggerer.proc.poll() is not None,
                        timeout=START_TIMEOUT, interval=0.5), triggerer.output()
        assert triggerer.proc.poll() is None, triggerer.output()
        assert _ranges(home) == [(0, 2), (2, 3), (3, 4)], (_ranges(home), triggerer.output()[-2000:])
        commit(1)  # ts 4
        assert wait_for(lambda: len(_ranges(home)) >= 4, timeout=EVENT_TIMEOUT, interval=0.5), triggerer.output()
    finally:
        triggerer.stop()

    payloads = _payloads(home)
    assert [(p["from_ts"], p["to_ts"]) for p in payloads] == [(0, 2), (2, 3), (3, 4), (4, 5)]
    assert [p["rows_out"] for p in payloads] == [rows_out[0] + rows_out[1], rows_out[2], rows_out[3], rows_out[4]]
    assert all(p["schema_version"] == 1 and p["shard"] == "orders" for p in payloads), payloads
    # No ts twice, none missed.
    assert sorted(ts for p in payloads for ts in range(p["from_ts"], p["to_ts"])) == list(range(5))
    assert _state_store(home) == {REPORTED_UPPER_KEY: 5}

    # The scheduler's step: a run of the watching DAG, whose task gets the events as its
    # triggering Asset events. Airflow queues the DAG at the first event and leaves that queue
    # entry as it is at the next ones; the run takes the events up to the one that queued it,
    # the later ones go to the run the next event queues (a running scheduler makes a run
    # about each event).
    proc = home.run([sys.executable, STEPS, "trigger-and-run", DAG_ID], env, timeout=600)
    assert proc.returncode == 0, failure_text(proc)
    runs = [line.split()[1:3] for line in proc.stdout.splitlines() if line.startswith("RUN ")]
    assert [state for _, state in runs] == ["success"], failure_text(proc)
    assert home.xcom(DAG_ID, runs[0][0], "report_commits") == [[0, 2]]
