"""Links both ways: the operators' "Shard page" button, and on the page the last writer's task
instance, the shard's Asset and its DAG runs (pure and in process: no Airflow process)."""

from __future__ import annotations

import json
from datetime import datetime
from urllib.parse import parse_qs, urlsplit

import pytest
from airflow.models.taskinstancekey import TaskInstanceKey
from airflow.sdk import DAG

from airflow_upsert_provider import get_provider_info
from airflow_upsert_provider.links import (
    ShardPageLink,
    parse_writer_id,
    shard_page_url,
    task_instance_path,
)
from airflow_upsert_provider.operators.lifecycle import BeginRecoveryOperator, ResumeAfterRecoveryOperator
from airflow_upsert_provider.operators.maintenance import CompactShardOperator, RestoreCheckpointOperator
from airflow_upsert_provider.operators.upsert import MicroBatchUpsertOperator, writer_id_for
from airflow_upsert_provider.sensors.frontier import FrontierStallSensor
from tests.airflow.test_ui import _AuthManager, _client, _connection_env
from tests.airflow.test_ui import shard_store  # noqa: F401 - the store fixture

BASE = "https://airflow.example.com/"
TI = TaskInstanceKey(dag_id="orders_dag", task_id="t", run_id="manual__2026-01-01T00:00:00+00:00", try_number=2)


def _dag_tasks():
    with DAG("orders_dag", schedule=None, start_date=datetime(2026, 1, 1)) as dag:
        tasks = {
            "upsert": MicroBatchUpsertOperator(task_id="upsert", shard="orders", upsert_conn_id="upsert_ledger"),
            "compact": CompactShardOperator(task_id="compact", shard="orders", upsert_conn_id="upsert_ledger"),
            "restore": RestoreCheckpointOperator(task_id="restore", shard="orders", checkpoint_id="c1",
                                                 target_shard="orders_restored", upsert_conn_id="upsert_ledger"),
            "begin": BeginRecoveryOperator(task_id="begin", shard="orders", upsert_conn_id="upsert_ledger"),
            "resume": ResumeAfterRecoveryOperator(task_id="resume", shard="orders", epoch=2,
                                                  upsert_conn_id="upsert_ledger"),
            "watch": FrontierStallSensor(task_id="watch", shard="orders", upsert_conn_id="upsert_ledger"),
        }
    return dag, tasks


def test_every_operator_and_the_sensor_link_to_their_shard_on_the_page(monkeypatch):
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", BASE)
    _, tasks = _dag_tasks()
    for task_id, task in tasks.items():
        [link] = [link for link in task.operator_extra_links if link.name == "Shard page"]
        url = link.get_link(task, ti_key=TI)
        parts = urlsplit(url)
        # The page framed by Airflow's UI (its external view), opened at the shard.
        assert f"{parts.scheme}://{parts.netloc}{parts.path}" == \
            "https://airflow.example.com/plugin/upsert-shards/upsert-provider-ui/", (task_id, url)
        shard = "orders_restored" if task_id == "restore" else "orders"
        assert parse_qs(parts.query) == {"conn": ["upsert_ledger"], "shard": [shard]}, (task_id, url)


def test_the_link_keeps_a_sub_path_deployment_and_names_no_unrendered_template(monkeypatch):
    assert shard_page_url("upsert_default", "a b", "https://h/airflow/") == \
        "https://h/airflow/plugin/upsert-shards/airflow/upsert-provider-ui/?conn=upsert_default&shard=a+b"
    assert shard_page_url("upsert_default", "orders", "") == \
        "/plugin/upsert-shards/upsert-provider-ui/?conn=upsert_default&shard=orders"
    task = MicroBatchUpsertOperator(task_id="u", shard="{{ params.shard }}")
    assert ShardPageLink().get_link(task, ti_key=TI) == ""


def test_the_link_is_declared_by_the_provider_and_survives_dag_serialization():
    from airflow.serialization.serialized_objects import DagSerialization

    assert "airflow_upsert_provider.links.ShardPageLink" in get_provider_info()["extra-links"]
    dag, _ = _dag_tasks()
    encoded = DagSerialization.to_dict(dag)
    for task in encoded["dag"]["tasks"]:
        assert task["__var"]["_operator_extra_links"] == {"Shard page": ShardPageLink().xcom_key}, task["__var"]["task_id"]
    restored = DagSerialization.from_dict(json.loads(json.dumps(encoded)))
    for task_id in ("upsert", "watch"):
        assert [link.name for link in restored.get_task(task_id).operator_extra_links] == ["Shard page"]


@pytest.mark.parametrize("run_id", ["scheduled__2026-01-01T00:00:00+00:00", "manual:a:b", "run"])
@pytest.mark.parametrize("map_index", [-1, 0, 12])
def test_a_writer_id_names_its_task_try(run_id, map_index):
    writer = writer_id_for("orders_dag", run_id, "group.upsert", map_index, 3)
    assert parse_writer_id(writer) == {"dag_id": "orders_dag", "run_id": run_id, "task_id": "group.upsert",
                                       "map_index": map_index, "try_number": 3}
    path = task_instance_path(writer)
    mapped = f"/mapped/{map_index}" if map_index >= 0 else ""
    assert path.startswith("dags/orders_dag/runs/") and path.endswith(f"/tasks/group.upsert{mapped}?try_number=3")
    assert parse_writer_id("w") is None and parse_writer_id("airflow:orders_dag") is None
    assert task_instance_path("upsertctl:host:42") is None


def test_the_pages_json_links_the_writer_its_dag_runs_and_the_asset(shard_store,  # noqa: F811
                                                                   monkeypatch, auth_manager):
    from airflow_upsert_provider.plugins import ui

    for name, value in _connection_env(shard_store).items():
        monkeypatch.setenv(name, value)
    asked: list[set[str]] = []

    def asset_ids(uris: set[str]) -> dict[str, int]:
        asked.append(set(uris))
        return {"upsert://upsert_default/stuck": 7}

    monkeypatch.setattr(ui, "asset_ids", asset_ids)
    by_id = {s["shard"]: s for s in _client().get("/api/shards").json()["shards"]}
    assert asked == [{"upsert://upsert_default/fresh", "upsert://upsert_default/stuck"}]
    assert by_id["stuck"]["links"] == {"writer": "dags/dag/runs/run/tasks/stuck?try_number=1",
                                       "dag_runs": "dags/dag/runs", "asset": "assets/7"}
    assert by_id["fresh"]["links"]["asset"] is None


@pytest.fixture
def auth_manager(monkeypatch):
    import airflow.api_fastapi.app as airflow_app

    manager = _AuthManager()
    monkeypatch.setattr(airflow_app, "get_auth_manager", lambda: manager)
    return manager

