"""Recover a shard from a checkpoint, manually: restore, then seek, then resume, in that order.

Use it when a shard's consensus state is lost (the consensus database is gone or was
replaced by an empty one) or to rebuild a checkpoint under a new shard id.

1. **restore** verifies every file the checkpoint lists (present, size, checksum, parses) and
   rebuilds the shard's state at the checkpoint's upper, into an empty store under the same
   id (`restore_target` empty, the form's default) or under a new shard id. The restored stream is RECOVERING in
   a new epoch: no writer commits to it yet, and scheduled `upsert_microbatch` runs fail
   without retry, naming the restore.
2. **seek** positions the source where the next batch after the checkpoint's upper starts and
   checks that every segment the shard still has to read is present. Segments deleted by the
   source's retention since the checkpoint fail it, naming the first missing file; nothing
   changes, and the shard stays RECOVERING (restore an older checkpoint under a new id, or
   put the segments back and clear the task).
3. **resume** makes the stream READY again; the next `upsert_microbatch` run catches the shard
   up from the checkpoint's upper.

The engine enforces this order whoever runs the steps: a resume without the seek of the same
recovery epoch is refused, and so is a seek or resume of another epoch (someone began another
recovery meanwhile). Seek and resume take the epoch from the restore's XCom. Every refusal
fails the task without retry, with the stream's status, who set it, when and why.

Runs on the `upsert_default` connection (embedded defaults when it is not defined).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param

from airflow_upsert_provider.engine.config import SHARD_ID_PATTERN
from airflow_upsert_provider.operators.lifecycle import ResumeAfterRecoveryOperator, SeekSourceOperator
from airflow_upsert_provider.operators.maintenance import RestoreCheckpointOperator
from airflow_upsert_provider.operators.params import optional_text_param

# "latest", or a checkpoint id as the catalog names it: the upper (12 digits) and 8 hex digits.
CHECKPOINT_PATTERN = r"^(latest|[0-9]{12}-[0-9a-f]{8})$"

# A shard id; empty (or null, the form's empty field): the shard's own id.
RESTORE_TARGET_PATTERN = r"^$|" + SHARD_ID_PATTERN.pattern

RESTORED = "ti.xcom_pull(task_ids='restore')"

with DAG(
    dag_id="upsert_recovery",
    description="Restore an upsert shard from a checkpoint, seek its source and resume it",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=1)},
    params={
        "shard": Param(
            "orders", type="string", pattern=SHARD_ID_PATTERN.pattern, title="Shard",
            description="Id of the shard whose checkpoint catalog holds the checkpoint to restore: "
            "letters, digits, '_', '.' and '-', starting with a letter or digit, at most 128 characters.",
        ),
        "checkpoint": Param(
            "latest", type="string", pattern=CHECKPOINT_PATTERN, title="Checkpoint",
            description="The checkpoint to restore: 'latest' for the newest in the shard's catalog, "
            "or a checkpoint id as `upsertctl checkpoint list` shows it (e.g. 000000000042-1a2b3c4d).",
        ),
        "restore_target": optional_text_param(
            pattern=RESTORE_TARGET_PATTERN, title="Restore under shard id",
            description="Empty: restore the shard under its own id, into a consensus store that no "
            "longer holds it (it was lost). Otherwise a new shard id to restore the checkpoint "
            "under; an existing shard is never overwritten.",
        ),
    },
    render_template_as_native_obj=True,
    tags=["upsert", "example", "recovery"],
    doc_md=__doc__,
) as dag:
    restore = RestoreCheckpointOperator(
        task_id="restore",
        shard="{{ params.shard }}",
        checkpoint_id="{{ params.checkpoint }}",
        target_shard="{{ params.restore_target }}",
    )
    # The restored shard (the target when one was given) and the recovery epoch its restore opened.
    seek = SeekSourceOperator(
        task_id="seek",
        shard="{{ " + RESTORED + "['shard'] }}",
        epoch="{{ " + RESTORED + "['stream']['epoch'] }}",
    )
    resume = ResumeAfterRecoveryOperator(
        task_id="resume",
        shard="{{ " + RESTORED + "['shard'] }}",
        epoch="{{ " + RESTORED + "['stream']['epoch'] }}",
    )
    restore >> seek >> resume
