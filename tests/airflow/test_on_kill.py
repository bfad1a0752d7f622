"""on_kill: a SIGTERM to the task's process (what Airflow sends to stop a task) cancels the
Spark work the task started; the try fails, the retry (try 2) completes the batch."""

from __future__ import annotations

import glob
import os
import signal
import subprocess

import pytest

from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.sample_data import SampleSpec, generate
from tests.airflow.conftest import init_shard, read_table
from tests.oracle import oracle_table
from tests.pgserver import wait_for

pytestmark = pytest.mark.slow


def test_sigterm_cancels_the_in_process_spark_job_and_the_retry_completes(airflow_home, tmp_path):
    landing = str(tmp_path / "landing")
    generate(landing, SampleSpec(records=120_000, keys=30_000, partitions=4, segments_per_partition=2, seed=21))
    url, blob = f"sqlite:///{tmp_path / 'consensus.db'}", str(tmp_path / "blob")
    init_shard(url, blob, landing, max_files_per_batch=64)
    home = airflow_home.clone(str(tmp_path / "home"))
    # The retry starts as soon as the try failed: the DAG's exponential backoff (30-60 s for a
    # first retry) is capped at 0 s, which `dags test` would otherwise wait out doing nothing.
    env = home.env(url, blob, AIRFLOW__CORE__MAX_TASK_RETRY_DELAY="0")
    proc = subprocess.Popen(
        home.dags_test_cmd("upsert_microbatch"), env=env, cwd=home.path,
        text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )
    # The first try's Spark job is writing its staged run.
    assert wait_for(
        lambda: glob.glob(os.path.join(blob, "orders", "runs", "ts=000000000000", "*try1*", "_temporary"))
        or proc.poll() is not None,
        timeout=300, interval=0.05,
    )
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output[-6000:]
    assert "on_kill: stopping the Spark jobs of this task" in output
    assert "new_state=up_for_retry" in output, output[-8000:]

    run_id = home.latest_run("upsert_microbatch")
    assert home.task_instance("upsert_microbatch", run_id, "upsert") == ("success", 2)
    report = home.xcom("upsert_microbatch", run_id, "upsert")
    assert report["writer_id"].endswith(":try2")
    consensus = open_consensus(url)
    try:
        assert [(b.ts, b.writer_id) for b in consensus.batches("orders")] == [(0, report["writer_id"])]
    finally:
        consensus.dispose()
    assert read_table(url, blob, "orders") == oracle_table(landing)
