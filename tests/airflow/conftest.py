"""An Airflow home shared by the Airflow tests: migrated and reserialized once per run.

Every DAG run is a real `airflow dags test` (or `dag.test()`) in a subprocess against this
home; the upsert connection comes from AIRFLOW_CONN_* environment variables, so each test
points the same example DAGs at its own shard store.
"""

from __future__ import annotations

import fcntl
import json
import os
import queue
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import pytest

from tests.airflow.dags_test_process import END
from tests.conftest import REPO_ROOT

VENV_BIN = os.path.dirname(sys.executable)
SAMPLE_SCHEMA = "id BIGINT, name STRING, amount DOUBLE, updated_at BIGINT, deleted BOOLEAN"


@dataclass
class AirflowHome:
    path: str
    base_env: dict[str, str]
    # The migrated metadata database every home of the run starts from; a clone copies it,
    # not this home's database, which the worker's earlier tests filled with their runs.
    template: str | None = None

    def env(self, consensus_url: str, blob_root: str, *, password: str | None = None,
            spark_master: str = "local[1]", spark_port: int | None = None, **extra: str) -> dict[str, str]:
        """Environment of an Airflow process whose `upsert_default` points at this store."""
        upsert: dict[str, Any] = {
            "conn_type": "upsert",
            "extra": {"consensus_url": consensus_url, "blob_root": blob_root},
        }
        if password:
            upsert["password"] = password
        spark: dict[str, Any] = {"conn_type": "spark", "host": spark_master}
        if spark_port:
            spark["port"] = spark_port
        env = dict(self.base_env)
        env["AIRFLOW_CONN_UPSERT_DEFAULT"] = json.dumps(upsert)
        env["AIRFLOW_CONN_SPARK_DEFAULT"] = json.dumps(spark)
        env.update(extra)
        return env

    def clone(self, directory: str) -> "AirflowHome":
        """A second home with a copy of the migrated metadata database, for a concurrent
        Airflow process (SQLite metadata does not take two writers well): the run's
        template, so no DAG run, Asset event or XCom of an earlier test is in it."""
        os.makedirs(directory, exist_ok=True)
        shutil.copy(self.template or os.path.join(self.path, "airflow.db"), os.path.join(directory, "airflow.db"))
        return AirflowHome(directory, home_env(self.base_env, directory), self.template)

    def dags_test_cmd(self, dag_id: str, conf: dict | None = None, logical_date: str | None = None) -> list[str]:
        cmd = [os.path.join(VENV_BIN, "airflow"), "dags", "test", dag_id]
        if logical_date:
            cmd.append(logical_date)
        if conf:
            cmd += ["--conf", json.dumps(conf)]
        return cmd

    def run(self, cmd: list[str], env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, env=env, cwd=self.path, text=True, capture_output=True, timeout=timeout)

    def dags_test(self, dag_id: str, env: dict[str, str], conf: dict | None = None,
                  timeout: float = 600) -> subprocess.CompletedProcess:
        return self.run(self.dags_test_cmd(dag_id, conf), env, timeout)

    @contextmanager
    def dags_test_process(self, env: dict[str, str]) -> Iterator["DagsTestProcess"]:
        """One Airflow process for several `airflow dags test` runs in ``env``, one at a time
        (tests/airflow/dags_test_process.py): for a test whose runs share a shard store and
        whose point is not a process of their own. Ended when the block ends."""
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.airflow.dags_test_process"], env=dict(env, PYTHONUNBUFFERED="1"),
            cwd=self.path, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        try:
            yield DagsTestProcess(self, proc)
        finally:
            proc.stdin.close()  # the process ends at stdin's end
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def query(self, sql: str, *args: Any) -> list[tuple]:
        with sqlite3.connect(os.path.join(self.path, "airflow.db")) as conn:
            return list(conn.execute(sql, args))

    def asset_events(self, uri: str) -> list[dict]:
        """The extras of the events Airflow registered on the Asset ``uri``, oldest first."""
        rows = self.query(
            "SELECT e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id WHERE a.uri = ? ORDER BY e.id", uri
        )
        return [json.loads(extra) if isinstance(extra, str) else extra for (extra,) in rows]

    def latest_run(self, dag_id: str) -> str:
        rows = self.query("SELECT run_id FROM dag_run WHERE dag_id = ? ORDER BY id DESC LIMIT 1", dag_id)
        assert rows, f"no run of {dag_id}"
        return rows[0][0]

    def xcom(self, dag_id: str, run_id: str, task_id: str) -> Any:
        rows = self.query(
            "SELECT value FROM xcom WHERE dag_id = ? AND run_id = ? AND task_id = ? AND key = 'return_value'",
            dag_id, run_id, task_id,
        )
        assert rows, f"no XCom from {dag_id}/{run_id}/{task_id}"
        value = rows[0][0]
        return json.loads(value) if isinstance(value, (str, bytes)) else value

    def task_instance(self, dag_id: str, run_id: str, task_id: str) -> tuple[str, int]:
        rows = self.query(
            "SELECT state, try_number FROM task_instance WHERE dag_id = ? AND run_id = ? AND task_id = ?",
            dag_id, run_id, task_id,
        )
        assert rows, f"no task instance {dag_id}/{run_id}/{task_id}"
        return rows[0]


class DagsTestProcess:
    """The test's side of tests/airflow/dags_test_process.py: each :meth:`dags_test` runs one
    command there and returns what ``airflow dags test`` in a process of its own would: its
    exit code, and its output (stderr is in ``stdout``, in the order written; a Spark driver
    JVM's lines come through a thread of the engine's and may fall into the next command's)."""

    def __init__(self, home: AirflowHome, proc: subprocess.Popen) -> None:
        self._home = home
        self._proc = proc
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, name="dags-test-output", daemon=True).start()

    def _read(self) -> None:
        for line in self._proc.stdout:
            self._lines.put(line)
        self._lines.put(None)  # the process ended

    def dags_test(self, dag_id: str, conf: dict | None = None, timeout: float = 600,
                  logical_date: str | None = None) -> subprocess.CompletedProcess:
        argv = self._home.dags_test_cmd(dag_id, conf, logical_date)[1:]
        self._proc.stdin.write(json.dumps(argv) + "\n")
        self._proc.stdin.flush()
        deadline = time.monotonic() + timeout
        output: list[str] = []
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"dags test {dag_id} did not end in {timeout} s:\n{''.join(output)[-6000:]}")
            if line is None:
                raise AssertionError(f"the Airflow process ended (exit {self._proc.wait()}) during dags test "
                                     f"{dag_id}:\n{''.join(output)[-6000:]}")
            if END in line:
                before, _, code = line.partition(END)
                output.append(before)
                return subprocess.CompletedProcess(argv, int(code.split()[0]), "".join(output), "")
            output.append(line)


def home_env(env: dict[str, str], path: str) -> dict[str, str]:
    # The metadata DB is named explicitly: airflow.cfg would pin the first home's path.
    return dict(env, AIRFLOW_HOME=path, AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{path}/airflow.db")


@pytest.fixture(scope="session")
def airflow_home(tmp_path_factory) -> AirflowHome:
    path = str(tmp_path_factory.mktemp("airflow-home"))
    env = home_env(dict(os.environ), path)
    env.update(
        AIRFLOW__CORE__DAGS_FOLDER=os.path.join(REPO_ROOT, "dags"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__DATABASE__LOAD_DEFAULT_CONNECTIONS="False",
        # The example DAGs back off from 30 s between tries; Airflow's own cap on an
        # exponential backoff keeps a test whose first try fails from waiting that out.
        AIRFLOW__CORE__MAX_TASK_RETRY_DELAY="1",
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        PATH=VENV_BIN + os.pathsep + env.get("PATH", ""),
        PYTHONPATH=REPO_ROOT + os.pathsep + env.get("PYTHONPATH", ""),
    )
    for var in ("AIRFLOW_CONN_UPSERT_DEFAULT", "AIRFLOW_CONN_SPARK_DEFAULT"):
        env.pop(var, None)
    template = _migrated_database(tmp_path_factory, env)
    home = AirflowHome(path, env, template)
    shutil.copy(template, os.path.join(path, "airflow.db"))
    return home


def _migrated_database(tmp_path_factory, env: dict[str, str]) -> str:
    """A metadata database migrated and with the example DAGs serialized, built once per run:
    the pytest-xdist workers share it (each migration and reserialization is two Airflow
    processes, about 10 s of CPU) and each copies it into its own home."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the run's directory, above each worker's own
    template = os.path.join(shared, "airflow-home-template")
    database = os.path.join(template, "airflow.db")
    with open(os.path.join(shared, "airflow-home-template.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not os.path.exists(database + ".built"):
            shutil.rmtree(template, ignore_errors=True)  # a worker that failed half-way
            os.makedirs(template)
            builder = AirflowHome(template, home_env(env, template))
            for step in (["db", "migrate"], ["dags", "reserialize"]):
                proc = builder.run([os.path.join(VENV_BIN, "airflow"), *step], builder.base_env)
                assert proc.returncode == 0, (f"airflow {' '.join(step)} failed:\n{proc.stdout[-3000:]}\n"
                                              f"{proc.stderr[-3000:]}")
            open(database + ".built", "w").close()
    return database


def init_shard(consensus_url: str, blob_root: str, landing: str, *, shard: str = "orders",
               max_files_per_batch: int = 3) -> None:
    """Create the sample shard with `upsertctl init` (the way an operator of the pipeline would)."""
    proc = subprocess.run(
        [os.path.join(VENV_BIN, "upsertctl"), "--consensus", consensus_url, "--blob-root", blob_root,
         "--master", "local[1]", "init", shard, "--source", f"dir:{landing}", "--key", "id",
         "--order-by", "updated_at", "--delete-marker", "deleted", "--schema", SAMPLE_SCHEMA,
         "--max-files-per-batch", str(max_files_per_batch)],
        env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1"), text=True, capture_output=True,
    )
    assert proc.returncode == 0, proc.stderr


def read_table(consensus_url: str, blob_root: str, shard: str) -> dict:
    """The shard's table, read by the Arrow reader (no Spark job; tests/test_arrow_reader_spark.py
    holds Spark's read to the same rows)."""
    from airflow_upsert_provider.engine.table.arrow_reader import read_table_from_store
    from tests.oracle import table_from_rows

    return table_from_rows(read_table_from_store(consensus_url, blob_root, shard).read_all().to_pylist())


def failure_text(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout ---\n{proc.stdout[-6000:]}\n--- stderr ---\n{proc.stderr[-6000:]}"
