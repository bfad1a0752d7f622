"""Bad input, in both modes: by default the batch fails naming file, line and reason and
nothing is committed; with quarantine the bad records or files are set aside with their
reason, counted, and the batch commits. Nothing is skipped silently.

The bad-record and bad-name cases share their Spark batches (each case in a file of its own;
a verdict depends on the record or the name only): the per-case tests assert on the shared
batch's error, rows, rejects and quarantined files.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import pytest

from airflow_upsert_provider.engine.blob.files import open_blob
from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.engine.errors import BadInputError
from airflow_upsert_provider.engine.write.writer import BatchResult, Writer
from airflow_upsert_provider.sample_data import write_segment
from tests.conftest import sqlite_only
from tests.helpers import make_shard, quarantined_records, table


def rec(id_, name="n", amount=1.0, at=1, deleted=False):
    return json.dumps({"id": id_, "name": name, "amount": amount, "updated_at": at, "deleted": deleted})


GOOD = [rec(1), rec(2), rec(3)]

BAD_RECORDS = {
    "malformed": ('{"id": 4, "name": "x"', "malformed JSON: not a JSON object"),
    "missing_key": (json.dumps({"name": "no id", "amount": 2.0}), "missing key column 'id'"),
    "null_key": (json.dumps({"id": None, "name": "null id"}), "null key column 'id'"),
    "wrong_type": (json.dumps({"id": 5, "amount": "lots"}), "field 'amount': expected double, got lots"),
    "wrong_key_type": (json.dumps({"id": "five"}), "field 'id': expected bigint, got five"),
}


def shard_with(consensus, blob, tmp_path, files: dict[str, list[str]], **overrides):
    landing = tmp_path / "landing"
    for relative, lines in files.items():
        write_segment(str(landing / relative), lines)
    return make_shard(consensus, blob, tmp_path, **overrides)


@dataclass
class SharedBatch:
    """One batch of a shard whose every case is a file of its own."""

    landing: str
    result: BatchResult | None = None
    error: BadInputError | None = None
    ids: list[int] = field(default_factory=list)
    written: list[dict] = field(default_factory=list)  # rejects quarantined beside the run
    upper: int = 0
    batches: int = 0


def case_path(landing: str, case: str) -> str:
    return os.path.join(landing, f"c{sorted(BAD_RECORDS).index(case)}", "0.jsonl")


def case_ids(case: str) -> list[int]:
    """The good records around a case's bad line: ids of its own."""
    first = 10 * (sorted(BAD_RECORDS).index(case) + 1)
    return [first + 1, first + 2]


def run_bad_records(spark, root, mode: str) -> SharedBatch:
    """Every BAD_RECORDS case as line 2 of its own file (partition c<n>), between two good records."""
    consensus = open_consensus(f"sqlite:///{root / 'consensus.db'}")
    try:
        blob = open_blob(str(root / "blob"))
        blob.ensure_root()
        batch = SharedBatch(str(root / "landing"))
        for case, (bad_line, _reason) in BAD_RECORDS.items():
            first, second = case_ids(case)
            write_segment(case_path(batch.landing, case), [rec(first), bad_line, rec(second)])
        shard = make_shard(consensus, blob, root, max_files_per_batch=len(BAD_RECORDS))
        try:
            batch.result = Writer(shard, "w", spark_factory=lambda: spark, on_bad_record=mode).step()
        except BadInputError as error:
            batch.error = error
        batch.ids = sorted(k[0] for k in table(shard))
        batch.upper = shard.state().upper
        batch.batches = len(shard.batches())
        batch.written = quarantined_records(shard)
    finally:
        consensus.dispose()
    return batch


@pytest.fixture(scope="module")
def bad_records_failed(spark, tmp_path_factory) -> SharedBatch:
    return run_bad_records(spark, tmp_path_factory.mktemp("bad-records-fail"), "fail")


@pytest.fixture(scope="module")
def bad_records_quarantined(spark, tmp_path_factory) -> SharedBatch:
    return run_bad_records(spark, tmp_path_factory.mktemp("bad-records-quarantine"), "quarantine")


@pytest.mark.parametrize("case", sorted(BAD_RECORDS))
def test_bad_record_fails_the_batch_naming_file_line_reason(case, bad_records_failed):
    _bad_line, reason = BAD_RECORDS[case]
    batch = bad_records_failed
    assert batch.error is not None and batch.error.exit_code == 3
    path = case_path(batch.landing, case)
    listed = [r for r in batch.error.details["records"] if r["file"] == path]
    assert listed == [{"file": path, "line": 2, "reason": reason}]
    assert (batch.upper, batch.batches, batch.ids) == (0, 0, [])


def test_a_failed_batch_lists_every_bad_record_and_names_the_first(bad_records_failed):
    error = bad_records_failed.error
    cases = sorted(BAD_RECORDS)  # partitions c0, c1, ...: the order the records are listed in
    assert error.details["count"] == len(cases)
    landing = bad_records_failed.landing
    assert error.details["records"] == [
        {"file": case_path(landing, case), "line": 2, "reason": BAD_RECORDS[case][1]} for case in cases
    ]
    first = case_path(bad_records_failed.landing, cases[0])
    assert first in error.message and "line 2" in error.message


@pytest.mark.parametrize("case", sorted(BAD_RECORDS))
def test_bad_record_quarantined_is_counted_and_batch_commits(case, bad_records_quarantined):
    bad_line, reason = BAD_RECORDS[case]
    batch = bad_records_quarantined
    assert batch.result.outcome == "committed"
    assert [i for i in batch.ids if i in case_ids(case)] == case_ids(case)
    path = case_path(batch.landing, case)
    assert [w for w in batch.written if w["file"] == path] == [
        {"file": path, "line": 2, "reason": reason, "record": bad_line}
    ]


def test_a_quarantined_batch_counts_every_record(bad_records_quarantined):
    batch = bad_records_quarantined
    assert (batch.result.rows_in, batch.result.rejected) == (3 * len(BAD_RECORDS), len(BAD_RECORDS))
    assert batch.ids == sorted(i for case in BAD_RECORDS for i in case_ids(case))
    assert len(batch.written) == len(BAD_RECORDS)


@sqlite_only
def test_blank_lines_and_crlf_are_not_records(spark, consensus, blob, tmp_path):
    landing = tmp_path / "landing" / "p0"
    landing.mkdir(parents=True)
    (landing / "0.jsonl").write_bytes((rec(1) + "\r\n\r\n" + rec(2) + "\r\n").encode())
    shard = make_shard(consensus, blob, tmp_path)
    result = Writer(shard, "w", spark_factory=lambda: spark).step()
    assert (result.rows_in, result.rejected) == (2, 0)


@sqlite_only
def test_many_bad_records_are_all_counted_and_listed_in_order(spark, consensus, blob, tmp_path):
    lines = [rec(i) if i % 3 else "not json" for i in range(60)]
    shard = shard_with(consensus, blob, tmp_path, {"p0/0.jsonl": lines})
    with pytest.raises(BadInputError) as info:
        Writer(shard, "w", spark_factory=lambda: spark).step()
    assert info.value.details["count"] == 20
    listed = [r["line"] for r in info.value.details["records"]]
    assert listed == [1 + 3 * i for i in range(20)]


# -- file-level problems: decided when the batch is bound, so every writer agrees ----------------

FILE_CASES = {
    "non_numeric": ("p0/abc.jsonl", "is not a non-negative integer offset"),
    "non_numeric_mixed": ("p0/12a.jsonl", "is not a non-negative integer offset"),
    "wrong_extension": ("p0/7.parquet", "is not jsonl"),
}


@sqlite_only
@pytest.mark.parametrize("case", sorted(FILE_CASES))
def test_bad_segment_name_fails_before_binding(case, spark, consensus, blob, tmp_path):
    relative, reason = FILE_CASES[case]
    shard = shard_with(consensus, blob, tmp_path, {"p0/0.jsonl": GOOD, relative: GOOD})
    with pytest.raises(BadInputError) as info:
        Writer(shard, "w", spark_factory=lambda: spark).step()
    record = info.value.details["records"][0]
    assert record["file"] == str(tmp_path / "landing" / relative)
    assert reason in record["reason"]
    assert shard.binding(0) is None and shard.state().upper == 0


@dataclass
class QuarantinedNames:
    landing: str
    first: BatchResult
    second: BatchResult
    quarantined: dict[str, str]
    ids: list[int]


@pytest.fixture(scope="module")
def bad_names_quarantined(spark, tmp_path_factory) -> QuarantinedNames:
    """Every FILE_CASES name beside a good segment in one shard, then one more good segment."""
    root = tmp_path_factory.mktemp("bad-names")
    consensus = open_consensus(f"sqlite:///{root / 'consensus.db'}")
    try:
        blob = open_blob(str(root / "blob"))
        blob.ensure_root()
        files = {"p0/0.jsonl": GOOD, **{name: GOOD for name, _ in FILE_CASES.values()}}
        shard = shard_with(consensus, blob, root, files)
        w = Writer(shard, "w", spark_factory=lambda: spark, on_bad_record="quarantine")
        first = w.step()
        quarantined = dict(shard.consensus.quarantined_files(shard.shard_id))
        write_segment(str(root / "landing" / "p0" / "20.jsonl"), [rec(9)])
        second = w.step()
        return QuarantinedNames(str(root / "landing"), first, second, quarantined,
                                sorted(k[0] for k in table(shard)))
    finally:
        consensus.dispose()


@pytest.mark.parametrize("case", sorted(FILE_CASES))
def test_bad_segment_name_quarantined_once(case, bad_names_quarantined):
    relative, reason = FILE_CASES[case]
    path = os.path.join(bad_names_quarantined.landing, relative)
    assert reason in bad_names_quarantined.quarantined[path]


def test_bad_segment_names_are_quarantined_once_and_the_good_ones_commit(bad_names_quarantined):
    names = bad_names_quarantined
    assert (names.first.outcome, names.first.quarantined_files) == ("committed", len(FILE_CASES))
    assert sorted(names.quarantined) == sorted(os.path.join(names.landing, r) for r, _ in FILE_CASES.values())
    assert (names.second.outcome, names.second.quarantined_files) == ("committed", 0)  # reported once
    assert names.ids == [1, 2, 3, 9]


def late_arrival_setup(consensus, blob, tmp_path, spark, mode):
    shard = shard_with(consensus, blob, tmp_path, {"p0/0.jsonl": [rec(1)], "p0/10.jsonl": [rec(2)]})
    w = Writer(shard, "w", spark_factory=lambda: spark, on_bad_record=mode)
    assert w.step().outcome == "committed"  # binds [0, 11)
    write_segment(str(tmp_path / "landing" / "p0" / "5.jsonl"), [rec(5)])
    write_segment(str(tmp_path / "landing" / "p0" / "30.jsonl"), [rec(30)])
    return shard, w


@sqlite_only
def test_late_arrival_fails_naming_the_file(spark, consensus, blob, tmp_path):
    shard, w = late_arrival_setup(consensus, blob, tmp_path, spark, "fail")
    with pytest.raises(BadInputError) as info:
        w.step()
    record = info.value.details["records"][0]
    assert record["file"] == str(tmp_path / "landing" / "p0" / "5.jsonl")
    assert "late arrival: offset 5 is below the bound offset 11" in record["reason"]
    assert shard.state().upper == 1 and shard.binding(1) is None


@sqlite_only
def test_late_arrival_quarantined_and_later_batches_proceed(spark, consensus, blob, tmp_path):
    shard, w = late_arrival_setup(consensus, blob, tmp_path, spark, "quarantine")
    result = w.step()
    assert (result.outcome, result.quarantined_files) == ("committed", 1)
    assert sorted(k[0] for k in table(shard)) == [1, 2, 30]
    assert "late arrival" in shard.consensus.quarantined_files(shard.shard_id)[str(tmp_path / "landing" / "p0" / "5.jsonl")]
    # Not reported again.
    write_segment(str(tmp_path / "landing" / "p0" / "40.jsonl"), [rec(40)])
    assert w.step().quarantined_files == 0


@sqlite_only
def test_unreadable_segment_fails_or_is_quarantined(spark, consensus, blob, tmp_path):
    shard = shard_with(consensus, blob, tmp_path, {"p0/0.jsonl": GOOD})
    (tmp_path / "landing" / "p0" / "10.jsonl").mkdir()  # a directory where a segment should be
    with pytest.raises(BadInputError) as info:
        Writer(shard, "w", spark_factory=lambda: spark).step()
    assert info.value.details["records"][0]["file"] == str(tmp_path / "landing" / "p0" / "10.jsonl")
    assert "directory" in info.value.details["records"][0]["reason"]
    assert shard.state().upper == 0

    result = Writer(shard, "w2", spark_factory=lambda: spark, on_bad_record="quarantine").step()
    assert (result.outcome, result.quarantined_files) == ("committed", 1)
    assert sorted(k[0] for k in table(shard)) == [1, 2, 3]
    # The offset range still covers it: the frontier moved past, it is never read later.
    assert shard.bound_offsets(1) == {"p0": 11}


@sqlite_only
def test_bound_segment_removed_before_its_batch_commits(spark, consensus, blob, tmp_path):
    shard = shard_with(consensus, blob, tmp_path, {"p0/0.jsonl": GOOD})
    shard.mint_binding(0, minted_by="m")
    os.unlink(tmp_path / "landing" / "p0" / "0.jsonl")
    with pytest.raises(BadInputError, match="bound to batch 0 are missing"):
        Writer(shard, "w", spark_factory=lambda: spark, on_bad_record="quarantine").step()
    assert shard.state().upper == 0


# -- Parquet segments -------------------------------------------------------------------------


def write_parquet(path, table):
    import pyarrow.parquet as pq

    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(table, path)


@sqlite_only
def test_parquet_segments_upsert_and_schema_mismatch_names_file_and_field(spark, consensus, blob, tmp_path):
    import pyarrow as pa

    landing = tmp_path / "landing"
    good = pa.table({"id": [1, 2, 2], "name": ["a", "b", "b2"], "amount": [1.0, 2.0, 3.0],
                     "updated_at": [1, 1, 2], "deleted": [False, False, False]})
    write_parquet(str(landing / "p0" / "0.parquet"), good)
    shard = make_shard(consensus, blob, tmp_path, source_format="parquet")
    result = Writer(shard, "w", spark_factory=lambda: spark).step()
    assert (result.rows_in, result.rows_out) == (3, 2)
    assert {k[0]: v["name"] for k, v in table(shard).items()} == {1: "a", 2: "b2"}

    wrong = pa.table({"id": [3], "amount": ["not a number"]})
    write_parquet(str(landing / "p0" / "10.parquet"), wrong)
    with pytest.raises(BadInputError) as info:
        Writer(shard, "w", spark_factory=lambda: spark).step()
    record = info.value.details["records"][0]
    assert record["file"] == str(landing / "p0" / "10.parquet")
    assert record["reason"] == "field 'amount': expected double, got string"
    assert shard.binding(1) is None

    (landing / "p0" / "20.parquet").write_bytes(b"not parquet at all")
    result = Writer(shard, "w", spark_factory=lambda: spark, on_bad_record="quarantine").step()
    assert (result.outcome, result.quarantined_files) == ("committed", 2)
    reasons = shard.consensus.quarantined_files(shard.shard_id)
    assert reasons[str(landing / "p0" / "20.parquet")] == "not a Parquet file (bad magic bytes)"
    assert sorted(k[0] for k in table(shard)) == [1, 2]


def test_user_columns_may_not_use_engine_column_names(tmp_path):
    from airflow_upsert_provider.engine.config import ShardConfig
    from airflow_upsert_provider.engine.errors import ConfigurationError
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    schema = StructType([StructField("id", LongType()), StructField("_corrupt", StringType())]).json()
    with pytest.raises(ConfigurationError, match=r"\['_corrupt'\] are reserved"):
        ShardConfig(source=f"dir:{tmp_path}", keys=("id",), schema=schema)


@sqlite_only
@pytest.mark.parametrize("mode", ["fail", "quarantine"])
def test_batch_whose_every_record_is_bad(mode, spark, consensus, blob, tmp_path):
    """Nothing good to write must not lose the count of what was rejected (Spark drops the
    observed totals of an empty write)."""
    shard = shard_with(consensus, blob, tmp_path, {"p0/0.jsonl": ["not json", '{"id": null}']})
    writer = Writer(shard, "w", spark_factory=lambda: spark, on_bad_record=mode)
    if mode == "fail":
        with pytest.raises(BadInputError) as info:
            writer.step()
        assert info.value.details["count"] == 2
        assert shard.state().upper == 0
        return
    result = writer.step()
    assert (result.outcome, result.rows_in, result.rejected, result.rows_out) == ("committed", 2, 2, 0)
    assert table(shard) == {}
