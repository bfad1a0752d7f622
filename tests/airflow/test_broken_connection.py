"""The operator against a broken `upsert` connection: one clear error naming what is wrong,
the password nowhere, and no retry storm (configuration errors fail without retry; an
unreachable store is retried only within the task's bounded retries)."""

from __future__ import annotations

import os
import re
import sys

import pytest

from airflow_upsert_provider.sample_data import SampleSpec, generate
from tests.airflow.conftest import failure_text, init_shard

pytestmark = pytest.mark.slow

PASSWORD = "Sup3r-S3cret-pw"


def _task_test(airflow_home, env) -> tuple[str, str]:
    """`airflow tasks test` of the scheduled DAG's task: its final state and its output."""
    proc = airflow_home.run(
        [os.path.join(os.path.dirname(sys.executable), "airflow"), "tasks", "test", "upsert_microbatch", "upsert"],
        env, timeout=300,
    )
    output = proc.stdout + proc.stderr
    states = re.findall(r"new_state=(\w+)", output)
    assert states, failure_text(proc)
    assert PASSWORD not in output
    return states[-1], output


def test_unreachable_consensus_is_retryable_and_never_shows_the_password(airflow_home, pg_server, tmp_path):
    blob = tmp_path / "blob"
    blob.mkdir()
    # A port nobody listens on, with the password in the connection's password field.
    url = f"postgresql://{pg_server.user}@127.0.0.1:1/upsert"
    state, output = _task_test(airflow_home, airflow_home.env(url, str(blob), password=PASSWORD))
    assert state == "up_for_retry"
    assert "cannot reach consensus store postgresql+psycopg://upsert:***@127.0.0.1:1/upsert" in output
    assert "Connection refused" in output


def test_missing_blob_root_fails_without_retry(airflow_home, tmp_path):
    landing = str(tmp_path / "landing")
    generate(landing, SampleSpec(records=100, keys=10, partitions=1, segments_per_partition=1))
    url = f"sqlite:///{tmp_path / 'consensus.db'}"
    init_shard(url, str(tmp_path / "blob"), landing)
    missing = str(tmp_path / "no-such-blob")
    state, output = _task_test(airflow_home, airflow_home.env(url, missing))
    assert state == "failed"
    assert f"configuration error: blob root {missing} does not exist" in output


def test_unknown_shard_fails_without_retry(airflow_home, tmp_path, pg_url):
    blob = tmp_path / "blob"
    blob.mkdir()
    # A reachable PostgreSQL consensus whose password comes from the password field.
    user_url = re.sub(r"://([^:]+):[^@]+@", r"://\1@", pg_url)
    password = re.search(r"://[^:]+:([^@]+)@", pg_url).group(1)
    env = airflow_home.env(user_url, str(blob), password=password)
    proc = airflow_home.run(
        [os.path.join(os.path.dirname(sys.executable), "airflow"), "tasks", "test", "upsert_microbatch", "upsert"],
        env, timeout=300,
    )
    output = proc.stdout + proc.stderr
    assert password not in output
    assert re.findall(r"new_state=(\w+)", output)[-1:] == ["failed"], failure_text(proc)
    assert "configuration error: unknown shard 'orders'" in output
