"""A zombie: the upsert task's process is killed with SIGKILL after staging its files, while
its commit waits. The retry (the next try number, a new writer) completes; the table equals
the oracle; the killed try's files are not referenced by the shard."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys

import psycopg
import pytest

from airflow_upsert_provider.sample_data import SampleSpec, generate
from tests.airflow.conftest import failure_text, init_shard, read_table
from tests.oracle import oracle_table
from tests.pgserver import wait_for

pytestmark = pytest.mark.slow

STEPS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scheduler_steps.py")


def _waiting_updates(conn) -> int:
    """Sessions blocked on a lock while updating the shard row: a commit in progress."""
    return conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND query ILIKE 'UPDATE upsert_shards%'"
    ).fetchone()[0]


def test_killed_try_is_superseded_by_its_retry(airflow_home, pg_url, tmp_path):
    landing = str(tmp_path / "landing")
    generate(landing, SampleSpec(records=1200, keys=300, partitions=2, segments_per_partition=3, seed=3))
    blob = str(tmp_path / "blob")
    init_shard(pg_url, blob, landing, max_files_per_batch=64)
    home = airflow_home.clone(str(tmp_path / "home"))
    env = home.env(pg_url, blob)

    # Hold the shard row: the first try stages its batch, then its compare-and-append waits.
    lock = psycopg.connect(pg_url)
    lock.execute("SELECT upper FROM upsert_shards WHERE shard_id = 'orders' FOR UPDATE")
    zombie = subprocess.Popen(
        home.dags_test_cmd("upsert_microbatch"), env=env, cwd=home.path,
        text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )
    watcher = psycopg.connect(pg_url, autocommit=True)
    try:
        assert wait_for(lambda: _waiting_updates(watcher) == 1 or zombie.poll() is not None, timeout=300)
        assert zombie.poll() is None, zombie.stdout.read()[-6000:]
        staged = glob.glob(os.path.join(blob, "orders", "runs", "ts=000000000000", "*"))
        assert len(staged) == 1 and "try1" in os.path.basename(staged[0])
        assert glob.glob(os.path.join(staged[0], "**", "*.parquet"), recursive=True)
        os.killpg(zombie.pid, signal.SIGKILL)
        zombie.wait(timeout=60)
    finally:
        lock.rollback()
        lock.close()
    # The killed backend's transaction is rolled back when the server sees its client gone.
    assert wait_for(lambda: _waiting_updates(watcher) == 0, timeout=60)
    watcher.close()

    run_id = home.latest_run("upsert_microbatch")
    assert home.task_instance("upsert_microbatch", run_id, "upsert") == ("running", 1)
    # The scheduler's two steps in one process: the heartbeat timeout fails the try, which puts
    # it up for retry; then the retry runs.
    retry = home.run([sys.executable, STEPS, "heartbeat-timeout,run-retry", "upsert_microbatch", run_id, "upsert"],
                     env, timeout=600)
    assert retry.returncode == 0, failure_text(retry)
    states = [line for line in retry.stdout.splitlines() if line.startswith("STATE ")]
    assert states == ["STATE up_for_retry TRY 1", "STATE success TRY 2"], failure_text(retry)
    assert home.task_instance("upsert_microbatch", run_id, "upsert") == ("success", 2)
    report = home.xcom("upsert_microbatch", run_id, "upsert")
    assert report["writer_id"] == f"airflow:upsert_microbatch:{run_id}:upsert:try2"
    assert [(b["ts"], b["outcome"]) for b in report["batches"]] == [(0, "committed"), (1, "nothing_to_do")]

    from airflow_upsert_provider.engine.store.registry import open_consensus

    consensus = open_consensus(pg_url)
    try:
        batches = consensus.batches("orders")
        assert consensus.get_shard("orders").upper == 1
    finally:
        consensus.dispose()
    assert [(b.ts, b.writer_id) for b in batches] == [(0, report["writer_id"])]
    referenced = {f["path"] for b in batches for f in b.run["files"]}
    killed_files = {
        os.path.relpath(p, blob) for p in glob.glob(os.path.join(staged[0], "**", "*.parquet"), recursive=True)
    }
    # The zombie's files stay on disk (its outcome was unknown: only GC may delete them)
    # and nothing the shard reads points at them.
    assert killed_files and referenced.isdisjoint(killed_files)
    assert all(path.startswith("orders/runs/ts=000000000000/") and "try2" in path for path in referenced)
    assert read_table(pg_url, blob, "orders") == oracle_table(landing)
