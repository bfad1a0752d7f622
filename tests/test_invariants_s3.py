"""The shard's invariants on an S3 root, end to end: `upsertctl` in this process, on the
session's Spark whose executors write the runs to the loopback S3 server (``s3_executors``;
through the fault proxy where a test needs one), against the oracle. A writer held mid-write
is a process of its own."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from airflow_upsert_provider.engine.blob.files import open_blob
from airflow_upsert_provider.engine.store.registry import open_consensus
from tests.conftest import REPO_ROOT, cli_env
from tests.helpers import Upsertctl
from tests.oracle import oracle_table, table_from_rows
from tests.test_run_io_s3 import ok
from tests.test_runs import write_segment

pytestmark = pytest.mark.slow

SCHEMA = "id BIGINT, v STRING, ts BIGINT, deleted BOOLEAN"
RUN_FILE = r"/runs/ts=.*\.parquet$"


def upsertctl_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "airflow_upsert_provider.cli", *args]


def landing_of(tmp_path, segments: int = 2, per_segment: int = 200) -> str:
    """A landing directory of two partitions, ``segments`` segments each, keys overlapping
    across segments (updates and deletes)."""
    landing = str(tmp_path / "landing")
    for n in range(segments):
        for p, partition in enumerate(("p0", "p1")):
            base = n * per_segment // 2 + p * 1000
            write_segment(landing, partition, n, [
                {"id": base + i, "v": f"{partition}-{n}", "ts": n, "deleted": (base + i) % 7 == 0 and n > 0}
                for i in range(per_segment)])
    return landing


def expected(landing: str):
    return oracle_table(landing, order_by="ts", delete_marker="deleted")


def init_args(shard_id: str, landing: str, files_per_batch: int = 2) -> tuple[str, ...]:
    """``upsertctl init`` of a shard over ``landing`` (:func:`landing_of`)."""
    return ("init", shard_id, "--source", f"dir:{landing}", "--key", "id", "--order-by", "ts", "--delete-marker",
            "deleted", "--buckets", "2", "--max-files-per-batch", str(files_per_batch), "--schema", SCHEMA)


def init_shard(shard_id: str, landing: str, env: dict[str, str], files_per_batch: int = 2) -> None:
    """:func:`init_args` in a process of its own."""
    ok(*init_args(shard_id, landing, files_per_batch), env=env)


def table_of(read_output: str):
    """The table ``upsertctl read`` printed."""
    return table_from_rows(json.loads(line) for line in read_output.splitlines())


def read_table(shard_id: str, env: dict[str, str], out: str):
    """The shard's table, read by ``upsertctl read --format parquet`` in a process of its own:
    the Arrow reader, no JVM (Spark's reads of S3 runs: the in-process tests here and in
    tests/test_run_io_s3.py)."""
    import pyarrow.parquet as pq

    ok("read", shard_id, "--format", "parquet", "--out", out, env=env)
    return table_from_rows(pq.read_table(out).to_pylist())


def run_keys(s3_server, root: str, shard_id: str) -> set[str]:
    """The objects below the shard's runs/ prefix as the S3 server lists them (directory
    markers left out), relative to the root."""
    bucket, prefix = root[len("s3://"):].split("/", 1)
    return {key[len(prefix) + 1:] for key in s3_server.keys(bucket, f"{prefix}/{shard_id}/runs/")
            if not key.endswith("/")}


def committed_files(consensus, shard_id: str) -> set[str]:
    return {f["path"] for b in consensus.batches(shard_id) for f in b.run["files"]}


# -- data durable before the commit that names it --------------------------------------


def test_a_batch_commits_only_after_every_executor_put_completed_and_a_failing_put_fails_it_retryably(
    s3_faults, s3_executors, sqlite_url, tmp_path, capsys
):
    landing = landing_of(tmp_path, segments=2)
    upsertctl = Upsertctl(capsys, sqlite_url, s3_faults.root)
    upsertctl.ok(*init_args("s", landing, files_per_batch=2))
    consensus = open_consensus(sqlite_url)
    try:
        # One executor PUT of the first batch's run is held: the batch is not committed while
        # it is, and is once it completes. (The writer is a process of its own: this one waits
        # for the PUT to arrive while the writer holds it.)
        held = s3_faults.proxy.hold("PUT", RUN_FILE)
        writer = subprocess.Popen(upsertctl_command("run-batch", "s", "--json"), cwd=REPO_ROOT,
                                  env=cli_env(sqlite_url, s3_faults.root),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert held.arrived.wait(300), "no run file PUT reached the proxy"
            assert consensus.get_batch("s", 0) is None
            assert consensus.get_shard("s").upper == 0
        finally:
            held.release()
        out, err = writer.communicate(timeout=600)
        assert writer.returncode == 0, err[-3000:]
        batch = consensus.get_batch("s", 0)
        assert batch is not None and batch.run["rows"] > 0
        stored = set(s3_faults.server.keys(s3_faults.bucket, ""))
        assert {f"shards/{f['path']}" for f in batch.run["files"]} <= stored

        # Every PUT of a run file fails beyond the filesystem layer's bound: the batch fails
        # retryably (exit 2, BlobUnavailable) and nothing is committed.
        s3_faults.proxy.fail("PUT", RUN_FILE, times=1000, status=503)
        code, out, err = upsertctl("run-batch", "s", "--json")
        assert code == 2, err[-3000:]
        error = json.loads(out)
        assert (error["error"], error["retryable"], error["operation"]) == ("BlobUnavailable", True, "write")
        assert error["bucket"] == s3_faults.bucket and "/runs/ts=" in error["key"]
        assert "SERVICE_UNAVAILABLE" in error["reason"] or "503" in error["reason"], error
        assert consensus.get_batch("s", 1) is None
        s3_faults.proxy.clear()
        # The retry converges.
        upsertctl.ok("run-batch", "s", "--until-caught-up")
        assert consensus.get_batch("s", 1) is not None and consensus.get_batch("s", 2) is None
    finally:
        consensus.dispose()
    assert table_of(upsertctl.ok("read", "s")) == expected(landing)


# -- checkpoints through upsertctl on an S3 root ---------------------------------------------


def test_checkpoint_of_executor_written_batches_on_s3_restores_into_a_new_store_and_the_shard_resumes(
    s3_server, s3_root, s3_executors, tmp_path, capsys
):
    landing = landing_of(tmp_path, segments=2)
    upsertctl = Upsertctl(capsys, f"sqlite:///{tmp_path / 'first.db'}", s3_root)
    upsertctl.ok(*init_args("s", landing, files_per_batch=2))
    upsertctl.ok("run-batch", "s", "--until-caught-up")
    created = json.loads(upsertctl.ok("checkpoint", "create", "s", "--json"))["checkpoint"]
    assert (created["upper"], created["since"]) == (2, 0)
    verified = json.loads(upsertctl.ok("checkpoint", "verify", "s", created["id"], "--json"))["verified"]
    assert verified == [{"id": created["id"], "files": created["files"], "ok": True}]
    # The checkpoint lists exactly the objects the executors wrote for the two batches.
    first = open_consensus(f"sqlite:///{tmp_path / 'first.db'}")
    try:
        written = committed_files(first, "s")
    finally:
        first.dispose()
    blob = open_blob(s3_root)
    manifest = json.loads(blob.read_bytes(blob.path("s", "checkpoints", created["id"], "MANIFEST.json")))
    assert {f["path"] for f in manifest["files"]} == written and written <= run_keys(s3_server, s3_root, "s")

    # One object of the checkpoint replaced by other bytes of its size: a plain verify checks
    # sizes only and passes; a full verify reads every byte and names it (exit 4).
    damaged = blob.path(sorted(written)[0])
    original = blob.read_bytes(damaged)
    blob.write_file(damaged, bytes(b ^ 0xFF for b in original), sync=True)
    code, out, err = upsertctl("checkpoint", "verify", "s", created["id"], "--json")
    assert code == 0, out[-2000:] + err[-2000:]
    code, out, err = upsertctl("checkpoint", "verify", "s", created["id"], "--full", "--json")
    assert code == 4 and sorted(written)[0] in out, out[-2000:] + err[-2000:]
    blob.write_file(damaged, original, sync=True)

    # More data lands; the shard is restored into a new consensus store and resumes there.
    for p, partition in enumerate(("p0", "p1")):
        write_segment(landing, partition, 2, [{"id": p * 1000 + i, "v": "late", "ts": 9, "deleted": i % 5 == 0}
                                             for i in range(0, 300, 3)])
    other = Upsertctl(capsys, f"sqlite:///{tmp_path / 'restored.db'}", s3_root)
    restored = json.loads(other.ok("checkpoint", "restore", "s", created["id"], "--json"))
    assert (restored["upper"], restored["since"]) == (2, 0)
    other.ok("recover", "seek", "s")
    other.ok("recover", "resume", "s")
    other.ok("run-batch", "s", "--until-caught-up")
    store = open_consensus(f"sqlite:///{tmp_path / 'restored.db'}")
    try:
        assert store.get_shard("s").upper == 3
        assert store.get_batch("s", 2).run["rows"] > 0
    finally:
        store.dispose()
    # The first store never saw the batch the restored shard wrote.
    first = open_consensus(f"sqlite:///{tmp_path / 'first.db'}")
    try:
        assert first.get_shard("s").upper == 2
    finally:
        first.dispose()
    assert table_of(other.ok("read", "s")) == expected(landing)
