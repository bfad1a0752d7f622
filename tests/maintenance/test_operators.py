"""The maintenance operators in process (their engine calls and error mapping), and the
example DAG end to end with `airflow dags test`."""

from __future__ import annotations

import json
import os

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_upsert_provider.engine.maintenance import iceberg_catalog
from airflow_upsert_provider.engine.maintenance.checkpoint import list_checkpoints
from airflow_upsert_provider.engine.maintenance.checkpoint_manifest import read_manifest
from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.engine.table.shard import Shard
from airflow_upsert_provider.operators.maintenance import (
    CheckpointCommitOperator,
    CompactShardOperator,
    GarbageCollectOperator,
    RestoreCheckpointOperator,
)
from tests.airflow.conftest import airflow_home, failure_text  # noqa: F401 - the session fixture
from tests.helpers import table
from tests.maintenance.support import age_compaction, age_files, as_legacy_catalog, oracle, tree, written_shard
from tests.oracle import table_from_rows


@pytest.fixture
def store(spark, sqlite_url, blob, tmp_path, monkeypatch):
    consensus = open_consensus(sqlite_url)
    shard = written_shard(spark, consensus, blob, tmp_path, batches=4)
    monkeypatch.setenv(
        "AIRFLOW_CONN_UPSERT_DEFAULT",
        json.dumps({"conn_type": "upsert", "extra": {"consensus_url": sqlite_url, "blob_root": blob.root}}),
    )
    yield consensus, shard
    consensus.dispose()


def test_operators_call_the_engine_and_return_its_report(spark, store, blob):
    consensus, shard = store
    expected = table(shard)
    compacted = CompactShardOperator(task_id="compact", shard="orders", since="3").execute({})
    assert (compacted["outcome"], compacted["since"], compacted["runs_merged"]) == ("compacted", 3, 3)
    first = CheckpointCommitOperator(task_id="checkpoint", shard="orders").execute({})
    second = CheckpointCommitOperator(task_id="checkpoint", shard="orders", keep_last="1").execute({})
    assert [e.id for e in list_checkpoints(blob, "orders")] == [second["id"]] != [first["id"]]
    age_files(blob.root)
    age_compaction(consensus, "orders")
    planned = GarbageCollectOperator(task_id="gc", shard="orders", grace_seconds=60, dry_run="true").execute({})
    assert planned["would_delete"]["items"] == 3
    done = GarbageCollectOperator(task_id="gc", shard="orders", grace_seconds=60).execute({})
    assert done["deleted"] == planned["would_delete"]
    restored = RestoreCheckpointOperator(task_id="restore", shard="orders", target_shard="copy").execute({})
    assert {k: restored[k] for k in ("shard", "checkpoint", "upper", "since")} == {
        "shard": "copy", "checkpoint": second["id"], "upper": 4, "since": 3}
    assert restored["stream"]["status"] == "RECOVERING"
    assert table(Shard.open(consensus, blob, "copy")) == expected == oracle(shard)


def test_engine_errors_fail_without_retry(spark, store, blob):
    consensus, shard = store
    CheckpointCommitOperator(task_id="checkpoint", shard="orders").execute({})
    # A catalog file of a release before the store held catalogs, not imported yet, damaged.
    catalog = as_legacy_catalog(consensus, blob, "orders")
    open(catalog, "wb").close()
    age_files(blob.root)
    before = tree(blob.root)
    with pytest.raises(AirflowFailException, match=f"integrity violation: checkpoint catalog {catalog} is empty"):
        GarbageCollectOperator(task_id="gc", shard="orders", grace_seconds=0).execute({})
    with pytest.raises(AirflowFailException, match="is empty"):
        RestoreCheckpointOperator(task_id="restore", shard="orders", target_shard="copy").execute({})
    assert tree(blob.root) == before
    with pytest.raises(AirflowFailException, match="configuration error: unknown shard 'nope'"):
        CompactShardOperator(task_id="compact", shard="nope").execute({})
    with pytest.raises(AirflowFailException, match="keep_last must be >= 1"):
        CheckpointCommitOperator(task_id="checkpoint", shard="orders", keep_last=0).execute({})
    with pytest.raises(AirflowFailException, match="grace_seconds cannot be negative"):
        GarbageCollectOperator(task_id="gc", shard="orders", grace_seconds=-1).execute({})


@pytest.mark.parametrize("dry_run", ["treu", "", "None", "2"])
def test_gc_with_a_mistyped_dry_run_deletes_nothing(spark, store, blob, dry_run):
    consensus, shard = store
    CompactShardOperator(task_id="compact", shard="orders").execute({})
    age_files(blob.root)
    age_compaction(consensus, "orders")
    before = tree(blob.root)
    with pytest.raises(AirflowFailException) as raised:
        GarbageCollectOperator(task_id="gc", shard="orders", grace_seconds="60", dry_run=dry_run).execute({})
    assert str(raised.value) == f"dry_run must be true or false, got {dry_run!r}"
    assert tree(blob.root) == before
    # The same call spelled right would have deleted the replaced runs: the typo mattered.
    planned = GarbageCollectOperator(task_id="gc", shard="orders", grace_seconds="60", dry_run="True").execute({})
    assert planned["would_delete"]["items"] > 0 and tree(blob.root) == before


def test_the_checkpoint_operator_reads_every_file_only_when_full(store, blob):
    first = CheckpointCommitOperator(task_id="checkpoint", shard="orders").execute({})
    incremental = CheckpointCommitOperator(task_id="checkpoint", shard="orders").execute({})
    full = CheckpointCommitOperator(task_id="checkpoint", shard="orders", full="True").execute({})
    checked = {name: read_manifest(blob, "orders", entry["id"])["verification"]
               for name, entry in (("first", first), ("incremental", incremental), ("full", full))}
    files = first["files"]
    assert checked == {
        "first": {"full": False, "hashed": files, "size_checked": 0, "trusted_from": None},
        "incremental": {"full": False, "hashed": 0, "size_checked": files, "trusted_from": first["id"]},
        "full": {"full": True, "hashed": files, "size_checked": 0, "trusted_from": None},
    }
    with pytest.raises(AirflowFailException, match=r"^full must be true or false, got 'maybe'$"):
        CheckpointCommitOperator(task_id="checkpoint", shard="orders", full="maybe").execute({})
    assert len(list_checkpoints(blob, "orders")) == 3


def test_maintenance_arguments_are_parsed_strictly(store):
    with pytest.raises(AirflowFailException, match=r"^grace_seconds must be a number of seconds, got '6h'$"):
        GarbageCollectOperator(task_id="gc", shard="orders", grace_seconds="6h").execute({})
    with pytest.raises(AirflowFailException, match=r"^keep_last must be an integer, got '7 days'$"):
        CheckpointCommitOperator(task_id="checkpoint", shard="orders", keep_last="7 days").execute({})
    with pytest.raises(AirflowFailException, match=r"^keep_within must be a number of seconds, got 'a week'$"):
        CheckpointCommitOperator(task_id="checkpoint", shard="orders", keep_within="a week").execute({})
    with pytest.raises(AirflowFailException, match=r"^since must be an integer, got 'latest'$"):
        CompactShardOperator(task_id="compact", shard="orders", since="latest").execute({})


@pytest.mark.slow
def test_upsert_maintenance_dag_compacts_checkpoints_and_collects(airflow_home, spark, sqlite_url, blob, tmp_path):  # noqa: F811
    consensus = open_consensus(sqlite_url)
    shard = written_shard(spark, consensus, blob, tmp_path, batches=None)
    upper = shard.state().upper
    expected = table(shard)
    batch_dirs = [blob.path(b.run["path"]) for b in shard.batches()]
    age_files(blob.root)
    env = airflow_home.env(sqlite_url, blob.root)
    proc = airflow_home.dags_test("upsert_maintenance", env, conf={"shard": "orders", "grace_seconds": 0})
    assert proc.returncode == 0, failure_text(proc)
    run_id = airflow_home.latest_run("upsert_maintenance")
    for task in ("compact", "checkpoint", "gc", "publish_iceberg"):
        assert airflow_home.task_instance("upsert_maintenance", run_id, task) == ("success", 1)
    compacted = airflow_home.xcom("upsert_maintenance", run_id, "compact")
    assert (compacted["since"], compacted["runs_merged"]) == (upper, upper)
    checkpoint = airflow_home.xcom("upsert_maintenance", run_id, "checkpoint")
    assert (checkpoint["upper"], checkpoint["since"]) == (upper, upper)
    collected = airflow_home.xcom("upsert_maintenance", run_id, "gc")
    # GC ran after the checkpoint: it deleted exactly the replaced batch runs.
    assert {blob.path(i["path"]) for i in collected["items"]} == set(batch_dirs)
    assert not any(os.path.exists(d) for d in batch_dirs)
    assert table(shard) == expected == oracle(shard)
    # The publish after the compaction: one snapshot of upsert.orders, the table at since.
    published = airflow_home.xcom("upsert_maintenance", run_id, "publish_iceberg")
    assert (published["outcome"], published["since"], published["table"]) == ("published", upper, "upsert.orders")
    catalog = iceberg_catalog.open_catalog(iceberg_catalog.catalog_properties(sqlite_url, blob.root))
    try:
        snapshot = catalog.load_table("upsert.orders").snapshot_by_id(published["snapshot_id"])
        assert snapshot.summary["upsert.since"] == str(upper)
        rows = catalog.load_table("upsert.orders").scan(snapshot_id=snapshot.snapshot_id).to_arrow().to_pylist()
    finally:
        iceberg_catalog.close_catalog(catalog)
    assert table_from_rows(rows) == expected
    consensus.dispose()
