"""Incremental checkpoints: a checkpoint reads only the files no earlier checkpoint hashed;
`--full`, a full verify and every restore read them all; a crash in the middle of one leaves
nothing the next one trusts."""

from __future__ import annotations

import pytest

from airflow_upsert_provider.engine.blob.files import LocalBlob
from airflow_upsert_provider.engine.maintenance.checkpoint import CommittedFileBad, create_checkpoint, list_checkpoints
from airflow_upsert_provider.engine.maintenance.checkpoint_catalog import CheckpointCorrupt, checkpoint_dirs
from airflow_upsert_provider.engine.maintenance.checkpoint_manifest import read_manifest
from airflow_upsert_provider.engine.maintenance.checkpoint_restore import restore_checkpoint
from airflow_upsert_provider.engine.maintenance.checkpoint_verify import verify_checkpoint
from airflow_upsert_provider.engine.table.shard import Shard
from airflow_upsert_provider.engine.write.writer import Writer
from tests.conftest import sqlite_only
from tests.helpers import run_cli_json
from tests.maintenance.support import written_shard


class CountingBlob(LocalBlob):
    """Records the files it hashes (reads whole) and those whose size it asks."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.hashed: list[str] = []
        self.sized: list[str] = []

    def checksum(self, path):
        self.hashed.append(self.relative(path))
        return super().checksum(path)

    def size(self, path):
        self.sized.append(self.relative(path))
        return super().size(path)

    def reset(self) -> None:
        self.hashed.clear()
        self.sized.clear()


class Stop(Exception):
    """The process dies here."""


def more_batches(spark, shard, n: int) -> None:
    Writer(shard, "more", spark_factory=lambda: spark).run(max_batches=n, with_lag=False)


def live_paths(shard) -> set[str]:
    return {f["path"] for run in shard.live_runs() for f in run["files"]}


def flip_a_byte(blob, path: str) -> str:
    """Damage a file in place without changing its size; returns its full path."""
    full = blob.path(path)
    with open(full, "r+b") as handle:
        data = bytearray(handle.read())
        data[len(data) // 2] ^= 0xFF
        handle.seek(0)
        handle.write(bytes(data))
    return full


@pytest.fixture
def counted(spark, consensus, blob, tmp_path):
    """A shard of 3 batches on a blob that counts what it reads."""
    shard = written_shard(spark, consensus, blob, tmp_path, batches=3)
    counting = CountingBlob(blob.root)
    return Shard(shard.consensus, counting, shard.shard_id, shard.config), counting


@sqlite_only
def test_a_checkpoint_hashes_only_the_files_no_earlier_checkpoint_hashed(spark, counted, capsys):
    shard, blob = counted
    first = create_checkpoint(shard)
    first_files = live_paths(shard)
    assert sorted(blob.hashed) == sorted(first_files)
    more_batches(spark, shard, 2)
    new_files = live_paths(shard) - first_files
    assert new_files

    blob.reset()
    second = create_checkpoint(shard)
    assert sorted(blob.hashed) == sorted(new_files)
    assert sorted(blob.sized) == sorted(live_paths(shard))
    manifest = read_manifest(blob, shard.shard_id, second.id, second.manifest_sha256)
    assert manifest["verification"] == {"full": False, "hashed": len(new_files), "size_checked": len(first_files),
                                        "trusted_from": first.id}
    assert {f["path"] for f in manifest["files"]} == live_paths(shard)

    # Nothing new: nothing read; --full reads everything again.
    blob.reset()
    create_checkpoint(shard)
    assert blob.hashed == []
    blob.reset()
    full = create_checkpoint(shard, full=True)
    assert sorted(blob.hashed) == sorted(live_paths(shard))
    assert read_manifest(blob, shard.shard_id, full.id)["verification"]["trusted_from"] is None

    # verify reads no file, only sizes; a full verify (and restore) reads each.
    blob.reset()
    verify_checkpoint(blob, shard.shard_id, second.id, shard.consensus, full=False)
    assert blob.hashed == [] and sorted(blob.sized) == sorted(live_paths(shard))
    blob.reset()
    verify_checkpoint(blob, shard.shard_id, second.id, shard.consensus)
    assert sorted(blob.hashed) == sorted(live_paths(shard))
    options = ("--consensus", shard.consensus.url, "--blob-root", blob.root)
    for full in ((), ("--full",)):
        code, out, err = run_cli_json(capsys, *options, "checkpoint", "verify", shard.shard_id, second.id, *full)
        assert code == 0, err
        assert out["verified"] == [{"id": second.id, "files": len(live_paths(shard)), "ok": True}]


@sqlite_only
def test_a_file_damaged_after_it_was_hashed_is_caught_by_a_full_verify_and_by_restore(spark, counted, capsys):
    shard, blob = counted
    first = create_checkpoint(shard)
    victim_path = sorted(live_paths(shard))[0]
    victim = flip_a_byte(blob, victim_path)

    # Same size: an incremental checkpoint and verify do not read it (as documented) ...
    second = create_checkpoint(shard)
    verify_checkpoint(blob, shard.shard_id, second.id, shard.consensus, full=False)
    options = ("--consensus", shard.consensus.url, "--blob-root", blob.root)
    for checkpoint_id in (first.id, second.id):
        # ... a full verify, a full checkpoint and a restore do.
        code, out, err = run_cli_json(capsys, *options, "checkpoint", "verify", shard.shard_id, checkpoint_id, "--full")
        assert code == 4, err
        assert (out["error"], out["file"]) == ("CheckpointCorrupt", victim)
        assert "checksum mismatch" in out["message"]
        with pytest.raises(CheckpointCorrupt) as caught:
            restore_checkpoint(shard.consensus, blob, shard.shard_id, checkpoint_id, target_shard_id="restored")
        assert caught.value.details["records"][0]["file"] == victim
    with pytest.raises(CommittedFileBad) as caught:
        create_checkpoint(shard, full=True)
    assert caught.value.details["file"] == victim

    # Another size: even an incremental checkpoint and verify catch it.
    with open(victim, "ab") as handle:
        handle.write(b"x")
    with pytest.raises(CommittedFileBad, match="size"):
        create_checkpoint(shard)
    with pytest.raises(CheckpointCorrupt, match="size"):
        verify_checkpoint(blob, shard.shard_id, second.id, shard.consensus, full=False)
    assert [e.id for e in list_checkpoints(blob, shard.shard_id, shard.consensus)] == [first.id, second.id]


class DiesWhileHashing(LocalBlob):
    """Dies on the ``after``-th file it hashes (the middle of a checkpoint's reads)."""

    def __init__(self, root: str, after: int) -> None:
        super().__init__(root)
        self.left = after

    def checksum(self, path):
        self.left -= 1
        if self.left < 0:
            raise Stop(path)
        return super().checksum(path)


@sqlite_only
@pytest.mark.parametrize("point", ["hashing", "verified", "manifest", "commit", "catalog"])
def test_a_crash_in_an_incremental_checkpoint_leaves_nothing_the_next_one_trusts(spark, consensus, blob, tmp_path,
                                                                                   point):
    shard = written_shard(spark, consensus, blob, tmp_path, batches=2)
    first = create_checkpoint(shard)
    before = live_paths(shard)
    more_batches(spark, shard, 2)
    new_files = sorted(live_paths(shard) - before)
    assert len(new_files) >= 2

    def die_at(step: str) -> None:
        if step == point:
            raise Stop(step)

    crashing = DiesWhileHashing(blob.root, after=1) if point == "hashing" else blob
    with pytest.raises(Stop):
        create_checkpoint(Shard(consensus, crashing, shard.shard_id, shard.config), on_step=die_at)
    listed = [e.id for e in list_checkpoints(blob, shard.shard_id, consensus)]
    # Every listed checkpoint's files were all read when it was made and verify in full.
    for checkpoint_id in listed:
        verify_checkpoint(blob, shard.shard_id, checkpoint_id, consensus, full=True)
    # A new file the crashed checkpoint hashed (or was about to) is damaged, keeping its size.
    victim = flip_a_byte(blob, new_files[0])
    if point == "catalog":
        # It committed: its manifest is trusted, and only a full read finds the damage.
        assert len(listed) == 2
        third = create_checkpoint(shard)
        with pytest.raises(CheckpointCorrupt) as caught:
            verify_checkpoint(blob, shard.shard_id, third.id, consensus, full=True)
        assert caught.value.details["file"] == victim
        return
    assert listed == [first.id]
    # A directory left behind without a catalog entry is never trusted: the next checkpoint
    # hashes the new files again and refuses the damaged one.
    assert len(checkpoint_dirs(blob, shard.shard_id)) == (1 if point in ("hashing", "verified") else 2)
    with pytest.raises(CommittedFileBad) as caught:
        create_checkpoint(shard)
    assert caught.value.details["file"] == victim
    assert [e.id for e in list_checkpoints(blob, shard.shard_id, consensus)] == [first.id]
    # Repaired (the file back as written), the next checkpoint is correct and verifies in full.
    flip_a_byte(blob, new_files[0])
    good = create_checkpoint(shard)
    manifest = verify_checkpoint(blob, shard.shard_id, good.id, consensus, full=True)
    assert {f["path"] for f in manifest["files"]} == live_paths(shard)
    assert (manifest["verification"]["hashed"], manifest["verification"]["trusted_from"]) == (len(new_files), first.id)
