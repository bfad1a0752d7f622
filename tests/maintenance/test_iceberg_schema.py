"""A shard's schema versions reach its Iceberg table as schema updates
(engine/maintenance/iceberg_schema.py, iceberg.py): the rule from the table's schema and the
shard's to the updates, over a grid of type pairs and nested shapes (pure); then publishes of
a real shard (runs written without Spark, tests/arrow_runs.py) across an added column and a
widened one, by the Arrow path and by Spark's executors."""

from __future__ import annotations

import itertools
import json

import pytest

from airflow_upsert_provider.engine.errors import SchemaChangeRefused
from airflow_upsert_provider.engine.maintenance.iceberg import PUBLISHED, publish_iceberg
from airflow_upsert_provider.engine.maintenance.iceberg_schema import ColumnUpdate, promotes, schema_updates
from airflow_upsert_provider.engine.store.table_schemas import current_schema, mint_schema_version
from airflow_upsert_provider.engine.table.arrow_reader import read_table
from airflow_upsert_provider.engine.table.schema_changes import add_column
from airflow_upsert_provider.sample_data import sample_schema_json
from tests.arrow_runs import arrow_table, expected_table
from tests.conftest import sqlite_only
from tests.helpers import make_shard
from tests.maintenance.test_iceberg import TABLE, by_key, catalog, files_below  # noqa: F401
from tests.maintenance.test_iceberg_buckets import compact_tier, files_by_bucket
from tests.schema.test_table_schemas import DISCOUNT, commit_rows

# -- pure: the rule --------------------------------------------------------------------------


def primitive_types() -> list:
    from pyiceberg import types as t

    return [t.BooleanType(), t.IntegerType(), t.LongType(), t.FloatType(), t.DoubleType(), t.StringType(),
            t.BinaryType(), t.DateType(), t.TimestampType(), t.TimestamptzType(),
            *(t.DecimalType(p, s) for p in (5, 10, 38) for s in (0, 2))]


# The promotions Iceberg's spec allows, written out: the oracle of the grid.
def allowed(old, new) -> bool:
    from pyiceberg import types as t

    pair = (type(old), type(new))
    if pair in {(t.IntegerType, t.LongType), (t.FloatType, t.DoubleType)}:
        return True
    return pair == (t.DecimalType, t.DecimalType) and new.scale == old.scale and new.precision > old.precision


def schema(*fields):
    from pyiceberg.schema import Schema
    from pyiceberg.types import NestedField

    return Schema(*[NestedField(i, name, kind, required=False) for i, (name, kind) in enumerate(fields, start=1)])


def test_every_type_pair_is_no_change_a_widening_or_a_refusal_naming_the_table_column_and_both_types():
    from pyiceberg.types import LongType

    seen = {"same": 0, "widen": 0, "refused": 0}
    for old, new in itertools.product(primitive_types(), repeat=2):
        actual = schema(("id", LongType()), ("v", old))
        expected = schema(("id", LongType()), ("v", new))
        if old == new:
            assert schema_updates(expected, actual, TABLE) == ()
            seen["same"] += 1
        elif allowed(old, new):
            assert promotes(old, new)
            assert schema_updates(expected, actual, TABLE) == (ColumnUpdate(("v",), old, new),)
            seen["widen"] += 1
        else:
            assert not promotes(old, new)
            with pytest.raises(SchemaChangeRefused) as refused:
                schema_updates(expected, actual, TABLE)
            assert refused.value.message.startswith(f"Iceberg table {TABLE}: column 'v' is {old}, the shard's is {new}")
            assert refused.value.details == {"table": TABLE, "column": "v", "old_type": str(old), "new_type": str(new)}
            seen["refused"] += 1
    # int->long, float->double, and per scale decimal precision 5->10, 5->38, 10->38.
    assert seen == {"same": 16, "widen": 2 + 2 * 3, "refused": 16 * 16 - 16 - 8}


def test_columns_the_table_lacks_are_added_at_every_level_and_a_column_it_has_beyond_the_shards_is_refused():
    from pyiceberg import types as t

    struct = t.StructType(t.NestedField(10, "sku", t.StringType(), required=False))
    wider_struct = t.StructType(t.NestedField(10, "sku", t.StringType(), required=False),
                                t.NestedField(11, "qty", t.IntegerType(), required=False))
    old = schema(("id", t.LongType()), ("item", struct), ("items", t.ListType(20, struct)),
                 ("by_code", t.MapType(30, t.StringType(), 31, t.FloatType())))
    new = schema(("id", t.LongType()), ("item", wider_struct), ("items", t.ListType(20, wider_struct)),
                 ("by_code", t.MapType(30, t.StringType(), 31, t.DoubleType())), ("note", t.StringType()))
    assert schema_updates(new, old, TABLE) == (
        ColumnUpdate(("item", "qty"), None, t.IntegerType()),
        ColumnUpdate(("items", "element", "qty"), None, t.IntegerType()),
        ColumnUpdate(("by_code", "value"), t.FloatType(), t.DoubleType()),
        ColumnUpdate(("note",), None, t.StringType()),
    )
    # Field ids and optionality aside, the same schema needs nothing.
    required = schema(("id", t.LongType()), ("item", struct))
    assert schema_updates(schema(("id", t.LongType()), ("item", struct)), required, TABLE) == ()
    # A column the shard's table does not have (dropped, renamed, or another writer's).
    for extra, column in ((schema(("id", t.LongType()), ("x", t.LongType())), "x"),
                          (schema(("id", t.LongType()), ("item", wider_struct)), "item.qty")):
        shard_side = schema(("id", t.LongType()), ("item", struct))
        with pytest.raises(SchemaChangeRefused, match=f"Iceberg table {TABLE} has column '{column}', which the "
                                                      "shard's table does not have"):
            schema_updates(shard_side, extra, TABLE)
    # A map's key, a struct turned list: not a promotion.
    for old_type, new_type, column in ((t.MapType(1, t.IntegerType(), 2, t.LongType()),
                                        t.MapType(1, t.LongType(), 2, t.LongType()), "m"),
                                       (struct, t.ListType(20, struct), "m")):
        with pytest.raises(SchemaChangeRefused, match=f"column '{column}' is .*a change Iceberg cannot make"):
            schema_updates(schema(("m", new_type)), schema(("m", old_type)), TABLE)


def test_the_updates_apply_to_a_tables_schema_at_every_level_keeping_every_field_id(tmp_path):
    from pyiceberg import types as t
    from pyiceberg.catalog.sql import SqlCatalog

    from airflow_upsert_provider.engine.maintenance.iceberg import apply_schema_updates

    struct = t.StructType(t.NestedField(10, "sku", t.StringType(), required=False))
    wider = t.StructType(t.NestedField(10, "sku", t.StringType(), required=False),
                         t.NestedField(11, "qty", t.IntegerType(), required=False))
    old = schema(("id", t.LongType()), ("item", struct), ("items", t.ListType(20, struct, element_required=False)),
                 ("by_code", t.MapType(30, t.StringType(), 31, t.FloatType(), value_required=False)),
                 ("counts", t.ListType(40, t.IntegerType(), element_required=False)))
    new = schema(("id", t.LongType()), ("item", wider), ("items", t.ListType(20, wider, element_required=False)),
                 ("by_code", t.MapType(30, t.StringType(), 31, t.DoubleType(), value_required=False)),
                 ("counts", t.ListType(40, t.LongType(), element_required=False)), ("note", t.StringType()))
    catalog = SqlCatalog("c", uri=f"sqlite:///{tmp_path}/c.db", warehouse=f"file://{tmp_path}/wh")
    catalog.create_namespace("analytics")
    table = catalog.create_table(TABLE, schema=old)
    before = {name: table.schema().find_field(name).field_id
              for name in ("id", "item", "item.sku", "items", "items.element.sku", "by_code", "by_code.value",
                           "counts", "counts.element")}
    highest_before = table.schema().highest_field_id
    with table.transaction() as transaction:
        with transaction.update_schema() as update:
            apply_schema_updates(update, schema_updates(new, table.schema(), TABLE))
    updated = catalog.load_table(TABLE).schema()
    assert {name: updated.find_field(name).field_id for name in before} == before
    assert updated.find_field("by_code.value").field_type == t.DoubleType()
    assert updated.find_field("counts.element").field_type == t.LongType()
    added = [updated.find_field(name) for name in ("item.qty", "items.element.qty", "note")]
    assert all(not f.required for f in added) and min(f.field_id for f in added) > highest_before
    assert schema_updates(new, updated, TABLE) == ()


# -- real publishes --------------------------------------------------------------------------

QTY = {"name": "qty", "type": "integer", "nullable": True, "metadata": {}}


def shard_schema(*extra: dict) -> str:
    parsed = json.loads(sample_schema_json())
    parsed["fields"] += list(extra)
    return json.dumps(parsed)


def rows(keys, batch: int, **values) -> list[dict]:
    return [{"id": k, "name": f"n{k}-{batch}", "amount": float(k + batch), "updated_at": batch, "qty": k,
             "_deleted": False, **values} for k in keys]


def commit(shard, history: list[dict], batch_rows: list[dict]) -> None:
    ts = commit_rows(shard, batch_rows)
    history += [{**r, "_ts": ts} for r in batch_rows]


def retype_qty(shard, spark_type: str, change: dict) -> None:
    """Mint the next schema version with ``qty`` of ``spark_type`` (no command does it: a
    widening, or a change the rules refuse that a store could still hold) and take it in."""
    current = current_schema(shard.consensus, shard.shard_id, shard.config.schema)
    changed = json.loads(current.schema)
    for field in changed["fields"]:
        if field["name"] == "qty":
            field["type"] = spark_type
    mint_schema_version(shard.consensus, shard.shard_id, current.version, json.dumps(changed), change, "tester")
    shard.refresh_schema()


def field_ids(table_schema) -> dict[str, int]:
    return {f.name: f.field_id for f in table_schema.fields}


def published_shard(consensus, blob, tmp_path, catalog, *, buckets: int, batches: list):  # noqa: F811
    """A shard with ``qty`` of type integer, a batch per entry of ``batches`` (the keys it
    writes), compacted and published: (shard, every committed row, the publish's result)."""
    shard = make_shard(consensus, blob, tmp_path, schema=shard_schema(QTY), buckets=buckets)
    history: list[dict] = []
    for batch, keys in enumerate(batches, start=1):
        commit(shard, history, rows(keys, batch))
    compact_tier(shard, history, len(batches))
    return shard, history, publish_iceberg(shard, catalog, TABLE, retention=None)


def snapshot_rows(table, snapshot_id=None):
    scanned = table.scan(snapshot_id=snapshot_id).to_arrow()
    return scanned.schema, by_key(scanned)


@sqlite_only
def test_an_added_column_and_a_widened_one_become_schema_updates_keeping_field_ids_and_old_snapshots(
        consensus, blob, tmp_path, catalog):  # noqa: F811
    from pyiceberg import types as t

    shard, history, first = published_shard(consensus, blob, tmp_path, catalog, buckets=4,
                                            batches=[range(8), [0, 5]])
    table = catalog.load_table(TABLE)
    ids_before = field_ids(table.schema())
    assert first.outcome == PUBLISHED and table.current_snapshot().summary["upsert.schema_version"] == "1"

    # Version 2 adds a column; a batch gives it values in bucket 1 only (keys 1 and 5).
    add_column(shard, DISCOUNT, "tester")
    shard.refresh_schema()
    history = [{**r, "discount": None} for r in history]
    commit(shard, history, rows([1, 5], 3, discount=0.25))
    compact_tier(shard, history, 3)
    before = files_by_bucket(table)
    second = publish_iceberg(shard, catalog, TABLE, retention=None)
    table = catalog.load_table(TABLE)
    assert second.outcome == PUBLISHED and (second.buckets_rewritten, second.buckets_kept) == (1, 3)
    snapshot = table.current_snapshot()
    assert snapshot.summary["upsert.schema_version"] == "2"
    # One commit: the snapshot is in the new schema, and no snapshot was added for the update.
    assert [s.snapshot_id for s in table.snapshots()] == [first.snapshot_id, second.snapshot_id]
    assert snapshot.schema_id == table.schema().schema_id != table.snapshot_by_id(first.snapshot_id).schema_id
    ids = field_ids(table.schema())
    assert {name: ids[name] for name in ids_before} == ids_before
    assert ids["discount"] > max(ids_before.values()) and not table.schema().find_field("discount").required
    # Unchanged buckets keep their data files (written before the column existed: read as null).
    after = files_by_bucket(table)
    assert {b: after[b] for b in ("0", "2", "3")} == {b: before[b] for b in ("0", "2", "3")}
    assert after["1"].isdisjoint(before["1"])
    scanned_schema, scanned = snapshot_rows(table)
    expected = expected_table(shard.config, history, 3)
    assert scanned_schema.names == ["id", "name", "amount", "updated_at", "qty", "discount"]
    assert scanned == expected == arrow_table(read_table(shard, as_of=3))
    assert {k for k, r in scanned.items() if r["discount"] is not None} == {(1,), (5,)}
    # A reader of the older snapshot keeps its schema.
    old_schema, old_rows = snapshot_rows(table, first.snapshot_id)
    assert old_schema.names == ["id", "name", "amount", "updated_at", "qty"]
    assert old_rows == {k: {c: v for c, v in r.items() if c != "discount"}
                        for k, r in expected_table(shard.config, history, 2).items()}

    # Version 3 widens qty from integer to long.
    retype_qty(shard, "long", {"widen": [{"name": "qty", "type": "bigint"}]})
    commit(shard, history, rows([2], 4, discount=None, qty=2**40))
    compact_tier(shard, history, 4)
    third = publish_iceberg(shard, catalog, TABLE, retention=None)
    table = catalog.load_table(TABLE)
    assert third.outcome == PUBLISHED and table.current_snapshot().summary["upsert.schema_version"] == "3"
    assert field_ids(table.schema()) == ids
    assert table.schema().find_field("qty").field_type == t.LongType()
    scanned_schema, scanned = snapshot_rows(table)
    assert scanned == expected_table(shard.config, history, 4) == arrow_table(read_table(shard, as_of=4))
    assert scanned[(2,)]["qty"] == 2**40 and str(scanned_schema.field("qty").type) == "int64"
    # The snapshot before the widening reads qty as it was written: 32-bit.
    old_schema, old_rows = snapshot_rows(table, second.snapshot_id)
    assert str(old_schema.field("qty").type) == "int32" and old_rows == expected


@sqlite_only
def test_a_shard_change_iceberg_cannot_make_commits_nothing_and_names_table_column_and_types(
        consensus, blob, tmp_path, catalog):  # noqa: F811
    shard, history, _ = published_shard(consensus, blob, tmp_path, catalog, buckets=2, batches=[range(4)])
    table = catalog.load_table(TABLE)
    # qty becomes a string (the shard's rules refuse it; a store could still hold it).
    retype_qty(shard, "string", {"change": "qty"})
    commit(shard, history, rows([1], 2, qty="seven"))
    compact_tier(shard, history, 2)
    published_files = files_below(blob.path("_iceberg"))
    with pytest.raises(SchemaChangeRefused) as refused:
        publish_iceberg(shard, catalog, TABLE, retention=None)
    assert refused.value.message == (
        f"Iceberg table {TABLE}: column 'qty' is int, the shard's is string, a change Iceberg cannot make to a "
        "column (it promotes int to long, float to double, a decimal's precision up at the same scale): "
        "nothing was published")
    assert refused.value.exit_code == 2
    assert {k: refused.value.details[k] for k in ("table", "column", "old_type", "new_type")} == {
        "table": TABLE, "column": "qty", "old_type": "int", "new_type": "string"}
    reloaded = catalog.load_table(TABLE)
    assert reloaded.metadata_location == table.metadata_location and len(reloaded.snapshots()) == 1
    assert files_below(blob.path("_iceberg")) == published_files


@sqlite_only
def test_executors_publish_an_added_and_a_widened_column_in_the_updated_schema(spark, consensus, blob, tmp_path,
                                                                               catalog):  # noqa: F811
    import pyarrow.parquet as pq
    from pyiceberg import types as t

    from airflow_upsert_provider.engine.maintenance.compaction import compact
    from airflow_upsert_provider.engine.maintenance.iceberg import current_data_files
    from tests.maintenance.test_iceberg_spark import buckets_of, spark_batch

    shard = make_shard(consensus, blob, tmp_path, schema=shard_schema(QTY), buckets=4)
    bucket_of = buckets_of(spark, shard, list(range(16)))
    history: list[dict] = []
    spark_batch(spark, shard, history, rows(range(16), 1))
    compact(spark, shard)
    first = publish_iceberg(shard, catalog, TABLE, spark=spark, retention=None)
    ids_before = field_ids(catalog.load_table(TABLE).schema())
    first_files = {f.file_path for f in current_data_files(catalog.load_table(TABLE))}

    add_column(shard, DISCOUNT, "tester")
    retype_qty(shard, "long", {"widen": [{"name": "qty", "type": "bigint"}]})
    one = [k for k in range(16) if bucket_of[k] == bucket_of[3]]
    history = [{**r, "discount": None} for r in history]
    spark_batch(spark, shard, history, rows(one, 2, discount=0.5, qty=2**40))
    compact(spark, shard)
    since = shard.state().since
    second = publish_iceberg(shard, catalog, TABLE, spark=spark, retention=None)
    assert (second.outcome, second.buckets_rewritten, second.buckets_kept) == (PUBLISHED, 1, 3)
    table = catalog.load_table(TABLE)
    ids = field_ids(table.schema())
    assert {name: ids[name] for name in ids_before} == ids_before and ids["discount"] > max(ids_before.values())
    assert table.schema().find_field("qty").field_type == t.LongType()
    expected = expected_table(shard.config, history, since)
    assert by_key(table.scan().to_arrow()) == expected == arrow_table(read_table(shard, as_of=since))
    assert {k for k, r in expected.items() if r["discount"] == 0.5} == {(k,) for k in one}
    # The executors' files of the rewritten bucket are in the updated schema, with its field ids.
    rewritten = {f.file_path for f in current_data_files(table)} - first_files
    assert rewritten
    for path in rewritten:
        assert [(f.name, f.metadata[b"PARQUET:field_id"]) for f in pq.read_schema(path.removeprefix("file://"))] == [
            (f.name, str(f.field_id).encode()) for f in table.schema().fields]
    old = table.scan(snapshot_id=first.snapshot_id).to_arrow()
    assert old.schema.names == ["id", "name", "amount", "updated_at", "qty"] and str(old.schema.field("qty").type) == "int32"
