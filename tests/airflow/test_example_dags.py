"""The example DAGs end to end: `airflow dags test` in the shared Airflow home, on the
embedded kind of store (SQLite consensus, local blob, local Spark)."""

from __future__ import annotations

import pytest

from airflow_upsert_provider.sample_data import SampleSpec, generate
from tests.airflow.conftest import failure_text, init_shard, read_table
from tests.oracle import oracle_table

pytestmark = pytest.mark.slow

SPEC = SampleSpec(records=2400, keys=600, partitions=2, segments_per_partition=6, seed=11)


@pytest.fixture
def store(tmp_path):
    landing = str(tmp_path / "landing")
    generate(landing, SPEC)
    url, blob = f"sqlite:///{tmp_path / 'consensus.db'}", str(tmp_path / "blob")
    init_shard(url, blob, landing, max_files_per_batch=3)
    return landing, url, blob


def _bindings(url: str) -> list[dict]:
    from airflow_upsert_provider.engine.consensus import open_consensus

    consensus = open_consensus(url)
    try:
        return [b.ranges for b in consensus.bindings("orders")]
    finally:
        consensus.dispose()


def test_upsert_microbatch_catches_the_shard_up(airflow_home, store, spark):
    landing, url, blob = store
    proc = airflow_home.dags_test("upsert_microbatch", airflow_home.env(url, blob))
    assert proc.returncode == 0, failure_text(proc)
    run_id = airflow_home.latest_run("upsert_microbatch")
    assert airflow_home.task_instance("upsert_microbatch", run_id, "upsert") == ("success", 1)

    report = airflow_home.xcom("upsert_microbatch", run_id, "upsert")
    outcomes = [b["outcome"] for b in report["batches"]]
    # 12 segments, 3 per batch: four batches, then the source is caught up.
    assert outcomes == ["committed"] * 4 + ["nothing_to_do"]
    assert [b["ts"] for b in report["batches"]] == [0, 1, 2, 3, 4]
    assert report["upper"] == 4 and report["committed"] == 4
    assert report["writer_id"] == f"airflow:upsert_microbatch:{run_id}:upsert:try1"
    assert sum(b["rows_in"] for b in report["batches"]) == SPEC.records
    assert report["batches"][-1]["lag_offsets"] == {"p0": 0, "p1": 0}
    assert read_table(url, blob, "orders", spark) == oracle_table(landing)


def test_upsert_backfill_validates_params_and_binds_large_batches(airflow_home, store, spark):
    landing, url, blob = store
    env = airflow_home.env(url, blob)
    bad = airflow_home.dags_test("upsert_backfill", env, conf={"shard": "orders", "batch_size": 0})
    assert bad.returncode != 0
    assert "batch_size" in bad.stdout + bad.stderr

    proc = airflow_home.dags_test("upsert_backfill", env, conf={"shard": "orders", "batch_size": 8, "max_batches": 1})
    assert proc.returncode == 0, failure_text(proc)
    report = airflow_home.xcom("upsert_backfill", airflow_home.latest_run("upsert_backfill"), "backfill")
    assert [(b["ts"], b["outcome"]) for b in report["batches"]] == [(0, "committed")]
    # One batch of 8 files, not the shard's 3: the backfill minted the binding.
    assert sum(len(r["files"]) for r in _bindings(url)[0].values()) == 8
    assert read_table(url, blob, "orders", spark) == oracle_table(
        landing, max_offset={p: rng["to"] for p, rng in _bindings(url)[0].items()}
    )

    proc = airflow_home.dags_test("upsert_backfill", env, conf={"shard": "orders", "batch_size": 8})
    assert proc.returncode == 0, failure_text(proc)
    report = airflow_home.xcom("upsert_backfill", airflow_home.latest_run("upsert_backfill"), "backfill")
    assert [(b["ts"], b["outcome"]) for b in report["batches"]] == [(1, "committed"), (2, "nothing_to_do")]
    assert read_table(url, blob, "orders", spark) == oracle_table(landing)
