"""Asset events: a micro-batch run that commits emits one event on the shard's Asset with its
numbers, a run that commits nothing emits none, and the example DAG scheduled on the Asset is
queued by the event. Real `airflow dags test` runs in a copy of the shared Airflow home."""

from __future__ import annotations

import json

import pytest

from airflow_upsert_provider.operators.upsert import MicroBatchUpsertOperator, shard_asset
from airflow_upsert_provider.sample_data import SampleSpec, generate
from tests.airflow.conftest import failure_text, init_shard

pytestmark = pytest.mark.slow

SPEC = SampleSpec(records=600, keys=150, partitions=2, segments_per_partition=2, seed=12)
URI = "upsert://upsert_default/orders"


def _events(home) -> list[tuple[str, dict]]:
    rows = home.query(
        "SELECT a.uri, e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id WHERE a.uri = ? ORDER BY e.id", URI
    )
    return [(uri, json.loads(extra) if isinstance(extra, str) else extra) for uri, extra in rows]


def _queued(home) -> list[str]:
    return [r[0] for r in home.query(
        "SELECT q.target_dag_id FROM asset_dag_run_queue q JOIN asset a ON a.id = q.asset_id WHERE a.uri = ?", URI)]


def test_the_shard_asset_is_declared_for_a_literal_shard_only():
    literal = MicroBatchUpsertOperator(task_id="a", shard="orders")
    assert [o.uri for o in literal.outlets] == [URI] == [shard_asset("upsert_default", "orders").uri]
    # A templated shard is known at run time only: its asset is added to the outlets of the try.
    assert MicroBatchUpsertOperator(task_id="b", shard="{{ params.shard }}").outlets == []


def test_a_committing_run_emits_one_event_with_its_numbers_and_queues_the_consumer(airflow_home, tmp_path):
    home = airflow_home.clone(str(tmp_path / "home"))
    landing = str(tmp_path / "landing")
    generate(landing, SPEC)
    url, blob = f"sqlite:///{tmp_path / 'consensus.db'}", str(tmp_path / "blob")
    init_shard(url, blob, landing, max_files_per_batch=2)
    env = home.env(url, blob)
    # The clone copies the shared home's metadata, where other tests' runs of the example
    # DAGs may have left events of this asset: start from none.
    home.query("DELETE FROM asset_dag_run_queue")
    home.query("DELETE FROM asset_event")
    assert _events(home) == [] and _queued(home) == []
    # New DAGs start paused, and Airflow queues no run of a paused DAG: unpause the consumer.
    proc = home.run([home.dags_test_cmd("x")[0], "dags", "unpause", "upsert_fresh_data"], env)
    assert proc.returncode == 0, failure_text(proc)

    proc = home.dags_test("upsert_microbatch", env)
    assert proc.returncode == 0, failure_text(proc)
    report = home.xcom("upsert_microbatch", home.latest_run("upsert_microbatch"), "upsert")
    assert report["committed"] == 2, report
    committed = [b for b in report["batches"] if b["outcome"] == "committed"]
    assert _events(home) == [(URI, {
        "upper": report["upper"], "committed": 2,
        "rows_in": sum(b["rows_in"] for b in committed), "rows_out": sum(b["rows_out"] for b in committed),
    })]
    # The DAG scheduled on the asset is queued for its next run by that event.
    assert _queued(home) == ["upsert_fresh_data"]

    # Caught up: the next run commits nothing and emits no event.
    proc = home.dags_test("upsert_microbatch", env)
    assert proc.returncode == 0, failure_text(proc)
    report = home.xcom("upsert_microbatch", home.latest_run("upsert_microbatch"), "upsert")
    assert report["committed"] == 0, report
    assert len(_events(home)) == 1
    assert "nothing committed, no event for asset upsert://upsert_default/orders" in proc.stdout + proc.stderr
