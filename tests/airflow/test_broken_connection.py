"""The operator against a broken `upsert` connection: one clear error naming what is wrong,
the password nowhere, and no retry storm (configuration errors fail without retry; an
unreachable store is retried only within the task's bounded retries)."""

from __future__ import annotations

import json
import os
import re
import sys
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.operators.upsert import MicroBatchUpsertOperator
from tests.airflow.conftest import failure_text

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


@pytest.mark.slow
def test_unreachable_consensus_is_retryable_and_never_shows_the_password(airflow_home, pg_server, tmp_path):
    blob = tmp_path / "blob"
    blob.mkdir()
    # A port nobody listens on, with the password in the connection's password field.
    url = f"postgresql://{pg_server.user}@127.0.0.1:1/upsert"
    state, output = _task_test(airflow_home, airflow_home.env(url, str(blob), password=PASSWORD))
    assert state == "up_for_retry"
    assert "cannot reach consensus store postgresql+psycopg://upsert:***@127.0.0.1:1/upsert" in output
    assert "Connection refused" in output


def test_missing_blob_root_fails_without_retry(tmp_path, monkeypatch):
    # In process: a configuration error's way to a failed task without retry is the real
    # `airflow tasks test` of test_unknown_shard_fails_without_retry below.
    url = f"sqlite:///{tmp_path / 'consensus.db'}"
    consensus = open_consensus(url)
    consensus.create_shard("orders", "{}")
    consensus.dispose()
    missing = str(tmp_path / "no-such-blob")
    monkeypatch.setenv("AIRFLOW_CONN_UPSERT_DEFAULT", json.dumps(
        {"conn_type": "upsert", "extra": {"consensus_url": url, "blob_root": missing}}))
    ti = SimpleNamespace(dag_id="upsert_microbatch", run_id="manual__1", task_id="upsert", map_index=-1, try_number=1)
    with pytest.raises(AirflowFailException) as failure:
        MicroBatchUpsertOperator(task_id="upsert", shard="orders").execute({"ti": ti})
    assert str(failure.value).startswith(f"configuration error: blob root {missing} does not exist")
    assert not os.path.exists(missing)


@pytest.mark.slow
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
