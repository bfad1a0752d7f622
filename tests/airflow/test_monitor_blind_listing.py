"""The monitor DAG's own page when the store cannot be listed (no shard in its dedup key) is
resolved by the next run that lists the store: two real `airflow dags test` runs of
`upsert_frontier_monitor`, the pages captured on a loopback server standing in for PagerDuty
and Slack."""

from __future__ import annotations

from airflow_upsert_provider.engine.frontier.blind import MONITOR_KEY
from airflow_upsert_provider.engine.frontier.pages import dedup_key
from airflow_upsert_provider.engine.store.registry import open_consensus
from tests.airflow.conftest import airflow_home, failure_text  # noqa: F401 - the session fixture
from tests.airflow.test_frontier_sensor import conn_env, pager  # noqa: F401 - the fixture

DAG_ID = "upsert_frontier_monitor"
CONF = {"watch_seconds": 0, "namespace": "listing", "pagerduty_conn_id": "pagerduty_test", "slack_conn_id": ""}
RECORD = "airflow-upsert-monitor-blind:listing:"


def test_the_page_of_a_store_that_could_not_be_listed_is_resolved_by_the_next_run_that_lists_it(
        airflow_home, tmp_path, pager):  # noqa: F811
    key = dedup_key(MONITOR_KEY, "listing")

    def recorded() -> list[str]:
        return [row[0] for row in airflow_home.query("SELECT key FROM variable WHERE key LIKE ?",
                                                     "airflow-upsert-monitor-blind:%")]

    # Nothing listens on port 1: every try of `shards` fails to reach the store.
    unreachable = airflow_home.env("postgresql://monitor@127.0.0.1:1/upsert", str(tmp_path / "blob"), **conn_env(pager))
    proc = airflow_home.dags_test(DAG_ID, unreachable, conf=CONF)
    first = airflow_home.latest_run(DAG_ID)
    assert airflow_home.task_instance(DAG_ID, first, "shards")[0] == "failed", failure_text(proc)
    [trigger] = pager.events()
    assert (trigger["event_action"], trigger["dedup_key"]) == ("trigger", key), failure_text(proc)
    assert "MONITOR BLIND: cannot evaluate its shards" in trigger["payload"]["summary"]
    assert recorded() == [RECORD]

    url = f"sqlite:///{tmp_path / 'consensus.db'}"
    open_consensus(url).dispose()  # an empty store: it lists, no shard in it
    proc = airflow_home.dags_test(DAG_ID, airflow_home.env(url, str(tmp_path / "blob"), **conn_env(pager)), conf=CONF)
    second = airflow_home.latest_run(DAG_ID)
    assert second != first
    assert airflow_home.task_instance(DAG_ID, second, "shards") == ("success", 1), failure_text(proc)
    assert airflow_home.xcom(DAG_ID, second, "shards") == []
    assert [(e["event_action"], e["dedup_key"]) for e in pager.events()] == [("trigger", key), ("resolve", key)]
    assert pager.events()[1]["payload"]["summary"] == "RESOLVED: the frontier monitor evaluates its shards again"
    assert recorded() == []

    # A third run lists again: nothing left to resolve, nothing sent.
    proc = airflow_home.dags_test(DAG_ID, airflow_home.env(url, str(tmp_path / "blob"), **conn_env(pager)), conf=CONF)
    assert airflow_home.task_instance(DAG_ID, airflow_home.latest_run(DAG_ID), "shards") == ("success", 1), \
        failure_text(proc)
    assert len(pager.events()) == 2
