"""A feed read racing a compaction and GC, driven by a hook in the read: the read holds the
runs it planned, compaction replaces some of them and GC (grace 0) deletes them before they
are read. The read then fails with the retryable ReadOutdated naming a lost file, never an
integrity error or a wrong feed, and a retry answers the same range from the new runs. No
Spark is started in this module."""

from __future__ import annotations

import os

import pytest

from airflow_upsert_provider.engine.errors import ReadOutdated
from airflow_upsert_provider.engine.maintenance.gc import collect_garbage
from airflow_upsert_provider.engine.table import run_io
from airflow_upsert_provider.engine.table.changes import read_changes
from tests.arrow_runs import commit_batch, compact_batches
from tests.changes.test_feed_oracle import expected_feed, feed_rows
from tests.conftest import sqlite_only
from tests.helpers import make_shard


def row(key: int, name: str, *, deleted: bool = False) -> dict:
    return {"id": key, "name": None if deleted else name, "amount": None if deleted else 1.0, "updated_at": 0,
            "_deleted": deleted}


@sqlite_only
def test_a_feed_read_whose_planned_runs_are_compacted_and_collected_fails_retryably_and_a_retry_answers(
        consensus, blob, tmp_path):
    shard = make_shard(consensus, blob, tmp_path, buckets=2, order_by=None)
    history = []
    for rows in ([row(1, "a"), row(2, "b")], [row(3, "c")], [row(1, "a2")],
                 [row(2, "b", deleted=True), row(4, "d")], [row(3, "c2"), row(5, "e")]):
        ts = commit_batch(shard, rows)
        history += [{**r, "_ts": ts} for r in rows]
    before_files = {blob.path(f["path"]) for b in shard.batches() if b.ts < 3 for f in b.run["files"]}
    held: list[str] = []

    def read_file(root, listed, schema):
        if not held:
            # The runs are chosen; now the shard moves under the read.
            held.append(listed["path"])
            compact_batches(shard, history, 3)
            report = collect_garbage(shard.consensus, shard.blob, shard.shard_id, grace_seconds=0)
            assert report.files > 0
        return run_io.read_files(root, [listed["path"]], schema, sizes=[listed["bytes"]])

    with pytest.raises(ReadOutdated) as lost:
        read_changes(shard, 3, read_file=read_file).read_all()
    error = lost.value
    assert error.retryable and error.exit_code == 2
    assert error.details["file"] in before_files and not os.path.exists(error.details["file"])
    assert "read again" in error.message
    # The retry plans on the new state: since 3, the compacted run as of 3, the same answer.
    assert shard.state().since == 3
    committed_at = {b.ts: b.committed_at for b in shard.batches()}
    got = feed_rows(read_changes(shard, 3, preimages=True))
    assert got == expected_feed(shard.config, history, 3, 5, committed_at)
    assert [r[4] for r in got] == ["delete", "update_preimage", "update_postimage", "insert", "insert"]
