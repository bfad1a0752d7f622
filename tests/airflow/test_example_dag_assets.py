"""The shard assets of the example DAGs have their producing tasks (the Assets view's
"Producing Tasks"), and a declared shard asset stands for the rendered shard at run time."""

from __future__ import annotations

import os

from airflow_upsert_provider.operators.upsert import MicroBatchUpsertOperator, shard_asset
from tests.conftest import REPO_ROOT

ORDERS = shard_asset("upsert_default", "orders")


def test_the_example_dags_declare_their_shard_assets_as_outlets(airflow_home):
    # What the Assets view counts: the serialized DAGs' task outlet references, of the example
    # DAGs (the session's Airflow home also holds DAGs other tests wrote).
    examples = sorted(name[:-3] for name in os.listdir(os.path.join(REPO_ROOT, "dags")) if name.endswith(".py"))
    rows = airflow_home.query(
        "SELECT a.uri, r.dag_id, r.task_id FROM task_outlet_asset_reference r JOIN asset a ON a.id = r.asset_id "
        f"WHERE a.uri LIKE 'upsert://%' AND r.dag_id IN ({', '.join(repr(e) for e in examples)}) "
        "ORDER BY a.uri, r.dag_id")
    assert [tuple(r) for r in rows] == [
        (ORDERS.uri, "upsert_backfill", "backfill"),
        (ORDERS.uri, "upsert_microbatch", "upsert"),
        ("upsert://upsert_default/orders_cdc", "upsert_kafka", "upsert"),
    ]


def test_a_declared_shard_asset_stands_for_the_rendered_shard():
    op = MicroBatchUpsertOperator(task_id="upsert", shard="{{ params.shard }}", outlets=[ORDERS])
    op.shard = "customers"  # as rendered for a run on another shard
    op._set_asset_event({}, {"upper": 3, "committed": 1, "batches": []}, due=True, upper_at_start=2)
    assert [o.uri for o in op.outlets] == [shard_asset("upsert_default", "customers").uri]

    op = MicroBatchUpsertOperator(task_id="upsert", shard="{{ params.shard }}", outlets=[ORDERS])
    op.shard = "customers"
    op._set_asset_event({}, {"upper": 2, "committed": 0, "batches": []}, due=False, upper_at_start=2)
    assert op.outlets == []
