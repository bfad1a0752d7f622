"""Scheduled micro-batch upserts: every five minutes, catch the shard up with its source.

Runs on the `upsert_default` connection (embedded defaults when it is not defined: SQLite
consensus and blob under $AIRFLOW_HOME/upsert, Spark local[*]). The shard must exist
(`upsertctl init`, or `UpsertShardHook.create_shard`). It is safe beside `upsert_backfill`
on the same shard: both converge on one table.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param

from airflow_upsert_provider.engine.config import SHARD_ID_PATTERN
from airflow_upsert_provider.hooks.upsert import DEFAULT_CONN_ID
from airflow_upsert_provider.operators.upsert import MicroBatchUpsertOperator, shard_asset

with DAG(
    dag_id="upsert_microbatch",
    description="Catch an upsert shard up with its source every five minutes",
    schedule="*/5 * * * *",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    # One scheduled run at a time; overlap with a backfill or a retry is still safe.
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=30), "retry_exponential_backoff": True},
    params={
        "shard": Param(
            "orders", type="string", pattern=SHARD_ID_PATTERN.pattern, title="Shard",
            description="Id of the shard to catch up (created beforehand with `upsertctl init`): letters, "
            "digits, '_', '.' and '-', starting with a letter or digit, at most 128 characters.",
        ),
        "spark_mode": Param(
            "in_process", type="string", enum=["in_process", "submit", "connect"], title="Spark mode",
            description="Where Spark runs. in_process: a Spark session inside the worker's task "
            "process, on the master of the upsert connection's Spark connection (local[*] when it "
            "is not defined). submit: the packaged job through spark-submit on that Spark "
            "connection (standalone, YARN or Kubernetes), driver beside the task. connect: the "
            "engine in the task, its Spark work on a warm Spark Connect server "
            "(`upsertctl spark-server start`, docs/spark-connect.md).",
        ),
    },
    render_template_as_native_obj=True,
    tags=["upsert", "example"],
    doc_md=__doc__,
) as dag:
    MicroBatchUpsertOperator(
        task_id="upsert",
        shard="{{ params.shard }}",
        spark_mode="{{ params.spark_mode }}",
        until_caught_up=True,
        # The default shard's asset, declared so that the Assets view shows this producing
        # task; a run on another shard emits its event on that shard's asset instead.
        outlets=[shard_asset(DEFAULT_CONN_ID, "orders")],
        execution_timeout=timedelta(minutes=30),
    )
