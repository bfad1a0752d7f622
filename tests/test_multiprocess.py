"""Writers as separate OS processes: racing on one shard, crashing, killed mid-batch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from airflow_upsert_provider.engine.blob.files import open_blob
from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.sample_data import SampleSpec
from tests.conftest import cli_env
from tests.helpers import make_shard, table
from tests.oracle import oracle_table
from tests.pgserver import wait_for

pytestmark = pytest.mark.slow

RUNNER = os.path.join(os.path.dirname(__file__), "racing_writer.py")


def start_writer(env, shard_id, writer_id, **extra):
    return subprocess.Popen(
        [sys.executable, RUNNER, "run-batch", shard_id, "--until-caught-up", "--json", "--writer-id", writer_id],
        env={**env, **extra},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def committed_dirs(shard):
    return {shard.blob.path(b.run["path"]) for b in shard.batches()}


def staged_dirs(shard):
    runs = shard.blob.path(shard.shard_id, "runs")
    if not os.path.isdir(runs):
        return set()
    return {os.path.join(runs, ts, d) for ts in os.listdir(runs) for d in os.listdir(os.path.join(runs, ts))}


def assert_valid_and_equal_to_oracle(shard, spark, expected_upper):
    state = shard.state()
    assert state.upper == expected_upper
    assert [b.ts for b in shard.batches()] == list(range(expected_upper))  # each ts once
    assert shard.binding(expected_upper) is None and shard.binding(expected_upper - 1) is not None
    for ts in range(1, expected_upper):  # contiguous bindings
        prev, cur = shard.binding(ts - 1), shard.binding(ts)
        for partition, rng in cur.ranges.items():
            assert rng["from"] == prev.ranges.get(partition, {"to": 0})["to"]
    assert table(shard) == oracle_table(shard.source.root)


def test_three_racing_writer_processes_converge(spark, tmp_path, pg_url):
    """On PostgreSQL; racing writer processes on SQLite (its file lock across processes):
    tests/connect/test_connect_multiprocess.py, whose writers are processes too."""
    url = pg_url
    consensus, blob = open_consensus(url), open_blob(str(tmp_path / "blob"))
    # 8 batches: every writer races for every one of them; more batches repeated the same races
    # (16 cost twice the time for the same races). One partition: the sample's coarse clock
    # ties records of one key across partitions, and such a tie is broken by batch ts across
    # batches (docs/overlap.md), which the batching-blind oracle does not model.
    spec = SampleSpec(records=1600, keys=400, partitions=1, segments_per_partition=8, seed=11)
    shard = make_shard(consensus, blob, tmp_path, spec=spec, max_files_per_batch=1)
    env = cli_env(url, blob.root)
    # All three hold batch 0 before any appends it, so two of them lose a race whatever the
    # machine's speed: the converged count below counts races, not timing luck. (Three racers
    # make every race a fourth did, for a JVM less.)
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    procs = [
        start_writer(env, shard.shard_id, f"racer-{n}", RACE_SEED=str(n), RACE_MAX_DELAY="0.3",
                     RACE_BARRIER=f"{barrier}:3")
        for n in range(3)
    ]
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-3000:]
        reports.append(json.loads(out))

    assert_valid_and_equal_to_oracle(shard, spark, 8)
    # No writer ended with its progress below the upper.
    assert [r["upper"] for r in reports] == [8] * 3
    # Every ts committed exactly once, by the writer the shard records.
    committed = [(b["ts"], r["writer_id"]) for r in reports for b in r["batches"] if b["outcome"] == "committed"]
    assert sorted(committed) == sorted((b.ts, b.writer_id) for b in shard.batches())
    lost_batch_0 = [r["writer_id"] for r in reports for b in r["batches"]
                    if (b["ts"], b["outcome"]) == (0, "already_persisted")]
    assert len(lost_batch_0) == 2 and shard.batches()[0].writer_id not in lost_batch_0
    # Losers deleted their provably-lost files; what is left is exactly what is referenced.
    assert staged_dirs(shard) == committed_dirs(shard)


@pytest.fixture
def fault_shard(tmp_path, pg_url):
    consensus, blob = open_consensus(pg_url), open_blob(str(tmp_path / "blob"))
    spec = SampleSpec(records=2000, keys=500, partitions=2, segments_per_partition=3, seed=13)
    shard = make_shard(consensus, blob, tmp_path, spec=spec, max_files_per_batch=2)
    return shard, cli_env(pg_url, blob.root)


def finish_with_healthy_writer(shard, env):
    proc = start_writer(env, shard.shard_id, "healthy")
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out)


def test_a_crash_and_sigkills_before_compare_and_set_commit_nothing_and_a_healthy_writer_converges(spark, fault_shard):
    """Three writers die before their compare-and-set, one after another on the same shard (one
    writer process each; the finishing writer is shared, a JVM start per fault less): one exits
    between staging and compare-and-set, one is SIGKILLed while Spark writes its run, one is
    SIGKILLed after staging. Nothing is committed, and a healthy writer then converges to the
    oracle without referencing any of their files."""
    shard, env = fault_shard
    crashed = start_writer(env, shard.shard_id, "crasher", FAULT="exit_before_cas")
    crashed.communicate(timeout=600)
    assert crashed.returncode == 9
    assert shard.state().upper == 0
    orphans = staged_dirs(shard)
    assert len(orphans) == 1 and any(f.endswith(".parquet") for d in orphans for _, _, fs in os.walk(d) for f in fs)

    killed: set[str] = set()
    for moment in ("mid_write", "after_stage"):
        before = staged_dirs(shard)
        # The victim never reaches its compare-and-set, so a kill that comes late (the test saw
        # the staging directory only after the write ended) still finds nothing committed.
        victim = start_writer(env, shard.shard_id, f"victim-{moment}", FAULT="hang_after_stage")
        if moment == "mid_write":
            # Spark creates the staging directory as it starts writing the run.
            assert wait_for(lambda: bool(staged_dirs(shard) - before), timeout=300, interval=0.02), moment
        else:
            line = victim.stderr.readline()
            while line and not line.startswith("STAGED"):
                line = victim.stderr.readline()
            assert line.startswith("STAGED"), moment
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=60)
        assert victim.returncode == -signal.SIGKILL, moment
        victim.stderr.close()
        victim.stdout.close()
        assert shard.state().upper == 0, moment
        killed |= staged_dirs(shard) - before
    assert len(killed) == 2

    report = finish_with_healthy_writer(shard, env)
    assert [b["outcome"] for b in report["batches"]] == ["committed"] * 3 + ["nothing_to_do"]
    assert_valid_and_equal_to_oracle(shard, spark, 3)
    # The dead writers' files are left to GC, and none of them is referenced.
    assert orphans | killed <= staged_dirs(shard) and not (orphans | killed) & committed_dirs(shard)
