"""A checkpoint of a shard whose S3 root's prefix holds a space, a non-ASCII character or
``%xx`` is created and verifies: the footer check reads each run file through the root's own
filesystem, so no good file is called bad (exit 4) for its name. The shard is real batches
written by Spark on local disk and copied to the root (tests/maintenance/test_object_storage.py)."""

from __future__ import annotations

import sqlite3

import pytest

from airflow_upsert_provider.engine.blob.files import open_blob
from airflow_upsert_provider.engine.maintenance.checkpoint import create_checkpoint
from airflow_upsert_provider.engine.maintenance.checkpoint_verify import verify_checkpoint
from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.engine.table.shard import Shard
from tests.maintenance.support import copy_blob
from tests.maintenance.test_object_storage import SHARD, local_shard  # noqa: F401 - the module's shard


@pytest.mark.parametrize("prefix", ["sp ace", "ünï/cødé 空", "pct%41"])
def test_a_checkpoint_on_an_s3_prefix_with_a_space_non_ascii_or_percent_is_created_and_verifies(
        local_shard, s3_root, tmp_path, prefix):  # noqa: F811
    base, _ = local_shard
    source, target = sqlite3.connect(base / "consensus.db"), sqlite3.connect(tmp_path / "consensus.db")
    with target:
        source.backup(target)
    source.close()
    target.close()
    consensus = open_consensus(f"sqlite:///{tmp_path / 'consensus.db'}")
    try:
        blob = open_blob(f"{s3_root}/{prefix}")
        blob.ensure_root()
        assert copy_blob(open_blob(str(base / "blob")), blob) > 0
        entry = create_checkpoint(Shard.open(consensus, blob, SHARD))
        manifest = verify_checkpoint(blob, SHARD, entry.id, consensus)
        assert manifest["files"] and all(f["path"].endswith(".parquet") for f in manifest["files"]
                                         if "/runs/" in f"/{f['path']}")
    finally:
        consensus.dispose()
