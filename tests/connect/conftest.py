"""One local Spark Connect server for the tests in this directory, started and stopped by the
tests themselves through engine/spark/server.py, and a ``spark`` fixture that is a Connect
client session on it: the engine's tests imported here run unchanged through Connect.

The server is started by two ``upsertctl spark-server start`` processes at once (the race the
lock exists for); test_spark_server.py checks that they left one server. Run these tests in
their own pytest process (``pytest tests/connect``): an in-process SparkSession started by
another test directory cannot share a process with a Connect session of the engine's.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from tests.conftest import AWS_VARIABLES
from tests.kafka.conftest import kafka_bootstrap, kafka_topic  # noqa: F401  (fixtures)

UPSERTCTL = [sys.executable, "-m", "airflow_upsert_provider.cli"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def spark_server_cli(state_dir: str, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*UPSERTCTL, "spark-server", *argv, "--state-dir", state_dir, "--json"],
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def connect_server(tmp_path_factory, s3_server):
    """{address, state_dir, starts: the two racing starts' JSON outputs}; the server is
    stopped at the end of the session. The server process has the loopback S3 server's
    variables in its environment (and none of the machine's), as a server whose executors
    reach a bucket with their own chain would: a test's ``s3_root`` bucket is on it."""
    state_dir = str(tmp_path_factory.mktemp("spark-state"))
    env = {name: value for name, value in os.environ.items() if name not in AWS_VARIABLES}
    env.update(s3_server.environment(), AWS_CONFIG_FILE=os.path.join(state_dir, "aws-config-absent"),
               AWS_SHARED_CREDENTIALS_FILE=os.path.join(state_dir, "aws-credentials-absent"))
    port = free_port()
    # 2 GiB: the machine is shared with other test runs.
    argv = [*UPSERTCTL, "spark-server", "start", "--state-dir", state_dir, "--json", "--port", str(port),
            "--memory", "2g", "--conf", "spark.sql.shuffle.partitions=4", "--conf", "spark.master=local[2]"]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    starts = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err[-3000:]
            starts.append(json.loads(out))
        yield {"address": f"sc://127.0.0.1:{port}", "state_dir": state_dir, "port": port, "starts": starts}
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        stopped = spark_server_cli(state_dir, "stop")
        assert stopped.returncode == 0, stopped.stderr[-3000:]


@pytest.fixture(scope="session")
def spark(connect_server):
    from airflow_upsert_provider.engine.spark.session import get_spark, is_connect_session

    session = get_spark(remote=connect_server["address"], conf={"spark.sql.shuffle.partitions": "4"})
    assert is_connect_session(session)
    yield session
    session.stop()  # the client's session only: the server stays until connect_server stops it


@pytest.fixture(autouse=True)
def remote_env(connect_server, monkeypatch):
    """`upsertctl` run in this process or in a child runs through the same server."""
    monkeypatch.setenv("UPSERT_SPARK_REMOTE", connect_server["address"])


@pytest.fixture(params=["sqlite"])
def consensus_url(request, tmp_path):
    # The consensus store is not what these tests are about: SQLite only, no PostgreSQL server.
    return f"sqlite:///{tmp_path / 'consensus.db'}"


@pytest.fixture
def sqlite_consensus(tmp_path):
    from airflow_upsert_provider.engine.store.registry import open_consensus

    store = open_consensus(f"sqlite:///{tmp_path / 'consensus.db'}")
    yield store
    store.dispose()
