"""Continuous upserts from a Kafka topic: each run keeps one Spark session busy for a window,
batches back to back, and the next run takes over when it ends.

The shard reads `kafka:<topic>` (created with `upsertctl init SHARD --source kafka:TOPIC
--kafka-config FILE --key ...`, [docs/kafka.md](upsert-provider/docs/kafka)). The client config comes from an Airflow
connection of the Kafka provider's type `kafka` (its extra: librdkafka properties,
`bootstrap.servers` required), named here or by the upsert connection's `kafka_conn_id`. The
shard's consumer group is committed after every batch, so lag tools see the shard's frontier.
A stop or a recovery (`upsert_recovery`) is seen between batches and ends the window early.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param

from airflow_upsert_provider.engine.common.time_text import DURATION_PATTERN
from airflow_upsert_provider.engine.config import SHARD_ID_PATTERN
from airflow_upsert_provider.hooks.upsert import DEFAULT_CONN_ID
from airflow_upsert_provider.operators.upsert import MicroBatchUpsertOperator, shard_asset

with DAG(
    dag_id="upsert_kafka",
    description="Upsert a Kafka topic into a shard continuously, in windows of ten minutes",
    schedule=timedelta(minutes=10),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    # One window at a time; a window that overlaps the next (a slow stop) is still safe.
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=30), "retry_exponential_backoff": True},
    params={
        "shard": Param(
            "orders_cdc", type="string", pattern=SHARD_ID_PATTERN.pattern, title="Shard",
            description="Id of a shard that reads a Kafka topic (created beforehand with `upsertctl init "
            "--source kafka:TOPIC`).",
        ),
        "kafka_conn_id": Param(
            "kafka_default", type="string", pattern=r"^[A-Za-z0-9_.-]{1,250}$", title="Kafka connection",
            description="An Airflow connection of type 'kafka' whose extra holds the client config.",
        ),
        "window": Param(
            "9m", type="string", pattern=f"^{DURATION_PATTERN.pattern}$", minLength=1, title="Window",
            description="How long one run keeps batching (seconds, or e.g. 90s, 9m, 1h); shorter than the "
            "schedule so that windows do not queue up.",
        ),
    },
    render_template_as_native_obj=True,
    tags=["upsert", "example", "kafka"],
    doc_md=__doc__,
) as dag:
    MicroBatchUpsertOperator(
        task_id="upsert",
        shard="{{ params.shard }}",
        kafka_conn_id="{{ params.kafka_conn_id }}",
        continuous_for="{{ params.window }}",
        # The default shard's asset (the Assets view shows this producing task); a run on
        # another shard emits its event on that shard's asset instead.
        outlets=[shard_asset(DEFAULT_CONN_ID, "orders_cdc")],
        execution_timeout=timedelta(minutes=15),
    )
