"""The two scheduler steps a zombie goes through, on one existing task instance.

``scheduler_steps.py heartbeat-timeout DAG_ID RUN_ID TASK_ID``: the task's process died
without a word; fail the try as the scheduler does on a heartbeat timeout
(``TaskInstance.handle_failure``), which puts it up for retry.

``scheduler_steps.py run-retry DAG_ID RUN_ID TASK_ID``: schedule the retry (the next try
number) and run it in this process with the task runner `dag.test()` uses. `dag.test()`
itself cannot do this: it deletes and recreates the DAG run, so every try would be try 1.

``scheduler_steps.py heartbeat-timeout,run-retry DAG_ID RUN_ID TASK_ID``: both, one after the
other in one process (each prints its STATE line; the retry refuses a try not up for retry).
"""

from __future__ import annotations

import sys

from sqlalchemy import select

from airflow import settings
from airflow.dag_processing.dagbag import DagBag
from airflow.models.taskinstance import TaskInstance
from airflow.utils.session import create_session
from airflow.utils.state import TaskInstanceState


def _ti(session, dag_id: str, run_id: str, task_id: str) -> TaskInstance:
    return session.scalars(
        select(TaskInstance).where(
            TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id, TaskInstance.task_id == task_id
        )
    ).one()


def heartbeat_timeout(dag_id: str, run_id: str, task_id: str) -> None:
    with create_session() as session:
        ti = _ti(session, dag_id, run_id, task_id)
        ti.handle_failure("task instance heartbeat timeout: its process was killed", session=session)
        print(f"STATE {getattr(ti.state, 'value', ti.state)} TRY {ti.try_number}", flush=True)


def run_retry(dag_id: str, run_id: str, task_id: str) -> None:
    from airflow.sdk.definitions.dag import _run_task

    dag = DagBag().get_dag(dag_id)
    session = settings.Session()
    ti = _ti(session, dag_id, run_id, task_id)
    if ti.state != TaskInstanceState.UP_FOR_RETRY:
        raise SystemExit(f"task instance is {ti.state}, not up for retry")
    ti.try_number += 1
    ti.state = TaskInstanceState.SCHEDULED
    session.commit()
    _run_task(ti=ti, task=dag.task_dict[task_id])
    session.expire_all()
    ti = _ti(session, dag_id, run_id, task_id)
    print(f"STATE {getattr(ti.state, 'value', ti.state)} TRY {ti.try_number}", flush=True)


if __name__ == "__main__":
    steps = {"heartbeat-timeout": heartbeat_timeout, "run-retry": run_retry}
    for step in sys.argv[1].split(","):
        steps[step](*sys.argv[2:5])
