"""Manual backfill: catch a lagging shard up in large batches while the schedule keeps running.

Trigger it with `shard`, `batch_size` (source files per batch it binds) and `max_batches`.
The scheduled `upsert_microbatch` may run at the same time on the same shard: every batch is
bound once and committed once by compare-and-append, so the two converge on the same table
(the loser of each batch reports `already_persisted`).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param

from airflow_upsert_provider.engine.config import SHARD_ID_PATTERN
from airflow_upsert_provider.operators.params import number_param
from airflow_upsert_provider.hooks.upsert import DEFAULT_CONN_ID
from airflow_upsert_provider.operators.upsert import MicroBatchUpsertOperator, shard_asset

with DAG(
    dag_id="upsert_backfill",
    description="Catch a lagging upsert shard up in large batches (manual trigger)",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=30), "retry_exponential_backoff": True},
    params={
        "shard": Param(
            "orders", type="string", pattern=SHARD_ID_PATTERN.pattern, title="Shard",
            description="Id of the shard to backfill (created beforehand with `upsertctl init`): letters, "
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
        "batch_size": number_param(
            256, type="integer", minimum=1, maximum=100_000, title="Files per batch",
            description="How many source segment files each batch this backfill binds covers "
            "(1 to 100,000). Larger than the shard's own setting, so the backlog goes in fewer, "
            "bigger Spark jobs. Batches already bound by another writer keep their size.",
        ),
        "max_batches": number_param(
            1000, type="integer", minimum=1, maximum=1_000_000, title="Batches at most",
            description="The backfill stops after this many batches (1 to 1,000,000), or earlier "
            "when the source is caught up; the schedule takes over from there.",
        ),
    },
    render_template_as_native_obj=True,
    tags=["upsert", "example"],
    doc_md=__doc__,
) as dag:
    MicroBatchUpsertOperator(
        task_id="backfill",
        shard="{{ params.shard }}",
        spark_mode="{{ params.spark_mode }}",
        max_batches="{{ params.max_batches }}",
        max_files_per_batch="{{ params.batch_size }}",
        # The default shard's asset (the Assets view shows this producing task); a run on
        # another shard emits its event on that shard's asset instead.
        outlets=[shard_asset(DEFAULT_CONN_ID, "orders")],
        execution_timeout=timedelta(hours=6),
    )
