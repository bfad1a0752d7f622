"""Time travel across schema versions: a shard with batches before and after `upsertctl schema
add-column`, read as of every ts by Spark (`Shard.read`) and the Arrow reader. As docs/schema.md
promises, every read has the newest columns: as of a ts before the change (and before the first
batch written at the new version) the new column is null; after it, it has the values written.
Both readers give the model's rows. One Spark read per ts, SQLite (the store plays no part)."""

from __future__ import annotations

import json

from airflow_upsert_provider.engine.table.arrow_reader import read_table
from airflow_upsert_provider.engine.table.shard import Shard
from tests.conftest import sqlite_only
from tests.helpers import Upsertctl, make_shard, spark_table, table
from tests.schema.test_table_schemas import commit_rows

COLUMNS = ["id", "name", "amount", "updated_at", "discount"]


def row(key: int, ts: int, **values) -> dict:
    return {"id": key, "name": f"n{key}-{ts}", "amount": float(key), "updated_at": ts, "_deleted": False, **values}


@sqlite_only
def test_reads_as_of_every_ts_across_a_schema_change_have_the_newest_columns_and_agree(
        spark, consensus, consensus_url, blob, tmp_path, capsys):
    shard = make_shard(consensus, blob, tmp_path, buckets=2)
    history = [
        [row(k, 0) for k in range(6)],
        [row(k, 1) for k in range(3, 9)] + [{**row(0, 1), "name": None, "amount": None, "_deleted": True}],
    ]
    for rows in history:
        commit_rows(shard, rows)
    upsertctl = Upsertctl(capsys, consensus_url, blob.root)
    assert "schema version 2" in upsertctl.ok("schema", "add-column", "orders", "discount", "DOUBLE", "--actor", "ops")
    shard = Shard.open(consensus, blob, "orders")
    later = [
        [row(k, 2, discount=float(k) / 2) for k in range(5, 11)],
        [row(4, 3, discount=None), row(5, 3, discount=9.5), {**row(7, 3), "discount": None, "_deleted": True}],
    ]
    for rows in later:
        commit_rows(shard, rows)
    history += later
    assert json.loads(upsertctl.ok("schema", "orders", "--json"))["version"] == 2

    for as_of in range(1, len(history) + 1):
        expected = {}
        for ts in range(as_of):
            for r in history[ts]:
                if r["_deleted"]:
                    expected.pop(r["id"], None)
                else:
                    expected[r["id"]] = {c: r.get(c) for c in COLUMNS}
        arrow = read_table(shard, as_of).read_all()
        assert arrow.schema.names == COLUMNS, as_of
        assert shard.read(spark, as_of=as_of).columns == COLUMNS, as_of
        assert table(shard, as_of) == spark_table(shard, spark, as_of), as_of
        got = {r["id"]: r for r in arrow.to_pylist()}
        assert got == expected, as_of
        if as_of <= 2:  # before the change, and between it and the first batch at version 2
            assert {r["discount"] for r in got.values()} == {None}, as_of
    assert {k: got[k]["discount"] for k in (4, 5, 6, 10)} == {4: None, 5: 9.5, 6: 3.0, 10: 5.0}
