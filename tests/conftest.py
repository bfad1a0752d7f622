"""Shared fixtures: one real SparkSession per test session, a real PostgreSQL server, and
consensus stores of both kinds."""

from __future__ import annotations

import logging
import os
import sys
import uuid

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# py4j logs from __del__ at interpreter exit, after pytest has closed the streams it captured.
logging.getLogger("py4j").setLevel(logging.WARNING)
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from airflow_upsert_provider.engine.blob.files import open_blob  # noqa: E402
from airflow_upsert_provider.engine.store.registry import open_consensus  # noqa: E402
from tests.pgserver import PostgresServer  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def spark():
    from airflow_upsert_provider.engine.spark.session import get_spark

    session = get_spark(
        "local[2]",
        app_name="upsert-tests",
        conf={"spark.sql.shuffle.partitions": "4", "spark.driver.memory": "2g"},
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def pg_server():
    server = PostgresServer().start()
    yield server
    server.stop()


@pytest.fixture
def pg_url(pg_server):
    """A fresh database on the shared server for one test."""
    return pg_server.create_database(f"t_{uuid.uuid4().hex[:12]}")


@pytest.fixture
def sqlite_url(tmp_path):
    return f"sqlite:///{tmp_path / 'consensus.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def consensus_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'consensus.db'}"
    return request.getfixturevalue("pg_url")


# For a test that runs Spark batches on a shard but tests nothing about the store (records,
# files, run format, reads): SQLite only. PostgreSQL stays for what depends on the store:
# consensus, compare-and-append, fencing, racing writers and lifecycle.
sqlite_only = pytest.mark.parametrize("consensus_url", ["sqlite"], indirect=True)


@pytest.fixture
def consensus(consensus_url):
    store = open_consensus(consensus_url)
    yield store
    store.dispose()


@pytest.fixture
def blob(tmp_path):
    b = open_blob(str(tmp_path / "blob"))
    b.ensure_root()
    return b


def cli_env(consensus_url: str, blob_root: str, **extra: str) -> dict[str, str]:
    """Environment for running `upsertctl` in a subprocess against a test shard."""
    env = dict(os.environ)
    env.update(
        UPSERT_CONSENSUS_URL=consensus_url,
        UPSERT_BLOB_ROOT=blob_root,
        UPSERT_SPARK_MASTER="local[1]",
        SPARK_LOCAL_IP="127.0.0.1",
        PYTHONPATH=REPO_ROOT + os.pathsep + env.get("PYTHONPATH", ""),
    )
    env.update(extra)
    return env


def pytest_collection_modifyitems(config, items):
    """tests/connect holds a Spark Connect client session, the rest an in-process SparkSession;
    PySpark refuses both in one process, so a run that collects both is refused up front
    (``make test`` runs tests/connect in a second pytest process)."""
    connect_dir = os.path.join(REPO_ROOT, "tests", "connect") + os.sep
    in_connect = {str(item.path).startswith(connect_dir) for item in items}
    if in_connect == {True, False}:
        raise pytest.UsageError(
            "tests/connect must run in its own pytest process: run `pytest --ignore=tests/connect` "
            "and `pytest tests/connect` (make test runs both)"
        )
