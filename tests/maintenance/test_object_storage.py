"""GC, checkpoints, retention and restore of a shard whose blob root is on object storage (an
S3 server on loopback): paths are URIs there, ages are the objects' last-modified times, and a
prefix is as old as its newest object.

The shard's runs are real batches written by Spark on local disk and copied object by object
to the S3 root (``support.copy_blob``), with consensus as it was: its records name files by
relative paths, which are the same on both roots."""

from __future__ import annotations

import sqlite3

import pytest

from airflow_upsert_provider.engine.blob.files import LocalBlob, open_blob
from airflow_upsert_provider.engine.blob.objects import ObjectBlob
from airflow_upsert_provider.engine.maintenance.checkpoint import create_checkpoint, list_checkpoints
from airflow_upsert_provider.engine.maintenance.checkpoint_catalog import Catalog, CheckpointCorrupt
from airflow_upsert_provider.engine.maintenance.checkpoint_manifest import read_manifest
from airflow_upsert_provider.engine.maintenance.checkpoint_restore import restore_checkpoint
from airflow_upsert_provider.engine.maintenance.checkpoint_retention import apply_retention
from airflow_upsert_provider.engine.maintenance.checkpoint_verify import verify_checkpoint
from airflow_upsert_provider.engine.maintenance.compaction import compact
from airflow_upsert_provider.engine.maintenance.gc import collect_garbage, run_dir_of
from airflow_upsert_provider.engine.store.gc_claims import OWNER_NAME, BlobOwnedElsewhere, run_dir_of_relative
from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.engine.table.shard import Shard
from tests.helpers import make_shard
from tests.maintenance.support import age_compaction, copy_blob, written_shard

GRACE = 600
SHARD = "orders"


@pytest.mark.parametrize("blob", [LocalBlob("/srv/blob"), ObjectBlob("s3://lake/shards")], ids=["local", "s3"])
def test_run_dir_of_a_file_is_its_run_directory_relative_to_the_root(blob):
    path = blob.path(SHARD, "runs", "ts=000000000003", "w-0123456789ab", "_bucket=2", "part-00000.parquet")
    assert run_dir_of(blob, path) == "orders/runs/ts=000000000003/w-0123456789ab"
    since = blob.path(SHARD, "runs", "since=000000000004", "compaction-ab12")
    assert run_dir_of(blob, since) == "orders/runs/since=000000000004/compaction-ab12"


def test_gc_on_s3_deletes_an_old_run_of_more_than_a_page_and_keeps_a_young_one(s3_server, s3_root, sqlite_url, tmp_path):
    """No Spark: a shard with no batch, a writer's run abandoned long ago whose one level holds
    more objects than a listing page, and one a writer is staging now."""
    consensus = open_consensus(sqlite_url)
    try:
        blob = open_blob(s3_root)
        blob.ensure_root()
        make_shard(consensus, blob, tmp_path, shard_id=SHARD)
        abandoned = f"{SHARD}/runs/ts=000000000000/lost-writer-0123456789ab"
        for i in range(1001):
            blob.write_file(blob.path(abandoned, "_bucket=0", f"part-{i:05d}.parquet"), b"x", sync=True)
        s3_server.age(bucket_of(blob), f"{blob.prefix}/{abandoned}/")
        staging = f"{SHARD}/runs/ts=000000000000/stager-0123456789ab/_bucket=0/part-00000.parquet"
        blob.write_file(blob.path(staging), b"staged", sync=True)
        started = len(s3_server.requests())
        steps: dict[str, int] = {}

        report = collect_garbage(consensus, blob, SHARD, grace_seconds=GRACE,
                                 on_step=lambda name: steps.setdefault(name, len(s3_server.requests())))

        assert [(i.path, i.kind, i.files, i.bytes) for i in report.items] == [(abandoned, "run", 1001, 1001)]
        assert (report.files_scanned, report.kept_in_grace) == (1002, 1)
        assert keys(s3_server, blob, f"{SHARD}/runs/") == {staging}
        # The plan listed the shard's directory flat (no delimiter: a request per page of keys,
        # not one per prefix), following the second page of its 1,002 objects.
        planning = s3_server.requests()[started : steps["listed"]]
        listed = [query for method, query in planning if method == "GET" and "list-type=2" in query]
        assert len(listed) == 2 and not any("delimiter=" in query for query in listed), listed
        assert "continuation-token=" in listed[1], listed
    finally:
        consensus.dispose()


# -- a shard of real batches on an S3 root ---------------------------------------------------


@pytest.fixture(scope="module")
def local_shard(spark, tmp_path_factory):
    """(directory, checkpoint id): a shard of 4 batches written by Spark on local disk, a
    checkpoint of them, then a compaction to since 4, so that the checkpoint alone pins the
    four batch runs. Built once; each test copies it."""
    base = tmp_path_factory.mktemp("local-shard")
    consensus = open_consensus(f"sqlite:///{base / 'consensus.db'}")
    try:
        blob = open_blob(str(base / "blob"))
        blob.ensure_root()
        shard = written_shard(spark, consensus, blob, base, batches=4, shard_id=SHARD)
        entry = create_checkpoint(shard)
        compact(spark, shard)
    finally:
        consensus.dispose()
    return base, entry.id


@pytest.fixture
def s3_shard(local_shard, s3_server, s3_root, tmp_path):
    """The module's shard with its files on a fresh S3 root and its consensus in a copy of
    the module's store, every object made three hours old (older than GC's grace)."""
    base, _ = local_shard
    source = sqlite3.connect(base / "consensus.db")
    target = sqlite3.connect(tmp_path / "consensus.db")
    with target:
        source.backup(target)
    source.close()
    target.close()
    consensus = open_consensus(f"sqlite:///{tmp_path / 'consensus.db'}")
    blob = open_blob(s3_root)
    assert isinstance(blob, ObjectBlob)
    blob.ensure_root()
    assert copy_blob(open_blob(str(base / "blob")), blob) > 0
    s3_server.age(bucket_of(blob), "")
    age_compaction(consensus, SHARD)
    yield Shard.open(consensus, blob, SHARD)
    consensus.dispose()


def bucket_of(blob: ObjectBlob) -> str:
    return blob.authority


def keys(s3_server, blob: ObjectBlob, relative: str = "") -> set[str]:
    """The object keys below ``relative`` (directory markers left out), relative to the root."""
    prefix = blob.prefix + "/" + relative if relative else blob.prefix + "/"
    return {k[len(blob.prefix) + 1 :] for k in s3_server.keys(bucket_of(blob), prefix) if not k.endswith("/")}


def recorded_paths(runs) -> set[str]:
    """The relative paths of every file the runs name, as consensus records them."""
    return {f["path"] for run in runs for f in run["files"]}


def test_gc_on_s3_deletes_an_old_unreferenced_run_and_keeps_live_pinned_and_young_ones(s3_server, s3_shard):
    shard, blob = s3_shard, s3_shard.blob
    consensus = shard.consensus
    live = recorded_paths(consensus.snapshot(SHARD).live_runs())
    (entry,) = list_checkpoints(blob, SHARD)
    pinned = {f["path"] for f in read_manifest(blob, SHARD, entry.id)["files"]}
    assert live and pinned and not live & pinned  # the checkpoint alone pins the batch runs
    # A writer whose append lost, long ago: a sibling of a pinned batch run, referenced by nothing.
    first_run = run_dir_of_relative(sorted(pinned)[0])
    lost = first_run.rsplit("/", 1)[0] + "/lost-writer-0123456789ab"
    for key in keys(s3_server, blob, first_run + "/"):
        blob.write_file(blob.path(lost + key[len(first_run):]), blob.read_bytes(blob.path(key)), sync=True)
    s3_server.age(bucket_of(blob), f"{blob.prefix}/{lost}/")
    lost_keys = keys(s3_server, blob, lost + "/")
    # A writer staging the next batch right now: unreferenced, young.
    staging = f"{SHARD}/runs/ts=000000000004/stager-0123456789ab"
    blob.write_file(blob.path(staging, "_bucket=0", "part-00000.parquet"), b"staged", sync=True)
    before = keys(s3_server, blob)
    assert lost_keys and lost_keys <= before and {staging + "/_bucket=0/part-00000.parquet"} <= before

    report = collect_garbage(consensus, blob, SHARD, grace_seconds=GRACE)

    assert [(i.path, i.kind, i.files) for i in report.items] == [(lost, "run", len(lost_keys))]
    after = keys(s3_server, blob)
    assert after == before - lost_keys
    assert live | pinned <= after
    # Spark's checksum and marker files live and die with their run directory.
    referenced_dirs = {run_dir_of_relative(p) for p in live | pinned}
    assert report.kept_referenced == len({k for k in before if run_dir_of_relative(k) in referenced_dirs})
    assert report.kept_in_grace == 1
    # The checkpoint still verifies, object by object.
    assert verify_checkpoint(blob, SHARD, entry.id)["files"]


def test_checkpoint_create_verify_retention_restore_and_fence_on_s3(s3_server, s3_shard, tmp_path):
    shard, blob = s3_shard, s3_shard.blob
    consensus = shard.consensus
    (old,) = list_checkpoints(blob, SHARD)
    pinned_by_old = {f["path"] for f in read_manifest(blob, SHARD, old.id)["files"]}

    new = create_checkpoint(shard)

    assert (new.upper, new.since) == (4, 4)
    assert {f"{SHARD}/checkpoints/{new.id}/MANIFEST.json", f"{SHARD}/checkpoints/{new.id}/COMMIT"} <= keys(s3_server, blob)
    manifest = verify_checkpoint(blob, SHARD, new.id)
    live = recorded_paths(consensus.snapshot(SHARD).live_runs())
    assert {f["path"] for f in manifest["files"]} == live
    assert all(f["sha256"] == blob.checksum(blob.path(f["path"])) for f in manifest["files"])

    # Verify reads every object: one replaced by other bytes of the same size is named.
    damaged = blob.path(manifest["files"][0]["path"])
    original = blob.read_bytes(damaged)
    blob.write_file(damaged, bytes(b ^ 0xFF for b in original), sync=True)
    with pytest.raises(CheckpointCorrupt) as caught:
        verify_checkpoint(blob, SHARD, new.id)
    assert caught.value.details["file"] == damaged
    assert "checksum mismatch" in caught.value.details["records"][0]["reason"]
    blob.write_file(damaged, original, sync=True)
    s3_server.age(bucket_of(blob), "")

    # Retention drops the older checkpoint, objects included; GC then deletes the batch runs
    # only it pinned, and nothing the live state or the kept checkpoint needs.
    catalog = Catalog.load(blob, SHARD, consensus)
    assert [e.id for e in apply_retention(catalog, keep_last=1)] == [old.id]
    assert not keys(s3_server, blob, f"{SHARD}/checkpoints/{old.id}/")
    report = collect_garbage(consensus, blob, SHARD, grace_seconds=GRACE)
    assert {i.kind for i in report.items} == {"run"}
    remaining = keys(s3_server, blob)
    assert not pinned_by_old & remaining
    assert live <= remaining
    verify_checkpoint(blob, SHARD, new.id)

    # Restore into another consensus store sharing the S3 root: the state comes back, the
    # owner marker is written to S3, and the original store's GC is fenced off.
    other = open_consensus(f"sqlite:///{tmp_path / 'other.db'}")
    try:
        record = restore_checkpoint(other, blob, SHARD, new.id)
        assert (record.upper, record.since) == (4, 4)
        restored = other.snapshot(SHARD)
        original = consensus.snapshot(SHARD)
        assert restored.compaction.run == original.compaction.run
        # The bindings from since - 1 on: what a restored shard plans and seeks from.
        assert list(other.bindings(SHARD)) == [b for b in consensus.bindings(SHARD) if b.ts >= record.since - 1]
        assert f"{SHARD}/{OWNER_NAME}" in keys(s3_server, blob)
        before = keys(s3_server, blob)
        with pytest.raises(BlobOwnedElsewhere, match=OWNER_NAME):
            collect_garbage(consensus, blob, SHARD, grace_seconds=GRACE)
        assert keys(s3_server, blob) == before
        # The store the shard was restored into collects it, and keeps all it needs.
        collect_garbage(other, blob, SHARD, grace_seconds=GRACE)
        verify_checkpoint(blob, SHARD, new.id)
    finally:
        other.dispose()
