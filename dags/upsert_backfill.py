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
from airflow_upsert_provider.operators.upsert import MicroBatchUpsertOperator

with DAG(
    dag_id="upsert_backfill",
    description="Catch a lagging upsert shard up in large batches (manual trigger)",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=30), "retry_exponential_backoff": True},
    params={
        "shard": Param("orders", type="string", pattern=SHARD_ID_PATTERN.pattern, description="shard id"),
        "spark_mode": Param(
            "in_process", enum=["in_process", "submit"],
            description="in_process: Spark in the worker; submit: spark-submit on the Spark connection",
        ),
        "batch_size": Param(
            256, type="integer", minimum=1, maximum=100_000,
            description="source segment files per batch this backfill binds",
        ),
        "max_batches": Param(1000, type="integer", minimum=1, maximum=1_000_000, description="batches at most"),
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
        execution_timeout=timedelta(hours=6),
    )
