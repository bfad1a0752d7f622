"""Moving a shard from local disk to object storage, as docs/storage.md tells a user to: stop
the stream, take a checkpoint (it verifies every file), copy the shard's files to the bucket
with any copy tool, restore the checkpoint from the bucket into the new store (it validates
every object there), seek and resume. `upsertctl` runs in this process, on the session's Spark
whose executors reach the S3 server (``s3_executors``)."""

from __future__ import annotations

import json
import os

import pyarrow.fs as pafs
import pytest

from airflow_upsert_provider.engine.blob.filesystems import filesystem_for
from airflow_upsert_provider.engine.store.registry import open_consensus
from tests.helpers import Upsertctl
from tests.test_invariants_s3 import expected, init_args, landing_of, run_keys, table_of
from tests.test_runs import write_segment

pytestmark = pytest.mark.slow


def test_a_shard_moves_from_local_disk_to_s3_through_a_checkpoint_and_resumes_there(
    s3_server, s3_root, s3_executors, tmp_path, capsys
):
    landing = landing_of(tmp_path, segments=2)
    local_root = str(tmp_path / "blob")
    local = Upsertctl(capsys, f"sqlite:///{tmp_path / 'local.db'}", local_root)
    local.ok(*init_args("s", landing, files_per_batch=2))
    local.ok("run-batch", "s", "--until-caught-up")
    local.ok("stream", "stop", "s", "--reason", "moving to S3")
    created = json.loads(local.ok("checkpoint", "create", "s", "--json"))["checkpoint"]

    # The copy: every file of the shard, same relative paths (here pyarrow's copy_files; the
    # docs show `aws s3 sync`).
    bucket, bucket_path = filesystem_for(s3_root)
    pafs.copy_files(os.path.join(local_root, "s"), f"{bucket_path}/s",
                    source_filesystem=pafs.LocalFileSystem(), destination_filesystem=bucket)

    # A copy that lost an object is refused by the restore, naming it; nothing is restored.
    moved = Upsertctl(capsys, f"sqlite:///{tmp_path / 'moved.db'}", s3_root)
    # (Spark's writer on local disk leaves marker files beside the data; a data file matters.)
    missing = sorted(k for k in run_keys(s3_server, s3_root, "s") if k.endswith(".parquet"))[0]
    content = bucket.open_input_stream(f"{bucket_path}/{missing}").readall()
    bucket.delete_file(f"{bucket_path}/{missing}")
    code, out, err = moved("checkpoint", "restore", "s", created["id"], "--json")
    assert code == 4 and missing in out + err, err[-2000:]
    store = open_consensus(f"sqlite:///{tmp_path / 'moved.db'}")
    try:
        assert store.list_shards() == []
    finally:
        store.dispose()
    with bucket.open_output_stream(f"{bucket_path}/{missing}") as out:
        out.write(content)

    restored = json.loads(moved.ok("checkpoint", "restore", "s", created["id"], "--json"))
    assert (restored["upper"], restored["since"]) == (2, 0)
    moved.ok("recover", "seek", "s")
    moved.ok("recover", "resume", "s")
    assert table_of(moved.ok("read", "s")) == table_of(local.ok("read", "s"))

    # New data lands after the move: the shard on S3 takes it, its new runs are in the bucket.
    for p, partition in enumerate(("p0", "p1")):
        write_segment(landing, partition, 2, [{"id": p * 1000 + i, "v": "after", "ts": 9, "deleted": i % 5 == 0}
                                             for i in range(0, 300, 3)])
    moved.ok("run-batch", "s", "--until-caught-up")
    assert table_of(moved.ok("read", "s")) == expected(landing)
    store = open_consensus(f"sqlite:///{tmp_path / 'moved.db'}")
    try:
        new_run = store.get_batch("s", 2).run
    finally:
        store.dispose()
    assert {f["path"] for f in new_run["files"]} <= run_keys(s3_server, s3_root, "s")
    assert not os.path.exists(os.path.join(local_root, new_run["path"]))
    store = open_consensus(f"sqlite:///{tmp_path / 'local.db'}")
    try:
        assert store.get_shard("s").upper == 2  # the local store stayed where the move left it
    finally:
        store.dispose()
