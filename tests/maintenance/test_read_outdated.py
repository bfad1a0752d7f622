"""A read that loses its files to compaction + GC (grace 0) between choosing its runs and
reading them fails with the retryable ReadOutdated, not an IntegrityError advising a restore;
a live file missing stays an integrity error. The interleaving is driven by hooks."""

from __future__ import annotations

import os

import pytest

from airflow_upsert_provider.engine.errors import IntegrityError, ReadOutdated
from airflow_upsert_provider.engine.maintenance.compaction import compact
from airflow_upsert_provider.engine.maintenance.gc import collect_garbage
from airflow_upsert_provider.engine.table.arrow_reader import read_table
from airflow_upsert_provider.engine.table.runs import read_runs
from airflow_upsert_provider.engine.table.shard import files_replaced
from tests.maintenance.support import oracle, written_shard


def compact_and_collect(spark, shard) -> None:
    compact(spark, shard)
    assert collect_garbage(shard.consensus, shard.blob, shard.shard_id, grace_seconds=0).files > 0


def planned_then_collected(spark, shard, monkeypatch) -> list:
    """Make the shard's next choice of runs be followed at once by a compaction and GC with
    grace 0: the read then reads runs that are gone. Later choices are the real ones."""
    real = shard.live_runs
    chosen: list = []

    def live_runs(as_of=None):
        runs = real(as_of)
        if not chosen:
            chosen.append(runs)
            compact_and_collect(spark, shard)
        return runs

    monkeypatch.setattr(shard, "live_runs", live_runs)
    return chosen


def assert_outdated(error: ReadOutdated, shard, runs) -> None:
    planned = {shard.blob.path(f["path"]) for run in runs for f in run["files"]}
    assert error.retryable and error.exit_code == 2
    assert error.details["shard"] == shard.shard_id and error.details["file"] in planned
    assert not os.path.exists(error.details["file"])
    assert "compaction replaced their runs and GC deleted them meanwhile" in error.message
    assert "restore" not in error.message


def test_a_spark_read_whose_files_are_collected_before_it_reads_is_read_outdated(spark, consensus, blob, tmp_path,
                                                                                 monkeypatch):
    shard = written_shard(spark, consensus, blob, tmp_path, batches=4)
    chosen = planned_then_collected(spark, shard, monkeypatch)
    with pytest.raises(ReadOutdated) as caught:
        shard.count_rows(spark)
    assert_outdated(caught.value, shard, chosen[0])
    assert shard.count_rows(spark) == len(oracle(shard))  # read again: the runs live now


def test_a_spark_read_whose_files_are_collected_while_it_reads_is_read_outdated(spark, consensus, blob, tmp_path):
    shard = written_shard(spark, consensus, blob, tmp_path, batches=4)
    runs = shard.live_runs()
    frame = read_runs(spark, shard.config, shard.blob, runs)  # planned: every file present
    compact_and_collect(spark, shard)
    with pytest.raises(ReadOutdated) as caught:
        with shard.reading(runs):
            frame.collect()
    assert_outdated(caught.value, shard, runs)


def test_an_arrow_read_whose_files_are_collected_is_read_outdated(spark, consensus, blob, tmp_path, monkeypatch):
    shard = written_shard(spark, consensus, blob, tmp_path, batches=4)
    # Between its choice of runs and its check that they are present.
    chosen = planned_then_collected(spark, shard, monkeypatch)
    with pytest.raises(ReadOutdated) as caught:
        read_table(shard)
    assert_outdated(caught.value, shard, chosen[0])
    monkeypatch.undo()
    # While the reader is consumed.
    shard = written_shard(spark, consensus, blob, tmp_path / "second", batches=4, shard_id="second")
    runs = shard.live_runs()
    reader = read_table(shard)
    compact_and_collect(spark, shard)
    with pytest.raises(ReadOutdated) as caught:
        reader.read_all()
    assert_outdated(caught.value, shard, runs)
    assert read_table(shard).read_all().num_rows == len(oracle(shard))


def test_a_live_file_missing_is_still_an_integrity_error(spark, consensus, blob, tmp_path):
    shard = written_shard(spark, consensus, blob, tmp_path, batches=2)
    [first, *_] = [f for run in shard.live_runs() for f in run["files"]]
    os.unlink(blob.path(first["path"]))
    with pytest.raises(IntegrityError) as caught:
        shard.count_rows(spark)
    assert not isinstance(caught.value, ReadOutdated) and caught.value.details["file"] == blob.path(first["path"])
    assert "restore the shard from a checkpoint" in caught.value.message


def test_files_replaced_only_when_every_failed_file_left_the_state():
    live = {"/b/a", "/b/b"}
    assert files_replaced(["/b/x", "/b/y"], live) == ["/b/x", "/b/y"]
    assert files_replaced(["/b/x", "/b/a"], live) == []  # a live file failed: damage
    assert files_replaced([], live) == [] and files_replaced([None], live) == []
    assert files_replaced(["/b/x", None], live) == []
