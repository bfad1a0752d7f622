"""Shared fixtures: one real SparkSession per test session, a real PostgreSQL server, an
S3-compatible server, and consensus stores of both kinds."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import uuid

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# py4j logs from __del__ at interpreter exit, after pytest has closed the streams it captured.
logging.getLogger("py4j").setLevel(logging.WARNING)
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The suite's Spark JVMs run jobs of a few hundred rows: C1 only, through the variable Spark's
# launcher adds to a driver JVM's options (no notice on stderr, unlike JAVA_TOOL_OPTIONS), and
# the class-data-sharing archive that pytest_configure builds. Together they took a fresh
# one-batch task to 0.46x (docs/performance.md, "Cold in-process task"); the suite starts
# hundreds, and its own in-process sessions ran its Spark-heavy modules in 0.72x with C1 only
# ("The test suite's time"). The serial collector: heaps of a few hundred MB on two cores, where
# G1's concurrent threads cost more than they save (0.97x on a Spark-heavy module). The Connect
# servers of tests/connect take them too, though each serves a whole run: its 66 tests took
# 134 s of CPU with them against 182 s with the JVM's defaults, whose C2 compiles did not
# pay for themselves in a run of two minutes (docs/performance.md).
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
os.environ.setdefault("SPARK_SUBMIT_OPTS", TEST_JVM_OPTIONS)
# Where pytest_configure builds that archive, once per checkout (gitignored).
TEST_STATE_DIR = os.path.join(REPO_ROOT, ".upsert-test")

from airflow_upsert_provider.engine.blob.files import open_blob  # noqa: E402
from airflow_upsert_provider.engine.store.registry import open_consensus  # noqa: E402
from tests.pgserver import PostgresServer  # noqa: E402
from tests.s3proxy import S3FaultProxy  # noqa: E402
from tests.s3server import S3Server  # noqa: E402


# What pytest_configure did about the archive, for the report header.
ARCHIVE_LINE = pytest.StashKey[str]()


def pytest_configure(config):
    """Register the ``long_process`` marker (see :data:`SCHEDULED_FIRST`), then build the
    class-data-sharing archive of the tests' Spark JVMs (once per checkout: a
    usable one is kept) and hand it to every process the tests start through
    ``UPSERT_CLASS_ARCHIVE``. Only in the main pytest process, before xdist starts its
    workers, which inherit the variable. ``UPSERT_CLASS_ARCHIVE`` set by the caller (a path,
    or ``off``) is left alone."""
    config.addinivalue_line("markers", "long_process: starts an Airflow or writer process but stays in "
                                       "`make test-fast`; its module is scheduled first, as slow ones are")
    if hasattr(config, "workerinput") or "UPSERT_CLASS_ARCHIVE" in os.environ or config.option.collectonly:
        return
    from airflow_upsert_provider.engine.spark import class_archive

    try:
        built = class_archive.build_archive(TEST_STATE_DIR)
    except Exception as exc:  # noqa: BLE001 - the suite runs without it, only slower
        line = f"class archive of the tests' Spark JVMs not built ({type(exc).__name__}: {str(exc)[:300]}); running without it"
        os.environ["UPSERT_CLASS_ARCHIVE"] = "off"
    else:
        how = f"built in {built['seconds']:.0f} s" if built.get("built") else "already built"
        line = f"class archive of the tests' Spark JVMs: {built['path']} ({how})"
        os.environ["UPSERT_CLASS_ARCHIVE"] = built["path"]
    config.stash[ARCHIVE_LINE] = line


def pytest_report_header(config):
    line = config.stash.get(ARCHIVE_LINE, None)
    return [line] if line else []


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


@pytest.fixture(scope="session")
def s3_server():
    server = S3Server().start()
    yield server
    server.stop()


# Variables of the AWS credential and endpoint chain: a test on the S3 server sets its own and
# sees none of the machine's.
AWS_VARIABLES = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                 "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_MAX_ATTEMPTS",
                 "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE")


@pytest.fixture
def s3_root(s3_server, monkeypatch, tmp_path):
    """A fresh bucket on the S3 server and the URI of a prefix in it, with the process's
    environment pointing at the server (dummy credentials) for the test's duration; a
    subprocess gets the same variables through ``cli_env``."""
    for name in AWS_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    # No shared config or credentials file of the machine is read.
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-config-absent"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws-credentials-absent"))
    for name, value in s3_server.environment().items():
        monkeypatch.setenv(name, value)
    return f"s3://{s3_server.create_bucket()}/shards"


@pytest.fixture
def s3_executors(request, spark, s3_root):
    """``s3_root`` for code that runs on the session ``spark``'s executors in this process
    (``cli.main``, an operator's task): their Python workers see the S3 server's variables.

    Those workers are started by the JVM with the JVM's environment, not this process's, so
    what ``s3_root`` sets in ``os.environ`` reaches only the driver. PySpark ships
    ``spark.sparkContext.environment`` with every Python function, and a changed one gets its
    own worker daemon: the variables ``s3_root`` sets (and ``s3_faults``'s endpoint and
    attempts, when the test asks for it) are put there for the test's duration, and the
    previous dict is restored after it."""
    if "s3_faults" in request.fixturenames:
        request.getfixturevalue("s3_faults")  # its endpoint first: the executors reach the proxy
    environment = spark.sparkContext.environment
    previous = dict(environment)
    environment.update({name: os.environ[name] for name in AWS_VARIABLES if name in os.environ})
    yield s3_root
    environment.clear()
    environment.update(previous)


class S3Faults:
    """A fresh bucket reached through a fault-injecting proxy (:mod:`tests.s3proxy`): ``root``
    is the URI of a prefix in it, ``proxy`` sets faults and records requests, ``server`` is
    the S3 server behind it."""

    # Attempts per request (AWS_MAX_ATTEMPTS) on the proxy's root: with the default of 5, the
    # standard backoff makes every request that fails to the end cost several seconds.
    attempts = 3

    def __init__(self, root: str, proxy: S3FaultProxy, server: S3Server) -> None:
        self.root, self.proxy, self.server = root, proxy, server
        self.bucket = root.split("/")[2]


@pytest.fixture
def s3_faults(s3_server, s3_root, monkeypatch):
    """An ``s3_root`` whose endpoint (``AWS_ENDPOINT_URL``, for this process and through
    ``cli_env`` for a subprocess) is a fault-injecting proxy in front of the S3 server, with
    ``S3Faults.attempts`` attempts per request."""
    proxy = S3FaultProxy(s3_server.endpoint).start()
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", str(S3Faults.attempts))
    yield S3Faults(s3_root, proxy, s3_server)
    proxy.stop()


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
    slow_modules_first(items)


# Markers of tests that start long processes (Airflow, JVMs, writers): their modules go first.
# ``slow`` ones are also left out of ``make test-fast``; ``long_process`` ones stay in it.
SCHEDULED_FIRST = ("slow", "long_process")


def slow_modules_first(items: list) -> None:
    """Modules with the most ``slow`` or ``long_process`` tests go first, each module's tests
    kept together and in their order. ``make test`` hands whole modules to its workers in this
    order (``--dist loadfile --no-loadscope-reorder``), so the longest ones start at once instead
    of ending the run on one worker while the other idles (xdist's own order, the modules with
    the most tests first, put them last)."""
    first_seen: dict[str, int] = {}
    slow: dict[str, int] = {}
    for item in items:
        module = str(item.path)
        first_seen.setdefault(module, len(first_seen))
        if any(item.get_closest_marker(name) is not None for name in SCHEDULED_FIRST):
            slow[module] = slow.get(module, 0) + 1
    items.sort(key=lambda item: (-slow.get(str(item.path), 0), first_seen[str(item.path)]))


@pytest.fixture
def tmpfs(tmp_path):
    """A real tmpfs of a chosen size (root and a working `mount` needed, else the test is
    skipped, and fails where UPSERT_REQUIRE_TMPFS is set, as CI sets it): ENOSPC and
    read-only roots for real, not simulated."""
    mounted = []
    unavailable = pytest.fail if os.environ.get("UPSERT_REQUIRE_TMPFS") else pytest.skip

    def mount(size: str, name: str = "blob"):
        path = tmp_path / name
        path.mkdir()
        if os.geteuid() != 0:
            unavailable("mounting a tmpfs needs root")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                              capture_output=True)
        if done.returncode != 0:
            unavailable(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
        mounted.append(path)
        return path

    yield mount
    for path in mounted:
        subprocess.run(["umount", "-l", str(path)], check=False)
