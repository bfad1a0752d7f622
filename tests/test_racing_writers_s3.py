"""Racing writers and GC on an S3 root, end to end: `upsertctl` writer processes whose local
Spark executors write the runs to the loopback S3 server, one killed or held mid-batch,
against the oracle (the local versions: tests/test_multiprocess.py,
tests/maintenance/test_gc_claims.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from airflow_upsert_provider.engine.blob.files import open_blob
from airflow_upsert_provider.engine.maintenance.gc import collect_garbage
from airflow_upsert_provider.engine.store.gc_claims import claims
from airflow_upsert_provider.engine.store.registry import open_consensus
from tests.conftest import REPO_ROOT, cli_env
from tests.test_invariants_s3 import committed_files, expected, init_shard, landing_of, read_table, run_keys

pytestmark = pytest.mark.slow

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


def test_gc_with_grace_0_against_a_writer_held_after_staging_on_s3_claims_its_run_and_the_writer_restages(
    s3_server, s3_root, sqlite_url, tmp_path
):
    landing = landing_of(tmp_path, segments=2)
    env = cli_env(sqlite_url, s3_root)
    init_shard("s", landing, env, files_per_batch=2)
    release = tmp_path / "release"
    consensus, blob = open_consensus(sqlite_url), open_blob(s3_root)
    try:
        writer = start_writer(env, "s", "slow", FAULT="wait_after_stage", RACE_RELEASE=str(release))
        staged = wait_staged(writer)
        staged_objects = {k for k in run_keys(s3_server, s3_root, "s") if k.startswith(staged + "/")}
        assert staged_objects and all(k.endswith(".parquet") for k in staged_objects)

        # Its objects are older than a grace of 0: GC claims the staging prefix and deletes it.
        report = collect_garbage(consensus, blob, "s", grace_seconds=0)
        assert staged in {i.path for i in report.items}
        assert not {k for k in run_keys(s3_server, s3_root, "s") if k.startswith(staged + "/")}
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
        assert committed_files(consensus, "s") <= run_keys(s3_server, s3_root, "s")
    finally:
        consensus.dispose()
    assert read_table("s", env, str(tmp_path / "table.parquet")) == expected(landing)


def test_three_writers_on_s3_one_sigkilled_mid_write_converge_to_the_oracle_and_gc_leaves_the_committed_runs(
    s3_faults, pg_url, tmp_path
):
    s3_server, s3_root = s3_faults.server, s3_faults.root
    landing = landing_of(tmp_path, segments=3, per_segment=150)  # 6 segments, one per batch
    env = cli_env(pg_url, s3_root)
    init_shard("s", landing, env, files_per_batch=1)
    consensus, blob = open_consensus(pg_url), open_blob(s3_root)
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    try:
        # The victim is killed while the proxy holds one PUT of its run in flight; the held
        # PUT is let through after the kill, so the dead writer's object still lands.
        held = s3_faults.proxy.hold("PUT", r"/runs/ts=\d+/victim-")
        victim = start_writer(env, "s", "victim", FAULT="hang_after_stage")
        assert held.arrived.wait(300), "no PUT of the victim's run reached the proxy"
        # Both racers hold batch 0 before either appends it: one of them loses that race.
        racers = [start_writer(env, "s", f"racer-{n}", RACE_SEED=str(n), RACE_MAX_DELAY="0.3",
                               RACE_BARRIER=f"{barrier}:2") for n in range(2)]
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=60)
        held.release()
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
        assert any("/victim-" in k for k in run_keys(s3_server, s3_root, "s"))
        collect_garbage(consensus, blob, "s", grace_seconds=0)
        assert run_keys(s3_server, s3_root, "s") == committed_files(consensus, "s")
    finally:
        consensus.dispose()
    assert read_table("s", env, str(tmp_path / "table.parquet")) == expected(landing)
