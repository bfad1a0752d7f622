"""Moving a shard from local disk to object storage, as docs/storage.md tells a user to: stop
the stream, take a checkpoint (it verifies every file), copy the shard's files to the bucket
with any copy tool, restore the checkpoint from the bucket into the new store (it validates
every object there), seek and resume."""

from __future__ import annotations

import json
import os

import pyarrow.fs as pafs
import pytest

from airflow_upsert_provider.engine.blob.filesystems import filesystem_for
from airflow_upsert_provider.engine.store.registry import open_consensus
from tests.conftest import cli_env
from tests.test_invariants_s3 import expected, init_shard, landing_of, ok, read_table, run_keys
from tests.test_run_io_s3 import upsertctl
from tests.test_runs import write_segment

pytestmark = pytest.mark.slow


def test_a_shard_moves_from_local_disk_to_s3_through_a_checkpoint_and_resumes_there(s3_server, s3_root, tmp_path):
    landing = landing_of(tmp_path, segments=2)
    local_root = str(tmp_path / "blob")
    local = cli_env(f"sqlite:///{tmp_path / 'local.db'}", local_root)
    init_shard("s", landing, local, files_per_batch=2)
    ok("run-batch", "s", "--until-caught-up", env=local)
    ok("stream", "stop", "s", "--reason", "moving to S3", env=local)
    created = json.loads(ok("checkpoint", "create", "s", "--json", env=local))["checkpoint"]

    # The copy: every file of the shard, same relative paths (here pyarrow's copy_files; the
    # docs show `aws s3 sync`).
    bucket, bucket_path = filesystem_for(s3_root)
    pafs.copy_files(os.path.join(local_root, "s"), f"{bucket_path}/s",
                    source_filesystem=pafs.LocalFileSystem(), destination_filesystem=bucket)

    # A copy that lost an object is refused by the restore, naming it; nothing is restored.
    moved = cli_env(f"sqlite:///{tmp_path / 'moved.db'}", s3_root)
    # (Spark's writer on local disk leaves marker files beside the data; a data file matters.)
    missing = sorted(k for k in run_keys(s3_server, s3_root, "s") if k.endswith(".parquet"))[0]
    content = bucket.open_input_stream(f"{bucket_path}/{missing}").readall()
    bucket.delete_file(f"{bucket_path}/{missing}")
    refused = upsertctl("checkpoint", "restore", "s", created["id"], "--json", env=moved)
    assert refused.returncode == 4 and missing in refused.stdout + refused.stderr, refused.stderr[-2000:]
    store = open_consensus(f"sqlite:///{tmp_path / 'moved.db'}")
    try:
        assert store.list_shards() == []
    finally:
        store.dispose()
    with bucket.open_output_stream(f"{bucket_path}/{missing}") as out:
        out.write(content)

    restored = json.loads(ok("checkpoint", "restore", "s", created["id"], "--json", env=moved))
    assert (restored["upper"], restored["since"]) == (2, 0)
    ok("recover", "seek", "s", env=moved)
    ok("recover", "resume", "s", env=moved)
    assert read_table("s", moved) == read_table("s", local)

    # New data lands after the move: the shard on S3 takes it, its new runs are in the bucket.
    for p, partition in enumerate(("p0", "p1")):
        write_segment(landing, partition, 2, [{"id": p * 1000 + i, "v": "after", "ts": 9, "deleted": i % 5 == 0}
                                             for i in range(0, 300, 3)])
    ok("run-batch", "s", "--until-caught-up", env=moved)
    assert read_table("s", moved) == expected(landing)
    store = open_consensus(f"sqlite:///{tmp_path / 'moved.db'}")
    try:
        new_run = store.get_batch("s", 2).run
    finally:
        store.dispose()
    assert {f["path"] for f in new_run["files"]} <= run_keys(s3_server, s3_root, "s")
    assert not os.path.exists(os.path.join(local_root, new_run["path"]))
