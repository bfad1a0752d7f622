"""Parquet widening under the schema evolution policies, without Spark: which type a column
widens to so that it reads a file's column (a sweep over Spark column types x Parquet types),
the bind-time verdict on a file over that grid x policies x column roles, a binding minted on a
real store (SQLite) under each policy, and what a bound batch observes from the footers."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_upsert_provider.engine.config import ShardConfig
from airflow_upsert_provider.engine.errors import BadInputError
from airflow_upsert_provider.engine.sources import Segment
from airflow_upsert_provider.engine.sources.parquet_types import parquet_schema_problem, type_problem, widened_type
from airflow_upsert_provider.engine.table.schema_apply import set_schema_policy
from airflow_upsert_provider.engine.table.schema_evolution import (
    ADD_AND_WIDEN,
    NONE,
    POLICIES,
    ObservedField,
    locked_columns,
    widening_refusal,
    widens,
)
from airflow_upsert_provider.engine.table.shard import Shard
from airflow_upsert_provider.engine.write.records import observed_parquet_fields
from tests.conftest import sqlite_only

SPARK_TYPES = [
    "byte", "short", "integer", "long", "float", "double",
    "decimal(5,2)", "decimal(10,2)", "decimal(12,2)", "decimal(13,2)", "decimal(38,2)", "decimal(10,0)",
    "string", "boolean", "date", "timestamp", "binary",
]
ARROW_TYPES = [
    pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(), pa.uint32(), pa.uint64(),
    pa.float32(), pa.float64(),
    pa.decimal128(5, 2), pa.decimal128(10, 2), pa.decimal128(12, 2), pa.decimal128(12, 1), pa.decimal128(12, 3),
    pa.decimal128(38, 2), pa.decimal128(20, 0),
    pa.string(), pa.bool_(), pa.date32(), pa.timestamp("us", tz="UTC"), pa.binary(),
    pa.dictionary(pa.int8(), pa.int64()),
]


def schema(*columns: tuple[str, str]) -> str:
    return json.dumps({"type": "struct", "fields": [
        {"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in columns]})


def test_a_column_widens_to_the_narrowest_type_that_reads_the_file_and_only_by_a_widening():
    """Over every (column type, Parquet type): None when the column reads the file as it is;
    otherwise a widening of the column (the rule of schema_evolution.widens) that reads the
    file, narrower than or equal to every other such widening in the grid, and there is one
    whenever the grid holds one."""
    widened = 0
    for spark_type in SPARK_TYPES:
        for arrow_type in ARROW_TYPES:
            wider = widened_type(spark_type, arrow_type)
            case = (spark_type, str(arrow_type), wider)
            if type_problem(spark_type, arrow_type) is None:
                assert wider is None, case
                continue
            reading = [t for t in SPARK_TYPES if widens(spark_type, t) and type_problem(t, arrow_type) is None]
            if wider is None:
                assert reading == [], case
                continue
            widened += 1
            assert widens(spark_type, wider) and type_problem(wider, arrow_type) is None, case
            assert all(t == wider or widens(wider, t) for t in reading), case
    assert widened >= 20  # the grid holds widenings of every family
    assert widened_type("integer", pa.int64()) == "long"
    assert widened_type("integer", pa.uint32()) == "long" and widened_type("long", pa.uint64()) is None
    assert widened_type("float", pa.float64()) == "double"
    assert widened_type("decimal(10,2)", pa.decimal128(12, 2)) == "decimal(12,2)"
    # One fraction digit fewer, three integer digits more: the same scale, precision 13.
    assert widened_type("decimal(10,2)", pa.decimal128(12, 1)) == "decimal(13,2)"
    assert widened_type("decimal(10,2)", pa.decimal128(12, 3)) is None  # would round
    assert widened_type("integer", pa.string()) is None and widened_type("long", pa.float64()) is None


def test_the_widening_rule_over_policies_and_column_roles():
    locked = locked_columns(("id",), "updated_at")
    assert locked == {"id", "updated_at"} and locked_columns(("a", "b"), None) == {"a", "b"}
    for policy in POLICIES:
        for column in ("id", "updated_at", "c"):
            for wider in ("long", None):
                refusal = widening_refusal(column, wider, policy, locked=locked)
                if column in locked:
                    assert refusal == "a key or the order column never changes type"
                elif wider is None:
                    assert refusal.startswith("a column's type never changes in place")
                elif policy == ADD_AND_WIDEN:
                    assert refusal is None
                else:
                    assert refusal == f"policy {policy} does not widen a column (add_and_widen does)"


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """One Parquet file per Parquet type: a key and the column ``c``."""
    root = tmp_path_factory.mktemp("grid")
    paths = {}
    for index, arrow_type in enumerate(ARROW_TYPES):
        path = str(root / f"{index}.parquet")
        pq.write_table(pa.table({"id": pa.array([1], pa.int64()), "c": pa.array([None], arrow_type)}), path)
        paths[str(arrow_type)] = path
    return paths


def test_a_file_holding_a_wider_column_is_readable_only_where_the_policy_widens_it_and_the_refusal_says_why(files):
    """The bind-time verdict over column types x Parquet types x policies x roles (a plain
    column, the key, the order column): readable as it is, readable as a widening under
    add_and_widen of a column that is no key or order column, otherwise refused naming the
    column, both types, the widening and why (the policy that would make it)."""
    for policy in POLICIES:
        for role in ("value", "key", "order"):
            keys = ("id", "c") if role == "key" else ("id",)
            order_by = "c" if role == "order" else None
            locked = locked_columns(keys, order_by)
            for spark_type in SPARK_TYPES:
                fields = json.loads(schema(("id", "long"), ("c", spark_type)))["fields"]
                for arrow_type in ARROW_TYPES:
                    problem = parquet_schema_problem(
                        files[str(arrow_type)], fields, keys,
                        lambda column, old, wider: widening_refusal(column, wider, policy, locked=locked))
                    as_is, wider = type_problem(spark_type, arrow_type), widened_type(spark_type, arrow_type)
                    case = (policy, role, spark_type, str(arrow_type), problem)
                    if as_is is None or (wider is not None and policy == ADD_AND_WIDEN and role == "value"):
                        assert problem is None, case
                    elif wider is None:
                        assert problem == f"field 'c': {as_is}", case
                    else:
                        why = ("a key or the order column never changes type" if role != "value"
                               else f"policy {policy} does not widen a column (add_and_widen does)")
                        assert problem == f"field 'c': {as_is}, a widening to {wider}: {why}", case
                        assert f"expected {spark_type}, got " in problem, case


def _parquet_shard(consensus, blob, tmp_path, name: str, policy: str) -> tuple[Shard, object]:
    landing = tmp_path / name
    (landing / "p0").mkdir(parents=True)
    config = ShardConfig(source=f"dir:{landing}", keys=("id",), buckets=2, max_files_per_batch=8,
                         source_format="parquet", order_by="at",
                         schema=schema(("id", "long"), ("at", "integer"), ("n", "integer"), ("f", "float"),
                                       ("d", "decimal(10,2)")))
    shard = Shard.create(consensus, blob, name, config)
    set_schema_policy(shard, policy, "test")
    return shard, landing


WIDE = {"id": pa.array([1], pa.int64()), "at": pa.array([1], pa.int32()), "n": pa.array([2 ** 40], pa.int64()),
        "f": pa.array([1e300], pa.float64()), "d": pa.array([None], pa.decimal128(12, 2))}


@sqlite_only
@pytest.mark.parametrize("policy", POLICIES)
def test_a_binding_takes_a_wider_file_under_add_and_widen_and_otherwise_sets_it_aside_naming_file_column_types_and_policy(
    consensus, blob, tmp_path, policy
):
    shard, landing = _parquet_shard(consensus, blob, tmp_path, f"bind_{policy}", policy)
    wide, wider_order = str(landing / "p0" / "1.parquet"), str(landing / "p0" / "2.parquet")
    pq.write_table(pa.table(WIDE), wide)
    pq.write_table(pa.table({**WIDE, "id": pa.array([2], pa.int64()), "at": pa.array([5], pa.int64())}), wider_order)
    if policy != ADD_AND_WIDEN:
        with pytest.raises(BadInputError) as failed:
            shard.mint_binding(0, minted_by="test")
        assert str(failed.value).startswith(f"2 bad source file(s) in {landing}; first: {wide}: field 'n': "
                                            f"expected integer, got int64, a widening to long: policy {policy} "
                                            "does not widen a column (add_and_widen does)")
        assert shard.binding(0) is None
    binding = shard.mint_binding(0, on_bad_record="quarantine", minted_by="test")
    # The order column never widens, whatever the policy.
    order_refused = {"file": wider_order, "reason": "field 'at': expected integer, got int64, a widening to long: "
                                                    "a key or the order column never changes type"}
    if policy == ADD_AND_WIDEN:
        assert binding.ranges["p0"]["files"] == [[1, "1.parquet"]] and binding.quarantined == [order_refused]
    else:
        assert binding.ranges["p0"]["files"] == []
        assert [q["file"] for q in binding.quarantined] == [wide, wider_order]
        assert binding.quarantined[1] == order_refused


def test_a_bound_file_observes_its_wider_columns_as_the_columns_widened(tmp_path):
    config = ShardConfig(source=f"dir:{tmp_path}", keys=("id",), source_format="parquet",
                         schema=schema(("id", "long"), ("at", "integer"), ("n", "integer"), ("f", "float"),
                                       ("d", "decimal(10,2)")))
    wide, fits = str(tmp_path / "1.parquet"), str(tmp_path / "2.parquet")
    pq.write_table(pa.table({**WIDE, "extra": pa.array(["x"])}), wide)
    pq.write_table(pa.table({"id": pa.array([1], pa.int64()), "n": pa.array([1], pa.int16())}), fits)
    segments = [Segment(1, "p0", wide), Segment(2, "p0", fits)]
    for policy in POLICIES:
        assert observed_parquet_fields(config, segments, policy) == [
            ObservedField("n", "long", wide), ObservedField("f", "double", wide),
            ObservedField("d", "decimal(12,2)", wide),
            ObservedField("extra", None if policy == NONE else "string", wide)], policy
