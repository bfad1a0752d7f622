"""Growing a shard's bucket count at a compaction, on a real SparkSession and SQLite consensus:
the new count's layout (every key in the bucket Spark's hash gives it), reads at every ts
unchanged by the Arrow reader and by Spark, the count recorded in the swap and used by later
batches, a writer that planned with the old count committing after the swap (read correctly,
rewritten by the next compaction), a crash between a rebucket's output and its swap, the size
target, and refusals of a count that is not a multiple of the current one."""

from __future__ import annotations

import json
import os
import re

import pyarrow.parquet as pq
import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.engine.maintenance.compaction import COMPACTED, compact
from airflow_upsert_provider.engine.maintenance.gc import collect_garbage
from airflow_upsert_provider.engine.write.writer import Writer
from airflow_upsert_provider.hooks.upsert import UpsertShardHook
from airflow_upsert_provider.operators.maintenance import CompactShardOperator
from tests.conftest import sqlite_only
from tests.helpers import make_shard, run_cli, spark_table, table
from tests.maintenance.crashfs import Crash
from tests.maintenance.support import SPEC, age_files, crash_after_written, oracle, reads_at_every_ts
from tests.maintenance.test_operators import store  # noqa: F401 - the fixture
from tests.test_arrow_reader import cli_shard  # noqa: F401 - the fixture


def shard_with_batches(spark, consensus, blob, tmp_path, batches: int, **overrides):
    """A shard of ``SPEC`` in 2 buckets with ``batches`` committed batches of one segment file each."""
    (tmp_path / "orders").mkdir()
    shard = make_shard(consensus, blob, tmp_path / "orders", spec=SPEC, max_files_per_batch=1,
                       **{"buckets": 2, **overrides})
    writer = Writer(shard, "setup", spark_factory=lambda: spark)
    writer.run(max_batches=batches, with_lag=False)
    return shard, writer


def check_layout(spark, blob, run: dict, count: int) -> None:
    """``run`` records ``count`` and each of its rows is in the file of the bucket Spark's hash
    of its key gives among ``count`` (what batches and compactions of that count write)."""
    assert run["buckets"] == count
    placed = []
    for listed in run["files"]:
        bucket = int(re.search(r"/_bucket=(\d+)/", listed["path"]).group(1))
        placed += [(key, bucket) for key in pq.read_table(blob.path(listed["path"]), columns=["id"]).column("id").to_pylist()]
    assert placed
    hashed = spark.createDataFrame(placed, "id BIGINT, bucket INT").selectExpr(
        "bucket", f"CAST(pmod(xxhash64(id), {count}) AS INT) AS hashed")
    assert hashed.where("bucket != hashed").count() == 0
    assert {b for _, b in placed} <= set(range(count))


@sqlite_only
def test_a_compaction_with_buckets_splits_every_bucket_and_reads_stay_what_they_were(spark, consensus, blob, tmp_path):
    """compact(buckets=4) on a 2-bucket shard with a tiered history: one full merge written in
    4 buckets, the count swapped with it; every ts reads as before (Arrow and Spark); later
    batches are written in 4 buckets, and later tiered compactions keep 4."""
    shard, writer = shard_with_batches(spark, consensus, blob, tmp_path, batches=6)
    compact(spark, shard, since=3)
    compact(spark, shard, since=4, max_runs=3)
    before = reads_at_every_ts(shard, 4)

    result = compact(spark, shard, since=5, buckets=4)

    assert (result.outcome, result.buckets_before, result.buckets, result.full) == (COMPACTED, 2, 4, True)
    assert result.runs_below_since == 1
    run = consensus.get_compaction(shard.shard_id).run
    check_layout(spark, blob, run, 4)
    assert [t["from_ts"] for t in run["tiers"]] == [0]
    assert shard.bucket_count() == 4
    assert reads_at_every_ts(shard, 5) == {ts: rows for ts, rows in before.items() if ts >= 5}
    assert spark_table(shard, spark, 5) == before[5]
    assert spark_table(shard, spark) == table(shard) == oracle(shard)

    writer.run(max_batches=2, with_lag=False)
    newest = shard.batches()[-1]
    check_layout(spark, blob, newest.run, 4)
    assert table(shard) == spark_table(shard, spark) == oracle(shard)
    tiered = compact(spark, shard, since=7, max_runs=3)
    assert (tiered.buckets_before, tiered.buckets) == (4, 4)
    check_layout(spark, blob, consensus.get_compaction(shard.shard_id).run, 4)
    assert table(shard) == oracle(shard)


@sqlite_only
def test_a_writer_that_planned_with_the_old_count_commits_after_the_swap_and_is_read_correctly(
    spark, consensus, blob, tmp_path
):
    """A writer stages batch 5 in 2 buckets; a compaction to since 5 doubles the count to 4
    between its staging and its compare-and-append (the writer's ``on_staged`` hook): the
    commit is not refused, the batch keeps its 2-bucket run, and reads of runs of both counts
    at every ts (Arrow and Spark) are what they were and the oracle's; the next compaction
    rewrites it in 4 buckets."""
    shard, writer = shard_with_batches(spark, consensus, blob, tmp_path, batches=5)
    compact(spark, shard, since=4)
    before = reads_at_every_ts(shard, 4)
    rebuckets = []

    def rebucket_before_the_append(staged) -> None:
        assert staged.run["buckets"] == 2
        rebuckets.append(compact(spark, shard, since=5, buckets=4))

    writer.on_staged = rebucket_before_the_append
    result = writer.run(max_batches=1, with_lag=False)
    writer.on_staged = None

    assert [(r.outcome, r.buckets_before, r.buckets) for r in rebuckets] == [(COMPACTED, 2, 4)]
    assert result.to_dict()["committed"] == 1
    assert (shard.state().since, shard.state().upper) == (5, 6)
    assert shard.batches()[-1].run["buckets"] == 2
    check_layout(spark, blob, consensus.get_compaction(shard.shard_id).run, 4)
    assert reads_at_every_ts(shard, 5)[5] == before[5]
    assert table(shard) == spark_table(shard, spark) == oracle(shard)
    assert spark_table(shard, spark, 5) == table(shard, 5)

    old_count_batch = shard.batches()[-1].run["path"]
    rewritten = compact(spark, shard)
    assert (rewritten.buckets_before, rewritten.buckets) == (4, 4)
    run = consensus.get_compaction(shard.shard_id).run
    assert old_count_batch in run["replaces"]
    check_layout(spark, blob, run, 4)  # every tier, the rewritten batch's too
    assert table(shard) == oracle(shard)


@sqlite_only
def test_a_crash_between_a_rebucket_and_its_swap_leaves_the_shard_valid_with_the_old_count(
    spark, consensus, blob, tmp_path
):
    """The process dies after writing a rebucket's 4-bucket output, before the swap: consensus
    is unchanged (count 2), a batch written meanwhile uses 2, reads are unchanged, the next
    rebucketing compaction is right, and GC deletes the dead output past its grace period."""
    shard, writer = shard_with_batches(spark, consensus, blob, tmp_path, batches=5)
    compact(spark, shard, since=4)
    record_before = consensus.get_compaction(shard.shard_id)
    expected = reads_at_every_ts(shard, 4)
    crashed: list[str] = []

    with pytest.raises(Crash):
        compact(spark, shard, since=5, buckets=4, on_step=crash_after_written(blob, shard.shard_id, 5, crashed))
    assert len(crashed) == 1
    written = sorted(name for name in os.listdir(crashed[0]) if name.startswith("_bucket="))
    assert written == [f"_bucket={b}" for b in range(4)]  # the output was written, in 4 buckets
    assert consensus.get_compaction(shard.shard_id) == record_before
    assert (shard.state().since, shard.state().upper, shard.bucket_count()) == (4, 5, 2)
    assert reads_at_every_ts(shard, 4) == expected

    writer.run(max_batches=1, with_lag=False)
    assert shard.batches()[-1].run["buckets"] == 2
    result = compact(spark, shard, since=5, buckets=4)
    assert (result.outcome, result.buckets_before, result.buckets) == (COMPACTED, 2, 4)
    assert blob.path(result.run_path) != crashed[0]
    check_layout(spark, blob, consensus.get_compaction(shard.shard_id).run, 4)
    assert table(shard, 5) == expected[5]
    assert table(shard) == spark_table(shard, spark) == oracle(shard)

    age_files(blob.root)
    report = collect_garbage(consensus, blob, shard.shard_id, grace_seconds=60)
    assert blob.relative(crashed[0]) in [item["path"] for item in report.to_dict()["items"]]
    assert not os.path.exists(crashed[0])
    assert table(shard) == oracle(shard)


@sqlite_only
def test_the_size_target_doubles_the_count_at_each_compaction_that_finds_the_runs_above_it(
    spark, consensus, blob, tmp_path
):
    """A shard whose ``target_bucket_bytes`` every run exceeds: each compaction doubles the
    count with no argument (2 -> 4 -> 8), reads stay the oracle's."""
    shard, writer = shard_with_batches(spark, consensus, blob, tmp_path, batches=3, target_bucket_bytes=1)
    grown = compact(spark, shard)
    assert (grown.buckets_before, grown.buckets, grown.full) == (2, 4, True)
    check_layout(spark, blob, consensus.get_compaction(shard.shard_id).run, 4)
    writer.run(max_batches=1, with_lag=False)
    again = compact(spark, shard)
    assert (again.buckets_before, again.buckets) == (4, 8)
    check_layout(spark, blob, consensus.get_compaction(shard.shard_id).run, 8)
    assert table(shard) == spark_table(shard, spark) == oracle(shard)


def test_a_count_that_is_not_a_multiple_is_refused_naming_it_by_the_cli_before_spark_and_by_the_operator(
    cli_shard, capsys  # noqa: F811
):
    shard, _ = cli_shard
    before = shard.state()
    compaction_before = shard.consensus.get_compaction("orders")
    code, out, err = run_cli(capsys, "compact", "orders", "--buckets", "6", "--json")
    current = shard.config.buckets
    message = (f"--buckets 6 is not allowed: the bucket count can only grow, to a multiple of the current count "
               f"{current} up to 4096 ({current}, {2 * current}, ..., {4096 // current * current})")
    assert (code, err) == (2, f"upsertctl: {message}\n")
    assert json.loads(out)["message"] == message
    code, _, err = run_cli(capsys, "compact", "orders", "--buckets", "8192")
    assert (code, err) == (2, "upsertctl: --buckets takes an integer from 1 to 4096, not '8192'\n")
    after = shard.state()
    assert (after.since, after.upper) == (before.since, before.upper)
    assert shard.consensus.get_compaction("orders") == compaction_before


def test_the_operator_passes_buckets_and_refuses_a_bad_one_before_spark(spark, store, blob, monkeypatch):  # noqa: F811
    consensus, shard = store
    current = shard.config.buckets
    sessions = []
    get_spark = UpsertShardHook.get_spark
    monkeypatch.setattr(UpsertShardHook, "get_spark", lambda hook, *a, **k: sessions.append(k) or get_spark(hook, *a, **k))
    with pytest.raises(AirflowFailException, match=rf"^configuration error: buckets {current + 1} is not allowed: .*current count {current} "):
        CompactShardOperator(task_id="compact", shard="orders", buckets=str(current + 1)).execute({})
    assert sessions == [], "the operator asked for a Spark session before refusing its arguments"
    assert shard.state().since == 0
    report = CompactShardOperator(task_id="compact", shard="orders", buckets=str(2 * current)).execute({})
    assert (report["outcome"], report["buckets_before"], report["buckets"]) == (COMPACTED, current, 2 * current)
    assert consensus.get_compaction("orders").run["buckets"] == 2 * current == shard.bucket_count()
    assert table(shard) == oracle(shard)


def test_an_engine_caller_gets_the_same_refusal_before_anything_is_written(spark, store, blob):  # noqa: F811
    consensus, shard = store
    assert shard.config.buckets == 4
    with pytest.raises(ConfigurationError, match=r"^buckets 6 is not allowed: the bucket count can only grow"):
        compact(spark, shard, buckets=6)
    assert consensus.get_compaction("orders") is None
    assert not os.path.exists(blob.path("orders", "runs", f"since={shard.state().upper:012d}"))
