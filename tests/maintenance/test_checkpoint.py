"""Checkpoints: catalog durability and refusals, verify and restore, retention."""

from __future__ import annotations

import json
import os

import pytest

from airflow_upsert_provider.engine.blob.files import LocalBlob
from airflow_upsert_provider.engine.maintenance.checkpoint import create_checkpoint, list_checkpoints
from airflow_upsert_provider.engine.maintenance.checkpoint_catalog import (
    COMMIT_NAME,
    COPY_PREFIX,
    MANIFEST_NAME,
    Catalog,
    CheckpointCorrupt,
    checkpoint_dirs,
    checkpoints_root,
    copy_name,
)
from airflow_upsert_provider.engine.maintenance.checkpoint_restore import restore_checkpoint
from airflow_upsert_provider.engine.maintenance.checkpoint_retention import apply_retention
from airflow_upsert_provider.engine.maintenance.checkpoint_verify import verify_checkpoint
from airflow_upsert_provider.engine.maintenance.compaction import compact
from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.engine.errors import ConfigurationError, ShardExists, ShardNotFound, StreamNotReady
from airflow_upsert_provider.engine.maintenance.gc import collect_garbage
from airflow_upsert_provider.engine.table.shard import Shard
from airflow_upsert_provider.engine.write.writer import Writer
from tests.conftest import sqlite_only
from tests.helpers import recover, run_cli_json
from tests.maintenance.support import (
    age_files,
    as_legacy_catalog,
    catalog_copies,
    files_of,
    oracle,
    reads_at_every_ts,
    table,
    tree,
    written_shard,
)


class FailingBlob(LocalBlob):
    """Fails one primitive operation on a catalog copy once, when armed."""

    def __init__(self, root: str, operation: str) -> None:
        super().__init__(root)
        self.operation = operation
        self.armed = False

    def _maybe_fail(self, operation: str, path: str) -> None:
        if self.armed and operation == self.operation and (COPY_PREFIX in path or operation == "fsync_dir"):
            self.armed = False
            raise OSError(28, f"injected {operation} failure")

    def write_file(self, path, data, *, sync):
        self._maybe_fail("write_file", os.path.join(os.path.dirname(path), COPY_PREFIX) if ".tmp-" in path else path)
        super().write_file(path, data, sync=sync)

    def rename(self, src, dst):
        self._maybe_fail("rename", dst)
        super().rename(src, dst)

    def fsync_dir(self, directory):
        super().fsync_dir(directory)
        self._maybe_fail("fsync_dir", directory)  # after the rename landed


def on_shard_with(blob, shard) -> Shard:
    return Shard(shard.consensus, blob, shard.shard_id, shard.config)


@sqlite_only
@pytest.mark.parametrize("operation", ["write_file", "rename", "fsync_dir"])
def test_a_failed_catalog_copy_write_fails_no_committed_change_and_no_copy_lists_a_deleted_directory(
    spark, consensus, blob, tmp_path, operation, capsys
):
    shard = written_shard(spark, consensus, blob, tmp_path, batches=2)
    sid = shard.shard_id
    first = create_checkpoint(shard)
    failing = FailingBlob(blob.root, operation)

    def arm(step: str) -> None:
        if step == "commit":  # manifest and marker are on disk; the catalog change is next
            failing.armed = True

    # The entry is committed in the store; its blob copy is written after, and failed.
    second = create_checkpoint(on_shard_with(failing, shard), on_step=arm)
    assert not failing.armed
    assert [e.id for e in list_checkpoints(blob, sid, consensus)] == [first.id, second.id]
    # The copy lags the store (unless the rename landed before the failure).
    lagging = [first.id, second.id] if operation == "fsync_dir" else [first.id]
    assert [e.id for e in list_checkpoints(blob, sid)] == lagging
    assert not [n for n in os.listdir(checkpoints_root(blob, sid)) if n.startswith(".tmp-")]
    # upsertctl lists and verifies what the store lists, not the lagging copy.
    code, listed, _ = run_cli_json(capsys, "--consensus", consensus.url, "--blob-root", blob.root,
                                   "checkpoint", "list", sid)
    assert code == 0 and [c["id"] for c in listed["checkpoints"]] == [first.id, second.id]
    code, verified, _ = run_cli_json(capsys, "--consensus", consensus.url, "--blob-root", blob.root,
                                     "checkpoint", "verify", sid)
    assert code == 0 and [v["id"] for v in verified["verified"]] == [first.id, second.id]
    # A restore from the blob alone (an empty store) works from the lagging copy.
    empty = open_consensus(f"sqlite:///{tmp_path / 'empty.db'}")
    try:
        assert restore_checkpoint(empty, blob, sid, lagging[-1], target_shard_id="from-blob").upper == 2
    finally:
        empty.dispose()

    # Retention whose copy write fails drops the entry in the store and deletes no directory:
    # the copy on the blob may still list it.
    catalog = Catalog.load(failing, sid, consensus)
    failing.armed = True
    assert [e.id for e in apply_retention(catalog, keep_last=1)] == [first.id]
    assert not failing.armed and not catalog.copy_written
    assert [e.id for e in list_checkpoints(blob, sid, consensus)] == [second.id]
    assert checkpoint_dirs(blob, sid) == sorted([first.id, second.id])
    for entry in list_checkpoints(blob, sid):
        verify_checkpoint(blob, sid, entry.id)

    # GC writes the copy of the current version before it deletes the unlisted directory.
    age_files(blob.root)
    report = collect_garbage(consensus, blob, sid, grace_seconds=0)
    assert "unlisted_checkpoint" in {i.kind for i in report.items}
    assert checkpoint_dirs(blob, sid) == [second.id]
    assert [e.id for e in list_checkpoints(blob, sid)] == [second.id]
    assert catalog_copies(blob, sid) == [copy_name(Catalog.load(blob, sid, consensus).version)]


def refused_everywhere(consensus, blob, shard, message: str, catalog_path: str) -> None:
    """Listing, GC and a new checkpoint all refuse, naming the catalog file."""
    for attempt in (
        lambda: list_checkpoints(blob, shard.shard_id, consensus),
        lambda: collect_garbage(consensus, blob, shard.shard_id, grace_seconds=0),
        lambda: create_checkpoint(shard),
    ):
        with pytest.raises(CheckpointCorrupt, match=message) as caught:
            attempt()
        assert catalog_path in str(caught.value)


@sqlite_only
@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda data: b"\x00\xff not json at all", "truncated or corrupt"),
        (lambda data: data[: len(data) // 2], "truncated or corrupt"),
        (lambda data: b"", "is empty"),
        (lambda data: b"  \n", "is empty"),
    ],
    ids=["corrupt", "truncated", "empty", "blank"],
)
def test_corrupt_truncated_or_empty_catalog_is_refused_and_nothing_deleted(
    spark, consensus, blob, tmp_path, damage, message
):
    shard = written_shard(spark, consensus, blob, tmp_path, batches=3)
    create_checkpoint(shard)
    compact(spark, shard)  # the batches' runs are now pinned only by the checkpoint
    create_checkpoint(shard)
    # The store holds the catalog: a damaged copy concerns only a reader of the blob alone.
    (copy,) = catalog_copies(blob, shard.shard_id)
    copy_path = os.path.join(checkpoints_root(blob, shard.shard_id), copy)
    with open(copy_path, "rb") as handle:
        original = handle.read()
    with open(copy_path, "wb") as handle:
        handle.write(damage(original))
    with pytest.raises(CheckpointCorrupt, match=message) as caught:
        list_checkpoints(blob, shard.shard_id)
    assert copy_path in str(caught.value)
    assert len(list_checkpoints(blob, shard.shard_id, consensus)) == 2

    # A catalog file of a release before the store held catalogs, damaged, before the store
    # imported it: refused by every reader and changer.
    catalog_path = as_legacy_catalog(consensus, blob, shard.shard_id)
    with open(catalog_path, "wb") as handle:
        handle.write(damage(original))
    age_files(blob.root)
    before = tree(blob.root)

    refused_everywhere(consensus, blob, shard, message, catalog_path)
    assert tree(blob.root) == before


@sqlite_only
def test_missing_catalog_with_checkpoint_directories_is_refused(spark, consensus, blob, tmp_path):
    shard = written_shard(spark, consensus, blob, tmp_path, batches=3)
    create_checkpoint(shard)
    compact(spark, shard)
    catalog_path = as_legacy_catalog(consensus, blob, shard.shard_id)
    os.unlink(catalog_path)
    age_files(blob.root)
    before = tree(blob.root)
    refused_everywhere(consensus, blob, shard, r"is missing but committed checkpoint directories exist \(1,", catalog_path)
    assert tree(blob.root) == before


@sqlite_only
def test_missing_catalog_without_checkpoints_is_an_empty_list(spark, consensus, blob, tmp_path):
    shard = written_shard(spark, consensus, blob, tmp_path, batches=1)
    assert list_checkpoints(blob, shard.shard_id) == []
    assert collect_garbage(consensus, blob, shard.shard_id, grace_seconds=0).items == []


@sqlite_only
def test_first_checkpoint_window_is_not_mistaken_for_corruption(spark, consensus, blob, tmp_path):
    shard = written_shard(spark, consensus, blob, tmp_path, batches=2)
    seen = {}

    def during(step: str) -> None:
        # Directory created, not yet in the catalog: listing and GC proceed normally.
        seen[step] = list_checkpoints(blob, shard.shard_id)
        collect_garbage(consensus, blob, shard.shard_id)

    entry = create_checkpoint(shard, on_step=during)
    assert seen == {"snapshot": [], "verified": [], "manifest": [], "commit": [], "catalog": [entry]}
    verify_checkpoint(blob, shard.shard_id, entry.id)

    # A first checkpoint interrupted before its catalog existed (directory and manifest, no
    # commit marker, no catalog) is an unfinished checkpoint, not a lost catalog.
    other = written_shard(spark, consensus, blob, tmp_path / "other", batches=1, shard_id="other")
    directory = os.path.join(checkpoints_root(blob, other.shard_id), "000000000001-unfinished")
    os.makedirs(directory)
    with open(os.path.join(directory, MANIFEST_NAME), "w") as handle:
        handle.write("{}")
    assert list_checkpoints(blob, other.shard_id) == []


@sqlite_only
@pytest.mark.parametrize("damage", ["deleted", "garbage_same_size", "manifest"])
def test_verify_and_restore_name_the_bad_file(spark, consensus, blob, tmp_path, damage):
    shard = written_shard(spark, consensus, blob, tmp_path, batches=3)
    entry = create_checkpoint(shard)
    verify_checkpoint(blob, shard.shard_id, entry.id)
    manifest_path = os.path.join(checkpoints_root(blob, shard.shard_id), entry.id, MANIFEST_NAME)
    with open(manifest_path) as handle:
        victim = blob.path(json.load(handle)["files"][1]["path"])
    if damage == "deleted":
        os.unlink(victim)
        reason = "missing"
    elif damage == "garbage_same_size":
        size = os.path.getsize(victim)
        with open(victim, "r+b") as handle:
            handle.write(os.urandom(size))
        assert os.path.getsize(victim) == size
        reason = "checksum mismatch"
    else:
        victim = manifest_path
        with open(manifest_path, "r+b") as handle:
            handle.seek(10)
            handle.write(b"#garbage#")
        reason = "checksum"

    for attempt in (
        lambda: verify_checkpoint(blob, shard.shard_id, entry.id),
        lambda: restore_checkpoint(consensus, blob, shard.shard_id, entry.id, target_shard_id="orders-restored"),
    ):
        with pytest.raises(CheckpointCorrupt) as caught:
            attempt()
        assert victim in str(caught.value) and reason in str(caught.value)
        assert caught.value.details["records"][0]["file"] == victim
        assert caught.value.exit_code == 4
    with pytest.raises(ShardNotFound):
        consensus.get_shard("orders-restored")


def test_restore_rebuilds_the_state_and_resumes(spark, consensus, blob, tmp_path):
    shard = written_shard(spark, consensus, blob, tmp_path, batches=4)
    compact(spark, shard, since=2)
    entry = create_checkpoint(shard)
    assert (entry.upper, entry.since) == (4, 2)
    expected = reads_at_every_ts(shard, start=2)
    # The manifest reuses the checksums recorded when the runs were written.
    manifest = verify_checkpoint(blob, shard.shard_id, entry.id)
    assert manifest["files"] and all(f["sha256"] == blob.checksum(blob.path(f["path"])) for f in manifest["files"])
    # The original moves on, compacts and collects its garbage.
    Writer(shard, "later", spark_factory=lambda: spark).run(until_caught_up=True, with_lag=False)
    compact(spark, shard)
    age_files(blob.root)
    collect_garbage(consensus, blob, shard.shard_id, grace_seconds=0)

    record = restore_checkpoint(consensus, blob, shard.shard_id, entry.id, target_shard_id="orders-restored")
    assert (record.upper, record.since) == (4, 2)
    restored = Shard.open(consensus, blob, "orders-restored")
    assert reads_at_every_ts(restored, start=2) == expected
    # The bindings from since - 1 on, as the checkpoint recorded them (the original's GC has
    # truncated its own below since - 1 meanwhile).
    assert [(b.ts, b.ranges) for b in consensus.bindings("orders-restored")] == [
        (b["ts"], b["ranges"]) for b in manifest["bindings"]
    ]
    assert [b["ts"] for b in manifest["bindings"]] == [1, 2, 3]
    with pytest.raises(ConfigurationError, match="compacted below since 2"):
        restored.read(spark, as_of=1)
    # Recovery order: the restored shard is RECOVERING until seek and resume have run; then it
    # resumes from its bound offsets and converges.
    with pytest.raises(StreamNotReady):
        Writer(restored, "too-early", spark_factory=lambda: spark).run()
    recover(restored)
    Writer(restored, "resumed", spark_factory=lambda: spark).run(until_caught_up=True, with_lag=False)
    assert table(restored) == oracle(restored) == table(shard)
    assert table(restored) == table(shard) == oracle(restored)

    # Never over an existing shard (its upper would move backwards).
    upper = shard.state().upper
    with pytest.raises(ShardExists, match=f"with upper {upper}"):
        restore_checkpoint(consensus, blob, shard.shard_id, entry.id)
    assert shard.state().upper == upper

    # The restored shard reads files in the original's directory: once no checkpoint pins
    # them, its live state alone keeps the original's GC from deleting them.
    latest = create_checkpoint(shard, keep_last=1)
    age_files(blob.root)
    borrowed = {
        p for p in files_of(blob, consensus.snapshot("orders-restored").live_runs())
        if p.startswith(blob.path(shard.shard_id) + os.sep)
    }
    assert borrowed and not borrowed & files_of(blob, consensus.snapshot(shard.shard_id).live_runs())
    collect_garbage(consensus, blob, shard.shard_id, grace_seconds=0)
    assert all(os.path.exists(p) for p in borrowed)

    # Into an empty consensus, under the same id (last: the original store's maintenance of
    # the shard is fenced from then on, see test_disaster_recovery.py).
    empty = open_consensus(f"sqlite:///{tmp_path / 'empty.db'}")
    try:
        restore_checkpoint(empty, blob, shard.shard_id, latest.id)
        assert table(Shard.open(empty, blob, shard.shard_id)) == table(shard)
    finally:
        empty.dispose()


def test_retention_keeps_the_last_n_or_the_recent_and_never_none(spark, consensus, blob, tmp_path):
    shard = written_shard(spark, consensus, blob, tmp_path, batches=1)
    ids = [create_checkpoint(shard).id for _ in range(3)]
    fourth = create_checkpoint(shard, keep_last=2)
    ids.append(fourth.id)
    assert [e.id for e in list_checkpoints(blob, shard.shard_id)] == ids[2:]
    assert checkpoint_dirs(blob, shard.shard_id) == sorted(ids[2:])

    catalog = Catalog.load(blob, shard.shard_id, consensus)
    newest = catalog.entries[-1]
    removed = apply_retention(catalog, keep_within=1, now=newest.created_at + 3600)
    assert [e.id for e in removed] == [ids[2]]
    assert [e.id for e in list_checkpoints(blob, shard.shard_id)] == [newest.id]
    with pytest.raises(ConfigurationError, match="keep-last must be >= 1"):
        create_checkpoint(shard, keep_last=0)
    assert [e.id for e in list_checkpoints(blob, shard.shard_id)] == [newest.id]


@sqlite_only
def test_commit_marker_checked_against_the_catalog(spark, consensus, blob, tmp_path):
    shard = written_shard(spark, consensus, blob, tmp_path, batches=1)
    entry = create_checkpoint(shard)
    marker = os.path.join(checkpoints_root(blob, shard.shard_id), entry.id, COMMIT_NAME)
    os.unlink(marker)
    with pytest.raises(CheckpointCorrupt, match="never committed") as caught:
        verify_checkpoint(blob, shard.shard_id, entry.id)
    assert marker in str(caught.value)
