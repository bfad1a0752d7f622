"""Runs on every commit to the shard `orders`, whoever made it ([docs/events.md](upsert-provider/docs/events)).

`ShardCommitTrigger` watches the shard's upper in the consensus store of the `upsert_default`
connection from the triggerer, and fires once each time it passed the last upper it reported:
commits of this deployment's DAGs, of a continuous run, of `upsertctl`, of another
deployment. Each event lands on this DAG's Asset, `upsert_commits_orders`, with the commit
range in its payload: `from_ts`, `to_ts` (exclusive), `rows_out`, `rows_in`, `committed`,
`schema_version`. Put your downstream work where `report_commits` is.

This Asset is not the shard's own (`upsert://upsert_default/orders`, whose events the upsert
operator emits): the two sources would report the same commits twice.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, Asset, AssetWatcher, task

from airflow_upsert_provider.triggers.commits import ShardCommitTrigger

ORDERS_COMMITS = Asset(
    "upsert_commits_orders",
    watchers=[AssetWatcher(name="orders_commits",
                           trigger=ShardCommitTrigger(shard="orders", upsert_conn_id="upsert_default",
                                                      poll_interval=30))],
)

with DAG(
    dag_id="upsert_commit_events",
    description="Runs on every commit to the orders shard, made by anything (ShardCommitTrigger)",
    schedule=[ORDERS_COMMITS],
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["upsert", "example"],
    doc_md=__doc__,
) as dag:

    @task(inlets=[ORDERS_COMMITS])
    def report_commits(triggering_asset_events=None) -> list[dict]:
        """The commit ranges that triggered this run (a trigger's event keeps its payload
        under the extra's ``payload``)."""
        ranges = []
        for event in (triggering_asset_events or {}).get(ORDERS_COMMITS, []):
            payload = dict((event.extra or {}).get("payload") or {})
            ranges.append({k: payload.get(k) for k in ("from_ts", "to_ts", "rows_out", "schema_version")})
        print(f"commits to shard orders: {ranges}")
        return ranges

    report_commits()
