"""The shard assets of the example DAGs have their producing tasks (the Assets view's
"Producing Tasks"), and a declared shard asset stands for the rendered shard at run time."""

from __future__ import annotations

from airflow_upsert_provider.operators.upsert import MicroBatchUpsertOperator, shard_asset

ORDERS = shard_asset("upsert_default", "orders")


def test_the_example_dags_declare_their_shard_assets_as_outlets(airflow_home):
    # What the Assets view counts: the serialized DAGs' task outlet references.
    rows = airflow_home.query(
        "SELECT a.uri, r.dag_id, r.task_id FROM task_outlet_asset_reference r JOIN asset a ON a.id = r.asset_id "
        "WHERE a.uri LIKE 'upsert://%' ORDER BY a.uri, r.dag_id")
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
