"""Tiered compaction on a real SparkSession and SQLite consensus: a schedule of batches and
compactions read against the oracle, a crash between a tier merge's output and its swap,
full compaction as it was, and the max-runs setting refused before Spark starts."""

from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_upsert_provider.engine.maintenance.compaction import COMPACTED, compact
from airflow_upsert_provider.engine.maintenance.compaction_policy import tier_runs
from airflow_upsert_provider.engine.maintenance.gc import collect_garbage
from airflow_upsert_provider.engine.write.writer import Writer
from tests.conftest import sqlite_only
from tests.helpers import make_shard, run_cli, spark_table, table
from airflow_upsert_provider.operators.maintenance import CompactShardOperator
from tests.maintenance.crashfs import Crash
from tests.maintenance.support import SPEC, age_files, crash_after_written, oracle
from tests.maintenance.test_operators import store  # noqa: F401 - the fixture
from tests.test_arrow_reader import cli_shard  # noqa: F401 - the fixture


def one_file_batches(spark, consensus, blob, tmp_path, batches: int, shard_id: str = "orders"):
    """A shard of ``SPEC`` with ``batches`` committed batches of one segment file each."""
    (tmp_path / shard_id).mkdir()
    shard = make_shard(consensus, blob, tmp_path / shard_id, spec=SPEC, shard_id=shard_id, max_files_per_batch=1)
    writer = Writer(shard, "setup", spark_factory=lambda: spark)
    if batches:
        writer.run(max_batches=batches, with_lag=False)
    return shard, writer


def check_tiers(consensus, shard, max_runs: int) -> list:
    """The shard's compacted runs: at most ``max_runs``, contiguous in ts from 0 to since."""
    state = shard.state()
    tiers = tier_runs(consensus.get_compaction(shard.shard_id).run, state.since)
    assert 1 <= len(tiers) <= max_runs
    assert [t.tier.from_ts for t in tiers] == [0] + [t.tier.to_ts for t in tiers[:-1]]
    assert tiers[-1].tier.to_ts == state.since
    return tiers


@sqlite_only
def test_a_schedule_of_batches_and_tiered_compactions_reads_what_the_oracle_holds(spark, consensus, blob, tmp_path):
    """Batches and compactions interleaved, at most 2 compacted runs: after each compaction
    the reads as of since and the upper are what they were and what the oracle holds, the
    swap replaced exactly the merged runs, and some compaction kept an older run unmerged."""
    shard, writer = one_file_batches(spark, consensus, blob, tmp_path, batches=0)
    kept_a_run = False
    for count in (3, 1, 1, 2, 1, 3, 1):
        writer.run(max_batches=count, with_lag=False)
        state = shard.state()
        target = state.upper - 1 if count > 1 else state.upper
        before = {ts: table(shard, ts) for ts in (target, state.upper)}
        tiers_before = check_tiers(consensus, shard, 2) if state.since else []

        result = compact(spark, shard, since=target, max_runs=2)

        assert (result.outcome, result.since) == (COMPACTED, target)
        tiers = check_tiers(consensus, shard, 2)
        assert result.runs_below_since == len(tiers)
        kept = tiers[:-1]
        assert kept == tiers_before[: len(kept)]  # the kept runs are untouched
        run = consensus.get_compaction(shard.shard_id).run
        merged_batches = [b.run["path"] for b in shard.batches(below=target) if b.ts >= state.since]
        assert sorted(run["replaces"]) == sorted([t.path for t in tiers_before[len(kept):]] + merged_batches)
        assert result.runs_merged == len(run["replaces"])
        kept_a_run = kept_a_run or bool(kept)
        for ts, rows in before.items():
            assert table(shard, ts) == rows, f"as_of={ts}"
        assert table(shard) == oracle(shard)
    assert kept_a_run
    assert shard.state().upper == 12
    assert spark_table(shard, spark, 12) == oracle(shard)


@sqlite_only
def test_a_crash_between_a_tier_merge_and_its_swap_leaves_the_shard_valid(spark, consensus, blob, tmp_path):
    """The process dies after writing a tier merge's output, before the swap: nothing changed
    in consensus, reads are unchanged, the next compaction keeps the older run and is right,
    and GC deletes the dead output once it is past the grace period."""
    shard, writer = one_file_batches(spark, consensus, blob, tmp_path, batches=8)
    compact(spark, shard, since=8)
    writer.run(max_batches=1, with_lag=False)
    record_before = consensus.get_compaction(shard.shard_id)
    expected = table(shard)
    crashed: list[str] = []

    try:
        compact(spark, shard, since=9, on_step=crash_after_written(blob, shard.shard_id, 9, crashed))
    except Crash:
        pass
    assert len(crashed) == 1 and os.listdir(crashed[0])  # the output was written
    assert consensus.get_compaction(shard.shard_id) == record_before
    assert (shard.state().since, shard.state().upper) == (8, 9)
    assert table(shard) == expected

    result = compact(spark, shard, since=9)
    assert (result.outcome, result.runs_merged, result.runs_below_since) == (COMPACTED, 1, 2)
    tiers = check_tiers(consensus, shard, 10)
    assert tiers[0] == tier_runs(record_before.run, 8)[0]
    assert blob.path(result.run_path) != crashed[0]
    assert table(shard) == expected == oracle(shard)

    age_files(blob.root)
    report = collect_garbage(consensus, blob, shard.shard_id, grace_seconds=60)
    assert blob.relative(crashed[0]) in [item["path"] for item in report.to_dict()["items"]]
    assert not os.path.exists(crashed[0])
    assert spark_table(shard, spark, 9) == expected


def output_rows(consensus, blob, shard) -> list[tuple]:
    """Every row of the shard's compacted runs, sorted, with the bucket of its file."""
    rows = []
    for listed in consensus.get_compaction(shard.shard_id).run["files"]:
        bucket = os.path.basename(os.path.dirname(listed["path"]))
        rows += [(bucket, *sorted(r.items())) for r in pq.read_table(blob.path(listed["path"])).to_pylist()]
    return sorted(rows, key=repr)


@sqlite_only
def test_full_compaction_after_tiers_writes_what_one_full_compaction_writes(spark, consensus, blob, tmp_path):
    """Tiered compactions then a full one write the same rows, one file per bucket, as a
    single compaction of the same batches (the compaction before tiers)."""
    tiered, _ = one_file_batches(spark, consensus, blob, tmp_path, batches=6, shard_id="tiered")
    single, _ = one_file_batches(spark, consensus, blob, tmp_path, batches=6, shard_id="single")
    compact(spark, tiered, since=4)
    compact(spark, tiered, since=5, max_runs=3)
    assert len(check_tiers(consensus, tiered, 3)) == 2

    result = compact(spark, tiered, since=6, full=True)
    assert (result.full, result.runs_merged, result.runs_below_since) == (True, 3, 1)
    compact(spark, single, since=6)
    assert len(check_tiers(consensus, single, 1)) == 1
    for shard in (tiered, single):
        buckets = [os.path.basename(os.path.dirname(f["path"]))
                   for f in consensus.get_compaction(shard.shard_id).run["files"]]
        assert len(buckets) == len(set(buckets))
    assert output_rows(consensus, blob, tiered) == output_rows(consensus, blob, single) != []
    assert table(tiered) == table(single) == oracle(tiered)


def test_a_bad_max_runs_is_refused_before_spark_starts(cli_shard, capsys):  # noqa: F811
    shard, _ = cli_shard
    before = shard.state()
    code, out, err = run_cli(capsys, "compact", "orders", "--max-runs", "0", "--json")
    message = "--max-runs takes an integer from 1 to 2**63-1, not '0'"
    assert (code, err) == (2, f"upsertctl: {message}\n")
    assert json.loads(out)["message"] == message
    after = shard.state()
    assert (after.since, after.upper) == (before.since, before.upper)


def test_the_operator_passes_full_and_max_runs_and_refuses_bad_ones(spark, store, blob):  # noqa: F811
    consensus, shard = store
    with pytest.raises(AirflowFailException, match=r"^max_runs must be >= 1, got 0$"):
        CompactShardOperator(task_id="compact", shard="orders", max_runs=0).execute({})
    with pytest.raises(AirflowFailException, match=r"^full must be true or false, got 'sometimes'$"):
        CompactShardOperator(task_id="compact", shard="orders", full="sometimes").execute({})
    assert shard.state().since == 0

    CompactShardOperator(task_id="compact", shard="orders", since="3").execute({})
    # The batch holds more than half the compacted run's rows: similar sizes, they merge.
    tiered = CompactShardOperator(task_id="compact", shard="orders", max_runs="2").execute({})
    assert (tiered["full"], tiered["runs_merged"], tiered["runs_below_since"]) == (False, 2, 1)
    Writer(shard, "more", spark_factory=lambda: spark).run(max_batches=1, with_lag=False)
    full = CompactShardOperator(task_id="compact", shard="orders", full="true").execute({})
    assert (full["full"], full["runs_merged"], full["runs_below_since"]) == (True, 2, 1)
    assert len(check_tiers(consensus, shard, 1)) == 1
    assert table(shard) == oracle(shard)
