"""GC checks its listing and the layout it lists: a store whose listing leaves out nested
prefixes is refused, a live file gone is an integrity error, a foreign file under ``runs/`` is
reported and kept (local disk and the S3 server), and a data file no run names inside a live
run directory (a failed or speculative task attempt's) is collected after the grace period."""

from __future__ import annotations

import os
import shutil

import pytest

from airflow_upsert_provider.cli import main
from airflow_upsert_provider.engine.blob.files import LocalBlob
from airflow_upsert_provider.engine.errors import ConfigurationError, IntegrityError
from airflow_upsert_provider.engine.maintenance.gc import collect_garbage
from airflow_upsert_provider.engine.maintenance.gc_plan import UNLISTED_FILE
from airflow_upsert_provider.engine.store.registry import open_consensus
from tests.conftest import sqlite_only
from tests.helpers import table
from tests.maintenance.support import age_files, oracle, tree, written_shard
from tests.maintenance.test_object_storage import SHARD, bucket_of, keys, local_shard, s3_shard  # noqa: F401 - fixtures

GRACE = 600


class NestedPrefixesOmitted(LocalBlob):
    """A local blob listing as a store whose delimiter listings omit nested prefixes does:
    only the files directly below the listed path, no directory."""

    def walk_files(self, path):
        for entry in super().walk_files(path):
            if os.path.dirname(entry.path) == path.rstrip("/"):
                yield entry

    def walk_dirs(self, path):
        return iter(())

    def listdir(self, path):
        return [name for name in super().listdir(path) if not os.path.isdir(os.path.join(path, name))]


def lost_run(shard, ts: int) -> str:
    """A run directory of a writer whose append lost (a copy of a committed one)."""
    source = shard.blob.path(shard.batches()[ts].run["path"])
    target = os.path.join(os.path.dirname(source), "lost-writer-0123456789ab")
    shutil.copytree(source, target)
    return target


@sqlite_only
def test_gc_refuses_a_listing_that_omits_the_live_files_and_deletes_nothing(spark, consensus, blob, tmp_path):
    shard = written_shard(spark, consensus, blob, tmp_path, batches=2)
    lost = lost_run(shard, 0)
    age_files(blob.root)
    before = tree(blob.root)
    omitting = NestedPrefixesOmitted(blob.root)

    with pytest.raises(ConfigurationError) as caught:
        collect_garbage(consensus, omitting, shard.shard_id, grace_seconds=GRACE)

    message = str(caught.value)
    assert "leaves out nested prefixes" in message and f"{shard.shard_id}/runs/" in message
    first_live = sorted(f["path"] for b in shard.batches() for f in b.run["files"])[0]
    assert caught.value.details["path"] == first_live and caught.value.details["field"] == "blob_root"
    assert tree(blob.root) == before and os.path.isdir(lost)
    # The same blob listed properly: GC goes on and deletes the lost run.
    report = collect_garbage(consensus, blob, shard.shard_id, grace_seconds=GRACE)
    assert [i.path for i in report.items] == [os.path.relpath(lost, blob.root)]


@sqlite_only
def test_gc_refuses_when_a_live_file_is_gone_naming_it(spark, consensus, blob, tmp_path):
    shard = written_shard(spark, consensus, blob, tmp_path, batches=2)
    lost = lost_run(shard, 0)
    gone = sorted(f["path"] for f in shard.batches()[1].run["files"])[0]
    os.unlink(blob.path(gone))
    age_files(blob.root)
    before = tree(blob.root)

    with pytest.raises(IntegrityError) as caught:
        collect_garbage(consensus, blob, shard.shard_id, grace_seconds=GRACE)

    assert f"live file {gone} is missing" in str(caught.value) and caught.value.exit_code == 4
    assert tree(blob.root) == before and os.path.isdir(lost)


def test_a_foreign_file_under_runs_on_local_disk_is_reported_and_kept(spark, sqlite_url, blob, tmp_path,
                                                                      monkeypatch, capsys):
    consensus = open_consensus(sqlite_url)
    shard = written_shard(spark, consensus, blob, tmp_path, batches=1)
    foreign = blob.path(shard.shard_id, "runs", "foreign.txt")
    with open(foreign, "w") as handle:
        handle.write("junk\n")
    age_files(blob.root)
    monkeypatch.setenv("UPSERT_CONSENSUS_URL", sqlite_url)
    monkeypatch.setenv("UPSERT_BLOB_ROOT", blob.root)

    for _ in range(2):  # never reported as deleted, run after run
        capsys.readouterr()
        assert main(["gc", shard.shard_id, "--grace", "0"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert f"kept foreign file {shard.shard_id}/runs/foreign.txt (5 bytes): not in the layout this project writes" in lines
        assert not any("foreign.txt" in line for line in lines if line.startswith("deleted"))
        with open(foreign) as handle:
            assert handle.read() == "junk\n"
    report = collect_garbage(consensus, blob, shard.shard_id, grace_seconds=0)
    assert report.items == []
    assert report.foreign == [{"path": f"{shard.shard_id}/runs/foreign.txt", "reason": "foreign", "files": 1, "bytes": 5}]
    assert report.to_dict()["foreign"] == report.foreign
    assert table(shard) == oracle(shard)
    consensus.dispose()


def test_a_foreign_object_under_runs_on_s3_is_reported_and_kept(s3_server, s3_shard):
    shard, blob = s3_shard, s3_shard.blob
    foreign = f"{SHARD}/runs/foreign.txt"
    blob.write_file(blob.path(foreign), b"not ours", sync=True)
    s3_server.age(bucket_of(blob), f"{blob.prefix}/{foreign}")
    before = keys(s3_server, blob)

    for _ in range(2):  # GC runs, and runs again: the object never stops it
        report = collect_garbage(shard.consensus, blob, SHARD, grace_seconds=0)
        assert report.items == []  # every run is live or pinned by the checkpoint
        assert report.foreign == [{"path": foreign, "reason": "foreign", "files": 1, "bytes": 8}]
        assert keys(s3_server, blob) == before
    assert blob.read_bytes(blob.path(foreign)) == b"not ours"


@sqlite_only
def test_an_unnamed_data_file_in_a_live_run_directory_is_collected_after_grace(spark, consensus, blob, tmp_path):
    """What a failed, killed or speculative task attempt leaves inside a committed run
    directory: a Parquet file the run's description does not name."""
    shard = written_shard(spark, consensus, blob, tmp_path, batches=2)
    expected = table(shard)
    run = shard.batches()[1].run
    named = sorted(f["path"] for f in run["files"])[0]
    bucket_dir = os.path.dirname(blob.path(named))
    stray = os.path.join(bucket_dir, "part-t99-deadbeef.parquet")
    shutil.copyfile(blob.path(named), stray)
    age_files(blob.root)
    young = os.path.join(bucket_dir, "part-t98-cafebabe.parquet")  # an attempt writing now
    shutil.copyfile(blob.path(named), young)
    companions = [os.path.join(d, f) for d, _, fs in os.walk(blob.path(run["path"])) for f in fs
                  if f.startswith((".", "_"))]

    report = collect_garbage(consensus, blob, shard.shard_id, grace_seconds=GRACE)

    assert [(i.path, i.kind, i.files) for i in report.items] == [
        (os.path.relpath(stray, blob.root), UNLISTED_FILE, 1)]
    assert not os.path.exists(stray) and os.path.exists(young)
    assert all(os.path.exists(blob.path(f["path"])) for b in shard.batches() for f in b.run["files"])
    assert companions and all(os.path.exists(p) for p in companions)  # Spark's .crc and _SUCCESS stay
    assert table(shard) == expected
