"""Scheduler steps for a DAG scheduled on an Asset, and a producer try that dies after its commit.

``consumer_steps.py trigger-and-run DAG_ID``: the scheduler's own steps turn the queued Asset
events into asset-triggered runs (``SchedulerJobRunner._create_dagruns_for_dags``, then
``_start_queued_dagruns``); each new run's tasks then run in this process with the task runner
`dag.test()` uses, which hands them the run's triggering Asset events. Prints one line
``RUN <run_id> <state>`` per run created.

``consumer_steps.py producer-dies-after-commit DAG_ID SIGNAL GO``: `airflow dags test DAG_ID`,
in which the first try's first commit lands and then the try fails as a process whose worker
was lost would, before its Asset event: it creates the file SIGNAL after that commit and waits
for the file GO (the test runs a peer producer in between) before failing. `dags test` then runs
the retry, a new writer (try 2), as the scheduler would.
"""

from __future__ import annotations

import os
import sys
import time

# How long a held try waits for the test's word before failing anyway.
HOLD_SECONDS = 600


def trigger_and_run(dag_id: str) -> None:
    from sqlalchemy import select

    from airflow.jobs.job import Job
    from airflow.jobs.scheduler_job_runner import SchedulerJobRunner
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from airflow.utils.sqlalchemy import prohibit_commit

    runner = SchedulerJobRunner(job=Job())
    with create_session() as session:
        before = set(session.scalars(select(DagRun.run_id).where(DagRun.dag_id == dag_id)))
        with prohibit_commit(session) as guard:
            runner._create_dagruns_for_dags(guard, session)
        session.commit()
        runner._start_queued_dagruns(session)
        session.commit()
        new_runs = session.scalars(
            select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id.not_in(before)).order_by(DagRun.id)
        ).all()
        run_ids = [run.run_id for run in new_runs]

    run_tasks(runner, dag_id, run_ids)


def run_tasks(runner, dag_id: str, run_ids: list[str]) -> None:
    from sqlalchemy import select

    from airflow.dag_processing.dagbag import DagBag
    from airflow.models.dagrun import DagRun
    from airflow.sdk.definitions.dag import _run_task
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState, TaskInstanceState

    dag = DagBag().get_dag(dag_id)
    for run_id in run_ids:
        with create_session() as session:
            run = session.scalars(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id)).one()
            run.dag = runner._get_current_dag(dag_id=dag_id, session=session)
            # The loop dag.test() runs in place of the scheduler and an executor.
            while run.state == DagRunState.RUNNING:
                session.expire_all()
                schedulable, _ = run.update_state(session=session)
                for ti in schedulable:
                    ti.try_number += 1
                    ti.state = TaskInstanceState.SCHEDULED
                session.commit()
                scheduled = [ti for ti in run.get_task_instances(session=session)
                             if ti.state == TaskInstanceState.SCHEDULED]
                if not scheduled and run.state == DagRunState.RUNNING:
                    break
                for ti in scheduled:
                    _run_task(ti=ti, task=dag.task_dict[ti.task_id])
            session.expire_all()
            print(f"RUN {run_id} {getattr(run.state, 'value', run.state)}", flush=True)


def producer_dies_after_commit(dag_id: str, signal_path: str, go_path: str) -> None:
    from airflow.cli import cli_parser
    from airflow.configuration import write_default_airflow_configuration_if_needed

    from airflow_upsert_provider.engine.table.shard import Shard

    append = Shard.compare_and_append
    held = []

    def append_then_die(self, *args, **kwargs):
        result = append(self, *args, **kwargs)
        if not held:
            held.append(True)
            open(signal_path, "w").close()
            deadline = time.monotonic() + HOLD_SECONDS
            while not os.path.exists(go_path) and time.monotonic() < deadline:
                time.sleep(0.1)
            raise RuntimeError("the task's worker was lost after its commit")
        return result

    Shard.compare_and_append = append_then_die
    write_default_airflow_configuration_if_needed()
    args = cli_parser.get_parser().parse_args(["dags", "test", dag_id])
    args.func(args)


if __name__ == "__main__":
    steps = {"trigger-and-run": trigger_and_run, "producer-dies-after-commit": producer_dies_after_commit}
    steps[sys.argv[1]](*sys.argv[2:])
