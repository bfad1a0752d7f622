"""Compaction on a real SparkSession, against SQLite and PostgreSQL consensus."""

from __future__ import annotations

import os

import pytest

from airflow_upsert_provider.engine.maintenance.compaction import COMPACTED, NOTHING_TO_DO, compact
from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.engine.table.runs import read_runs
from airflow_upsert_provider.engine.write.writer import Writer
from tests.conftest import sqlite_only
from tests.helpers import spark_table, table
from tests.maintenance.support import BATCHES, oracle, reads_at_every_ts, written_shard
from tests.oracle import table_from_rows


@sqlite_only
def test_reads_at_every_ts_from_since_are_unchanged(spark, consensus, blob, tmp_path):
    shard = written_shard(spark, consensus, blob, tmp_path)
    # Spark's own reads here: compaction's output as the engine's main reader sees it.
    before = {ts: spark_table(shard, spark, ts) for ts in range(BATCHES + 1)}
    assert before[BATCHES] == oracle(shard)

    result = compact(spark, shard, since=3)
    assert (result.outcome, result.since_before, result.since, result.runs_merged) == (COMPACTED, 0, 3, 3)
    state = shard.state()
    assert (state.since, state.upper) == (3, BATCHES)
    for ts in range(3, BATCHES + 1):
        assert spark_table(shard, spark, ts) == before[ts], f"as_of={ts}"
    with pytest.raises(ConfigurationError, match="as of 2: compacted below since 3"):
        shard.read(spark, as_of=2)

    # The output is one sorted file per bucket, _ts kept per row. Tombstones are kept: the
    # shard has an order column, and a later batch may bring a key with a lower order value.
    run = consensus.get_compaction(shard.shard_id).run
    buckets = [os.path.basename(os.path.dirname(f["path"])) for f in run["files"]]
    assert len(buckets) == len(set(buckets)) <= shard.config.buckets
    rows = spark.read.parquet(*[blob.path(f["path"]) for f in run["files"]])
    assert rows.where("_deleted").count() > 0
    assert {r["_ts"] for r in rows.select("_ts").distinct().collect()} <= {0, 1, 2}
    assert rows.count() == run["rows"]
    assert rows.where("NOT _deleted").count() == len(before[3])

    # Compacting again merges the compacted run with the later batches.
    again = compact(spark, shard)
    assert (again.outcome, again.since, again.runs_merged) == (COMPACTED, BATCHES, 1 + BATCHES - 3)
    assert table(shard) == before[BATCHES] == oracle(shard)
    assert compact(spark, shard).outcome == NOTHING_TO_DO


def test_since_beyond_upper_is_refused(spark, consensus, blob, tmp_path):
    shard = written_shard(spark, consensus, blob, tmp_path, batches=2)
    with pytest.raises(ConfigurationError, match="its upper is 2"):
        compact(spark, shard, since=3)
    assert shard.state().since == 0


def test_racing_writers_and_a_rival_compaction(spark, consensus, blob, tmp_path):
    """Writers commit while the compaction runs; a rival compaction wins the swap first: the
    loser deletes its output, retries against the new state, and never touches a batch."""
    shard = written_shard(spark, consensus, blob, tmp_path, batches=3)
    rival_done = []
    lost_outputs = []

    def on_step(step: str) -> None:
        assert step == "written"
        if rival_done:
            return
        # A writer commits two batches, then a rival compaction moves since first.
        Writer(shard, "racer", spark_factory=lambda: spark).run(max_batches=2, with_lag=False)
        rival_done.append(compact(spark, shard, since=2))
        runs_root = blob.path(shard.shard_id, "runs", "since=000000000003")
        lost_outputs.extend(os.path.join(runs_root, d) for d in os.listdir(runs_root))

    result = compact(spark, shard, since=3, on_step=on_step)
    assert result.outcome == COMPACTED and result.attempts == 2
    assert (result.since_before, result.since) == (2, 3)
    assert [os.path.isdir(d) for d in lost_outputs] == [False]  # the lost output is gone
    # Every batch the writer committed is intact and counted.
    assert [b.ts for b in shard.batches()] == [0, 1, 2, 3, 4]
    Writer(shard, "tail", spark_factory=lambda: spark).run(until_caught_up=True, with_lag=False)
    final = reads_at_every_ts(shard, start=3)
    assert final[shard.state().upper] == oracle(shard)
    # Reads at every ts >= since equal those of an uncompacted copy of the same batches.
    for ts, rows in final.items():
        runs = [b.run for b in shard.batches(below=ts)]
        assert rows == table_from_rows(read_runs(spark, shard.config, blob, runs).collect()), f"as_of={ts}"


def test_store_lost_during_the_swap_and_its_read_back_is_an_unknown_outcome(spark, consensus, blob, tmp_path):
    """The swap commits, the connection drops before the client hears it, and the store is
    still down when compaction reads back what happened: exit 5 (retryable), never exit 2
    ("nothing changed"), and a rerun finds the swap that landed."""
    from airflow_upsert_provider.engine.errors import ConsensusOutcomeUnknown, OutcomeUnknown
    from tests.faults import StoreOutage

    shard = written_shard(spark, consensus, blob, tmp_path)
    before = table(shard)
    outage = StoreOutage(consensus)
    real_swap = consensus.compare_and_set_since

    def swap_then_lose_the_connection(*args, **kwargs):
        assert real_swap(*args, **kwargs)
        outage._reads_to_fail = 1  # the read-back fails too
        raise ConsensusOutcomeUnknown("consensus store failed while committing")

    consensus.compare_and_set_since = swap_then_lose_the_connection
    with pytest.raises(OutcomeUnknown) as raised:
        compact(spark, shard, since=3)
    assert raised.value.exit_code == 5 and raised.value.retryable
    assert outage.failed_reads == 1
    consensus.compare_and_set_since = real_swap
    outage.end()

    assert shard.state().since == 3
    assert compact(spark, shard, since=3).outcome == NOTHING_TO_DO
    assert table(shard) == before
