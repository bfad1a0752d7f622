"""Directory batches apply the shard's schema evolution policy, on a real Spark batch (one
session, SQLite; the racing writers on PostgreSQL too, about 10 s more): a JSON Lines field and
a Parquet column become nullable columns, an overflowing integer widens its column under
add_and_widen and is refused under add_columns (binding and upper untouched, nothing minted),
policy none makes a record carrying such a field bad, naming it, files that disagree on a new
field's type are refused naming both, two writers of one batch through a schema change stage
the same batch with one version, and a field seen only in rejected records changes no schema."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_upsert_provider.engine.config import ShardConfig
from airflow_upsert_provider.engine.errors import BadInputError, BatchSchemaRefused
from airflow_upsert_provider.engine.store.table_schemas import run_schema_version, schema_history
from airflow_upsert_provider.engine.table.schema_apply import set_schema_policy
from airflow_upsert_provider.engine.table.schema_evolution import ADD_AND_WIDEN, ADD_COLUMNS, NONE
from airflow_upsert_provider.engine.table.shard import Shard
from airflow_upsert_provider.engine.write.writer import Writer
from tests.conftest import sqlite_only
from tests.helpers import quarantined_records, table

def schema(*columns: tuple[str, str]) -> str:
    return json.dumps({"type": "struct", "fields": [
        {"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in columns]})


def land(landing, partition: str, seq: int, records: list[dict]) -> str:
    part = landing / partition
    part.mkdir(parents=True, exist_ok=True)
    path = part / f"{seq}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def shard_of(consensus, blob, tmp_path, name: str, policy: str, columns=(("id", "long"), ("v", "integer")),
             source_format: str = "jsonl") -> tuple[Shard, object]:
    landing = tmp_path / name
    landing.mkdir()
    config = ShardConfig(source=f"dir:{landing}", keys=("id",), schema=schema(*columns), buckets=2,
                         max_files_per_batch=2, source_format=source_format)
    shard = Shard.create(consensus, blob, name, config)
    set_schema_policy(shard, policy, "test")
    return shard, landing


def versions(shard: Shard) -> list[tuple[int, dict]]:
    return [(v.version, v.change) for v in schema_history(shard.consensus, shard.shard_id, shard.config.schema)][1:]


def columns_of(shard: Shard) -> list[tuple[str, str]]:
    return [(f["name"], f["type"]) for f in json.loads(Shard.open(shard.consensus, shard.blob, shard.shard_id)
                                                       .config.schema)["fields"]]


@sqlite_only
def test_a_jsonl_field_becomes_a_nullable_column_and_older_rows_read_null(spark, consensus, blob, tmp_path):
    shard, landing = shard_of(consensus, blob, tmp_path, "jsonl", ADD_COLUMNS)
    writer = Writer(shard, "w", spark_factory=lambda: spark)
    land(landing, "p0", 1, [{"id": 1, "v": 1}, {"id": 2, "v": 2}])
    assert writer.step().outcome == "committed"
    # Null in every record of one file: says nothing of its type there.
    land(landing, "p0", 2, [{"id": 3, "v": 3, "email": "c@x"}, {"id": 1, "v": 10, "note": None}])
    land(landing, "p1", 1, [{"id": 4, "v": 4, "email": None}])
    result = writer.step()
    assert (result.outcome, result.rows_in, result.unknown_fields) == ("committed", 3, {})
    assert versions(shard) == [(2, {"add": [{"name": "email", "type": "string"}]})]
    assert [run_schema_version(b.run) for b in shard.batches()] == [1, 2]
    assert table(shard) == {
        (1,): {"id": 1, "v": 10, "email": None}, (2,): {"id": 2, "v": 2, "email": None},
        (3,): {"id": 3, "v": 3, "email": "c@x"}, (4,): {"id": 4, "v": 4, "email": None}}


@sqlite_only
def test_a_parquet_file_with_a_new_column(spark, consensus, blob, tmp_path):
    shard, landing = shard_of(consensus, blob, tmp_path, "parquet", ADD_COLUMNS, source_format="parquet")
    (landing / "p0").mkdir()
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int64()), "v": pa.array([1, 2], pa.int32())}),
                   str(landing / "p0" / "1.parquet"))
    pq.write_table(pa.table({"id": pa.array([3], pa.int64()), "v": pa.array([3], pa.int32()),
                             "price": pa.array([9.5], pa.float64())}), str(landing / "p0" / "2.parquet"))
    result = Writer(shard, "w", spark_factory=lambda: spark).step()
    assert (result.outcome, result.rows_in) == ("committed", 3)
    assert columns_of(shard) == [("id", "long"), ("v", "integer"), ("price", "double")]
    assert [run_schema_version(b.run) for b in shard.batches()] == [2]
    assert table(shard) == {(1,): {"id": 1, "v": 1, "price": None}, (2,): {"id": 2, "v": 2, "price": None},
                            (3,): {"id": 3, "v": 3, "price": 9.5}}


@sqlite_only
def test_an_overflowing_integer_is_refused_under_add_columns_leaving_everything_then_widened(
    spark, consensus, blob, tmp_path
):
    shard, landing = shard_of(consensus, blob, tmp_path, "widen", ADD_COLUMNS)
    big = 2 ** 40
    land(landing, "p0", 1, [{"id": 1, "v": 1}, {"id": 2, "v": big}])
    writer = Writer(shard, "w", spark_factory=lambda: spark, on_bad_record="quarantine")
    with pytest.raises(BatchSchemaRefused) as refused:
        writer.step()
    assert refused.value.details["column"] == "v" and refused.value.details["old_type"] == "integer"
    assert refused.value.details["new_type"] == "long" and "policy add_columns does not widen" in str(refused.value)
    # Nothing lost: no version, nothing committed, the binding stays for the next attempt.
    binding = shard.binding(0)
    assert (shard.state().upper, versions(shard), shard.batches()) == (0, [], [])
    assert binding is not None

    set_schema_policy(shard, ADD_AND_WIDEN, "ops")
    result = Writer(Shard.open(consensus, blob, "widen"), "w2", spark_factory=lambda: spark).step()
    assert (result.outcome, result.rows_in, result.rejected) == ("committed", 2, 0)
    assert shard.binding(0) == binding
    assert versions(shard) == [(2, {"widen": [{"name": "v", "old_type": "integer", "new_type": "long"}]})]
    assert table(shard) == {(1,): {"id": 1, "v": 1}, (2,): {"id": 2, "v": big}}


@sqlite_only
def test_policy_none_makes_a_record_with_an_unnamed_field_bad_naming_it(spark, consensus, blob, tmp_path):
    shard, landing = shard_of(consensus, blob, tmp_path, "strict", NONE)
    path = land(landing, "p0", 1, [{"id": 1, "v": 1}, {"id": 2, "v": 2, "email": "b@x"}])
    with pytest.raises(BadInputError) as failed:
        Writer(shard, "w", spark_factory=lambda: spark).step()
    reason = ("field 'email' is not a column of the shard's schema (schema evolution policy none: add it with "
              "`upsertctl schema add-column`, or set a policy that adds columns)")
    assert failed.value.details["records"] == [{"file": path, "line": 2, "reason": reason}]
    assert shard.state().upper == 0

    result = Writer(shard, "w", spark_factory=lambda: spark, on_bad_record="quarantine").step()
    assert (result.outcome, result.rows_in, result.rejected) == ("committed", 2, 1)
    assert [(r["line"], r["reason"]) for r in quarantined_records(shard)] == [(2, reason)]
    assert table(shard) == {(1,): {"id": 1, "v": 1}} and versions(shard) == []


@sqlite_only
def test_files_that_disagree_on_a_new_fields_type_are_refused_naming_both(spark, consensus, blob, tmp_path):
    shard, landing = shard_of(consensus, blob, tmp_path, "disagree", ADD_COLUMNS)
    first = land(landing, "p0", 1, [{"id": 1, "v": 1, "code": "A1"}])
    second = land(landing, "p1", 1, [{"id": 2, "v": 2, "code": 7}])
    with pytest.raises(BatchSchemaRefused) as refused:
        Writer(shard, "w", spark_factory=lambda: spark, on_bad_record="quarantine").step()
    assert refused.value.details["files"] == [first, second]
    assert f"string in {first}, long in {second}" in str(refused.value)
    assert (shard.state().upper, versions(shard)) == (0, [])


def test_two_writers_of_one_batch_through_a_schema_change_stage_the_same_batch(spark, consensus, blob, tmp_path):
    """The second writer's handle was opened before the first minted the version: it stages
    the same batch with the same version, and loses the append to the first."""
    shard, landing = shard_of(consensus, blob, tmp_path, "race", ADD_COLUMNS)
    land(landing, "p0", 1, [{"id": 1, "v": 1, "email": "a@x"}, {"id": 2, "v": 2}])
    writers = [Writer(Shard.open(consensus, blob, "race"), name, spark_factory=lambda: spark) for name in ("a", "b")]
    assert shard.mint_binding(0, minted_by="test") is not None
    staged = [writer.stage(0) for writer in writers]
    assert [w.shard.config.schema_version for w in writers] == [2, 2] and len(versions(shard)) == 1
    contents = []
    for one in staged:
        files = sorted(one.run["files"], key=lambda f: f["path"].rsplit("/", 1)[-1])
        contents.append([pq.read_table(blob.path(f["path"])).to_pylist() for f in files])
        assert run_schema_version(one.run) == 2
    assert contents[0] == contents[1] and sum(map(len, contents[0])) == 2
    assert writers[0].append(staged[0]) == "committed"
    assert writers[1].append(staged[1]) != "committed"
    assert table(shard) == {(1,): {"id": 1, "v": 1, "email": "a@x"}, (2,): {"id": 2, "v": 2, "email": None}}


def test_the_drivers_overflow_count_equals_sparks(spark, tmp_path):
    """A batch up to 64 MB is checked on the driver, a bigger one by Spark: one answer for
    values at and beyond each bound, other JSON types and lines that are no records."""
    import random

    from airflow_upsert_provider.engine.sources import Segment
    from airflow_upsert_provider.engine.write import records as R
    from tests.test_unknown_fields import LINE_SHAPES

    config = ShardConfig(source=f"dir:{tmp_path}", keys=("id",), schema=schema(
        ("id", "long"), ("b", "byte"), ("s", "short"), ("i", "integer"), ("f", "float"), ("d", "double")))
    values = [0, 127, 128, -129, 32767, 32768, 2 ** 31 - 1, 2 ** 31, -(2 ** 31) - 1, 2 ** 63, 1.5, 3.5e38, -1e39,
              "1", None, True, [1], {"x": 1}]
    rng = random.Random(36)
    segments = []
    for index in range(3):
        path = tmp_path / f"p{index}" / "0.jsonl"
        path.parent.mkdir()
        lines = [json.dumps({"id": n, **{c: rng.choice(values) for c in "bsifd" if rng.random() < 0.7}}).encode()
                 for n in range(40)] + rng.sample(LINE_SHAPES, 4)
        path.write_bytes(b"\n".join(lines) + b"\n")
        segments.append(Segment(0, f"p{index}", str(path)))
    widen = R.widenable_columns(config)
    on_driver = sorted(R.jsonl_field_counts_on_driver(config, segments, widen=widen))
    on_spark = sorted((f, n, R.local_path(file))
                      for f, n, file in R._jsonl_field_counts_spark(spark, config, segments, widen=widen))
    assert on_driver == on_spark
    assert {f for f, _, _ in on_driver} >= {"b", "s", "i", "f"} and "d" not in {f for f, _, _ in on_driver}


@sqlite_only
def test_a_field_or_an_overflow_carried_only_by_rejected_records_changes_no_schema(spark, consensus, blob, tmp_path):
    """Only records that pass the checks of the schema's columns are observed: a field (or an
    overflowing value) seen only in a record rejected for invalid UTF-8, malformed JSON, a null
    or missing key or a value of the wrong type becomes no column (and widens none); a field of
    an accepted record does."""
    shard, landing = shard_of(consensus, blob, tmp_path, "rejected", ADD_AND_WIDEN)
    (landing / "p0").mkdir()
    path = landing / "p0" / "1.jsonl"
    path.write_bytes(b"\n".join([
        b'{"id": 1, "v": 1, "kept": "k"}',
        b'{"id": 2, "v": 2, "bad_utf8": "\xff"}',
        b'{"id": 3, "v": 3, "trailing": 1} x',
        b'{"id": null, "v": 4, "null_key": 1}',
        b'{"v": 5, "no_key": 1}',
        b'{"id": 6, "v": "six", "wrong_type": 1}',
        b'{"id": null, "v": 1099511627776}',
    ]) + b"\n")
    result = Writer(shard, "w", spark_factory=lambda: spark, on_bad_record="quarantine").step()
    assert (result.outcome, result.rows_in, result.rejected) == ("committed", 7, 6)
    assert versions(shard) == [(2, {"add": [{"name": "kept", "type": "string"}]})]
    assert columns_of(shard) == [("id", "long"), ("v", "integer"), ("kept", "string")]
    assert table(shard) == {(1,): {"id": 1, "v": 1, "kept": "k"}}
    assert [r["line"] for r in quarantined_records(shard)] == [2, 3, 4, 5, 6, 7]
