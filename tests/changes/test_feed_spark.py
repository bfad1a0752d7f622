"""The change feed on Spark, in one module sharing one session: the Spark reader gives the
Arrow reader's rows over a history with compactions, with and without pre-images, and a real
compaction under a change retention stops its since at the first batch of the retention
period, so a feed from there still answers while one from below is refused."""

from __future__ import annotations

import datetime
import itertools
import random

import pytest
import sqlalchemy as sa

from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.engine.maintenance.compaction import COMPACTED, compact
from airflow_upsert_provider.engine.store.change_feed import set_change_retention
from airflow_upsert_provider.engine.store.tables import batches_table
from airflow_upsert_provider.engine.table.changes import read_changes
from airflow_upsert_provider.engine.table.spark_changes import read_changes_spark
from tests.arrow_runs import commit_batch
from tests.changes.test_feed_oracle import VALUES, build_history, expected_feed
from tests.conftest import sqlite_only
from tests.helpers import make_shard


def spark_rows(frame) -> list:
    assert frame.columns == ["id", *VALUES, "_change_type", "_commit_version", "_commit_timestamp"]
    assert dict(frame.dtypes)["_commit_version"] == "bigint"
    rows = []
    for r in frame.collect():
        values = r.asDict()
        at = values["_commit_timestamp"].astimezone(datetime.timezone.utc)
        rows.append((*(values[c] for c in frame.columns[:-1]), at))
    return sorted(rows, key=lambda r: (r[0], ["delete", "update_preimage", "update_postimage", "insert"].index(r[4])))


@sqlite_only
def test_the_spark_reader_gives_the_arrow_readers_rows(spark, consensus, blob, tmp_path):
    rng = random.Random(7)
    shard = make_shard(consensus, blob, tmp_path, buckets=3)
    history = build_history(shard, rng, batches=7, keys=20)
    state = shard.state()
    committed_at = {b.ts: b.committed_at for b in shard.batches()}
    # Each range is a few Spark jobs: two ranges, one from since (the compacted runs as of it).
    ranges = [(state.since, state.upper), (state.upper - 2, state.upper)]
    for (from_ts, to_ts), preimages in itertools.product(ranges, (False, True)):
        expected = expected_feed(shard.config, history, from_ts, to_ts, committed_at, preimages=preimages)
        arrow = read_changes(shard, from_ts, to_ts, preimages=preimages).read_all()
        assert arrow.num_rows == len(expected)
        got = spark_rows(read_changes_spark(spark, shard, from_ts, to_ts, preimages=preimages))
        assert got == expected, (from_ts, to_ts, preimages)
    assert any(expected_feed(shard.config, history, a, b, committed_at) for a, b in ranges)
    with pytest.raises(ConfigurationError, match="no longer answerable") if state.since else pytest.raises(
            ConfigurationError, match="ends past its upper"):
        read_changes_spark(spark, shard, max(state.since - 1, 0), state.upper + (0 if state.since else 1))


def row(key: int, name: str) -> dict:
    return {"id": key, "name": name, "amount": 1.0, "updated_at": 0, "_deleted": False}


@sqlite_only
def test_a_compaction_under_change_retention_keeps_the_batches_of_the_period(spark, consensus, blob, tmp_path):
    # One bucket: the batches here are written with pyarrow, whose stand-in for the key hash
    # (tests/arrow_runs.py) is not the hash a Spark compaction buckets by.
    shard = make_shard(consensus, blob, tmp_path, buckets=1)
    for ts in range(6):
        commit_batch(shard, [row(ts % 3, f"v{ts}")])
    # Batches 0-2 were committed two days ago, 3-5 now.
    with consensus.engine.begin() as conn:
        conn.execute(sa.update(batches_table).where(batches_table.c.ts < 3)
                     .values(committed_at=batches_table.c.committed_at - 2 * 86400))
    set_change_retention(consensus, shard.shard_id, 86400.0)
    result = compact(spark, shard)
    assert result.outcome == COMPACTED and result.since == 3 and shard.state().since == 3
    feed = read_changes(shard, 3, preimages=True).read_all()
    assert sorted(zip(feed.column("id").to_pylist(), feed.column("_change_type").to_pylist())) == [
        (0, "update_postimage"), (0, "update_preimage"), (1, "update_postimage"), (1, "update_preimage"),
        (2, "update_postimage"), (2, "update_preimage")]
    with pytest.raises(ConfigurationError, match=r"\[2, 6\) .* since 3"):
        read_changes(shard, 2)
    # An explicit since inside the period is held too; without the retention it goes through.
    assert compact(spark, shard, since=5).outcome == "nothing_to_do" and shard.state().since == 3
    set_change_retention(consensus, shard.shard_id, None)
    assert compact(spark, shard, since=5).since == 5
