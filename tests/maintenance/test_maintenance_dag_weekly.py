"""The example maintenance DAG's weekly full checkpoint: its chooser (pure, over every hour of
two years) and a real `airflow dags test` for a Monday and for a Sunday."""

from __future__ import annotations

import importlib.util
import os
from datetime import datetime, timedelta, timezone

import pytest

from airflow_upsert_provider.engine.maintenance.checkpoint import create_checkpoint, list_checkpoints
from airflow_upsert_provider.engine.maintenance.checkpoint_manifest import read_manifest
from airflow_upsert_provider.engine.store.registry import open_consensus
from tests.airflow.conftest import airflow_home, failure_text  # noqa: F401 - the session fixture
from tests.conftest import REPO_ROOT
from tests.helpers import table
from tests.maintenance.support import oracle, written_shard


def maintenance_dag_module():
    spec = importlib.util.spec_from_file_location(
        "upsert_maintenance_example", os.path.join(REPO_ROOT, "dags", "upsert_maintenance.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def every_hour(start: datetime, days: int):
    for hour in range(days * 24):
        yield start + timedelta(hours=hour)


def test_the_full_checkpoint_is_chosen_on_sundays_and_only_on_sundays():
    full_verify_due = maintenance_dag_module().full_verify_due
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    hours = list(every_hour(start, 2 * 366))
    for moment in hours:
        sunday = moment.weekday() == 6
        # A run with a logical date is judged by it, whenever it runs (a late or a manual run).
        for run_after in (moment, moment + timedelta(days=1), moment + timedelta(days=3)):
            assert full_verify_due(moment, run_after) is sunday, (moment, run_after)
        # A run without one (a manual trigger in Airflow 3) by when it is due.
        assert full_verify_due(None, moment) is sunday, moment
    # A daily schedule gets exactly one full checkpoint in any seven days in a row.
    days = [start + timedelta(days=n) for n in range(2 * 366)]
    due = [full_verify_due(day, day) for day in days]
    for first in range(len(days) - 6):
        assert sum(due[first:first + 7]) == 1, days[first]


def run_on(airflow_home, airflow, day: str) -> dict:
    """One `dags test` of the maintenance DAG for ``day`` (its logical date): its checkpoint's report."""
    proc = airflow.dags_test("upsert_maintenance", conf={"shard": "orders", "keep_last": 1}, logical_date=day)
    assert proc.returncode == 0, failure_text(proc)
    run_id = airflow_home.latest_run("upsert_maintenance")
    assert airflow_home.task_instance("upsert_maintenance", run_id, "checkpoint") == ("success", 1)
    return airflow_home.xcom("upsert_maintenance", run_id, "checkpoint")


@pytest.mark.slow
def test_a_sunday_run_checkpoints_in_full_and_applies_retention_and_a_monday_run_does_neither(
    airflow_home, spark, sqlite_url, blob, tmp_path  # noqa: F811
):
    consensus = open_consensus(sqlite_url)
    shard = written_shard(spark, consensus, blob, tmp_path, batches=None)
    earlier = create_checkpoint(shard)
    env = airflow_home.env(sqlite_url, blob.root)
    # Both runs in one Airflow process: their point is the logical date's choice, not a process.
    with airflow_home.dags_test_process(env) as airflow:
        monday = run_on(airflow_home, airflow, "2026-11-23")
        # Incremental: the compaction's new files hashed, nothing read whole beyond them.
        assert read_manifest(blob, "orders", monday["id"])["verification"] == {
            "full": False, "hashed": monday["files"], "size_checked": 0, "trusted_from": None,
        }
        # No retention on a weekday although keep_last is 1.
        assert [e.id for e in list_checkpoints(blob, "orders")] == [earlier.id, monday["id"]]

        sunday = run_on(airflow_home, airflow, "2026-11-29")
    assert read_manifest(blob, "orders", sunday["id"])["verification"] == {
        "full": True, "hashed": sunday["files"], "size_checked": 0, "trusted_from": None,
    }
    # Retention ran with that full checkpoint: only it is left.
    assert [e.id for e in list_checkpoints(blob, "orders")] == [sunday["id"]]
    assert table(shard) == oracle(shard)
    consensus.dispose()
