"""The monitor DAG's own page when the store cannot be listed (no shard in its dedup key) is
resolved by the next run that lists the store: real `airflow dags test` runs of
`upsert_frontier_monitor`, the pages captured on a loopback server standing in for PagerDuty
and Slack."""

from __future__ import annotations

import os

import pytest

from airflow_upsert_provider.engine.frontier.blind import MONITOR_KEY
from airflow_upsert_provider.engine.frontier.pages import dedup_key
from airflow_upsert_provider.engine.store.registry import open_consensus
from tests.airflow.conftest import airflow_home, failure_text  # noqa: F401 - the session fixture
from tests.airflow.test_frontier_sensor import conn_env, pager  # noqa: F401 - the fixture

pytestmark = pytest.mark.long_process

DAG_ID = "upsert_frontier_monitor"
CONF = {"watch_seconds": 0, "namespace": "listing", "pagerduty_conn_id": "pagerduty_test", "slack_conn_id": ""}
RECORD = "airflow-upsert-monitor-blind:listing:"
# Tries of `shards` in a run (the DAG's LIST_RETRIES retries and the first try).
TRIES = 3

# An Airflow cluster policy for the run that cannot list the store: its retries come at once
# instead of a minute apart, which `dags test` would wait out doing nothing. The tries and
# what the last one sends are what the test is about, not the delay between them.
NO_RETRY_DELAY = """
from datetime import timedelta


def task_policy(task):
    if (task.dag_id, task.task_id) == ("upsert_frontier_monitor", "shards"):
        task.retry_delay = timedelta(0)
"""


def test_the_page_of_a_store_that_could_not_be_listed_is_resolved_by_the_next_run_that_lists_it(
        airflow_home, tmp_path, pager):  # noqa: F811
    key = dedup_key(MONITOR_KEY, "listing")

    def recorded() -> list[str]:
        return [row[0] for row in airflow_home.query("SELECT key FROM variable WHERE key LIKE ?",
                                                     "airflow-upsert-monitor-blind:%")]

    # Nothing listens on port 1: every try of `shards` fails to reach the store.
    policy = tmp_path / "policy"
    policy.mkdir()
    (policy / "airflow_local_settings.py").write_text(NO_RETRY_DELAY)
    unreachable = airflow_home.env("postgresql://monitor@127.0.0.1:1/upsert", str(tmp_path / "blob"), **conn_env(pager))
    unreachable["PYTHONPATH"] = os.pathsep.join(filter(None, [str(policy), unreachable.get("PYTHONPATH")]))
    proc = airflow_home.dags_test(DAG_ID, unreachable, conf=CONF)
    first = airflow_home.latest_run(DAG_ID)
    assert airflow_home.task_instance(DAG_ID, first, "shards") == ("failed", TRIES), failure_text(proc)
    [trigger] = pager.events()
    assert (trigger["event_action"], trigger["dedup_key"]) == ("trigger", key), failure_text(proc)
    assert "MONITOR BLIND: cannot evaluate its shards" in trigger["payload"]["summary"]
    assert recorded() == [RECORD]

    url = f"sqlite:///{tmp_path / 'consensus.db'}"
    open_consensus(url).dispose()  # an empty store: it lists, no shard in it
    # The runs that list the store in one Airflow process: their point is what the run before left
    # recorded, not a process of their own (the first run's env is another store, so its own process).
    with airflow_home.dags_test_process(airflow_home.env(url, str(tmp_path / "blob"), **conn_env(pager))) as airflow:
        proc = airflow.dags_test(DAG_ID, conf=CONF)
        second = airflow_home.latest_run(DAG_ID)
        assert second != first
        assert airflow_home.task_instance(DAG_ID, second, "shards") == ("success", 1), failure_text(proc)
        assert airflow_home.xcom(DAG_ID, second, "shards") == []
        assert [(e["event_action"], e["dedup_key"]) for e in pager.events()] == [("trigger", key), ("resolve", key)]
        assert pager.events()[1]["payload"]["summary"] == "RESOLVED: the frontier monitor evaluates its shards again"
        assert recorded() == []

        # A third run lists again: nothing left to resolve, nothing sent.
        proc = airflow.dags_test(DAG_ID, conf=CONF)
        third = airflow_home.latest_run(DAG_ID)
        assert third not in (first, second)
        assert airflow_home.task_instance(DAG_ID, third, "shards") == ("success", 1), failure_text(proc)
    assert len(pager.events()) == 2
