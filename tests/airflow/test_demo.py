"""What `make demo` leaves for a new user to look at in the Airflow UI: a connection whose
edit form is filled in, task logs the UI can read, closing text that matches the DAGs."""

from __future__ import annotations

import json
import os
import runpy
import sys

from airflow_upsert_provider import get_provider_info
from tests.airflow.conftest import failure_text
from tests.conftest import REPO_ROOT

DEMO = os.path.join(REPO_ROOT, "demo", "demo.py")

# What `airflow dags test` prints for one task (the console format of Airflow 3.3), around
# lines of the run itself that are not the task's.
CONSOLE = """\
2026-11-23T13:16:03.554416Z [info     ] Created dag run.               [airflow.models.dagrun] dagrun=<DagRun d>
2026-11-23T13:16:03.578166Z [info     ] [DAG TEST] starting task_id=upsert map_index=-1 [airflow.sdk.definitions.dag] loc=dag.py:1501
2026-11-23T13:16:16.597430Z [info     ] batch ts=0 committed: rows in 10 [airflow.task.operators.airflow_upsert_provider.operators.upsert.MicroBatchUpsertOperator] loc=upsert.py:200
printed by the task
2026-11-23T13:16:16.647135Z [info     ] [DAG TEST] end task task_id=upsert map_index=-1 [airflow.sdk.definitions.dag] loc=dag.py:1563
2026-11-23T13:16:16.649091Z [info     ] Marking run <DagRun d> successful [airflow.models.dagrun] loc=dagrun.py:1
2026-11-23T13:17:03.578166Z [info     ] [DAG TEST] starting task_id=gc map_index=2 [airflow.sdk.definitions.dag] loc=dag.py:1501
2026-11-23T13:17:04.000000Z [error    ] Task failed with exception     [task] loc=task_runner.py:1
2026-11-23T13:17:05.647135Z [info     ] [DAG TEST] end task task_id=gc map_index=2 [airflow.sdk.definitions.dag] loc=dag.py:1563
2026-11-23T13:18:03.578166Z [info     ] [DAG TEST] starting task_id=gc map_index=2 [airflow.sdk.definitions.dag] loc=dag.py:1501
2026-11-23T13:18:05.647135Z [info     ] [DAG TEST] end task task_id=gc map_index=2 [airflow.sdk.definitions.dag] loc=dag.py:1563
"""


def _demo_module() -> dict:
    sys.path.insert(0, os.path.dirname(DEMO))
    try:
        return runpy.run_path(DEMO, run_name="demo_under_test")
    finally:
        sys.path.remove(os.path.dirname(DEMO))


def test_demo_connection_fills_every_field_of_the_connection_form():
    demo = _demo_module()
    fields = get_provider_info()["connection-types"][0]["conn-fields"]
    extra = demo["UPSERT_CONNECTION_EXTRA"]
    assert set(extra) == set(fields)
    for name, value in extra.items():
        assert value not in (None, ""), name
        kinds = fields[name]["schema"]["type"]
        assert ("integer" in kinds) == isinstance(value, int), name


def test_demo_closing_text_names_every_example_dag():
    with open(DEMO, encoding="utf-8") as handle:
        text = handle.read()
    dags = sorted(name[:-3] for name in os.listdir(os.path.join(REPO_ROOT, "dags")) if name.endswith(".py"))
    assert len(dags) == 9
    assert "both example DAGs" not in text
    assert "the nine example DAGs" in text


def test_task_logs_are_cut_per_try_and_written_where_airflow_reads_them(tmp_path):
    from demo.task_logs import save_task_logs

    written = save_task_logs(CONSOLE, str(tmp_path), "d", "manual__1")
    base = tmp_path / "dag_id=d" / "run_id=manual__1"
    assert written == [
        str(base / "task_id=upsert" / "attempt=1.log"),
        str(base / "task_id=gc" / "map_index=2" / "attempt=1.log"),
        str(base / "task_id=gc" / "map_index=2" / "attempt=2.log"),
    ]
    records = [json.loads(line) for line in open(written[0], encoding="utf-8")]
    assert [r["event"] for r in records] == [
        "[DAG TEST] starting task_id=upsert map_index=-1 loc=dag.py:1501",
        "batch ts=0 committed: rows in 10 loc=upsert.py:200",
        "printed by the task",
        "[DAG TEST] end task task_id=upsert map_index=-1 loc=dag.py:1563",
    ]
    assert records[1]["logger"].endswith("MicroBatchUpsertOperator") and records[1]["level"] == "info"
    assert records[1]["timestamp"] == "2026-11-23T13:16:16.597430Z" and "timestamp" not in records[2]
    assert [json.loads(line)["level"] for line in open(written[1], encoding="utf-8")][1] == "error"


READ_LOG = r"""
import json, sys
from sqlalchemy import select
from airflow.models import TaskInstance
from airflow.utils.log.log_reader import TaskLogReader
from airflow.utils.session import create_session

dag_id, run_id, task_id = sys.argv[1:4]
with create_session() as session:
    ti = session.scalars(select(TaskInstance).where(
        TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id, TaskInstance.task_id == task_id)).one()
    lines, _ = TaskLogReader().read_log_chunks(ti, ti.try_number, {})
    print(json.dumps([str(getattr(line, "event", line)) for line in lines]))
"""


def read_task_log(airflow_home, env: dict, dag_id: str, run_id: str, task_id: str) -> list[str]:
    """The task's log as the Airflow UI gets it (the same reader, in the test's Airflow home)."""
    proc = airflow_home.run([sys.executable, "-c", READ_LOG, dag_id, run_id, task_id], env)
    assert proc.returncode == 0, failure_text(proc)
    return json.loads(proc.stdout.strip().splitlines()[-1])
