"""Schema versions through a real Spark batch, read and compaction (one SparkSession, SQLite):
a column added to a running shard reaches the table from the next batch of the same writer,
rows of earlier batches read as null in it (Spark and the Arrow reader), and compaction
writes the newest schema."""

from __future__ import annotations

import json

import pyarrow.parquet as pq

from airflow_upsert_provider.engine.config import ShardConfig
from airflow_upsert_provider.engine.maintenance.compaction import COMPACTED, compact
from airflow_upsert_provider.engine.store.table_schemas import run_schema_version
from airflow_upsert_provider.engine.table.arrow_reader import read_table
from airflow_upsert_provider.engine.table.schema_changes import add_column
from airflow_upsert_provider.engine.table.shard import Shard
from airflow_upsert_provider.engine.write.writer import Writer
from tests.conftest import sqlite_only

SCHEMA = json.dumps({"type": "struct", "fields": [
    {"name": "id", "type": "long", "nullable": True, "metadata": {}},
    {"name": "v", "type": "string", "nullable": True, "metadata": {}},
]})
AMOUNT = {"name": "amount", "type": "double", "nullable": True, "metadata": {}}


def land(landing, seq: int, records: list[dict]) -> None:
    part = landing / "p0"
    part.mkdir(parents=True, exist_ok=True)
    (part / f"{seq}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


@sqlite_only
def test_a_column_added_to_a_running_shard_reaches_the_table_and_older_rows_read_null(spark, consensus, blob, tmp_path):
    landing = tmp_path / "landing"
    land(landing, 1, [{"id": 1, "v": "a"}, {"id": 2, "v": "b"}])
    config = ShardConfig(source=f"dir:{landing}", keys=("id",), schema=SCHEMA, buckets=2, max_files_per_batch=1)
    shard = Shard.create(consensus, blob, "orders", config)
    stale = Shard.open(consensus, blob, "orders")
    writer = Writer(shard, "w", spark_factory=lambda: spark)
    first = writer.run(max_batches=1, with_lag=False).results[-1]
    assert (first.outcome, first.unknown_fields) == ("committed", {})

    assert add_column(Shard.open(consensus, blob, "orders"), AMOUNT, "ops")[0].version == 2
    land(landing, 2, [{"id": 3, "v": "c", "amount": 2.5}, {"id": 1, "v": "a2", "amount": 7.0}])
    second = writer.run(max_batches=1, with_lag=False).results[-1]  # the same writer and handle
    assert (second.outcome, second.rows_in, second.unknown_fields) == ("committed", 2, {})
    assert [run_schema_version(b.run) for b in shard.batches()] == [1, 2]

    expected = {1: ("a2", 7.0), 2: ("b", None), 3: ("c", 2.5)}
    for handle in (shard, stale):
        rows = handle.read(spark).collect()
        assert {r["id"]: (r["v"], r["amount"]) for r in rows} == expected
        arrow = read_table(handle).read_all()
        assert arrow.schema.names == ["id", "v", "amount"]
        assert {r["id"]: (r["v"], r["amount"]) for r in arrow.to_pylist()} == expected
    # As of the first batch: its rows in the newest schema.
    assert {r["id"]: r["amount"] for r in shard.read(spark, as_of=1).collect()} == {1: None, 2: None}

    result = compact(spark, stale)  # a handle opened at version 1 compacts with version 2
    assert result.outcome == COMPACTED
    run = consensus.get_compaction("orders").run
    assert run_schema_version(run) == 2
    assert all("amount" in pq.read_schema(blob.path(f["path"])).names for f in run["files"])
    assert {r["id"]: (r["v"], r["amount"]) for r in shard.read(spark).collect()} == expected
