"""Scale-out: a Spark standalone master and worker on loopback, the operator in `submit` mode
through the Spark provider's SparkSubmitHook, a PostgreSQL consensus. The table equals the
in-process run's (and the oracle)."""

from __future__ import annotations

import glob
import os
import signal
import subprocess

import pyspark
import pytest

from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.sample_data import SampleSpec, generate
from tests.airflow.conftest import failure_text, init_shard, read_table
from tests.oracle import oracle_table
from tests.pgserver import free_port, wait_for

pytestmark = pytest.mark.slow

SPARK_HOME = os.path.dirname(os.path.abspath(pyspark.__file__))


class StandaloneCluster:
    """One master and one small worker, both on 127.0.0.1."""

    def __init__(self, directory: str) -> None:
        self.dir = directory
        self.port = free_port()
        self.work_dir = os.path.join(directory, "work")
        os.makedirs(self.work_dir, exist_ok=True)
        self.env = dict(
            os.environ,
            SPARK_HOME=SPARK_HOME,
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_LOG_DIR=directory,
            # No REST submission server: it would claim a fixed port.
            SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
        )
        self.procs: list[subprocess.Popen] = []

    def _start(self, name: str, *args: str) -> subprocess.Popen:
        log = open(os.path.join(self.dir, f"{name}.log"), "w")
        proc = subprocess.Popen(
            [os.path.join(SPARK_HOME, "bin", "spark-class"), *args],
            env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        self.procs.append(proc)
        return proc

    def log(self, name: str) -> str:
        with open(os.path.join(self.dir, f"{name}.log"), encoding="utf-8", errors="replace") as handle:
            return handle.read()

    def start(self) -> "StandaloneCluster":
        self._start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", str(self.port), "--webui-port", str(free_port()))
        assert wait_for(lambda: "I have been elected leader" in self.log("master"), timeout=120), self.log("master")
        self._start("worker", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                    "--cores", "1", "--memory", "1g", "--webui-port", str(free_port()),
                    "--work-dir", self.work_dir, f"spark://127.0.0.1:{self.port}")
        assert wait_for(lambda: "Registering worker" in self.log("master"), timeout=120), self.log("worker")
        return self

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


@pytest.fixture
def cluster(tmp_path):
    running = StandaloneCluster(str(tmp_path / "spark-cluster")).start()
    yield running
    running.stop()


def _batches(url: str, shard: str) -> list[tuple[int, str, int]]:
    consensus = open_consensus(url)
    try:
        return [(b.ts, b.writer_id, b.run["rows"]) for b in consensus.batches(shard)]
    finally:
        consensus.dispose()


def test_submit_mode_on_a_standalone_cluster_equals_the_local_run(airflow_home, cluster, pg_url, tmp_path, spark):
    landing = str(tmp_path / "landing")
    generate(landing, SampleSpec(records=2000, keys=400, partitions=2, segments_per_partition=4, seed=9))
    blob = str(tmp_path / "blob")
    init_shard(pg_url, blob, landing, shard="orders", max_files_per_batch=3)
    init_shard(pg_url, blob, landing, shard="orders_local", max_files_per_batch=3)

    submit_env = airflow_home.env(pg_url, blob, spark_master="spark://127.0.0.1", spark_port=cluster.port)
    proc = airflow_home.dags_test("upsert_microbatch", submit_env, conf={"spark_mode": "submit"})
    assert proc.returncode == 0, failure_text(proc)
    run_id = airflow_home.latest_run("upsert_microbatch")
    report = airflow_home.xcom("upsert_microbatch", run_id, "upsert")
    assert report["spark_mode"] == "submit"
    assert [b["outcome"] for b in report["batches"]] == ["committed"] * 3 + ["nothing_to_do"]
    # The job ran on the cluster: the master registered it, the worker ran its executor.
    assert "Registered app upsert-orders" in cluster.log("master")
    assert glob.glob(os.path.join(cluster.work_dir, "app-*", "*", "stderr"))
    # The consensus password never reached the logged spark-submit command line.
    password = pg_url.split(":")[2].split("@")[0]
    assert password not in proc.stdout + proc.stderr

    proc = airflow_home.dags_test("upsert_microbatch", airflow_home.env(pg_url, blob), conf={"shard": "orders_local"})
    assert proc.returncode == 0, failure_text(proc)

    submitted, local = _batches(pg_url, "orders"), _batches(pg_url, "orders_local")
    assert [(ts, rows) for ts, _, rows in submitted] == [(ts, rows) for ts, _, rows in local]
    expected = oracle_table(landing)
    assert read_table(pg_url, blob, "orders", spark) == read_table(pg_url, blob, "orders_local", spark) == expected
