"""The example DAGs end to end: `airflow dags test` in the shared Airflow home, on the
embedded kind of store (SQLite consensus, local blob, local Spark). A backfill binds one
large batch, then the scheduled DAG catches the rest up in the shard's small batches; each
committing run emits one event on the shard's Asset with its numbers, which queues the DAG
scheduled on it, and a caught-up run emits none. The recovery DAG restores a shard whose consensus store was lost from its checkpoint, seeks and
resumes it; a micro-batch run then catches it up from the checkpoint's upper."""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from types import SimpleNamespace

import pytest

from airflow_upsert_provider.engine.store import streams
from airflow_upsert_provider.engine.blob.files import open_blob
from airflow_upsert_provider.engine.maintenance.checkpoint import create_checkpoint
from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.engine.table.shard import Shard
from airflow_upsert_provider.engine.write.writer import Writer
from airflow_upsert_provider.operators.upsert import MicroBatchUpsertOperator
from airflow_upsert_provider.sample_data import SampleSpec, generate
from demo.task_logs import save_task_logs
from tests.airflow.conftest import AirflowHome, DagsTestProcess, failure_text, init_shard, read_table
from tests.airflow.test_demo import read_task_log
from tests.helpers import table
from tests.maintenance.support import oracle, written_shard
from tests.oracle import oracle_table

pytestmark = pytest.mark.slow

SPEC = SampleSpec(records=2400, keys=600, partitions=2, segments_per_partition=6, seed=11)


def _bindings(url: str) -> list[dict]:
    consensus = open_consensus(url)
    try:
        return [b.ranges for b in consensus.bindings("orders")]
    finally:
        consensus.dispose()


URI = "upsert://upsert_default/orders"
CONSUMER = "upsert_fresh_data"


def _events(home: AirflowHome) -> list[dict]:
    return home.asset_events(URI)


def _queued(home: AirflowHome) -> list[str]:
    return [r[0] for r in home.query(
        "SELECT q.target_dag_id FROM asset_dag_run_queue q JOIN asset a ON a.id = q.asset_id WHERE a.uri = ?", URI)]


def _event_of(report: dict, upper_before: int) -> dict:
    committed = [b for b in report["batches"] if b["outcome"] == "committed"]
    return {"upper": report["upper"], "upper_before": upper_before, "committed": report["committed"],
            "rows_in": sum(b["rows_in"] for b in committed), "rows_out": sum(b["rows_out"] for b in committed),
            "from_ts": upper_before, "to_ts": report["upper"], "schema_version": 1}


@contextmanager
def _consumer_unpaused(home: AirflowHome):
    """The DAG scheduled on the shard's Asset unpaused (Airflow queues no run of a paused DAG),
    with none of the shard's events or queued runs left by other tests' runs; the shared home
    is left as it was found: paused, nothing queued."""
    home.query("DELETE FROM asset_dag_run_queue")
    home.query("DELETE FROM asset_event")
    home.query("UPDATE dag SET is_paused = 0 WHERE dag_id = ?", CONSUMER)
    try:
        assert home.query("SELECT is_paused FROM dag WHERE dag_id = ?", CONSUMER) == [(0,)]
        assert _events(home) == [] and _queued(home) == []
        yield
    finally:
        home.query("UPDATE dag SET is_paused = 1 WHERE dag_id = ?", CONSUMER)
        home.query("DELETE FROM asset_dag_run_queue")


def test_backfill_then_schedule_catch_the_shard_up(airflow_home, tmp_path):
    landing = str(tmp_path / "landing")
    generate(landing, SPEC)
    url, blob = f"sqlite:///{tmp_path / 'consensus.db'}", str(tmp_path / "blob")
    init_shard(url, blob, landing, max_files_per_batch=3)
    env = airflow_home.env(url, blob)
    # The three runs in one Airflow process (one import of Airflow, one Spark driver JVM),
    # each checked before the next starts.
    with _consumer_unpaused(airflow_home), airflow_home.dags_test_process(env) as airflow:
        _backfill_then_schedule(airflow_home, airflow, env, url, blob, landing)


def _backfill_then_schedule(airflow_home: AirflowHome, airflow: DagsTestProcess, env: dict[str, str], url: str,
                            blob: str, landing: str) -> None:

    # A batch_size the form refuses (0) is refused by the param's schema before any task runs:
    # tests/airflow/test_provider.py checks every param's refusals without an Airflow process.
    proc = airflow.dags_test("upsert_backfill", conf={"shard": "orders", "batch_size": 8, "max_batches": 1})
    assert proc.returncode == 0, failure_text(proc)
    run_id = airflow_home.latest_run("upsert_backfill")
    assert airflow_home.task_instance("upsert_backfill", run_id, "backfill") == ("success", 1)
    report = airflow_home.xcom("upsert_backfill", run_id, "backfill")
    assert [(b["ts"], b["outcome"]) for b in report["batches"]] == [(0, "committed")]
    # One batch of 8 files, not the shard's 3: the backfill minted the binding.
    first = _bindings(url)[0]
    assert sum(len(r["files"]) for r in first.values()) == 8
    assert read_table(url, blob, "orders") == oracle_table(
        landing, max_offset={p: rng["to"] for p, rng in first.items()}
    )
    # Its committing run emitted one event on the shard's Asset, which queued the DAG scheduled on it.
    assert _events(airflow_home) == [_event_of(report, upper_before=0)]
    assert _queued(airflow_home) == [CONSUMER]

    proc = airflow.dags_test("upsert_microbatch")
    assert proc.returncode == 0, failure_text(proc)
    run_id = airflow_home.latest_run("upsert_microbatch")
    assert airflow_home.task_instance("upsert_microbatch", run_id, "upsert") == ("success", 1)
    report = airflow_home.xcom("upsert_microbatch", run_id, "upsert")
    # The 4 remaining segments in the shard's batches of 3, then the source is caught up.
    assert [(b["ts"], b["outcome"]) for b in report["batches"]] == [
        (1, "committed"), (2, "committed"), (3, "nothing_to_do"),
    ]
    assert report["upper"] == 3 and report["committed"] == 2
    assert report["writer_id"] == f"airflow:upsert_microbatch:{run_id}:upsert:try1"
    assert report["batches"][-1]["lag_offsets"] == {"p0": 0, "p1": 0}
    # The demo keeps the run's task log where the UI reads it; the UI's reader then shows it.
    written = save_task_logs(proc.stdout + "\n" + proc.stderr, os.path.join(airflow_home.path, "logs"),
                             "upsert_microbatch", run_id)
    assert len(written) == 1 and written[0].endswith("task_id=upsert/attempt=1.log")
    shown = read_task_log(airflow_home, env, "upsert_microbatch", run_id, "upsert")
    assert any(line.startswith("batch ts=2 committed: rows in") for line in shown), shown[-20:]
    assert not any("Could not read served logs" in line for line in shown)
    assert [sum(len(r["files"]) for r in b.values()) for b in _bindings(url)] == [8, 3, 1]
    assert read_table(url, blob, "orders") == oracle_table(landing)
    # One more event, with this run's numbers; the consumer stays queued once.
    assert _events(airflow_home)[1:] == [_event_of(report, upper_before=1)]
    assert _queued(airflow_home) == [CONSUMER]

    # Caught up: the next run commits nothing, and Airflow registers no event (the operator took
    # the shard's asset out of the try's outlets, which the task runner sends on success).
    proc = airflow.dags_test("upsert_microbatch")
    assert proc.returncode == 0, failure_text(proc)
    report = airflow_home.xcom("upsert_microbatch", airflow_home.latest_run("upsert_microbatch"), "upsert")
    assert report["committed"] == 0 and report["upper"] == 3, report
    assert len(_events(airflow_home)) == 2
    assert f"this run committed no batch, no event for asset {URI}" in proc.stdout + proc.stderr


def test_recovery_dag_restores_a_lost_store_from_its_checkpoint_seeks_and_resumes(airflow_home, tmp_path, spark,
                                                                                   monkeypatch):
    consensus_db = tmp_path / "consensus.db"
    url = f"sqlite:///{consensus_db}"
    blob = open_blob(str(tmp_path / "blob"))
    blob.ensure_root()
    consensus = open_consensus(url)
    shard = written_shard(spark, consensus, blob, tmp_path, batches=2)
    checkpoint = create_checkpoint(shard)
    # The shard moves on after its checkpoint, then its consensus store is lost.
    Writer(shard, "after-checkpoint", spark_factory=lambda: spark).run(max_batches=2, with_lag=False)
    assert (checkpoint.upper, shard.state().upper) == (2, 4)
    consensus.dispose()
    os.remove(consensus_db)

    env = airflow_home.env(url, blob.root)
    proc = airflow_home.dags_test("upsert_recovery", env, conf={"shard": "orders", "checkpoint": "latest"})
    assert proc.returncode == 0, failure_text(proc)
    run_id = airflow_home.latest_run("upsert_recovery")
    for task in ("restore", "seek", "resume"):
        assert airflow_home.task_instance("upsert_recovery", run_id, task) == ("success", 1)
    restored = airflow_home.xcom("upsert_recovery", run_id, "restore")
    epoch = restored["stream"]["epoch"]
    assert (restored["shard"], restored["checkpoint"], restored["upper"]) == ("orders", checkpoint.id, 2)
    assert restored["stream"]["status"] == "RECOVERING" and epoch > 0
    sought = airflow_home.xcom("upsert_recovery", run_id, "seek")
    assert (sought["epoch"], sought["upper"], sought["stream"]["seeked_epoch"]) == (epoch, 2, epoch)
    resumed = airflow_home.xcom("upsert_recovery", run_id, "resume")
    assert (resumed["from"], resumed["status"], resumed["epoch"]) == ("RECOVERING", "READY", epoch)

    consensus = open_consensus(url)
    try:
        shard = Shard.open(consensus, blob, "orders")
        # READY at the checkpoint's upper; every step recorded with the task try that took it.
        assert streams.read_stream(consensus, "orders").status.value == "READY"
        assert shard.state().upper == checkpoint.upper
        task = f"airflow:upsert_recovery:{run_id}"
        assert [(h["action"], h["to"], h["actor"], h["epoch"]) for h in streams.stream_history(consensus, "orders")] == [
            ("restore", "RECOVERING", f"{task}:restore:try1", epoch),
            ("recover seek", "RECOVERING", f"{task}:seek:try1", epoch),
            ("recover resume", "READY", f"{task}:resume:try1", epoch),
        ]
        # A micro-batch run catches the restored shard up from the checkpoint's upper.
        monkeypatch.setenv("AIRFLOW_CONN_UPSERT_DEFAULT", env["AIRFLOW_CONN_UPSERT_DEFAULT"])
        ti = SimpleNamespace(dag_id="upsert_microbatch", run_id="manual__1", task_id="upsert", map_index=-1,
                             try_number=1)
        report = MicroBatchUpsertOperator(task_id="upsert", shard="orders", until_caught_up=True).execute({"ti": ti})
        assert [b["ts"] for b in report["batches"] if b["outcome"] == "committed"] == [2, 3, 4, 5]
        assert report["upper"] == 6 == shard.state().upper
        assert table(shard) == oracle(shard)
    finally:
        consensus.dispose()
