"""The example DAGs end to end: `airflow dags test` in the shared Airflow home, on the
embedded kind of store (SQLite consensus, local blob, local Spark). A backfill binds one
large batch, then the scheduled DAG catches the rest up in the shard's small batches."""

from __future__ import annotations

import os

import pytest

from airflow_upsert_provider.engine.consensus import open_consensus
from airflow_upsert_provider.sample_data import SampleSpec, generate
from demo.task_logs import save_task_logs
from tests.airflow.conftest import failure_text, init_shard, read_table
from tests.airflow.test_demo import read_task_log
from tests.oracle import oracle_table

pytestmark = pytest.mark.slow

SPEC = SampleSpec(records=2400, keys=600, partitions=2, segments_per_partition=6, seed=11)


def _bindings(url: str) -> list[dict]:
    consensus = open_consensus(url)
    try:
        return [b.ranges for b in consensus.bindings("orders")]
    finally:
        consensus.dispose()


def test_backfill_then_schedule_catch_the_shard_up(airflow_home, tmp_path, spark):
    landing = str(tmp_path / "landing")
    generate(landing, SPEC)
    url, blob = f"sqlite:///{tmp_path / 'consensus.db'}", str(tmp_path / "blob")
    init_shard(url, blob, landing, max_files_per_batch=3)
    env = airflow_home.env(url, blob)

    bad = airflow_home.dags_test("upsert_backfill", env, conf={"shard": "orders", "batch_size": 0})
    assert bad.returncode != 0
    assert "batch_size" in bad.stdout + bad.stderr
    assert _bindings(url) == []

    proc = airflow_home.dags_test("upsert_backfill", env, conf={"shard": "orders", "batch_size": 8, "max_batches": 1})
    assert proc.returncode == 0, failure_text(proc)
    run_id = airflow_home.latest_run("upsert_backfill")
    assert airflow_home.task_instance("upsert_backfill", run_id, "backfill") == ("success", 1)
    report = airflow_home.xcom("upsert_backfill", run_id, "backfill")
    assert [(b["ts"], b["outcome"]) for b in report["batches"]] == [(0, "committed")]
    # One batch of 8 files, not the shard's 3: the backfill minted the binding.
    first = _bindings(url)[0]
    assert sum(len(r["files"]) for r in first.values()) == 8
    assert read_table(url, blob, "orders", spark) == oracle_table(
        landing, max_offset={p: rng["to"] for p, rng in first.items()}
    )

    proc = airflow_home.dags_test("upsert_microbatch", env)
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
    assert read_table(url, blob, "orders", spark) == oracle_table(landing)
