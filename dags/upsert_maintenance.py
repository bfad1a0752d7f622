"""Shard maintenance, daily: compact, then checkpoint, then collect garbage, in that order;
after the compaction the table as of the new since is also published as a snapshot of the
Apache Iceberg table `upsert.<shard>` ([docs/readers.md, "Iceberg"](upsert-provider/docs/readers#iceberg)).

Compaction advances since to the upper (reads as of an older ts fail afterwards) and leaves
the replaced runs behind; the checkpoint then records the compacted state, reading only the
files no earlier checkpoint read. On Sundays (the slower schedule: a run whose logical date,
or for a run without one the time it is due, is a Sunday) it reads every file whole,
a full verify that catches a file damaged after an earlier checkpoint read it, and then
retention drops old checkpoints (that checkpoint was read whole, so retention need not read
it again). Only then does GC delete what neither the live state nor a retained
checkpoint nor an in-flight writer or read references (the runs today's compaction replaced
stay for the grace period, for reads planned before it, and go on a later run). Daily GC works
from what the consensus store recorded as replaced, so its cost follows the garbage; on
Sundays it also sweeps (one listing of the shard's directory) for what no state names, such as
the staged files of writers that failed. Every step is
safe beside running writers (`upsert_microbatch`, `upsert_backfill`). A corrupt or missing checkpoint
catalog fails the checkpoint and GC tasks without retry, and nothing is deleted. The publish
writes its own files under `<blob root>/_iceberg/`, which GC never touches, and registers the
table in the SQL catalog inside the consensus store; it needs no Spark.

Runs on the `upsert_default` connection (embedded defaults when it is not defined).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param

from airflow_upsert_provider.engine.config import SHARD_ID_PATTERN
from airflow_upsert_provider.operators.params import number_param
from airflow_upsert_provider.operators.maintenance import (
    CheckpointCommitOperator,
    CompactShardOperator,
    GarbageCollectOperator,
    PublishIcebergOperator,
)

# The weekday of the full verify (datetime.weekday(): Monday is 0).
FULL_VERIFY_WEEKDAY = 6


def full_verify_due(logical_date: datetime | None, run_after: datetime) -> bool:
    """Whether this run is the weekly one that reads every file: its day (the logical date,
    or when it runs for a run without one, such as a manual trigger) is a Sunday, in the
    date's own time zone (UTC for scheduled runs)."""
    return (logical_date or run_after).weekday() == FULL_VERIFY_WEEKDAY


# Jinja: the chooser applied to this run.
FULL_VERIFY_DAY = "full_verify_due(dag_run.logical_date, dag_run.run_after)"

with DAG(
    dag_id="upsert_maintenance",
    description="Compact, checkpoint and garbage-collect an upsert shard",
    schedule="@daily",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=1)},
    params={
        "shard": Param(
            "orders", type="string", pattern=SHARD_ID_PATTERN.pattern, title="Shard",
            description="Id of the shard to maintain (created beforehand with `upsertctl init`): letters, "
            "digits, '_', '.' and '-', starting with a letter or digit, at most 128 characters.",
        ),
        "keep_last": number_param(
            7, type="integer", minimum=1, title="Checkpoints to keep",
            description="Retention after Sunday's full checkpoint: keep the newest N checkpoints (at "
            "least 1), and always the newest one whose files verify; older ones leave the catalog "
            "and their files become collectable.",
        ),
        "grace_seconds": number_param(
            6 * 3600, minimum=0, title="GC grace period (seconds)",
            description="Garbage collection keeps every unreferenced file younger than this many "
            "seconds (0 or more). Make it longer than any writer takes from staging a batch to "
            "committing it, and than any read runs. Default 6 hours.",
        ),
        "dry_run": Param(
            False, type="boolean", title="Dry run",
            description="When true, garbage collection only reports what it would delete and "
            "deletes nothing; compaction and the checkpoint still run.",
        ),
    },
    render_template_as_native_obj=True,
    user_defined_macros={"full_verify_due": full_verify_due},
    tags=["upsert", "example", "maintenance"],
    doc_md=__doc__,
) as dag:
    compact = CompactShardOperator(
        task_id="compact", shard="{{ params.shard }}", execution_timeout=timedelta(hours=2)
    )
    # The full verify runs weekly: every file read whole, then retention.
    checkpoint = CheckpointCommitOperator(
        task_id="checkpoint",
        shard="{{ params.shard }}",
        full="{{ " + FULL_VERIFY_DAY + " }}",
        keep_last="{{ params.keep_last if " + FULL_VERIFY_DAY + " else none }}",
    )
    gc = GarbageCollectOperator(
        task_id="gc",
        shard="{{ params.shard }}",
        grace_seconds="{{ params.grace_seconds }}",
        dry_run="{{ params.dry_run }}",
        # The orphan sweep lists the shard's directory: weekly, on the full verify's day.
        sweep="{{ " + FULL_VERIFY_DAY + " }}",
    )
    publish = PublishIcebergOperator(
        task_id="publish_iceberg", shard="{{ params.shard }}", table="upsert.{{ params.shard }}"
    )
    compact >> checkpoint >> gc
    compact >> publish
