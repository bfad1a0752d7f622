"""Reads only what changed in the shard `orders` of the `upsert_default` connection, each time it changes.

Scheduled on the shard's Asset, `upsert://<connection>/<shard>`: `MicroBatchUpsertOperator`
emits an event there for each run that commits, carrying the committed ts range (`from_ts`,
`to_ts`) in its extra. Each run of this DAG delivers the change feed of the batches it has not
delivered yet, one Parquet file per range (`changes-<from>-<to>.parquet` in `out_dir`), with
per key the net change and its `_change_type`, `_commit_version` and `_commit_timestamp`
(`out_dir`: `$AIRFLOW_HOME/upsert/changes/orders`; point it where your downstream reads).

Producer events can overlap (a backfill beside the schedule, a retried task), repeat, arrive
late, or be missing (a task that committed and then failed): so the range read is decided from
this consumer's durable cursor in the shard's consensus store, from the cursor up to the
newest end its triggering events name, claimed and completed by compare-and-set. No batch is
delivered twice and none is skipped, whatever the runs
([docs/changes.md, "Incremental consumers"](upsert-provider/docs/changes#incremental-consumers)).
Keep the change retention of the shard above how long this DAG may stay paused
([docs/changes.md, "Change retention"](upsert-provider/docs/changes#change-retention)).
"""

from __future__ import annotations

import os
from datetime import datetime

from airflow.sdk import DAG, task

from airflow_upsert_provider.operators.upsert import shard_asset

CONN_ID = "upsert_default"
SHARD = "orders"
ORDERS = shard_asset(CONN_ID, SHARD)

with DAG(
    dag_id="upsert_changes_consumer",
    description="Delivers the change feed of the orders shard on each of its commits, each batch once",
    schedule=[ORDERS],
    start_date=datetime(2026, 1, 1),
    catchup=False,
    # One run at a time keeps deliveries in order; overlapping runs (a retry beside a zombie)
    # are still safe: the cursor's compare-and-set decides.
    max_active_runs=1,
    tags=["upsert", "example"],
    doc_md=__doc__,
) as dag:

    @task(inlets=[ORDERS])
    def deliver_changes(dag=None, triggering_asset_events=None) -> list[list[int]]:
        """Deliver the changes this DAG has not delivered; the ranges delivered."""
        from airflow_upsert_provider.engine.table.change_consumer import consume_changes, parquet_files_in
        from airflow_upsert_provider.hooks.upsert import UpsertShardHook, airflow_home

        events = [dict(event.extra or {}) for event in (triggering_asset_events or {}).get(ORDERS, [])]
        out_dir = os.path.join(airflow_home(), "upsert", "changes", SHARD)
        hook = UpsertShardHook(CONN_ID)
        try:
            shard = hook.open_shard(SHARD)
            delivered = consume_changes(shard, dag.dag_id, events, parquet_files_in(out_dir))
        finally:
            hook.close()
        print(f"delivered changes of {ORDERS.uri} to {out_dir}: {delivered or 'nothing new'}")
        return [list(r) for r in delivered]

    deliver_changes()
