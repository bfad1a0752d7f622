"""Checkpoints and GC on an S3 root whose store fails midway (a fault-injecting proxy on
loopback, :mod:`tests.s3proxy`), without Spark: a request failing beyond the filesystem
layer's bound fails the step retryably (:class:`BlobUnavailable`), never as a corrupt
checkpoint or a bad committed file; nothing half-done is recorded, the shard stays valid and
running the step again finishes it."""

from __future__ import annotations

import hashlib
import io
import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_upsert_provider.engine.blob.files import open_blob
from airflow_upsert_provider.engine.errors import BlobUnavailable
from airflow_upsert_provider.engine.maintenance.checkpoint import (
    copy_name,
    create_checkpoint,
    list_checkpoints,
    verify_checkpoint,
)
from airflow_upsert_provider.engine.maintenance.gc import collect_garbage
from airflow_upsert_provider.engine.store.records import BatchRecord
from airflow_upsert_provider.engine.store.registry import open_consensus
from tests.helpers import make_shard

SHARD = "orders"
GRACE = 600
RUN = f"{SHARD}/runs/ts=000000000000/w-0123456789ab"
PART = f"{RUN}/_bucket=0/part-00000.parquet"


def parquet() -> bytes:
    out = io.BytesIO()
    pq.write_table(pa.table({"id": [1, 2, 3], "amount": [1.5, 2.5, 3.5]}), out)
    return out.getvalue()


@pytest.fixture
def shard(s3_faults, sqlite_url, tmp_path):
    """A shard on the proxy's root with one committed batch: a run of one real Parquet file,
    recorded with its size and SHA-256 as a writer records them."""
    consensus = open_consensus(sqlite_url)
    blob = open_blob(s3_faults.root)
    blob.ensure_root()
    shard = make_shard(consensus, blob, tmp_path, shard_id=SHARD)
    data = parquet()
    blob.write_file(blob.path(PART), data, sync=True)
    run = {"path": RUN, "files": [{"path": PART, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}],
           "rows": 3}
    shard.compare_and_append(0, 1, BatchRecord(0, "w", "tok", run, {}))
    yield shard
    consensus.dispose()


def keys(faults, relative: str) -> set[str]:
    """Object keys below ``relative`` (relative to the root; directory markers left out)."""
    return {k[len("shards/"):] for k in faults.server.keys(faults.bucket, f"shards/{relative}") if not k.endswith("/")}


def test_a_checkpoint_whose_manifest_put_fails_beyond_the_bound_is_not_recorded_and_a_retry_succeeds(s3_faults,
                                                                                                   shard):
    s3_faults.proxy.fail("PUT", r"/MANIFEST\.json$", times=s3_faults.attempts)

    with pytest.raises(BlobUnavailable) as caught:
        create_checkpoint(shard)

    assert caught.value.details["operation"] == "write" and caught.value.details["key"].endswith("/MANIFEST.json")
    assert list_checkpoints(shard.blob, SHARD) == []
    assert keys(s3_faults, f"{SHARD}/checkpoints/") == {f"{SHARD}/checkpoints/{copy_name(1)}"}
    entry = create_checkpoint(shard)
    assert [e.id for e in list_checkpoints(shard.blob, SHARD)] == [entry.id]
    assert [f["path"] for f in verify_checkpoint(shard.blob, SHARD, entry.id)["files"]] == [PART]


def test_a_checkpoint_is_listed_only_once_its_manifest_put_completed(s3_faults, shard):
    """Guards item 3 (an object is durable before the record naming it): while the manifest's
    PUT is held in flight, neither the commit marker nor the catalog names the checkpoint."""
    hold = s3_faults.proxy.hold("PUT", r"/MANIFEST\.json$")
    created = []
    creating = threading.Thread(target=lambda: created.append(create_checkpoint(shard)))
    creating.start()
    try:
        assert hold.arrived.wait(60)
        assert list_checkpoints(shard.blob, SHARD) == []
        assert keys(s3_faults, f"{SHARD}/checkpoints/") == {f"{SHARD}/checkpoints/{copy_name(1)}"}
    finally:
        hold.release()
        creating.join(60)
    (entry,) = created
    assert [e.id for e in list_checkpoints(shard.blob, SHARD)] == [entry.id]
    verify_checkpoint(shard.blob, SHARD, entry.id)


def test_a_run_file_unreadable_for_now_fails_create_and_verify_retryably_not_as_corrupt(s3_faults, shard):
    """On a transient failure a checkpoint names no file bad (exit 4 asks for a human): the
    step is retryable and succeeds once the store answers."""
    s3_faults.proxy.fail("GET", r"part-00000\.parquet$", times=s3_faults.attempts)
    with pytest.raises(BlobUnavailable) as caught:
        create_checkpoint(shard)
    assert caught.value.details["key"] == f"shards/{PART}"
    assert list_checkpoints(shard.blob, SHARD) == []

    entry = create_checkpoint(shard)
    s3_faults.proxy.throttle("GET", r"part-00000\.parquet$", times=s3_faults.attempts)
    # (A ranged GET's error body is not parsed: throttling shows as SERVICE_UNAVAILABLE there.)
    with pytest.raises(BlobUnavailable, match="during GetObject"):
        verify_checkpoint(shard.blob, SHARD, entry.id)
    verify_checkpoint(shard.blob, SHARD, entry.id)


def test_gc_whose_delete_fails_midway_leaves_the_shard_valid_and_the_next_gc_finishes(s3_faults, shard):
    blob = shard.blob
    entry = create_checkpoint(shard)
    # Two runs of writers whose appends lost, long ago: GC deletes them in name order.
    lost = [f"{SHARD}/runs/ts=000000000000/lost-{name}-0123456789ab" for name in ("a", "b")]
    for run in lost:
        for i in range(3):
            blob.write_file(blob.path(run, "_bucket=0", f"part-{i:05d}.parquet"), b"x", sync=True)
        s3_faults.server.age(s3_faults.bucket, f"shards/{run}/")
    needed = keys(s3_faults, f"{SHARD}/runs/") - keys(s3_faults, lost[0]) - keys(s3_faults, lost[1])
    assert PART in needed
    # The batched DELETE of the second run's objects fails on every attempt.
    s3_faults.proxy.fail("POST", query="delete", body="lost-b-", times=s3_faults.attempts)

    with pytest.raises(BlobUnavailable) as caught:
        collect_garbage(shard.consensus, blob, SHARD, grace_seconds=GRACE)

    assert caught.value.details["operation"] == "delete" and caught.value.details["key"] == f"shards/{lost[1]}"
    assert not keys(s3_faults, lost[0] + "/") and len(keys(s3_faults, lost[1] + "/")) == 3
    assert needed <= keys(s3_faults, f"{SHARD}/runs/")
    verify_checkpoint(blob, SHARD, entry.id)

    report = collect_garbage(shard.consensus, blob, SHARD, grace_seconds=GRACE)

    assert [(i.path, i.kind, i.files) for i in report.items] == [(lost[1], "run", 3)]
    assert keys(s3_faults, f"{SHARD}/runs/") == needed
    verify_checkpoint(blob, SHARD, entry.id)


def test_an_unreadable_catalog_or_owner_marker_for_now_is_retryable_not_an_integrity_error(s3_faults, shard):
    """A catalog or an ``OWNER.json`` the store fails to serve is not corrupt (exit 4 pages
    someone): listing checkpoints and GC fail retryably, and succeed once the store answers."""
    create_checkpoint(shard)
    s3_faults.proxy.fail("HEAD", r"/catalog-v[0-9]+\.json$", times=s3_faults.attempts)
    with pytest.raises(BlobUnavailable) as caught:
        list_checkpoints(shard.blob, SHARD)  # the blob copy, as a restore into an empty store reads it
    assert caught.value.details["key"] == f"shards/{SHARD}/checkpoints/{copy_name(2)}"
    assert len(list_checkpoints(shard.blob, SHARD)) == 1

    s3_faults.proxy.fail("HEAD", r"/OWNER\.json$", times=s3_faults.attempts)
    with pytest.raises(BlobUnavailable) as caught:
        collect_garbage(shard.consensus, shard.blob, SHARD, grace_seconds=GRACE)
    assert caught.value.details["key"] == f"shards/{SHARD}/OWNER.json"
    collect_garbage(shard.consensus, shard.blob, SHARD, grace_seconds=GRACE)


def test_retention_whose_delete_fails_drops_the_checkpoint_and_leaves_its_objects_to_gc(s3_faults, shard):
    old = create_checkpoint(shard)
    s3_faults.server.age(s3_faults.bucket, f"shards/{SHARD}/checkpoints/{old.id}/")
    s3_faults.proxy.fail("POST", query="delete", body=old.id, times=s3_faults.attempts)

    new = create_checkpoint(shard, keep_last=1)

    assert [e.id for e in list_checkpoints(shard.blob, SHARD)] == [new.id]
    assert keys(s3_faults, f"{SHARD}/checkpoints/{old.id}/")  # left behind by the failed delete
    report = collect_garbage(shard.consensus, shard.blob, SHARD, grace_seconds=GRACE)
    assert [(i.path, i.kind) for i in report.items] == [(f"{SHARD}/checkpoints/{old.id}", "unlisted_checkpoint")]
    assert not keys(s3_faults, f"{SHARD}/checkpoints/{old.id}/")
    verify_checkpoint(shard.blob, SHARD, new.id)
