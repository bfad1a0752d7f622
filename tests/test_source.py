"""The directory source and binding planning: segment names (zero-padded, duplicate offsets,
offsets beyond BIGINT, trailing newlines), late arrivals decided against the set of bound
offsets (also after retention deleted bound files), the settled-names index that keeps
planning O(new files), and the exact Parquet type check. Pure decisions are tested without
Spark or a database; the rest through a shard, in both bad-record modes."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_upsert_provider.engine.table import binding_planner
from airflow_upsert_provider.engine.store import source_index
from airflow_upsert_provider.engine.config import ShardConfig, validate_shard_id
from airflow_upsert_provider.engine.errors import BadInputError, ConfigurationError
from airflow_upsert_provider.engine.sources import DirectorySource, Segment
from airflow_upsert_provider.engine.sources import planning
from airflow_upsert_provider.engine.sources.directory import MAX_OFFSET, segment_offset
from airflow_upsert_provider.engine.sources.parquet_types import parquet_schema_problem, type_problem
from airflow_upsert_provider.engine.sources.planning import late_arrival_reason, range_files, sort_out_new_names
from airflow_upsert_provider.engine.write.writer import Writer
from airflow_upsert_provider.sample_data import write_segment
from tests.conftest import sqlite_only
from tests.helpers import batch, make_shard
from tests.oracle import table_from_rows


def rec(id_: int) -> str:
    return json.dumps({"id": id_, "name": "n", "amount": 1.0, "updated_at": 1, "deleted": False})


def land(tmp_path, relative: str, *ids: int) -> str:
    path = str(tmp_path / "landing" / relative)
    write_segment(path, [rec(i) for i in ids or (0,)])
    return path


def ids(shard, spark) -> list[int]:
    return sorted(k[0] for k in table_from_rows(shard.read(spark).collect()))


def commit_next(shard, mode: str = "fail"):
    """Mint binding(upper) and commit an empty batch for it: planning without Spark."""
    upper = shard.state().upper
    minted = shard.mint_binding(upper, minted_by="t", on_bad_record=mode)
    if minted is not None:
        shard.compare_and_append(upper, upper + 1, batch(upper))
    return minted


# -- names: pure -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, offset",
    [("42.jsonl", 42), ("00000000000000000042.jsonl", 42), ("0.jsonl", 0), ("000.jsonl", 0),
     (f"{MAX_OFFSET}.jsonl", MAX_OFFSET)],
)
def test_segment_names_zero_padded_are_their_offset(name, offset):
    assert segment_offset(name, "jsonl") == (offset, None)


@pytest.mark.parametrize(
    "name, reason",
    [
        ("1.jsonl\n", "is not <offset>.jsonl"),
        ("99999999999999999999.jsonl", "offset beyond the largest offset"),
        (f"{MAX_OFFSET + 1}.jsonl", "offset beyond the largest offset"),
        ("\u0663.jsonl", "is not a non-negative integer offset"),  # a non-ASCII digit
        ("-1.jsonl", "is not a non-negative integer offset"),
        ("7.parquet", "is not jsonl"),
        ("7.json", "is not <offset>.jsonl"),
        ("abc.jsonl", "is not a non-negative integer offset"),
    ],
)
def test_segment_names_that_are_bad_input(name, reason):
    offset, why = segment_offset(name, "jsonl")
    assert offset is None and reason in why


def test_partition_and_shard_id_with_trailing_newline_are_refused(tmp_path):
    os.makedirs(tmp_path / "p1\n")
    with pytest.raises(ConfigurationError, match="unusable name"):
        DirectorySource(str(tmp_path)).partitions()
    with pytest.raises(ConfigurationError, match="invalid shard id"):
        validate_shard_id("abc\n")
    assert validate_shard_id("abc") == "abc"


def test_new_names_only_are_sorted_out_and_duplicate_offsets_name_both():
    listing = {"0.jsonl", "1.jsonl", "9.jsonl", "09.jsonl", "12.jsonl", "3.jsonl", "_SUCCESS", "x.jsonl"}
    new = sort_out_new_names("p0", "/l/p0", listing, {"0.jsonl", "1.jsonl"}, 5, "jsonl")
    assert new.candidates == [Segment(12, "p0", "/l/p0/12.jsonl")]
    assert new.below == [Segment(3, "p0", "/l/p0/3.jsonl")]
    assert new.ignored == ["_SUCCESS"]
    assert [b.path for b in new.bad] == ["/l/p0/09.jsonl", "/l/p0/9.jsonl", "/l/p0/x.jsonl"]
    clash = "2 segments with offset 9 in partition 'p0': 09.jsonl, 9.jsonl"
    assert [b.reason for b in new.bad[:2]] == [clash, clash]


def test_late_arrival_is_decided_against_the_bound_set_not_a_count():
    # S4: 1 and 2 bound in [0, 3); 1 deleted by retention; 0 lands: as many files below the
    # frontier as were bound, yet 0 was never bound.
    covering = {"from": 0, "to": 3, "files": [[1, "1.jsonl"], [2, "2.jsonl"]]}
    new = sort_out_new_names("p0", "/l/p0", {"0.jsonl", "2.jsonl"}, {"1.jsonl", "2.jsonl"}, 3, "jsonl")
    assert new.below == [Segment(0, "p0", "/l/p0/0.jsonl")]
    reason = late_arrival_reason(new.below[0], 3, covering, ".jsonl")
    assert reason == "late arrival: offset 0 is below the bound offset 3 of partition 'p0'"
    # A bound segment put back is not late; another name for a bound offset is, naming both.
    assert late_arrival_reason(Segment(1, "p0", "/l/p0/1.jsonl"), 3, covering, ".jsonl") is None
    other = late_arrival_reason(Segment(1, "p0", "/l/p0/01.jsonl"), 3, covering, ".jsonl")
    assert other.endswith("that offset is bound to '1.jsonl'")


def test_bindings_minted_before_names_were_recorded_still_name_their_files():
    assert range_files({"files": [0, 5]}, ".jsonl") == [(0, "0.jsonl"), (5, "5.jsonl")]
    assert range_files({"files": [[42, "00042.jsonl"]]}, ".jsonl") == [(42, "00042.jsonl")]


# -- Parquet types: pure ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spark_type, arrow_type, ok",
    [
        ("integer", pa.int64(), False),  # D20
        ("integer", pa.int32(), True),
        ("integer", pa.int16(), True),
        ("integer", pa.uint32(), False),
        ("integer", pa.month_day_nano_interval(), False),
        ("long", pa.int32(), True),
        ("long", pa.uint64(), False),
        ("short", pa.int32(), False),
        ("byte", pa.int8(), True),
        ("double", pa.float32(), True),
        ("double", pa.int64(), False),
        ("float", pa.float64(), False),
        ("string", pa.large_string(), True),
        ("string", pa.binary(), False),
        ("date", pa.date32(), True),
        ("timestamp", pa.timestamp("us", tz="UTC"), True),
        ("timestamp", pa.timestamp("us"), False),
        ("timestamp_ntz", pa.timestamp("us"), True),
        ("timestamp", pa.timestamp("ns", tz="UTC"), False),
        ("decimal(12,4)", pa.decimal128(10, 3), True),
        ("decimal(12,2)", pa.decimal128(20, 2), False),
        ("decimal(10,2)", pa.decimal128(10, 3), False),
        ("decimal(10,2)", pa.int32(), False),
        ({"type": "array", "elementType": "long", "containsNull": True}, pa.list_(pa.int32()), True),
        ({"type": "array", "elementType": "integer", "containsNull": True}, pa.list_(pa.int64()), False),
        ({"type": "map", "keyType": "string", "valueType": "long", "valueContainsNull": True},
         pa.map_(pa.string(), pa.int32()), True),
        ({"type": "struct", "fields": [{"name": "a", "type": "integer", "nullable": True, "metadata": {}}]},
         pa.struct([("a", pa.int64())]), False),
        ({"type": "struct", "fields": [{"name": "a", "type": "long", "nullable": True, "metadata": {}}]},
         pa.struct([("a", pa.int32()), ("b", pa.string())]), True),
        ("variant", pa.string(), False),
    ],
)
def test_parquet_type_check_is_exact(spark_type, arrow_type, ok):
    assert (type_problem(spark_type, arrow_type) is None) == ok


def test_parquet_schema_problem_names_field_and_both_types(tmp_path):
    path = str(tmp_path / "0.parquet")
    pq.write_table(pa.table({"id": pa.array([1], pa.int64()), "n": pa.array([1], pa.int64())}), path)
    fields = [{"name": "id", "type": "long"}, {"name": "n", "type": "integer"}]
    assert parquet_schema_problem(path, fields, ("id",)) == "field 'n': expected integer, got int64"


# -- planning through a shard, no Spark ---------------------------------------------------------------


def test_late_arrival_after_retention_fails_then_is_quarantined_without_spark(consensus, blob, tmp_path):
    land(tmp_path, "p0/1.jsonl", 1)
    land(tmp_path, "p0/2.jsonl", 2)
    shard = make_shard(consensus, blob, tmp_path)
    assert commit_next(shard).ranges["p0"]["to"] == 3
    os.unlink(tmp_path / "landing" / "p0" / "1.jsonl")
    late = land(tmp_path, "p0/0.jsonl", 100)
    with pytest.raises(BadInputError) as info:
        commit_next(shard)
    assert info.value.details["records"] == [
        {"file": late, "reason": "late arrival: offset 0 is below the bound offset 3 of partition 'p0'"}
    ]
    minted = commit_next(shard, "quarantine")
    assert [q["file"] for q in minted.quarantined] == [late]
    assert commit_next(shard) is None  # set aside once, not reported again


def test_partition_with_trailing_newline_stops_both_modes_until_renamed(consensus, blob, tmp_path):
    land(tmp_path, "p0/0.jsonl", 1)
    shard = make_shard(consensus, blob, tmp_path)
    land(tmp_path, "p1\n/0.jsonl", 2)
    for mode in ("fail", "quarantine"):
        with pytest.raises(ConfigurationError, match="unusable name") as info:
            commit_next(shard, mode)
        assert info.value.exit_code == 2 and repr(str(tmp_path / "landing" / "p1\n")) in info.value.message
    os.rename(tmp_path / "landing" / "p1\n", tmp_path / "landing" / "p1")
    assert sorted(commit_next(shard).ranges) == ["p0", "p1"]


def test_padded_names_are_bound_by_their_real_name(consensus, blob, tmp_path):
    first = land(tmp_path, "p0/00000000000000000000.jsonl", 1)
    second = land(tmp_path, "p0/00000000000000000042.jsonl", 2)
    shard = make_shard(consensus, blob, tmp_path)
    minted = commit_next(shard)
    assert minted.ranges["p0"]["to"] == 43
    assert [s.path for s in shard.segment_paths(minted)] == [first, second]


def test_duplicate_offset_fails_naming_both_and_quarantine_sets_both_aside(consensus, blob, tmp_path):
    land(tmp_path, "p0/0.jsonl", 1)
    nine = land(tmp_path, "p0/9.jsonl", 2)
    zero_nine = land(tmp_path, "p0/09.jsonl", 3)
    shard = make_shard(consensus, blob, tmp_path)
    with pytest.raises(BadInputError) as info:
        commit_next(shard)
    assert [r["file"] for r in info.value.details["records"]] == [zero_nine, nine]
    assert "09.jsonl, 9.jsonl" in info.value.message
    minted = commit_next(shard, "quarantine")
    assert sorted(q["file"] for q in minted.quarantined) == [zero_nine, nine]
    assert [s.seq for s in shard.segment_paths(minted)] == [0]


def test_bound_segment_put_back_is_not_late(consensus, blob, tmp_path):
    path = land(tmp_path, "p0/1.jsonl", 1)
    shard = make_shard(consensus, blob, tmp_path)
    commit_next(shard)
    with open(path) as handle:
        kept = handle.read()
    os.unlink(path)
    assert commit_next(shard) is None
    with open(path, "w") as handle:
        handle.write(kept)
    assert commit_next(shard) is None


def test_settled_names_are_an_accelerator_not_the_authority(consensus, blob, tmp_path, monkeypatch):
    """Without its rows, or with rows another shard of the same id left, planning reaches
    the same verdicts from the bindings."""
    monkeypatch.setattr(binding_planner, "SAVE_EVERY_BINDINGS", 1)
    for offset in range(5):
        land(tmp_path, f"p0/{offset}.jsonl", offset)
    shard = make_shard(consensus, blob, tmp_path, max_files_per_batch=2)
    for _ in range(3):
        commit_next(shard)
    land(tmp_path, "p0/10.jsonl", 10)
    table = source_index.settled_names_table
    assert consensus.run_in_transaction(lambda conn: conn.execute(table.delete()).rowcount) == 1
    assert shard.mint_binding(3, minted_by="t").ranges["p0"]["files"] == [[10, "10.jsonl"]]
    # A forged row claiming a late file is settled is ignored: it matches no binding.
    forged = table.update().values(binding_digest="0" * 64, names="3.jsonl/7.jsonl")
    assert consensus.run_in_transaction(lambda conn: conn.execute(forged).rowcount) == 1
    shard.compare_and_append(3, 4, batch(3))
    late = land(tmp_path, "p0/7.jsonl", 7)
    with pytest.raises(BadInputError) as info:
        commit_next(shard)
    assert [r["file"] for r in info.value.details["records"]] == [late]


def test_planning_parses_only_new_names_and_reads_no_binding_history(consensus, blob, tmp_path, monkeypatch):
    for offset in range(200):
        land(tmp_path, f"p0/{offset}.jsonl", offset)
    shard = make_shard(consensus, blob, tmp_path, max_files_per_batch=200)
    commit_next(shard)
    land(tmp_path, "p0/500.jsonl", 500)
    parsed: list[str] = []
    real = planning.segment_offset
    monkeypatch.setattr(planning, "segment_offset", lambda name, fmt: parsed.append(name) or real(name, fmt))
    monkeypatch.setattr(type(consensus), "bindings", lambda *a, **k: pytest.fail("read every binding"))
    minted = commit_next(shard)
    assert parsed == ["500.jsonl"]
    assert minted.ranges["p0"]["files"] == [[500, "500.jsonl"]]


# -- through Spark, both modes: no shard may wedge ---------------------------------------------------


@sqlite_only
@pytest.mark.parametrize("mode", ["fail", "quarantine"])
def test_s4_late_segment_hidden_by_retention(mode, spark, consensus, blob, tmp_path):
    land(tmp_path, "p0/1.jsonl", 1)
    land(tmp_path, "p0/2.jsonl", 2)
    shard = make_shard(consensus, blob, tmp_path)
    w = Writer(shard, "w", spark_factory=lambda: spark, on_bad_record=mode)
    assert w.step().outcome == "committed"
    os.unlink(tmp_path / "landing" / "p0" / "1.jsonl")  # retention: its batch committed
    late = land(tmp_path, "p0/0.jsonl", 100)
    if mode == "fail":
        with pytest.raises(BadInputError, match="late arrival: offset 0") as info:
            w.step()
        assert info.value.details["records"][0]["file"] == late
        assert shard.state().upper == 1
    else:
        result = w.step()
        assert (result.outcome, result.quarantined_files) == ("committed", 1)
        assert "late arrival" in shard.consensus.quarantined_files(shard.shard_id)[late]
        assert ids(shard, spark) == [1, 2]


@sqlite_only
@pytest.mark.parametrize("mode", ["fail", "quarantine"])
@pytest.mark.parametrize(
    "name, reason",
    [("99999999999999999999.jsonl", "offset beyond the largest offset"),
     ("1.jsonl\n", "is not <offset>.jsonl")],
)
def test_s9_s10_names_that_wedged_a_shard_are_bad_input(mode, name, reason, spark, consensus, blob, tmp_path):
    land(tmp_path, "p0/0.jsonl", 1)
    bad = land(tmp_path, f"p0/{name}", 2)
    shard = make_shard(consensus, blob, tmp_path)
    w = Writer(shard, "w", spark_factory=lambda: spark, on_bad_record=mode)
    if mode == "fail":
        with pytest.raises(BadInputError) as info:
            w.step()
        assert info.value.details["records"] == [{"file": bad, "reason": info.value.details["records"][0]["reason"]}]
        assert reason in info.value.details["records"][0]["reason"]
        assert shard.binding(0) is None
        os.unlink(bad)  # the user removes it: the next run is not stuck
        assert w.step().outcome == "committed"
    else:
        assert w.step().quarantined_files == 1
        assert reason in shard.consensus.quarantined_files(shard.shard_id)[bad]
        land(tmp_path, "p0/5.jsonl", 5)
        assert w.step().outcome == "committed"
    assert ids(shard, spark) == ([1] if mode == "fail" else [1, 5])


@sqlite_only
def test_zero_padded_segments_upsert_end_to_end(spark, consensus, blob, tmp_path):
    land(tmp_path, "p0/00000000000000000000.jsonl", 1, 2)
    land(tmp_path, "p0/00000000000000000002.jsonl", 3)
    shard = make_shard(consensus, blob, tmp_path)
    result = Writer(shard, "w", spark_factory=lambda: spark).step()
    assert (result.outcome, result.rows_in) == ("committed", 3)
    assert ids(shard, spark) == [1, 2, 3]
    assert shard.status().to_dict()["source"]["high_watermark"] == {"p0": 3}


@sqlite_only
@pytest.mark.parametrize("mode", ["fail", "quarantine"])
def test_d20_parquet_int64_into_int_is_bad_input(mode, spark, consensus, blob, tmp_path):
    from pyspark.sql.types import IntegerType, LongType, StructField, StructType

    landing = tmp_path / "landing" / "p0"
    landing.mkdir(parents=True)
    pq.write_table(pa.table({"id": pa.array([1], pa.int64()), "n": pa.array([7], pa.int32())}), landing / "0.parquet")
    wide = str(landing / "1.parquet")
    pq.write_table(pa.table({"id": pa.array([2], pa.int64()), "n": pa.array([8], pa.int64())}), wide)
    schema = StructType([StructField("id", LongType()), StructField("n", IntegerType())]).json()
    config = ShardConfig(source=f"dir:{tmp_path / 'landing'}", keys=("id",), schema=schema, source_format="parquet")
    from airflow_upsert_provider.engine.table.shard import Shard

    shard = Shard.create(consensus, blob, "d20", config)
    w = Writer(shard, "w", spark_factory=lambda: spark, on_bad_record=mode)
    # A widening, which the default policy add_columns does not make (tests/schema/test_parquet_widen*.py).
    expected = ("field 'n': expected integer, got int64, a widening to long: policy add_columns does not widen "
                "a column (add_and_widen does)")
    if mode == "fail":
        with pytest.raises(BadInputError) as info:
            w.step()
        assert info.value.details["records"] == [{"file": wide, "reason": expected}]
        os.unlink(wide)
        assert w.step().outcome == "committed"
    else:
        assert w.step().quarantined_files == 1
        assert shard.consensus.quarantined_files(shard.shard_id)[wide] == expected
    assert sorted(r["id"] for r in shard.read(spark).collect()) == [1]
