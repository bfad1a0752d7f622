"""A scheduled run and a backfill run of the example DAGs at the same time on one shard, in
separate Airflow processes: they converge on one table, equal to the oracle."""

from __future__ import annotations

import subprocess
from datetime import datetime

import pytest

from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.sample_data import SampleSpec, generate
from tests.airflow.conftest import init_shard, read_table
from tests.oracle import oracle_table

pytestmark = pytest.mark.slow


def test_scheduled_and_backfill_runs_converge(airflow_home, tmp_path):
    landing = str(tmp_path / "landing")
    # 16 segments: the scheduled run's 8 batches of 2 and the backfill's 3 of 6 overlap in time
    # and race for bindings (twice the segments ran the same races).
    generate(landing, SampleSpec(records=1600, keys=400, partitions=2, segments_per_partition=8, seed=5))
    url, blob = f"sqlite:///{tmp_path / 'consensus.db'}", str(tmp_path / "blob")
    init_shard(url, blob, landing, max_files_per_batch=2)

    # Two Airflow deployments' worth of metadata; one shard store.
    scheduled_home = airflow_home.clone(str(tmp_path / "home-scheduled"))
    backfill_home = airflow_home.clone(str(tmp_path / "home-backfill"))
    procs = {
        "scheduled": subprocess.Popen(
            scheduled_home.dags_test_cmd("upsert_microbatch"), env=scheduled_home.env(url, blob),
            cwd=scheduled_home.path, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        ),
        "backfill": subprocess.Popen(
            backfill_home.dags_test_cmd("upsert_backfill", {"shard": "orders", "batch_size": 6}),
            env=backfill_home.env(url, blob), cwd=backfill_home.path,
            text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        ),
    }
    outputs = {name: proc.communicate(timeout=900)[0] for name, proc in procs.items()}
    for name, proc in procs.items():
        assert proc.returncode == 0, f"{name} failed:\n{outputs[name][-6000:]}"

    runs = {
        "scheduled": (scheduled_home, "upsert_microbatch", "upsert"),
        "backfill": (backfill_home, "upsert_backfill", "backfill"),
    }
    reports, intervals = {}, {}
    for name, (home, dag_id, task_id) in runs.items():
        run_id = home.latest_run(dag_id)
        assert home.task_instance(dag_id, run_id, task_id) == ("success", 1)
        reports[name] = home.xcom(dag_id, run_id, task_id)
        start, end = home.query(
            "SELECT start_date, end_date FROM task_instance WHERE dag_id = ? AND run_id = ?", dag_id, run_id
        )[0]
        intervals[name] = (datetime.fromisoformat(start), datetime.fromisoformat(end))
    # The two tasks really ran at the same time.
    assert max(i[0] for i in intervals.values()) < min(i[1] for i in intervals.values())

    consensus = open_consensus(url)
    try:
        upper = consensus.get_shard("orders").upper
        batches = consensus.batches("orders")
    finally:
        consensus.dispose()
    # Both writers reached the shard's upper: nothing either holds keeps it behind.
    assert reports["scheduled"]["upper"] == reports["backfill"]["upper"] == upper
    assert [b.ts for b in batches] == list(range(upper))
    committed = {
        name: {b["ts"] for b in report["batches"] if b["outcome"] == "committed"}
        for name, report in reports.items()
    }
    # Every batch was committed exactly once, by one of the two writers.
    assert committed["scheduled"].isdisjoint(committed["backfill"])
    assert committed["scheduled"] | committed["backfill"] == set(range(upper))
    assert {b.writer_id for b in batches} <= {reports["scheduled"]["writer_id"], reports["backfill"]["writer_id"]}
    assert read_table(url, blob, "orders") == oracle_table(landing)
    # Each deployment announced only the batches its own writer committed: a batch is one event,
    # never a second one from the writer that converged on it (already_persisted).
    for name, (home, _, _) in runs.items():
        events = home.asset_events("upsert://upsert_default/orders")
        assert [e["committed"] for e in events] == ([len(committed[name])] if committed[name] else []), (name, events)
