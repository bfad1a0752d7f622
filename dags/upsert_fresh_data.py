"""Runs whenever the shard `orders` of the `upsert_default` connection has fresh data.

`MicroBatchUpsertOperator` emits an event on the shard's Asset, `upsert://<connection>/<shard>`,
each time a run commits at least one batch (none when it commits nothing), with the run's
numbers in the event's extra: `upper`, `committed`, `rows_in`, `rows_out`. This DAG is
scheduled on that Asset: one run per event (or per group of events queued together), which
reads the numbers from `triggering_asset_events`. Put your downstream work (a report, an
export, a refresh of what reads the table) where `report_fresh_data` is.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, Asset, task

from airflow_upsert_provider.operators.upsert import shard_asset

ORDERS = shard_asset("upsert_default", "orders")

with DAG(
    dag_id="upsert_fresh_data",
    description="Runs on every commit to the orders shard (its Asset events)",
    schedule=[ORDERS],
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["upsert", "example"],
    doc_md=__doc__,
) as dag:

    @task(inlets=[ORDERS])
    def report_fresh_data(triggering_asset_events=None) -> dict:
        """The newest upper and the rows committed since the previous run of this DAG."""
        events = list((triggering_asset_events or {}).get(ORDERS, []))
        extras = [dict(event.extra or {}) for event in events]
        summary = {
            "events": len(extras),
            "upper": max((e.get("upper") or 0 for e in extras), default=None),
            "committed": sum(e.get("committed") or 0 for e in extras),
            "rows_out": sum(e.get("rows_out") or 0 for e in extras),
        }
        print(f"fresh data in {ORDERS.uri}: {summary}")
        return summary

    report_fresh_data()
