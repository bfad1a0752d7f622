"""A Parquet batch widens its columns under add_and_widen, on a real Spark batch (SQLite): files
holding int64 for an integer column, double for a float column and a decimal of more digits are
bound, the batch mints one version widening the three columns, and two writers racing through
it stage the same runs with that version; the values read back exactly."""

from __future__ import annotations

import json
from decimal import Decimal

import pyarrow as pa
import pyarrow.parquet as pq

from airflow_upsert_provider.engine.config import ShardConfig
from airflow_upsert_provider.engine.store.table_schemas import run_schema_version, schema_history
from airflow_upsert_provider.engine.table.schema_apply import set_schema_policy
from airflow_upsert_provider.engine.table.schema_evolution import ADD_AND_WIDEN
from airflow_upsert_provider.engine.table.shard import Shard
from airflow_upsert_provider.engine.write.writer import Writer
from tests.conftest import sqlite_only
from tests.helpers import table


@sqlite_only
def test_writers_racing_through_a_parquet_widening_stage_one_batch_with_one_version(spark, consensus, blob, tmp_path):
    landing = tmp_path / "landing"
    (landing / "p0").mkdir(parents=True)
    columns = (("id", "long"), ("n", "integer"), ("f", "float"), ("d", "decimal(10,2)"))
    config = ShardConfig(source=f"dir:{landing}", keys=("id",), buckets=2, source_format="parquet", schema=json.dumps(
        {"type": "struct", "fields": [{"name": c, "type": t, "nullable": True, "metadata": {}} for c, t in columns]}))
    shard = Shard.create(consensus, blob, "widen", config)
    set_schema_policy(shard, ADD_AND_WIDEN, "test")
    pq.write_table(pa.table({"id": pa.array([1, 2], pa.int64()), "n": pa.array([7, 8], pa.int32()),
                             "f": pa.array([1.5, None], pa.float32()),
                             "d": pa.array([Decimal("12345678.90"), None], pa.decimal128(10, 2))}),
                   str(landing / "p0" / "1.parquet"))
    big_d = Decimal("1234567890.12")
    pq.write_table(pa.table({"id": pa.array([2, 3], pa.int64()), "n": pa.array([2 ** 40, -(2 ** 62)], pa.int64()),
                             "f": pa.array([1e300, 0.1], pa.float64()),
                             "d": pa.array([big_d, Decimal("-0.01")], pa.decimal128(12, 2))}),
                   str(landing / "p0" / "2.parquet"))

    writers = [Writer(Shard.open(consensus, blob, "widen"), name, spark_factory=lambda: spark) for name in ("a", "b")]
    binding = shard.mint_binding(0, minted_by="test")
    assert binding.ranges["p0"]["files"] == [[1, "1.parquet"], [2, "2.parquet"]] and binding.quarantined == []
    staged = [writer.stage(0) for writer in writers]
    history = schema_history(consensus, "widen", shard.config.schema)
    assert [(v.version, v.change) for v in history] == [(1, {"init": True}), (2, {"widen": [
        {"name": "d", "old_type": "decimal(10,2)", "new_type": "decimal(12,2)"},
        {"name": "f", "old_type": "float", "new_type": "double"},
        {"name": "n", "old_type": "integer", "new_type": "long"}]})]
    assert [w.shard.config.schema_version for w in writers] == [2, 2]
    contents = []
    for one in staged:
        assert run_schema_version(one.run) == 2
        files = sorted(one.run["files"], key=lambda f: f["path"].rsplit("/", 1)[-1])
        contents.append([pq.read_table(blob.path(f["path"])).to_pylist() for f in files])
    assert contents[0] == contents[1] and sum(map(len, contents[0])) == 3
    assert writers[0].append(staged[0]) == "committed"
    assert writers[1].append(staged[1]) != "committed"
    assert table(shard) == {
        (1,): {"id": 1, "n": 7, "f": 1.5, "d": Decimal("12345678.90")},
        (2,): {"id": 2, "n": 2 ** 40, "f": 1e300, "d": big_d},
        (3,): {"id": 3, "n": -(2 ** 62), "f": 0.1, "d": Decimal("-0.01")},
    }
