"""Runs written and read by the executors through pyarrow (engine/table/run_io.py), on a real
SparkSession: the path object storage takes, forced here onto a local blob root so that the
run format's oracle tests check it too (they are imported below and run again in this module
with the executor path on).
"""

from __future__ import annotations

import hashlib
import os

import pyarrow.parquet as pq
import pytest

from airflow_upsert_provider.engine.table import run_io
from airflow_upsert_provider.engine.maintenance.compaction import compact
from airflow_upsert_provider.engine.write.writer import Writer
from tests.conftest import sqlite_only
from tests.oracle import table_from_rows

# The oracle tests of the run format, the writer and compaction, run again with the executors
# writing and reading every run.
from tests.test_runs import (  # noqa: F401
    test_a_batch_of_empty_segments_commits_an_empty_run,
    test_a_missing_run_file_is_an_integrity_error_naming_it,
    test_a_run_carries_its_batch_ts_and_a_new_ts_compiles_no_code,
    test_a_tombstone_with_a_higher_order_value_survives_compaction,
    test_order_column_wins_across_batches,
    test_without_an_order_column_compaction_drops_tombstones,
)
from tests.test_runs import new_shard, run_all, write_segment
from tests.test_runs import test_every_batching_gives_the_same_table as every_batching_property
from tests.test_writer import (  # noqa: F401
    test_read_as_of_every_ts_matches_oracle_of_bound_offsets,
    test_tombstones_and_tie_breaking,
    test_two_writers_stage_identical_batches,
)
from tests.maintenance.test_compaction import test_reads_at_every_ts_from_since_are_unchanged  # noqa: F401
from tests.maintenance.test_cli import test_read_of_a_run_damaged_in_place_exits_4_naming_it  # noqa: F401
from tests.test_record_shapes import (  # noqa: F401
    fail_batches,
    fast_path_decides,
    quarantine_batches,
    test_a_failed_shared_batch_lists_every_reject_in_order,
    test_quarantine_batches_count_every_record,
    test_shape_in_fail_mode,
    test_shape_in_quarantine_mode,
)


@pytest.fixture(scope="module", autouse=True)
def executors_do_run_io():
    """Every run of this module's tests written and read by the executors through pyarrow.
    Module-scoped, so that the module-scoped batches of the imported tests take it too."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(run_io, "executor_io", lambda root: True)
        yield


def test_every_batching_gives_the_same_table_through_the_executors(spark, sqlite_url, tmp_path):
    """The every-batching property once here, on its harder shape (keys per partition, tied and
    null order values): the executors write and read the runs the same way whatever the
    batching; both shapes run on Spark's own I/O in tests/test_runs.py."""
    every_batching_property(spark, sqlite_url, tmp_path, key_per_partition=True)


def listed_files(directory: str) -> set[str]:
    return {os.path.join(d, name) for d, _, names in os.walk(directory) for name in names}


@sqlite_only
def test_the_executors_report_what_they_wrote(spark, consensus, blob, tmp_path, monkeypatch):
    """The run's description comes from the tasks, and is exactly what is on disk: every
    file listed with its real size and SHA-256, the row count of the footers, one file per
    bucket, nothing else in the run directory (no temporary name, no marker file)."""
    monkeypatch.setattr(run_io, "executor_io", lambda root: True)  # also where imported alone
    landing = str(tmp_path / "landing")
    write_segment(landing, "p0", 0, [{"id": i, "v": f"a{i}", "ts": 1} for i in range(200)])
    write_segment(landing, "p1", 0, [{"id": i, "v": f"b{i}", "ts": 2, "deleted": i % 7 == 0} for i in range(100, 300)])
    shard = new_shard(consensus, blob, landing, "s", buckets=4)
    run_all(spark, shard)
    run = consensus.get_batch("s", 0).run
    paths = [blob.path(f["path"]) for f in run["files"]]
    assert len(paths) == 4
    assert listed_files(blob.path(run["path"])) == set(paths)
    for listed, path in zip(run["files"], paths):
        with open(path, "rb") as handle:
            data = handle.read()
        assert listed["bytes"] == len(data) and listed["sha256"] == hashlib.sha256(data).hexdigest()
        assert os.path.basename(os.path.dirname(path)).startswith("_bucket=")
    assert run["rows"] == sum(pq.read_metadata(p).num_rows for p in paths) == 300
    # Each file sorted by key.
    for path in paths:
        ids = pq.read_table(path, columns=["id"]).column("id").to_pylist()
        assert ids == sorted(ids)
    # The executor reader and Spark's own reader agree on the merged table.
    via_executors = table_from_rows(shard.read(spark).collect())
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(run_io, "executor_io", lambda root: False)
        assert table_from_rows(shard.read(spark).collect()) == via_executors
    assert len(via_executors) == 300 - len([i for i in range(100, 300) if i % 7 == 0])


@sqlite_only
def test_a_compaction_reads_runs_spark_wrote_and_writes_through_the_executors(spark, consensus, blob, tmp_path,
                                                                              monkeypatch):
    """A shard whose runs Spark's writer wrote (INT96 timestamps among them) is compacted by
    the executors: same table before and after, and the compacted run is described from
    its tasks."""
    import json

    monkeypatch.setattr(run_io, "executor_io", lambda root: True)  # also where imported alone

    landing = str(tmp_path / "landing")
    schema = json.dumps({"type": "struct", "fields": [
        {"name": "id", "type": "long", "nullable": True, "metadata": {}},
        {"name": "at", "type": "timestamp", "nullable": True, "metadata": {}},
        {"name": "amount", "type": "decimal(12,2)", "nullable": True, "metadata": {}},
        {"name": "day", "type": "date", "nullable": True, "metadata": {}},
    ]})
    write_segment(landing, "p0", 0, [{"id": i, "at": f"2026-11-2{i % 9}T10:00:0{i % 10}Z", "amount": f"{i}.25",
                                      "day": f"2026-01-0{1 + i % 9}"} for i in range(50)])
    write_segment(landing, "p0", 1, [{"id": i, "at": "2027-01-01T00:00:00Z", "amount": "1.50", "day": None}
                                     for i in range(40, 60)])
    shard = new_shard(consensus, blob, landing, "s", schema=schema, order_by=None, delete_marker=None,
                      max_files_per_batch=1)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(run_io, "executor_io", lambda root: False)
        run_all(spark, shard)
        before = table_from_rows(shard.read(spark).collect())
    spark_written = blob.path(consensus.get_batch("s", 0).run["files"][0]["path"])
    column = pq.ParquetFile(spark_written).schema.column(1)
    assert (column.name, column.physical_type) == ("at", "INT96")
    assert table_from_rows(shard.read(spark).collect()) == before
    compact(spark, shard)
    run = consensus.get_compaction("s").run
    assert run["rows"] == 60 and listed_files(blob.path(run["path"])) == {blob.path(f["path"]) for f in run["files"]}
    assert table_from_rows(shard.read(spark).collect()) == before
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(run_io, "executor_io", lambda root: False)
        assert table_from_rows(shard.read(spark).collect()) == before
