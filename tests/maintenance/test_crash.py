"""Crash consistency: at every operation of a checkpoint commit and of GC, a simulated power
loss drops what was not durable; recovery finds the old or the new state, every checkpoint
whose commit returned is complete, and no catalog entry points at a missing file: neither the
store's nor the blob copy's (which may lag the store's after a crash, never list a deleted
directory). Each crash point starts from a copy of the store as it was before (its own state
is transactional: only the blob loses what was not durable)."""

from __future__ import annotations

import os
import shutil

from airflow_upsert_provider.engine.blob.files import LocalBlob
from airflow_upsert_provider.engine.maintenance.checkpoint import create_checkpoint, list_checkpoints
from airflow_upsert_provider.engine.maintenance.checkpoint_catalog import Catalog, copy_name, checkpoints_root
from airflow_upsert_provider.engine.maintenance.checkpoint_retention import apply_retention
from airflow_upsert_provider.engine.maintenance.checkpoint_verify import verify_checkpoint
from airflow_upsert_provider.engine.maintenance.compaction import compact
from airflow_upsert_provider.engine.maintenance.gc import collect_garbage
from airflow_upsert_provider.engine.table.shard import Shard
from tests.maintenance.crashfs import Crash, CrashingBlob
from tests.maintenance.support import (
    age_compaction,
    age_files,
    catalog_copies,
    copy_sqlite_store,
    table,
    written_shard,
)

# A guard: a crash point loop that never completes is a bug in the test or the code.
MAX_POINTS = 400


def copy_blob(source: str, target: str) -> LocalBlob:
    """A copy of a blob tree made of hard links (run paths are relative to the root)."""
    shutil.copytree(source, target, copy_function=os.link)
    return LocalBlob(target)


def recovered(consensus, root: str, shard_id: str) -> list[str]:
    """What recovery finds: the store's catalog and the blob copy must load and every
    checkpoint either lists verify, before and after a GC on the recovered tree. Returns the
    store's list."""
    blob = LocalBlob(root)
    ids = [e.id for e in list_checkpoints(blob, shard_id, consensus)]

    def all_verify() -> None:
        for checkpoint_id in ids:
            verify_checkpoint(blob, shard_id, checkpoint_id, consensus)
        for entry in list_checkpoints(blob, shard_id):  # what a restore from the blob alone reads
            verify_checkpoint(blob, shard_id, entry.id)

    all_verify()
    collect_garbage(consensus, blob, shard_id, grace_seconds=0)
    all_verify()
    assert [e.id for e in list_checkpoints(blob, shard_id, consensus)] == ids
    return ids


def test_checkpoint_commit_crash_at_every_point(spark, sqlite_url, tmp_path):
    from airflow_upsert_provider.engine.store.registry import open_consensus

    consensus = open_consensus(sqlite_url)
    base = LocalBlob(str(tmp_path / "blob"))
    shard = written_shard(spark, consensus, base, tmp_path, batches=3)
    first = create_checkpoint(shard).id
    second = create_checkpoint(shard).id
    before = [first, second]

    outcomes = set()
    for point in range(MAX_POINTS):
        root = str(tmp_path / f"crash-{point}")
        copy_blob(base.root, root)
        crashing = CrashingBlob(root, str(tmp_path / f"stash-{point}"), crash_at=point)
        store = copy_sqlite_store(consensus, str(tmp_path / f"crash-{point}.db"))
        try:
            entry = create_checkpoint(Shard(store, crashing, shard.shard_id, shard.config), keep_last=2)
        except Crash:
            entry = None
        if entry is not None:
            crashing.crash_now()
        ids = recovered(store, root, shard.shard_id)
        store.dispose()
        new = [i for i in ids if i not in before]
        assert len(new) <= 1
        # Old state, new state, or new state after retention: nothing in between.
        assert ids in (before, before + new, [second] + new), (point, crashing.ops[-3:], ids)
        if entry is not None:
            assert ids == [second, entry.id]  # a commit that returned is complete
            break
        outcomes.add("new" if new else "old")
    else:
        raise AssertionError("the checkpoint commit never completed")
    assert point > 10 and outcomes == {"old", "new"}
    consensus.dispose()


def test_gc_crash_at_every_point(spark, sqlite_url, tmp_path):
    from airflow_upsert_provider.engine.store.registry import open_consensus

    consensus = open_consensus(sqlite_url)
    base = LocalBlob(str(tmp_path / "blob"))
    shard = written_shard(spark, consensus, base, tmp_path, batches=3)
    create_checkpoint(shard)
    compact(spark, shard)
    age_compaction(consensus, shard.shard_id)
    kept = create_checkpoint(shard).id
    # Garbage of every kind: runs only the dropped checkpoint pinned, its directory left by
    # a retention that crashed before deleting it, and a temporary file of a crashed write.
    catalog = Catalog.load(base, shard.shard_id, consensus)
    dropped = catalog.entries[0].id
    catalog.remove({dropped})
    with open(os.path.join(checkpoints_root(base, shard.shard_id), ".tmp-crashed"), "wb") as handle:
        handle.write(b"{")
    age_files(base.root)
    expected = table(shard)

    for point in range(MAX_POINTS):
        root = str(tmp_path / f"crash-{point}")
        copy_blob(base.root, root)
        crashing = CrashingBlob(root, str(tmp_path / f"stash-{point}"), crash_at=point)
        store = copy_sqlite_store(consensus, str(tmp_path / f"crash-{point}.db"))
        try:
            report = collect_garbage(store, crashing, shard.shard_id, grace_seconds=60)
            crashing.crash_now()
        except Crash:
            report = None
        assert recovered(store, root, shard.shard_id) == [kept]
        assert table(Shard(store, LocalBlob(root), shard.shard_id, shard.config)) == expected
        version = Catalog.load(LocalBlob(root), shard.shard_id, store).version
        store.dispose()
        if report is not None:
            assert {i.kind for i in report.items} == {"run", "unlisted_checkpoint", "temporary_file"}
            assert not os.path.exists(os.path.join(checkpoints_root(LocalBlob(root), shard.shard_id), dropped))
            break
    else:
        raise AssertionError("GC never completed")
    assert point > 10
    assert catalog_copies(LocalBlob(root), shard.shard_id) == [copy_name(version)]
    consensus.dispose()


def test_retention_crash_at_every_point(spark, sqlite_url, tmp_path):
    from airflow_upsert_provider.engine.store.registry import open_consensus

    consensus = open_consensus(sqlite_url)
    base = LocalBlob(str(tmp_path / "blob"))
    shard = written_shard(spark, consensus, base, tmp_path, batches=1)
    ids = [create_checkpoint(shard).id for _ in range(3)]
    for point in range(MAX_POINTS):
        root = str(tmp_path / f"crash-{point}")
        copy_blob(base.root, root)
        crashing = CrashingBlob(root, str(tmp_path / f"stash-{point}"), crash_at=point)
        store = copy_sqlite_store(consensus, str(tmp_path / f"crash-{point}.db"))
        try:
            apply_retention(Catalog.load(crashing, shard.shard_id, store), keep_last=1)
            crashing.crash_now()
            done = True
        except Crash:
            done = False
        found = recovered(store, root, shard.shard_id)
        store.dispose()
        assert found in (ids, ids[2:])
        if done:
            assert found == ids[2:]
            break
    else:
        raise AssertionError("retention never completed")
    consensus.dispose()
