"""A checkpoint created before a schema change, restored after it, on both consensus stores:
into a new store (the store was lost) and under the shard's own id into the store it came from
after the shard was dropped there (its version rows are left behind). Either way the shard is
back at version 1 (docs/schema.md: "one taken before it at version 1"): version 1's columns and
the checkpoint's rows; the versions recorded after the checkpoint are not the restored shard's
(the rows a dropped shard left are replaced), and the next change mints version 2 anew. The
runs written at version 2 stay in the blob, named by nothing the restored shard reads. No Spark."""

from __future__ import annotations

import uuid

import sqlalchemy as sa

from airflow_upsert_provider.engine.maintenance.checkpoint import create_checkpoint
from airflow_upsert_provider.engine.maintenance.checkpoint_restore import restore_checkpoint
from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.engine.store.table_schemas import schema_history
from airflow_upsert_provider.engine.table.arrow_reader import read_table
from airflow_upsert_provider.engine.table.schema_changes import add_column
from airflow_upsert_provider.engine.table.shard import Shard
from tests.helpers import make_shard, table
from tests.schema.test_table_schemas import DISCOUNT, commit_rows, row

V1_COLUMNS = ["id", "name", "amount", "updated_at"]


def _changed_shard(consensus, blob, tmp_path):
    """A shard with a checkpoint at version 1, then a column added and a batch written with it:
    (checkpoint, the table at the checkpoint, the files of the version-2 batch)."""
    shard = make_shard(consensus, blob, tmp_path, buckets=2)
    commit_rows(shard, [row(k) for k in range(10)])
    commit_rows(shard, [{**row(k), "name": f"again-{k}"} for k in range(5, 12)])
    checkpoint = create_checkpoint(shard)
    at_checkpoint = table(shard)
    assert add_column(shard, DISCOUNT, "ops")[0].version == 2
    shard = Shard.open(consensus, blob, "orders")
    commit_rows(shard, [row(k, discount=float(k)) for k in range(8, 20)])
    v2_files = {f["path"] for b in shard.batches() if b.ts == 2 for f in b.run["files"]}
    assert v2_files and shard.config.schema_version == 2
    return checkpoint, at_checkpoint, v2_files


def _assert_back_at_version_1(store, blob, checkpoint, at_checkpoint, v2_files) -> None:
    shard = Shard.open(store, blob, "orders")
    assert shard.config.schema_version == 1
    assert [v.version for v in schema_history(store, "orders", shard.config.schema)] == [1]
    assert shard.state().upper == checkpoint.upper == 2
    assert read_table(shard).schema.names == V1_COLUMNS
    assert table(shard) == at_checkpoint
    assert not {f["path"] for b in shard.batches() for f in b.run["files"]} & v2_files
    assert all(blob.exists(blob.path(path)) for path in v2_files)  # only GC removes what nothing names
    # The next change is version 2 of the restored shard, by whoever makes it now.
    version, added = add_column(shard, DISCOUNT, "after-restore")
    assert (version.version, added, version.created_by) == (2, True, "after-restore")
    reopened = Shard.open(store, blob, "orders")
    assert read_table(reopened).schema.names == [*V1_COLUMNS, "discount"]
    assert {r["discount"] for r in read_table(reopened).read_all().to_pylist()} == {None}


def _new_store_url(consensus_url: str, request, tmp_path) -> str:
    if consensus_url.startswith("sqlite"):
        return f"sqlite:///{tmp_path / 'restored.db'}"
    return request.getfixturevalue("pg_server").create_database(f"t_{uuid.uuid4().hex[:12]}")


def test_a_checkpoint_from_before_a_change_restores_into_a_new_store_at_version_1(
        consensus, consensus_url, blob, tmp_path, request):
    checkpoint, at_checkpoint, v2_files = _changed_shard(consensus, blob, tmp_path)
    restored = open_consensus(_new_store_url(consensus_url, request, tmp_path))
    try:
        restore_checkpoint(restored, blob, "orders", checkpoint.id)
        _assert_back_at_version_1(restored, blob, checkpoint, at_checkpoint, v2_files)
    finally:
        restored.dispose()
    # The store it came from keeps its own versions.
    assert Shard.open(consensus, blob, "orders").config.schema_version == 2


def test_a_checkpoint_from_before_a_change_restores_over_a_dropped_shards_versions_at_version_1(
        consensus, blob, tmp_path):
    checkpoint, at_checkpoint, v2_files = _changed_shard(consensus, blob, tmp_path)
    # The shard is dropped from its store; its version rows (and the rest) are left behind.
    with consensus.engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM upsert_shards WHERE shard_id = 'orders'"))
        left = conn.execute(sa.text("SELECT count(*) FROM upsert_table_schemas WHERE shard_id = 'orders'")).scalar()
    assert left >= 1
    restore_checkpoint(consensus, blob, "orders", checkpoint.id)
    _assert_back_at_version_1(consensus, blob, checkpoint, at_checkpoint, v2_files)
