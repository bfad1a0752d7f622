"""GC races that used to lose protection or page someone: runs replaced by every compaction
inside the grace period stay, a checkpoint removed by retention while GC reads it is not
corruption, and a checkpoint is never written over a missing committed file."""

from __future__ import annotations

import os

import pytest

from airflow_upsert_provider.engine.blob.files import LocalBlob
from airflow_upsert_provider.engine.maintenance.checkpoint import (
    CommittedFileBad,
    create_checkpoint,
    list_checkpoints,
)
from airflow_upsert_provider.engine.maintenance.checkpoint_catalog import (
    MANIFEST_NAME,
    Catalog,
    checkpoint_dirs,
)
from airflow_upsert_provider.engine.maintenance.checkpoint_retention import apply_retention
from airflow_upsert_provider.engine.maintenance.checkpoint_verify import verify_checkpoint
from airflow_upsert_provider.engine.maintenance.compaction import compact
from airflow_upsert_provider.engine.errors import IntegrityError
from airflow_upsert_provider.engine.maintenance.gc import collect_garbage
from airflow_upsert_provider.engine.table.shard import Shard
from tests.conftest import sqlite_only
from tests.helpers import table
from tests.maintenance.support import age_compaction, age_files, written_shard
from tests.oracle import table_from_rows

GRACE = 600


def test_runs_replaced_by_every_compaction_inside_the_grace_period_stay(spark, consensus, blob, tmp_path):
    shard = written_shard(spark, consensus, blob, tmp_path, batches=4)
    first_replaced = {b.run["path"] for b in shard.batches(below=2)}
    planned = shard.read(spark, as_of=4)  # lists every batch run
    expected = table(shard)
    compact(spark, shard, since=2)
    compact(spark, shard, since=4)  # the compactions table now only holds this one
    age_files(blob.root)

    report = collect_garbage(consensus, blob, shard.shard_id, grace_seconds=GRACE)
    deleted = {i.path for i in report.items}
    assert not deleted & first_replaced, deleted
    assert all(os.path.isdir(blob.path(p)) for p in first_replaced)
    assert table(shard) == expected
    assert table_from_rows(planned.collect()) == expected  # a read planned before both swaps

    age_compaction(consensus, shard.shard_id)
    report = collect_garbage(consensus, blob, shard.shard_id, grace_seconds=GRACE)
    deleted = {i.path for i in report.items}
    assert first_replaced <= deleted and not any(os.path.exists(blob.path(p)) for p in first_replaced)
    assert table(shard) == expected


class RetentionWhileGcReads(LocalBlob):
    """Runs ``during`` once, just before the manifest of checkpoint ``victim`` is read."""

    def __init__(self, root: str, victim: str, during) -> None:
        super().__init__(root)
        self.victim, self.during, self.fired = victim, during, False

    def read_bytes(self, path: str) -> bytes:
        if not self.fired and path.endswith(os.path.join(self.victim, MANIFEST_NAME)):
            self.fired = True
            self.during()
        return super().read_bytes(path)


@sqlite_only
def test_checkpoint_removed_by_retention_between_catalog_and_manifest_read_is_not_corruption(
    spark, consensus, blob, tmp_path
):
    shard = written_shard(spark, consensus, blob, tmp_path, batches=2)
    old = create_checkpoint(shard)
    compact(spark, shard)
    new = create_checkpoint(shard)
    age_files(blob.root)
    age_compaction(consensus, shard.shard_id)
    racing = RetentionWhileGcReads(
        blob.root, old.id, lambda: apply_retention(Catalog.load(blob, shard.shard_id, consensus), keep_last=1)
    )

    report = collect_garbage(consensus, racing, shard.shard_id, grace_seconds=GRACE)

    assert racing.fired
    assert [e.id for e in list_checkpoints(blob, shard.shard_id)] == [new.id]
    verify_checkpoint(blob, shard.shard_id, new.id)
    assert report.checkpoints_read == 1
    assert table(shard) == table(Shard.open(consensus, blob, shard.shard_id))


@sqlite_only
def test_a_listed_checkpoint_whose_manifest_is_gone_is_still_corruption(spark, consensus, blob, tmp_path):
    """The re-read only forgives a checkpoint that is no longer listed."""
    shard = written_shard(spark, consensus, blob, tmp_path, batches=1)
    entry = create_checkpoint(shard)
    manifest = os.path.join(blob.root, shard.shard_id, "checkpoints", entry.id, MANIFEST_NAME)
    os.unlink(manifest)
    with pytest.raises(IntegrityError, match="missing") as caught:
        collect_garbage(consensus, blob, shard.shard_id, grace_seconds=0)
    assert manifest in str(caught.value) and caught.value.exit_code == 4


@sqlite_only
def test_checkpoint_over_a_deleted_committed_file_is_refused_naming_it(spark, consensus, blob, tmp_path):
    shard = written_shard(spark, consensus, blob, tmp_path, batches=3)
    first = create_checkpoint(shard)
    lost = blob.path(shard.batches()[1].run["files"][0]["path"])
    os.unlink(lost)

    with pytest.raises(CommittedFileBad) as caught:
        create_checkpoint(shard)
    assert isinstance(caught.value, IntegrityError) and caught.value.exit_code == 4
    assert lost in str(caught.value) and caught.value.details["records"][0] == {"file": lost, "reason": "missing"}
    assert [e.id for e in list_checkpoints(blob, shard.shard_id)] == [first.id]
    assert checkpoint_dirs(blob, shard.shard_id) == [first.id]  # no half-written checkpoint left


@sqlite_only
def test_checkpoint_create_cli_exits_4_naming_the_deleted_file(spark, consensus, consensus_url, blob, tmp_path,
                                                              monkeypatch, capsys):
    from airflow_upsert_provider.cli import main

    shard = written_shard(spark, consensus, blob, tmp_path, batches=2)
    lost = blob.path(shard.batches()[0].run["files"][0]["path"])
    os.unlink(lost)
    monkeypatch.setenv("UPSERT_CONSENSUS_URL", consensus_url)
    monkeypatch.setenv("UPSERT_BLOB_ROOT", blob.root)
    capsys.readouterr()
    code = main(["checkpoint", "create", shard.shard_id, "--json"])
    printed = capsys.readouterr()
    assert code == 4
    assert lost in printed.out + printed.err
    assert list_checkpoints(blob, shard.shard_id) == []


def _corrupt_in_place(path: str) -> None:
    """Overwrite bytes in the middle of ``path``: same size, same name, other content."""
    size = os.path.getsize(path)
    with open(path, "r+b") as handle:
        handle.seek(size // 2)
        chunk = handle.read(16)
        handle.seek(size // 2)
        handle.write(bytes(b ^ 0xFF for b in chunk))


def test_checkpoint_create_over_a_same_size_corrupted_file_exits_4_and_keeps_the_verifying_one(
    spark, sqlite_url, blob, tmp_path, monkeypatch, capsys
):
    """Create verifies what it lists: a live run corrupted in place (same size) makes
    ``checkpoint create --keep-last 1`` exit 4 naming the file, and the checkpoint that
    still verifies stays listed."""
    from airflow_upsert_provider.cli import main
    from airflow_upsert_provider.engine.store.registry import open_consensus
    from airflow_upsert_provider.engine.write.writer import Writer

    consensus = open_consensus(sqlite_url)
    shard = written_shard(spark, consensus, blob, tmp_path, batches=2)
    first = create_checkpoint(shard)
    Writer(shard, "more", spark_factory=lambda: spark).run(max_batches=1, with_lag=False)
    damaged = blob.path(shard.batches()[2].run["files"][0]["path"])
    _corrupt_in_place(damaged)

    monkeypatch.setenv("UPSERT_CONSENSUS_URL", sqlite_url)
    monkeypatch.setenv("UPSERT_BLOB_ROOT", blob.root)
    capsys.readouterr()
    code = main(["checkpoint", "create", shard.shard_id, "--keep-last", "1"])
    printed = capsys.readouterr()
    assert code == 4
    assert damaged in printed.err and "checksum mismatch" in printed.err
    assert [e.id for e in list_checkpoints(blob, shard.shard_id)] == [first.id]
    assert checkpoint_dirs(blob, shard.shard_id) == [first.id]
    verify_checkpoint(blob, shard.shard_id, first.id)
    consensus.dispose()


def test_retention_never_drops_the_newest_checkpoint_that_verifies(consensus, blob, tmp_path):
    """The newest checkpoint no longer verifies (its manifest was damaged after it was
    written): ``--keep-last 1`` keeps it (the newest) and the newest one that verifies."""
    from tests.helpers import make_shard

    shard = make_shard(consensus, blob, tmp_path)
    oldest, verifying, damaged = (create_checkpoint(shard) for _ in range(3))
    manifest = os.path.join(blob.path(shard.shard_id, "checkpoints", damaged.id), MANIFEST_NAME)
    with open(manifest, "ab") as handle:
        handle.write(b" ")

    removed = apply_retention(Catalog.load(blob, shard.shard_id, consensus), keep_last=1)

    assert [e.id for e in removed] == [oldest.id]
    assert {e.id for e in list_checkpoints(blob, shard.shard_id)} == {verifying.id, damaged.id}
    verify_checkpoint(blob, shard.shard_id, verifying.id)


def test_checkpoint_create_whose_directory_gc_collects_under_its_commit_write_writes_it_again(
    consensus, blob, tmp_path
):
    """A create paused between MANIFEST and COMMIT past the grace period: GC (grace 0)
    collects its directory right as the commit marker is written. The create writes the
    checkpoint again under a new id, and that one verifies."""
    from tests.helpers import make_shard

    shard = make_shard(consensus, blob, tmp_path)
    collected = []

    class GcUnderTheCommitWrite(LocalBlob):
        armed = False

        def write_file(self, path, data, *, sync):
            if self.armed and os.path.basename(os.path.dirname(path)) != "checkpoints":
                self.armed = False
                collected.append(collect_garbage(consensus, blob, shard.shard_id, grace_seconds=0))
            super().write_file(path, data, sync=sync)

    racing = GcUnderTheCommitWrite(blob.root)
    shard.blob = racing

    def pause(step: str) -> None:
        if step == "manifest" and not collected:
            racing.armed = True

    entry = create_checkpoint(shard, on_step=pause)

    assert len(collected) == 1 and len(collected[0].items) == 1
    first_attempt = os.path.basename(collected[0].items[0].path)
    assert first_attempt != entry.id
    assert [e.id for e in list_checkpoints(blob, shard.shard_id)] == [entry.id]
    verify_checkpoint(blob, shard.shard_id, entry.id)
