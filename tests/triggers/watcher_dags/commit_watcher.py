"""The example `upsert_commit_events` as a test runs it in Airflow's triggerer: its Asset
watched by ShardCommitTrigger, polling every 0.2 s (the example's 30 s would make a test
wait minutes) from ts 0 on; its task returns the commit ranges that triggered its run."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, Asset, AssetWatcher, task

from airflow_upsert_provider.triggers.commits import ShardCommitTrigger

COMMITS = Asset(
    "upsert_commits_orders_test",
    watchers=[AssetWatcher(name="orders_commits",
                           trigger=ShardCommitTrigger(shard="orders", upsert_conn_id="upsert_default",
                                                      after_upper=0, poll_interval=0.2))],
)

with DAG(dag_id="upsert_commit_watcher", schedule=[COMMITS], start_date=datetime(2026, 1, 1), catchup=False):

    @task(inlets=[COMMITS])
    def report_commits(triggering_asset_events=None) -> list[list[int]]:
        return [[event.extra["payload"]["from_ts"], event.extra["payload"]["to_ts"]]
                for event in (triggering_asset_events or {}).get(COMMITS, [])]

    report_commits()
