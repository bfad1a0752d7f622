"""Scale-out: a Spark standalone master and workers on loopback. The operator in `submit` mode
through the Spark provider's SparkSubmitHook, a PostgreSQL consensus: the table equals the
oracle after each batch. Batches on a cluster of two workers whose executors write
the runs to the loopback S3 server with their own environment's credentials: the table
equals the oracle, and both workers wrote run files."""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess

import pyspark
import pytest

from airflow_upsert_provider.engine.blob.files import open_blob
from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.engine.table.shard import Shard
from airflow_upsert_provider.sample_data import SampleSpec, generate
from tests.airflow.conftest import SAMPLE_SCHEMA, failure_text, init_shard, read_table
from tests.conftest import REPO_ROOT, TEST_JVM_OPTIONS, cli_env
from tests.oracle import oracle_table, table_from_rows
from tests.pgserver import free_port, wait_for

pytestmark = pytest.mark.slow

SPARK_HOME = os.path.dirname(os.path.abspath(pyspark.__file__))


class StandaloneCluster:
    """One master and ``workers`` small workers (one core each), all on 127.0.0.1; ``env``:
    variables of the workers' own environment (their executors inherit it)."""

    def __init__(self, directory: str, *, workers: int = 1, env: dict[str, str] | None = None) -> None:
        self.dir = directory
        self.port = free_port()
        self.workers = workers
        self.work_dirs = [os.path.join(directory, f"work-{n}") for n in range(workers)]
        for work_dir in self.work_dirs:
            os.makedirs(work_dir, exist_ok=True)
        self.work_dir = self.work_dirs[0]
        self.env = dict(
            os.environ,
            SPARK_HOME=SPARK_HOME,
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_LOG_DIR=directory,
            # No REST submission server: it would claim a fixed port.
            SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
            # The master and workers take the options of the suite's other JVMs (C1 only).
            SPARK_DAEMON_JAVA_OPTS=TEST_JVM_OPTIONS,
            **(env or {}),
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
        for n, work_dir in enumerate(self.work_dirs):
            self._start("worker" if n == 0 else f"worker-{n}", "org.apache.spark.deploy.worker.Worker",
                        "--host", "127.0.0.1", "--cores", "1", "--memory", "1g", "--webui-port", str(free_port()),
                        "--work-dir", work_dir, f"spark://127.0.0.1:{self.port}")
        assert wait_for(lambda: self.log("master").count("Registering worker") == self.workers, timeout=120), \
            self.log("master")
        return self

    @staticmethod
    def executor_logs(work_dir: str, app: str) -> list[str]:
        """The stderr of every executor of application ``app`` a worker ran."""
        return glob.glob(os.path.join(work_dir, app, "*", "stderr"))

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, s3_server):
    """One master and two workers for the module (a cluster start is two JVMs and a wait).
    The workers' own environment points at the S3 server (their executors take the
    credentials from there: nothing is sent from the driver) and imports this checkout."""
    running = StandaloneCluster(str(tmp_path_factory.mktemp("spark-cluster")), workers=2, env=dict(
        s3_server.environment(), PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))).start()
    yield running
    running.stop()


def test_submit_mode_on_a_standalone_cluster_equals_the_oracle(airflow_home, cluster, pg_url, tmp_path, spark):
    landing = str(tmp_path / "landing")
    generate(landing, SampleSpec(records=2000, keys=400, partitions=2, segments_per_partition=4, seed=9))
    blob = str(tmp_path / "blob")
    init_shard(pg_url, blob, landing, shard="orders", max_files_per_batch=3)

    # One core of the cluster's two (spark-submit reads SPARK_CONF_DIR's defaults): one executor
    # JVM is what this test needs; the two-worker test below spreads a job over both. The
    # executor takes the suite's JVM options, as the driver does.
    conf_dir = tmp_path / "spark-conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text(
        f"spark.cores.max 1\nspark.executor.extraJavaOptions {TEST_JVM_OPTIONS}\n")
    submit_env = airflow_home.env(pg_url, blob, spark_master="spark://127.0.0.1", spark_port=cluster.port,
                                  SPARK_CONF_DIR=str(conf_dir))
    proc = airflow_home.dags_test("upsert_microbatch", submit_env, conf={"spark_mode": "submit"})
    assert proc.returncode == 0, failure_text(proc)
    run_id = airflow_home.latest_run("upsert_microbatch")
    report = airflow_home.xcom("upsert_microbatch", run_id, "upsert")
    assert report["spark_mode"] == "submit"
    assert [b["outcome"] for b in report["batches"]] == ["committed"] * 3 + ["nothing_to_do"]
    # The job ran on the cluster: the master registered it, a worker ran its executor.
    assert "Registered app upsert-orders" in cluster.log("master")
    app = app_id(cluster, "upsert-orders")
    assert sum(bool(cluster.executor_logs(work_dir, app)) for work_dir in cluster.work_dirs) == 1
    # The consensus password never reached the logged spark-submit command line.
    password = pg_url.split(":")[2].split("@")[0]
    assert password not in proc.stdout + proc.stderr

    # The shard's own batches (3, 3 and 2 of the 8 segments), each holding the rows an
    # in-process run would: the table at each batch's upper is the oracle of what it bound.
    consensus = open_consensus(pg_url)
    try:
        bindings = [b.ranges for b in consensus.bindings("orders")]
    finally:
        consensus.dispose()
    assert [sum(len(r["files"]) for r in ranges.values()) for ranges in bindings] == [3, 3, 2]
    consensus = open_consensus(pg_url)
    try:
        shard = Shard.open(consensus, open_blob(blob), "orders")
        bound: dict[str, int] = {}
        for ts, ranges in enumerate(bindings):
            bound.update({partition: rng["to"] for partition, rng in ranges.items()})
            as_of = table_from_rows(shard.read(spark, as_of=ts + 1).collect())
            assert as_of == oracle_table(landing, max_offset=bound), ts
    finally:
        consensus.dispose()
    assert read_table(pg_url, blob, "orders") == oracle_table(landing)


def app_id(cluster: StandaloneCluster, name: str) -> str:
    """The id the master gave the (last) application called ``name``."""
    found = re.findall(rf"Registered app {re.escape(name)} with ID (app-\S+)", cluster.log("master"))
    assert found, cluster.log("master")[-3000:]
    return found[-1]


def tasks_run_by(cluster: StandaloneCluster, app: str) -> list[set[int]]:
    """Per worker, the ids (TID) of the task attempts its executors ran for application
    ``app``, from their logs (task ids restart at 0 in every application)."""
    ran = []
    for work_dir in cluster.work_dirs:
        tids: set[int] = set()
        for path in cluster.executor_logs(work_dir, app):
            with open(path, encoding="utf-8", errors="replace") as handle:
                tids |= {int(t) for t in re.findall(r"Running task \S+ in stage \S+ \(TID (\d+)\)", handle.read())}
        ran.append(tids)
    return ran


def test_batches_on_a_two_worker_cluster_write_a_shard_on_s3(cluster, s3_server, s3_root, tmp_path):
    from tests.test_invariants_s3 import read_table as read_table_arrow
    from tests.test_run_io_s3 import check_run_is_what_is_stored, upsertctl

    landing = str(tmp_path / "landing")
    generate(landing, SampleSpec(records=2000, keys=400, partitions=2, segments_per_partition=4, seed=9))
    url = f"sqlite:///{tmp_path / 'consensus.db'}"
    env = cli_env(url, s3_root)

    def run(*args: str) -> str:
        done = upsertctl(*args, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    run("init", "orders", "--source", f"dir:{landing}", "--key", "id", "--order-by", "updated_at",
        "--delete-marker", "deleted", "--schema", SAMPLE_SCHEMA, "--buckets", "4", "--max-files-per-batch", "4")
    # The batches run on the cluster (one application): they start once both executors are
    # registered, and a task goes to whichever executor is free (no wait for locality).
    report = json.loads(run(
        "run-batch", "orders", "--until-caught-up", "--json", "--master", f"spark://127.0.0.1:{cluster.port}",
        "--conf", "spark.scheduler.minRegisteredResourcesRatio=1.0",
        "--conf", "spark.scheduler.maxRegisteredResourcesWaitingTime=300s",
        "--conf", "spark.locality.wait=0", "--conf", "spark.executor.memory=512m",
        "--conf", f"spark.executor.extraJavaOptions={TEST_JVM_OPTIONS}"))
    assert [b["outcome"] for b in report["batches"]][:2] == ["committed", "committed"]
    assert "Registered app airflow-upsert-provider" in cluster.log("master")
    # The table read by the Arrow reader (no third JVM): Spark's reads of runs on S3 are
    # tested in process (tests/test_run_io_s3.py).
    assert read_table_arrow("orders", env, str(tmp_path / "table.parquet")) == oracle_table(landing)

    bucket, prefix = s3_root[len("s3://"):].split("/", 1)
    consensus = open_consensus(url)
    try:
        runs = [batch.run for batch in consensus.batches("orders")]
    finally:
        consensus.dispose()
    assert len(runs) == 2
    for written in runs:
        check_run_is_what_is_stored(s3_server, bucket, prefix, written)
    # Which worker wrote each file: a file is named after the task attempt that wrote it
    # (part-t<TID>-…), and each worker's executor log lists the attempts it ran.
    ran = tasks_run_by(cluster, app_id(cluster, "airflow-upsert-provider"))
    writers = []
    for listed in (f for written in runs for f in written["files"]):
        tid = int(re.search(r"/part-t(\d+)-[0-9a-f]+\.parquet$", listed["path"]).group(1))
        writers.append([n for n, tids in enumerate(ran) if tid in tids])
    assert all(len(w) == 1 for w in writers), (writers, ran)
    # Both workers' executors ran tasks of the batches. Which of them wrote the run files is
    # the scheduler's choice (a task goes to whichever executor is free first), so that is not
    # asserted: on a loaded machine one executor took every write task.
    assert all(ran), ran
