"""The shard's invariants on an S3 root, end to end: `upsertctl` processes whose local Spark
executors write the runs to the loopback S3 server (through the fault proxy where a test
needs one), against the oracle."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pyarrow.fs
import pytest

from airflow_upsert_provider.engine.blob.files import open_blob
from airflow_upsert_provider.engine.blob.filesystems import filesystem_for
from airflow_upsert_provider.engine.maintenance.gc import collect_garbage
from airflow_upsert_provider.engine.store.gc_claims import claims
from airflow_upsert_provider.engine.store.registry import open_consensus
from tests.conftest import REPO_ROOT, cli_env
from tests.oracle import oracle_table, table_from_rows
from tests.pgserver import wait_for
from tests.test_runs import write_segment

pytestmark = pytest.mark.slow

SCHEMA = "id BIGINT, v STRING, ts BIGINT, deleted BOOLEAN"
RUN_FILE = r"/runs/ts=.*\.parquet$"


def upsertctl_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "airflow_upsert_provider.cli", *args]


def upsertctl(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(upsertctl_command(*args), env=env, capture_output=True, text=True, timeout=600,
                          cwd=REPO_ROOT)


def ok(*args: str, env: dict[str, str]) -> str:
    done = upsertctl(*args, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


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


def init_shard(shard_id: str, landing: str, env: dict[str, str], files_per_batch: int = 2) -> None:
    ok("init", shard_id, "--source", f"dir:{landing}", "--key", "id", "--order-by", "ts", "--delete-marker",
       "deleted", "--buckets", "2", "--max-files-per-batch", str(files_per_batch), "--schema", SCHEMA, env=env)


def read_table(shard_id: str, env: dict[str, str]):
    return table_from_rows(json.loads(line) for line in ok("read", shard_id, env=env).splitlines())


# -- item: data durable before the commit that names it --------------------------------------


def test_a_batch_commits_only_after_every_executor_put_completed_and_a_failing_put_fails_it_retryably(
    s3_faults, sqlite_url, tmp_path
):
    landing = landing_of(tmp_path, segments=2)
    env = cli_env(sqlite_url, s3_faults.root)
    init_shard("s", landing, env, files_per_batch=2)
    consensus = open_consensus(sqlite_url)
    try:
        # One executor PUT of the first batch's run is held: the batch is not committed while
        # it is, and is once it completes.
        held = s3_faults.proxy.hold("PUT", RUN_FILE)
        writer = subprocess.Popen(upsertctl_command("run-batch", "s", "--json"), env=env, cwd=REPO_ROOT,
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
        failed = upsertctl("run-batch", "s", "--json", env=env)
        assert failed.returncode == 2, failed.stderr[-3000:]
        error = json.loads(failed.stdout)
        assert (error["error"], error["retryable"], error["operation"]) == ("BlobUnavailable", True, "write")
        assert error["bucket"] == s3_faults.bucket and "/runs/ts=" in error["key"]
        assert "SERVICE_UNAVAILABLE" in error["reason"] or "503" in error["reason"], error
        assert consensus.get_batch("s", 1) is None
        s3_faults.proxy.clear()
        # The retry converges.
        ok("run-batch", "s", "--until-caught-up", env=env)
        assert consensus.get_batch("s", 1) is not None and consensus.get_batch("s", 2) is None
    finally:
        consensus.dispose()
    assert read_table("s", env) == expected(landing)


# -- racing writers and GC on an S3 root ------------------------------------------------------

RUNNER = os.path.join(os.path.dirname(__file__), "racing_writer.py")


def start_writer(env: dict[str, str], shard_id: str, writer_id: str, **extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, RUNNER, "run-batch", shard_id, "--until-caught-up", "--json", "--writer-id", writer_id],
        env={**env, **extra}, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def wait_staged(proc: subprocess.Popen) -> str:
    """The run path the writer printed once it staged its batch (racing_writer's STAGED line)."""
    line = proc.stderr.readline()
    while line and not line.startswith("STAGED "):
        line = proc.stderr.readline()
    assert line.startswith("STAGED "), proc.stderr.read()[-3000:]
    return line.split(" ", 1)[1].strip()


def run_keys(blob, shard_id: str) -> set[str]:
    """The objects below the shard's runs/ prefix (directory markers left out), relative to the root."""
    filesystem, inner = filesystem_for(blob.root)
    prefix = f"{inner.rstrip('/')}/{shard_id}/runs"
    selector = pyarrow.fs.FileSelector(prefix, recursive=True, allow_not_found=True)
    return {info.path[len(inner.rstrip('/')) + 1:] for info in filesystem.get_file_info(selector)
            if info.type == pyarrow.fs.FileType.File}


def committed_files(consensus, shard_id: str) -> set[str]:
    return {f["path"] for b in consensus.batches(shard_id) for f in b.run["files"]}


def test_gc_with_grace_0_against_a_writer_held_after_staging_on_s3_claims_its_run_and_the_writer_restages(
    s3_root, sqlite_url, tmp_path
):
    landing = landing_of(tmp_path, segments=2)
    env = cli_env(sqlite_url, s3_root)
    init_shard("s", landing, env, files_per_batch=2)
    release = tmp_path / "release"
    consensus, blob = open_consensus(sqlite_url), open_blob(s3_root)
    try:
        writer = start_writer(env, "s", "slow", FAULT="wait_after_stage", RACE_RELEASE=str(release))
        staged = wait_staged(writer)
        staged_objects = {k for k in run_keys(blob, "s") if k.startswith(staged + "/")}
        assert staged_objects and all(k.endswith(".parquet") for k in staged_objects)

        # Its objects are older than a grace of 0: GC claims the staging prefix and deletes it.
        report = collect_garbage(consensus, blob, "s", grace_seconds=0)
        assert staged in {i.path for i in report.items}
        assert not {k for k in run_keys(blob, "s") if k.startswith(staged + "/")}
        assert claims(consensus, "s") == [staged]

        release.touch()
        out, err = writer.communicate(timeout=600)
        assert writer.returncode == 0, err[-3000:]
        # The held commit was refused; the writer restaged batch 0 and went on.
        assert [(b["ts"], b["outcome"]) for b in json.loads(out)["batches"]][:2] == [(0, "committed"), (1, "committed")]
        first = consensus.get_batch("s", 0)
        assert first.run["path"] != staged and first.run["rows"] > 0
        assert consensus.get_shard("s").upper == 2
        # Nothing committed is lost: every file a batch names is in the bucket.
        assert committed_files(consensus, "s") <= run_keys(blob, "s")
    finally:
        consensus.dispose()
    assert read_table("s", env) == expected(landing)


def test_three_writers_on_s3_one_sigkilled_mid_write_converge_to_the_oracle_and_gc_leaves_the_committed_runs(
    s3_root, pg_url, tmp_path
):
    landing = landing_of(tmp_path, segments=3, per_segment=150)  # 6 segments, one per batch
    env = cli_env(pg_url, s3_root)
    init_shard("s", landing, env, files_per_batch=1)
    consensus, blob = open_consensus(pg_url), open_blob(s3_root)
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    try:
        # The victim never reaches its compare-and-set; it is killed once its executor's
        # first run object is in the bucket, whether or not the rest of its run is.
        victim = start_writer(env, "s", "victim", FAULT="hang_after_stage")
        assert wait_for(lambda: any("/victim-" in k for k in run_keys(blob, "s")), timeout=300, interval=0.05)
        # Both racers hold batch 0 before either appends it: one of them loses that race.
        racers = [start_writer(env, "s", f"racer-{n}", RACE_SEED=str(n), RACE_MAX_DELAY="0.3",
                               RACE_BARRIER=f"{barrier}:2") for n in range(2)]
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=60)
        assert victim.returncode == -signal.SIGKILL
        reports = []
        for proc in racers:
            out, err = proc.communicate(timeout=900)
            assert proc.returncode == 0, err[-3000:]
            reports.append(json.loads(out))

        batches = consensus.batches("s")
        assert consensus.get_shard("s").upper == 6
        assert [b.ts for b in batches] == list(range(6))  # each ts once
        for ts in range(1, 6):  # contiguous bindings
            prev, cur = consensus.get_binding("s", ts - 1), consensus.get_binding("s", ts)
            for partition, rng in cur.ranges.items():
                assert rng["from"] == prev.ranges.get(partition, {"to": 0})["to"]
        committed = [(b["ts"], r["writer_id"]) for r in reports for b in r["batches"] if b["outcome"] == "committed"]
        assert sorted(committed) == [(b.ts, b.writer_id) for b in batches]
        assert not any(b.writer_id == "victim" for b in batches)
        lost_batch_0 = [r["writer_id"] for r in reports for b in r["batches"]
                        if (b["ts"], b["outcome"]) == (0, "already_persisted")]
        assert len(lost_batch_0) == 1 and batches[0].writer_id not in lost_batch_0

        # GC with grace 0: what is left under runs/ is exactly what the committed batches name.
        assert any("/victim-" in k for k in run_keys(blob, "s"))
        collect_garbage(consensus, blob, "s", grace_seconds=0)
        assert run_keys(blob, "s") == committed_files(consensus, "s")
    finally:
        consensus.dispose()
    assert read_table("s", env) == expected(landing)


# -- checkpoints through upsertctl on an S3 root ---------------------------------------------


def test_checkpoint_of_executor_written_batches_on_s3_restores_into_a_new_store_and_the_shard_resumes(
    s3_root, tmp_path
):
    landing = landing_of(tmp_path, segments=2)
    env = cli_env(f"sqlite:///{tmp_path / 'first.db'}", s3_root)
    init_shard("s", landing, env, files_per_batch=2)
    ok("run-batch", "s", "--until-caught-up", env=env)
    created = json.loads(ok("checkpoint", "create", "s", "--json", env=env))["checkpoint"]
    assert (created["upper"], created["since"]) == (2, 0)
    verified = json.loads(ok("checkpoint", "verify", "s", created["id"], "--json", env=env))["verified"]
    assert verified == [{"id": created["id"], "files": created["files"], "ok": True}]
    # The checkpoint lists exactly the objects the executors wrote for the two batches.
    first = open_consensus(f"sqlite:///{tmp_path / 'first.db'}")
    try:
        written = committed_files(first, "s")
    finally:
        first.dispose()
    blob = open_blob(s3_root)
    manifest = json.loads(blob.read_bytes(blob.path("s", "checkpoints", created["id"], "MANIFEST.json")))
    assert {f["path"] for f in manifest["files"]} == written and written <= run_keys(blob, "s")

    # One object of the checkpoint replaced by other bytes of its size: verify names it (exit 4).
    damaged = blob.path(sorted(written)[0])
    original = blob.read_bytes(damaged)
    blob.write_file(damaged, bytes(b ^ 0xFF for b in original), sync=True)
    bad = upsertctl("checkpoint", "verify", "s", created["id"], "--json", env=env)
    assert bad.returncode == 4 and sorted(written)[0] in bad.stdout, bad.stdout[-2000:] + bad.stderr[-2000:]
    blob.write_file(damaged, original, sync=True)

    # More data lands; the shard is restored into a new consensus store and resumes there.
    for p, partition in enumerate(("p0", "p1")):
        write_segment(landing, partition, 2, [{"id": p * 1000 + i, "v": "late", "ts": 9, "deleted": i % 5 == 0}
                                             for i in range(0, 300, 3)])
    other = cli_env(f"sqlite:///{tmp_path / 'restored.db'}", s3_root)
    restored = json.loads(ok("checkpoint", "restore", "s", created["id"], "--json", env=other))
    assert (restored["upper"], restored["since"]) == (2, 0)
    ok("recover", "seek", "s", env=other)
    ok("recover", "resume", "s", env=other)
    ok("run-batch", "s", "--until-caught-up", env=other)
    store = open_consensus(f"sqlite:///{tmp_path / 'restored.db'}")
    try:
        assert store.get_shard("s").upper == 3
        assert store.get_batch("s", 2).run["rows"] > 0
    finally:
        store.dispose()
    assert read_table("s", other) == expected(landing)
