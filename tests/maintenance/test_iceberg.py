"""Publishing a shard's table as Apache Iceberg snapshots (engine/maintenance/iceberg.py), read
back by other engines: PyIceberg's scan and DuckDB. The decision, the schema mapping and the
catalog settings are pure; the publishes run on histories committed without Spark
(tests/arrow_runs.py), in the SQL catalog inside the consensus store (SQLite and PostgreSQL).
No Spark is started in this module."""

from __future__ import annotations

import json
import os
import random

import pyarrow as pa
import pytest

from airflow_upsert_provider.engine.config import ShardConfig
from airflow_upsert_provider.engine.errors import ConfigurationError, ConsensusUnavailable
from airflow_upsert_provider.engine.maintenance import iceberg, iceberg_catalog
from airflow_upsert_provider.engine.maintenance.gc import collect_garbage
from airflow_upsert_provider.engine.maintenance.iceberg import (
    NOTHING,
    NOTHING_TO_PUBLISH,
    PUBLISH,
    PUBLISHED,
    REFUSE,
    decide_publish,
    iceberg_schema,
    publish_iceberg,
)
from airflow_upsert_provider.engine.maintenance.iceberg_catalog import catalog_properties
from airflow_upsert_provider.engine.maintenance.iceberg_names import parse_table_identifier
from airflow_upsert_provider.engine.maintenance.iceberg_schema import ColumnUpdate, schema_updates
from airflow_upsert_provider.engine.store.migrations import schema_status
from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.engine.table.arrow_reader import read_table
from tests.arrow_runs import arrow_table, commit_batch, compact_batches, expected_table
from tests.conftest import sqlite_only
from tests.helpers import make_shard, run_cli

TABLE = "analytics.orders"


# -- pure: the decision --------------------------------------------------------------------


def ours(since: int, shard: str = "orders") -> dict[str, str]:
    return {"upsert.shard": shard, "upsert.since": str(since), "upsert.upper": str(since + 2)}


@pytest.mark.parametrize(
    ("since", "snapshot_id", "summary", "action", "words"),
    [
        (0, None, None, NOTHING, "no compaction yet"),
        (3, None, None, PUBLISH, "no snapshot"),
        (3, 11, ours(3), NOTHING, "since 3 already published: snapshot 11"),
        (5, 11, ours(3), PUBLISH, "holds since 3"),
        (3, 11, ours(5), REFUSE, "is ahead of shard 'orders': its current snapshot 11 holds since 5"),
        (0, 11, ours(5), REFUSE, "is ahead"),
        (3, 11, ours(3, shard="payments"), REFUSE, "published from shard 'payments', not 'orders'"),
        (3, 11, {"added-records": "4"}, REFUSE, "was not written by a publish of this provider"),
        (3, 11, {}, REFUSE, "was not written by a publish"),
        (3, 11, {"upsert.shard": "orders", "upsert.since": "x"}, REFUSE, "no integer upsert.since ('x')"),
    ],
)
def test_the_decision_is_a_pure_function_of_since_and_the_current_snapshot(since, snapshot_id, summary, action, words):
    decision = decide_publish("orders", since, TABLE, snapshot_id, summary)
    assert decision.action == action and words in decision.reason, decision
    if action == REFUSE:
        assert TABLE in decision.reason


def test_table_identifiers_are_namespace_dot_table():
    assert parse_table_identifier("analytics.orders") == ("analytics", "orders")
    assert parse_table_identifier("a.b.orders") == ("a", "b", "orders")
    for bad in ("orders", "analytics.", ".orders", "a..b", "a. b", ""):
        with pytest.raises(ConfigurationError, match="is not NAMESPACE.TABLE") as raised:
            parse_table_identifier(bad)
        assert raised.value.details["field"] == "iceberg"


@pytest.mark.parametrize(("name", "words"), [
    ("ns/x.t", "the name 'ns/x' holds '/', a path separator"),
    ("ns.a\\b", "holds '\\\\', a path separator"),
    ("ns.t\nx", "the name 't\\nx' holds a control or unprintable character"),
    ("ns.t\x1b[2Jx", "holds a control or unprintable character"),
    ("ns." + "x" * 256, "is 256 bytes long: a directory name may have at most 255"),
    ("ns." + "\u00e9" * 128, "is 256 bytes long"),
])
def test_a_table_name_that_is_not_a_safe_path_part_is_refused_naming_it(name, words):
    with pytest.raises(ConfigurationError) as raised:
        parse_table_identifier(name)
    assert words in raised.value.message and raised.value.details["field"] == "iceberg"
    assert "\n" not in raised.value.message and "\x1b" not in raised.value.message


def test_every_character_of_a_name_part_is_accepted_iff_it_is_a_printable_non_separator():
    """Property over the code points of the Basic Multilingual Plane (surrogates aside): a
    character inside a name part is accepted exactly when it is printable and no path
    separator (the dot separates the parts)."""
    for code in range(0x10000):
        ch = chr(code)
        if 0xD800 <= code <= 0xDFFF or ch == ".":
            continue
        name = f"ns.a{ch}b"
        expected = ch.isprintable() and ch not in "/\\"
        try:
            accepted = parse_table_identifier(name) == ("ns", f"a{ch}b")
        except ConfigurationError:
            accepted = False
        assert accepted == expected, (hex(code), name)
    # The length limit is in bytes of UTF-8, at the boundary.
    assert parse_table_identifier("ns." + "x" * 255)[1] == "x" * 255
    assert parse_table_identifier("ns." + "\u00e9" * 127 + "x")[1] == "\u00e9" * 127 + "x"


def test_a_catalog_uri_of_no_known_kind_is_refused_naming_the_option_not_the_uri():
    for uri, shown in (("garbage", "it has no scheme"), ("mysql://u:pw@h/db", "its scheme is 'mysql'"),
                       ("ftp://u:pw@h/x", "its scheme is 'ftp'")):
        with pytest.raises(ConfigurationError) as raised:
            catalog_properties("sqlite:///c.db", "/b", uri)
        assert raised.value.message == (
            "the Iceberg catalog URI is neither a REST catalog's http[s]:// URL nor a SQL catalog's sqlite:/// or "
            f"postgresql:// database URL ({shown})")
        assert raised.value.details["field"] == "catalog_uri" and "pw" not in raised.value.message
    assert catalog_properties("sqlite:///c.db", "/b", "postgres://u@h/db")["type"] == "sql"
    assert catalog_properties("sqlite:///c.db", "/b", "postgresql+psycopg://u@h/db")["type"] == "sql"


def test_the_decision_publishes_iff_the_table_holds_nothing_of_this_shard_at_or_past_since():
    """Property over a grid of sinces, published sinces and publishers: a publish happens
    exactly when the table has no snapshot (and since > 0) or its snapshot is this shard's at
    a lower since; a snapshot of this shard at the same since is nothing to publish (what a
    publish that lost the race to create the table finds in the table it loaded)."""
    for since in range(6):
        assert decide_publish("orders", since, TABLE, None, None).action == (PUBLISH if since else NOTHING)
        for published in range(6):
            for publisher in ("orders", "payments"):
                action = decide_publish("orders", since, TABLE, 7, ours(published, shard=publisher)).action
                if publisher != "orders" or published > since:
                    assert action == REFUSE, (since, published, publisher)
                else:
                    assert action == (NOTHING if published == since else PUBLISH), (since, published, publisher)


def _config(fields: list[dict], tmp_path, **overrides) -> ShardConfig:
    schema = json.dumps({"type": "struct", "fields": [{"nullable": True, "metadata": {}, **f} for f in fields]})
    return ShardConfig(source=f"dir:{tmp_path}", keys=("id",), schema=schema, **overrides)


def test_the_schema_maps_spark_types_to_iceberg_types(tmp_path):
    from pyiceberg import types as t

    element = {"type": "struct", "fields": [{"name": "sku", "type": "string", "nullable": True, "metadata": {}}]}
    config = _config([
        {"name": "flag", "type": "boolean"},
        {"name": "id", "type": "long"},
        {"name": "tiny", "type": "byte"},
        {"name": "small", "type": "short"},
        {"name": "n", "type": "integer"},
        {"name": "price", "type": "decimal(12,2)"},
        {"name": "ratio", "type": "float"},
        {"name": "score", "type": "double"},
        {"name": "code", "type": "varchar(8)"},
        {"name": "raw", "type": "binary"},
        {"name": "day", "type": "date"},
        {"name": "at", "type": "timestamp"},
        {"name": "local_at", "type": "timestamp_ntz"},
        {"name": "items", "type": {"type": "array", "elementType": element, "containsNull": True}},
        {"name": "tags", "type": {"type": "map", "keyType": "string", "valueType": "long", "valueContainsNull": True}},
        {"name": "deleted", "type": "boolean"},
    ], tmp_path, delete_marker="deleted")
    schema = iceberg_schema(config)
    # Keys first, the delete marker left out, every field optional.
    assert [f.name for f in schema.fields] == ["id", "flag", "tiny", "small", "n", "price", "ratio", "score", "code",
                                               "raw", "day", "at", "local_at", "items", "tags"]
    assert not any(f.required for f in schema.fields)
    types = {f.name: f.field_type for f in schema.fields}
    assert types["id"] == t.LongType() and types["tiny"] == types["small"] == types["n"] == t.IntegerType()
    assert types["price"] == t.DecimalType(12, 2) and types["code"] == t.StringType()
    assert types["at"] == t.TimestamptzType() and types["local_at"] == t.TimestampType()
    assert isinstance(types["items"], t.ListType) and types["items"].element_type.fields[0].name == "sku"
    assert isinstance(types["tags"], t.MapType) and types["tags"].value_type == t.LongType()


@pytest.mark.parametrize(("spark_type", "named"), [
    ("interval day to second", "'span'"),
    ({"type": "array", "elementType": "void", "containsNull": True}, "'span.element'"),
])
def test_a_type_iceberg_lacks_is_refused_naming_the_column(tmp_path, spark_type, named):
    config = _config([{"name": "id", "type": "long"}, {"name": "span", "type": spark_type}], tmp_path)
    with pytest.raises(ConfigurationError, match=f"column {named} has type .*which Iceberg has no type for"):
        iceberg_schema(config)


def test_a_schema_mismatch_names_the_table_and_the_field(tmp_path):
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    config = _config([{"name": "id", "type": "long"}, {"name": "name", "type": "string"}], tmp_path)
    expected = iceberg_schema(config)
    # Field ids and optionality aside, the same schema agrees.
    same = Schema(NestedField(7, "id", LongType(), required=True), NestedField(9, "name", StringType()))
    assert schema_updates(expected, same, TABLE) == ()
    other_type = Schema(NestedField(1, "id", StringType()), NestedField(2, "name", StringType()))
    with pytest.raises(ConfigurationError, match=f"Iceberg table {TABLE}: column 'id' is string, the shard's is long"):
        schema_updates(expected, other_type, TABLE)
    # A column the table lacks is a schema update (tests/maintenance/test_iceberg_schema.py).
    missing = Schema(NestedField(1, "id", LongType()))
    assert schema_updates(expected, missing, TABLE) == (ColumnUpdate(("name",), None, StringType()),)
    extra = Schema(NestedField(1, "id", LongType()), NestedField(2, "name", StringType()), NestedField(3, "x", LongType()))
    with pytest.raises(ConfigurationError, match="has column 'x', which the shard's table does not have"):
        schema_updates(expected, extra, TABLE)


def test_the_default_catalog_is_the_consensus_store_with_tables_under_the_blob_root(tmp_path):
    pg = "postgresql://upsert:s3cret@db.example.com:5432/upsert?lock_timeout=5s&statement_timeout=1min&sslmode=require"
    properties = catalog_properties(pg, str(tmp_path / "blob"))
    # The engine's own options stay out of the catalog's URL (libpq does not know them).
    assert properties == {
        "type": "sql",
        "uri": "postgresql+psycopg://upsert:s3cret@db.example.com:5432/upsert?sslmode=require",
        "warehouse": f"file://{tmp_path}/blob/_iceberg",
    }
    assert "s3cret" not in iceberg_catalog.describe_catalog(properties)
    assert catalog_properties(f"sqlite:///{tmp_path}/c.db?timeout=5", "s3://b/shards")["warehouse"] == "s3://b/shards/_iceberg"
    assert catalog_properties(f"sqlite:///{tmp_path}/c.db", "/b", "https://catalog.example.com/api") == {
        "type": "rest", "uri": "https://catalog.example.com/api"}
    # A SQLite catalog waits for the write lock as long as the store's writers (60 s), not 5 s.
    assert catalog_properties(pg, "/b", f"sqlite:///{tmp_path}/ice.db")["uri"] == f"sqlite:///{tmp_path}/ice.db?timeout=60.0"
    assert catalog_properties(f"sqlite:///{tmp_path}/c.db?timeout=5", "/b")["uri"] == f"sqlite:///{tmp_path}/c.db?timeout=5"


# -- publishing ----------------------------------------------------------------------------


def random_batch(rng: random.Random, keys: int) -> list[dict]:
    """One batch's rows, one per key: updates with order values from a small range, some
    tombstones."""
    rows = []
    for key in rng.sample(range(keys), rng.randrange(1, keys + 1)):
        deleted = rng.random() < 0.2
        rows.append({"id": key, "name": None if deleted else f"n{key}-{rng.randrange(100)}",
                     "amount": None if deleted else float(rng.randrange(1000)),
                     "updated_at": rng.randrange(4), "_deleted": deleted})
    return rows


def commit_batches(shard, rng: random.Random, history: list[dict], batches: int, keys: int = 40) -> None:
    for _ in range(batches):
        rows = random_batch(rng, keys)
        ts = commit_batch(shard, rows)
        history += [{**r, "_ts": ts} for r in rows]


def compacted_shard(consensus, blob, tmp_path, *, seed: int, batches: int, since: int, keys: int = 40,
                    buckets: int = 2, shard_id: str = "orders"):
    """A shard with ``batches`` random batches over ``keys`` keys, compacted to ``since``:
    (shard, every committed row with its ``_ts``)."""
    shard = make_shard(consensus, blob, tmp_path, buckets=buckets, shard_id=shard_id)
    history: list[dict] = []
    commit_batches(shard, random.Random(seed), history, batches, keys=keys)
    compact_batches(shard, history, since)
    return shard, history


def files_below(path: str) -> set[str]:
    return {os.path.join(d, n) for d, _, names in os.walk(path) for n in names}


def by_key(table: pa.Table) -> dict[tuple, dict]:
    rows = table.to_pylist()
    out = {(r["id"],): r for r in rows}
    assert len(out) == len(rows), "a key came out twice"
    return out


@pytest.fixture
def catalog(consensus, blob):
    """The default catalog: PyIceberg's SQL catalog in the consensus store, tables under the
    blob root."""
    properties = catalog_properties(consensus.url, blob.root)
    opened = iceberg_catalog.open_catalog(properties)
    yield opened
    iceberg_catalog.close_catalog(opened)


def test_each_compaction_is_one_snapshot_that_other_engines_read(consensus, blob, tmp_path, catalog):
    import duckdb

    shard = make_shard(consensus, blob, tmp_path, buckets=3)
    rng = random.Random(23)
    history: list[dict] = []
    commit_batches(shard, rng, history, 4)
    assert publish_iceberg(shard, catalog, TABLE).outcome == NOTHING_TO_PUBLISH  # nothing compacted yet
    assert not catalog.table_exists(TABLE)
    compact_batches(shard, history, 3)

    first = publish_iceberg(shard, catalog, TABLE)
    assert (first.outcome, first.since, first.upper, first.table) == (PUBLISHED, 3, 4, TABLE)
    expected_first = expected_table(shard.config, history, 3)
    table = catalog.load_table(TABLE)
    assert [s.snapshot_id for s in table.snapshots()] == [first.snapshot_id]
    snapshot = table.current_snapshot()
    assert {k: snapshot.summary[k] for k in ("upsert.shard", "upsert.since", "upsert.upper")} == {
        "upsert.shard": "orders", "upsert.since": "3", "upsert.upper": "4"}
    # PyIceberg's scan, the engine's Arrow reader at since and the plain oracle agree.
    scanned = table.scan().to_arrow()
    assert scanned.schema.names == ["id", "name", "amount", "updated_at"]
    assert by_key(scanned) == expected_first == arrow_table(read_table(shard, as_of=3))
    assert first.rows == scanned.num_rows == len(expected_first) and first.files >= 1
    # DuckDB queries what PyIceberg returns (its iceberg extension cannot be installed here).
    [counted] = duckdb.sql("SELECT count(*), sum(amount) FROM scanned WHERE amount > 500").fetchall()
    big = [r["amount"] for r in expected_first.values() if r["amount"] is not None and r["amount"] > 500]
    assert counted == (len(big), sum(big) if big else None)

    # The same since again adds no snapshot.
    again = publish_iceberg(shard, catalog, TABLE)
    assert (again.outcome, again.snapshot_id, again.reason) == (
        NOTHING_TO_PUBLISH, first.snapshot_id, f"since 3 already published: snapshot {first.snapshot_id}")
    assert len(catalog.load_table(TABLE).snapshots()) == 1

    # A second compaction, a second snapshot: an overwrite of the whole table.
    commit_batches(shard, rng, history, 3)
    compact_batches(shard, history, 6)
    second = publish_iceberg(shard, catalog, TABLE)
    assert (second.outcome, second.since, second.upper) == (PUBLISHED, 6, 7)
    table = catalog.load_table(TABLE)
    assert [s.snapshot_id for s in table.snapshots()] == [first.snapshot_id, second.snapshot_id]
    assert table.current_snapshot().summary.operation.value == "overwrite"
    assert table.current_snapshot().summary["upsert.since"] == "6"
    expected_second = expected_table(shard.config, history, 6)
    assert expected_second != expected_first
    assert by_key(table.scan().to_arrow()) == expected_second == arrow_table(read_table(shard, as_of=6))
    # Time travel: the first snapshot is the table as of the first compaction.
    assert by_key(table.scan(snapshot_id=first.snapshot_id).to_arrow()) == expected_first

    # Compaction and GC (grace 0) afterwards: the shard's replaced runs go, every snapshot
    # stays readable (its files are under <blob root>/_iceberg, which GC never lists).
    commit_batches(shard, rng, history, 2)
    compact_batches(shard, history, 9)
    published_files = files_below(blob.path("_iceberg"))
    report = collect_garbage(consensus, blob, "orders", grace_seconds=0)
    assert report.files > 0, "GC deleted nothing: the test proves nothing"
    assert files_below(blob.path("_iceberg")) == published_files
    table = catalog.load_table(TABLE)
    assert by_key(table.scan(snapshot_id=first.snapshot_id).to_arrow()) == expected_first
    assert by_key(table.scan().to_arrow()) == expected_second

    # The catalog's tables beside ours change nothing of the store's schema checks.
    reopened = open_consensus(consensus.url, create=False)
    try:
        status = schema_status(reopened)
    finally:
        reopened.dispose()
    assert (status["state"], status["upgrade_needed"]) == ("current", False)
    assert not [name for name in status["tables"] if name.startswith("iceberg")]


@sqlite_only
def test_a_table_of_another_schema_is_refused_and_nothing_is_published(consensus, blob, tmp_path, catalog):
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType

    shard, history = compacted_shard(consensus, blob, tmp_path, seed=1, batches=2, since=2)
    catalog.create_namespace("analytics")
    catalog.create_table(TABLE, schema=Schema(
        NestedField(1, "id", LongType()), NestedField(2, "name", StringType()),
        NestedField(3, "amount", StringType()), NestedField(4, "updated_at", LongType())))
    with pytest.raises(ConfigurationError) as raised:
        publish_iceberg(shard, catalog, TABLE)
    assert raised.value.message == (
        f"Iceberg table {TABLE}: column 'amount' is string, the shard's is double, a change Iceberg cannot make to "
        "a column (it promotes int to long, float to double, a decimal's precision up at the same scale): "
        "nothing was published")
    assert raised.value.details["table"] == TABLE
    table = catalog.load_table(TABLE)
    assert table.current_snapshot() is None
    assert table.location() == "file://" + blob.path("_iceberg", "analytics", "orders")
    assert os.path.isdir(blob.path("_iceberg", "analytics", "orders", "metadata"))
    assert not os.path.exists(blob.path("_iceberg", "analytics", "orders", "data"))


@sqlite_only
def test_typed_and_nested_columns_round_trip(consensus, blob, tmp_path, catalog):
    """Decimal, timestamps, a small integer, a map and a list of structs come back from the
    snapshot as the Arrow reader gives them at since; nested field ids are unique."""
    import datetime
    from decimal import Decimal

    element = {"type": "struct", "fields": [{"name": "sku", "type": "string", "nullable": True, "metadata": {}},
                                            {"name": "qty", "type": "integer", "nullable": True, "metadata": {}}]}
    schema = json.loads(_config([
        {"name": "id", "type": "long"},
        {"name": "price", "type": "decimal(12,2)"},
        {"name": "at", "type": "timestamp"},
        {"name": "tiny", "type": "byte"},
        {"name": "tags", "type": {"type": "map", "keyType": "string", "valueType": "long", "valueContainsNull": True}},
        {"name": "items", "type": {"type": "array", "elementType": element, "containsNull": True}},
        {"name": "deleted", "type": "boolean"},
    ], tmp_path).schema)
    shard = make_shard(consensus, blob, tmp_path, buckets=2, schema=json.dumps(schema), order_by=None,
                       delete_marker="deleted")
    at = datetime.datetime(2026, 3, 1, 12, 30, tzinfo=datetime.timezone.utc)

    def row(key: int, version: int, deleted: bool = False) -> dict:
        return {"id": key, "price": Decimal(f"{key}.{version:02d}"), "at": at + datetime.timedelta(hours=version),
                "tiny": version, "tags": [("v", version), ("k", key)],
                "items": [{"sku": f"s{key}", "qty": version}, None], "_deleted": deleted}

    commit_batch(shard, [row(k, 1) for k in range(6)])
    commit_batch(shard, [row(1, 2), row(2, 2, deleted=True), row(7, 2)])
    history = []  # compacted straight from the rows: no order column, later batches win
    for ts, rows in enumerate([[row(k, 1) for k in range(6)], [row(1, 2), row(2, 2, deleted=True), row(7, 2)]]):
        history += [{**r, "_ts": ts} for r in rows]
    compact_batches(shard, history, 2)
    publish_iceberg(shard, catalog, TABLE)
    table = catalog.load_table(TABLE)
    ids = [f.field_id for f in table.schema().find_field("items").field_type.element_type.fields]
    ids += [table.schema().find_field(n).field_id for n in ("id", "price", "at", "tiny", "tags", "items")]
    assert len(set(ids)) == len(ids)
    scanned = by_key(table.scan().to_arrow())
    assert scanned == arrow_table(read_table(shard, as_of=2))
    assert sorted(k for (k,) in scanned) == [0, 1, 3, 4, 5, 7]
    assert scanned[(1,)]["price"] == Decimal("1.02") and scanned[(1,)]["at"] == at + datetime.timedelta(hours=2)
    assert scanned[(1,)]["items"] == [{"sku": "s1", "qty": 2}, None] and dict(scanned[(1,)]["tags"]) == {"v": 2, "k": 1}


@sqlite_only
def test_a_large_table_is_written_in_chunks_of_one_data_file(consensus, blob, tmp_path, catalog):
    """A table created beforehand with small data files: the publish writes many, chunk by
    chunk (every chunk of the reader's batches one PyIceberg write), all in one snapshot."""
    shard, history = compacted_shard(consensus, blob, tmp_path, seed=8, batches=3, since=3, keys=400, buckets=4)
    catalog.create_namespace("analytics")
    catalog.create_table(TABLE, schema=iceberg_schema(shard.config),
                         properties={"write.target-file-size-bytes": "4000"})
    result = publish_iceberg(shard, catalog, TABLE)
    table = catalog.load_table(TABLE)
    files = list(iceberg.current_data_files(table))
    assert result.files == len(files) > 3 and len({f.file_path for f in files}) == len(files)
    assert [s.snapshot_id for s in table.snapshots()] == [result.snapshot_id]
    assert by_key(table.scan().to_arrow()) == expected_table(shard.config, history, 3)


def test_chunks_gather_batches_up_to_the_target():
    schema = pa.schema([("id", pa.int64())])
    batches = [pa.record_batch([pa.array(range(n), pa.int64())], schema=schema) for n in (100, 0, 100, 100, 50)]
    reader = pa.RecordBatchReader.from_batches(schema, iter(batches))
    chunks = list(iceberg.arrow_chunks(reader, 1600))  # 200 rows of 8 bytes
    assert [c.num_rows for c in chunks] == [200, 150]
    assert list(iceberg.arrow_chunks(pa.RecordBatchReader.from_batches(schema, iter([])), 10)) == []
    assert iceberg.target_file_bytes({}) == iceberg.target_file_bytes({"write.target-file-size-bytes": "x"}) == 128 << 20


@sqlite_only
def test_another_shards_table_is_refused(consensus, blob, tmp_path, catalog):
    shard, _ = compacted_shard(consensus, blob, tmp_path, seed=2, batches=2, since=2)
    other, _ = compacted_shard(consensus, blob, tmp_path, seed=2, batches=2, since=2, shard_id="payments")
    published = publish_iceberg(shard, catalog, TABLE)
    with pytest.raises(ConfigurationError, match="published from shard 'orders', not 'payments'"):
        publish_iceberg(other, catalog, TABLE)
    assert [s.snapshot_id for s in catalog.load_table(TABLE).snapshots()] == [published.snapshot_id]


def publish_with_a_peer_first(shard, consensus, blob, catalog, step: str):
    """Publish ``shard`` to TABLE while a peer (a catalog of its own) publishes the same since
    when this publish reaches ``step`` (publish_iceberg's on_step): (this result, the peer's)."""
    peer = iceberg_catalog.open_catalog(catalog_properties(consensus.url, blob.root))
    peer_results = []

    def peer_publishes_first(reached: str) -> None:
        if reached == step and not peer_results:
            peer_results.append(publish_iceberg(shard, peer, TABLE))

    try:
        result = publish_iceberg(shard, catalog, TABLE, on_step=peer_publishes_first)
    finally:
        iceberg_catalog.close_catalog(peer)
    assert peer_results[0].outcome == PUBLISHED
    return result, peer_results[0]


def only_the_peers_snapshot(catalog, blob, shard, history, peer_result):
    """The table, after asserting it holds the peer's snapshot alone, as of since 3, and only
    that snapshot's data files (the loser's went with its attempt)."""
    table = catalog.load_table(TABLE)
    assert [s.snapshot_id for s in table.snapshots()] == [peer_result.snapshot_id]
    assert by_key(table.scan().to_arrow()) == expected_table(shard.config, history, 3)
    on_disk = files_below(blob.path("_iceberg", "analytics", "orders", "data"))
    assert on_disk == {f.file_path.removeprefix("file://") for f in iceberg.current_data_files(table)}
    return table


@sqlite_only
def test_a_publish_that_loses_the_commit_race_publishes_nothing_twice(consensus, blob, tmp_path, catalog):
    """Two publishes of the same since: the one whose commit comes second finds the table
    moved, decides again and has nothing to publish; one snapshot in all."""
    shard, history = compacted_shard(consensus, blob, tmp_path, seed=3, batches=3, since=3)
    result, peer = publish_with_a_peer_first(shard, consensus, blob, catalog, "written")
    assert (result.outcome, result.attempts, result.snapshot_id) == (NOTHING_TO_PUBLISH, 2, peer.snapshot_id)
    table = only_the_peers_snapshot(catalog, blob, shard, history, peer)
    # PyIceberg's own commit retry stays off: it would have rebased the loser's snapshot.
    assert "commit.retry.num-retries" not in table.properties


def test_a_first_publish_that_loses_the_race_to_create_the_table_has_nothing_to_publish(
        consensus, blob, tmp_path, catalog):
    """Two first publishes of one since to a new table: both find no table and decide to
    publish; the peer creates the table and publishes before this one creates it. The
    table this one's create-if-not-exists loads holds the peer's snapshot: it decides again
    and has nothing to publish. One snapshot, one set of data files (SQLite and PostgreSQL
    catalogs)."""
    shard, history = compacted_shard(consensus, blob, tmp_path, seed=12, batches=3, since=3)
    result, peer = publish_with_a_peer_first(shard, consensus, blob, catalog, "create")
    assert (result.outcome, result.attempts, result.snapshot_id) == (NOTHING_TO_PUBLISH, 1, peer.snapshot_id)
    assert result.reason == f"since 3 already published: snapshot {peer.snapshot_id}"
    only_the_peers_snapshot(catalog, blob, shard, history, peer)


@sqlite_only
def test_damaged_table_metadata_is_an_integrity_error_naming_the_file(consensus, blob, tmp_path, catalog):
    from airflow_upsert_provider.engine.errors import IntegrityError

    shard, history = compacted_shard(consensus, blob, tmp_path, seed=13, batches=3, since=2)
    first = publish_iceberg(shard, catalog, TABLE)
    compact_batches(shard, history, 3)
    location = catalog.load_table(TABLE).metadata_location
    path = location.removeprefix("file://")
    intact = open(path, "rb").read()
    for damage, words in ((intact[: len(intact) // 2], "does not parse"), (b"\xff\xfe", "does not parse"),
                          (None, "is missing")):
        if damage is None:
            os.unlink(path)
        else:
            with open(path, "wb") as handle:
                handle.write(damage)
        with pytest.raises(IntegrityError) as raised:
            publish_iceberg(shard, catalog, TABLE, catalog_name="SQL catalog x")
        error = raised.value
        assert error.message.startswith(f"Iceberg table {TABLE} in SQL catalog x: its metadata file {location} {words}")
        assert "nothing was published" in error.message
        assert (error.details["file"], error.retryable, error.exit_code) == (location, False, 4)
    # Put back, the table publishes the new since over the first snapshot.
    with open(path, "wb") as handle:
        handle.write(intact)
    result = publish_iceberg(shard, catalog, TABLE)
    assert (result.outcome, result.since) == (PUBLISHED, 3)
    assert [s.snapshot_id for s in catalog.load_table(TABLE).snapshots()] == [first.snapshot_id, result.snapshot_id]


def test_a_store_failing_the_data_file_upload_is_blob_unavailable_and_commits_nothing(s3_faults, tmp_path):
    """PyIceberg's own writer uploads the data files: a store that fails every upload is a
    transient store failure (BlobUnavailable, retryable, exit 2) as the blob's own requests
    report it; no snapshot, no data file left; the run after the store is back publishes."""
    from airflow_upsert_provider.engine.blob.files import open_blob
    from airflow_upsert_provider.engine.errors import BlobUnavailable

    url = f"sqlite:///{tmp_path / 'c.db'}"
    consensus, s3_blob = open_consensus(url), open_blob(s3_faults.root)
    data_prefix = "shards/_iceberg/analytics/orders/data/"
    try:
        shard, history = compacted_shard(consensus, s3_blob, tmp_path, seed=14, batches=3, since=3)
        catalog = iceberg_catalog.open_catalog(catalog_properties(url, s3_faults.root))
        try:
            s3_faults.proxy.fail(None, data_prefix, times=1000, status=503)
            with pytest.raises(BlobUnavailable) as raised:
                publish_iceberg(shard, catalog, TABLE)
            error = raised.value
            assert (error.retryable, error.exit_code, error.details["operation"]) == (True, 2, "write")
            assert error.details["bucket"] == s3_faults.bucket
            assert error.message.startswith(f"writing {s3_faults.root}/_iceberg/analytics/orders/data failed")
            assert any(r.key.startswith(data_prefix) and r.status == 503 for r in s3_faults.proxy.requests())
            assert catalog.load_table(TABLE).current_snapshot() is None
            assert [k for k in s3_faults.server.keys(s3_faults.bucket, data_prefix) if not k.endswith("/")] == []
            s3_faults.proxy.clear()
            result = publish_iceberg(shard, catalog, TABLE)
            assert (result.outcome, result.since) == (PUBLISHED, 3)
            assert by_key(catalog.load_table(TABLE).scan().to_arrow()) == expected_table(shard.config, history, 3)
        finally:
            iceberg_catalog.close_catalog(catalog)
    finally:
        consensus.dispose()


@sqlite_only
def test_a_crash_before_the_commit_leaves_no_snapshot(consensus, blob, tmp_path, catalog):
    shard, history = compacted_shard(consensus, blob, tmp_path, seed=4, batches=3, since=2)
    first = publish_iceberg(shard, catalog, TABLE)
    compact_batches(shard, history, 3)

    def crash(step: str) -> None:
        raise KeyboardInterrupt(step)

    with pytest.raises(KeyboardInterrupt, match="written"):
        publish_iceberg(shard, catalog, TABLE, on_step=crash)
    table = catalog.load_table(TABLE)
    assert [s.snapshot_id for s in table.snapshots()] == [first.snapshot_id]
    assert by_key(table.scan().to_arrow()) == expected_table(shard.config, history, 2)
    # The run afterwards publishes since 3.
    assert publish_iceberg(shard, catalog, TABLE).since == 3


def test_publish_on_an_object_storage_blob_root(s3_root, tmp_path):
    """A blob root on S3: the default warehouse is <root>/_iceberg on the same store, written
    by PyIceberg's S3 client with the blob's endpoint and the environment's credentials."""
    from airflow_upsert_provider.engine.blob.files import open_blob

    url = f"sqlite:///{tmp_path / 'c.db'}"
    consensus, s3_blob = open_consensus(url), open_blob(s3_root)
    try:
        shard, history = compacted_shard(consensus, s3_blob, tmp_path, seed=9, batches=3, since=3)
        properties = catalog_properties(url, s3_root)
        assert properties["warehouse"] == f"{s3_root}/_iceberg" and properties["s3.endpoint"]
        catalog = iceberg_catalog.open_catalog(properties)
        try:
            result = publish_iceberg(shard, catalog, TABLE)
            table = catalog.load_table(TABLE)
            assert table.location() == f"{s3_root}/_iceberg/analytics/orders"
            assert result.files >= 1 and all(f.file_path.startswith(table.location())
                                              for f in iceberg.current_data_files(table))
            assert by_key(table.scan().to_arrow()) == expected_table(shard.config, history, 3)
        finally:
            iceberg_catalog.close_catalog(catalog)
    finally:
        consensus.dispose()


@sqlite_only
def test_a_damaged_run_file_fails_the_publish_naming_it_and_leaves_no_file(consensus, blob, tmp_path, catalog):
    from airflow_upsert_provider.engine.errors import IntegrityError

    shard, history = compacted_shard(consensus, blob, tmp_path, seed=10, batches=2, since=2, keys=400, buckets=4)
    catalog.create_namespace("analytics")
    # Small data files: some are written before the read reaches the damaged bucket.
    catalog.create_table(TABLE, schema=iceberg_schema(shard.config), properties={"write.target-file-size-bytes": "2000"})
    victim = blob.path(shard.live_runs()[0]["files"][-1]["path"])
    with open(victim, "r+b") as handle:
        handle.truncate(os.path.getsize(victim) - 9)  # its footer is gone
    with pytest.raises(IntegrityError, match="damaged") as raised:
        publish_iceberg(shard, catalog, TABLE)
    assert raised.value.details["file"] == victim
    table = catalog.load_table(TABLE)
    assert table.current_snapshot() is None
    assert files_below(blob.path("_iceberg", "analytics", "orders", "data")) == set()


# -- upsertctl publish ---------------------------------------------------------------------


@pytest.fixture
def cli_shard(tmp_path, monkeypatch):
    """A compacted shard in a store `upsertctl` (in this process) uses; Spark refused."""
    from airflow_upsert_provider.cli.context import Context
    from tests.helpers import cli_store

    consensus, cli_blob = cli_store(tmp_path, monkeypatch, f"sqlite:///{tmp_path / 'c.db'}")
    shard, history = compacted_shard(consensus, cli_blob, tmp_path, seed=5, batches=3, since=2)

    def no_spark(self):
        raise AssertionError("publish started Spark")

    monkeypatch.setattr(Context, "spark", no_spark)
    yield shard, history
    consensus.dispose()


def test_upsertctl_publish_without_spark(cli_shard, capsys):
    shard, history = cli_shard
    code, out, err = run_cli(capsys, "publish", "orders", "--iceberg", TABLE)
    assert code == 0, err
    properties = catalog_properties(shard.consensus.url, shard.blob.root)
    catalog = iceberg_catalog.open_catalog(properties)
    try:
        table = catalog.load_table(TABLE)
        snapshot_id = table.current_snapshot().snapshot_id
        assert out.startswith(f"published snapshot {snapshot_id} at since 2 to {TABLE} (")
        assert by_key(table.scan().to_arrow()) == expected_table(shard.config, history, 2)
    finally:
        iceberg_catalog.close_catalog(catalog)
    code, out, err = run_cli(capsys, "publish", "orders", "--iceberg", TABLE)
    assert (code, out) == (0, f"nothing to publish (since 2 already published: snapshot {snapshot_id})\n"), err
    code, out, err = run_cli(capsys, "publish", "orders", "--iceberg", TABLE, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert {k: report[k] for k in ("outcome", "snapshot_id", "since", "upper", "table")} == {
        "outcome": "nothing_to_publish", "snapshot_id": snapshot_id, "since": 2, "upper": 3, "table": TABLE}


def test_upsertctl_publish_errors(cli_shard, capsys, monkeypatch):
    code, out, err = run_cli(capsys, "publish", "orders", "--iceberg", "orders")
    assert code == 2 and "Iceberg table 'orders' is not NAMESPACE.TABLE" in err
    # An unreachable catalog: exit 2 (retryable), its password never shown.
    code, out, err = run_cli(capsys, "publish", "orders", "--iceberg", TABLE, "--json",
                             "--catalog-uri", "postgresql://iceberg:Hunter2secret@127.0.0.1:1/catalog")
    assert code == 2, err
    payload = json.loads(out)
    assert payload["error"] == ConsensusUnavailable.__name__ and payload["retryable"] is True
    assert "nothing was published" in payload["message"] and "127.0.0.1" in payload["message"]
    assert "Hunter2secret" not in out + err
    # The same URL from the environment, where a password belongs (argv is visible to ps).
    monkeypatch.setenv("UPSERT_ICEBERG_CATALOG_URI", "postgresql://iceberg:Hunter2secret@127.0.0.1:1/catalog")
    code, out, err = run_cli(capsys, "publish", "orders", "--iceberg", TABLE)
    assert code == 2 and "SQL catalog postgresql+psycopg://iceberg:***@127.0.0.1:1/catalog could not be used" in err
    assert "Hunter2secret" not in out + err
    # A catalog URI of no known kind names the option, not a consensus URL (nor the URI).
    code, out, err = run_cli(capsys, "publish", "orders", "--iceberg", TABLE, "--catalog-uri", "garbage")
    assert code == 2 and "the Iceberg catalog URI is neither a REST catalog's" in err and "consensus" not in err
    # A REST catalog's client is PyIceberg's: nothing answers here, nothing is published.
    monkeypatch.delenv("UPSERT_ICEBERG_CATALOG_URI")
    code, out, err = run_cli(capsys, "publish", "orders", "--iceberg", TABLE, "--catalog-uri", "http://127.0.0.1:1/api")
    assert code == 2 and "REST catalog http://127.0.0.1:1/api could not be used" in err, err


def test_upsertctl_publish_refuses_unsafe_table_names_and_creates_nothing(cli_shard, capsys):
    shard, _ = cli_shard
    for name, words in (("ns/x.t", "holds '/', a path separator"),
                        ("ns.t\nx", "holds a control or unprintable character")):
        code, out, err = run_cli(capsys, "publish", "orders", "--iceberg", name)
        assert (code, out) == (2, ""), err
        assert words in err and err.count("\n") == 1, err
    assert not os.path.exists(shard.blob.path("_iceberg"))


def test_upsertctl_publish_with_damaged_metadata_exits_4_naming_the_file(cli_shard, capsys):
    shard, _ = cli_shard
    assert run_cli(capsys, "publish", "orders", "--iceberg", TABLE)[0] == 0
    catalog = iceberg_catalog.open_catalog(catalog_properties(shard.consensus.url, shard.blob.root))
    try:
        location = catalog.load_table(TABLE).metadata_location
    finally:
        iceberg_catalog.close_catalog(catalog)
    with open(location.removeprefix("file://"), "wb") as handle:
        handle.write(b"{}")
    code, out, err = run_cli(capsys, "publish", "orders", "--iceberg", TABLE, "--json")
    payload = json.loads(out)
    assert code == 4 and (payload["error"], payload["retryable"], payload["file"]) == ("IntegrityError", False, location)
    assert f"its metadata file {location} does not parse" in err


# -- the operator --------------------------------------------------------------------------


@sqlite_only
def test_the_operator_publishes_through_the_connection(consensus, blob, tmp_path, monkeypatch):
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_upsert_provider.operators.maintenance import PublishIcebergOperator

    monkeypatch.setenv("AIRFLOW_CONN_UPSERT_DEFAULT", json.dumps(
        {"conn_type": "upsert", "extra": {"consensus_url": consensus.url, "blob_root": blob.root}}))
    shard, history = compacted_shard(consensus, blob, tmp_path, seed=6, batches=3, since=3)
    assert PublishIcebergOperator.template_fields == ("shard", "table")
    result = PublishIcebergOperator(task_id="publish", shard="orders", table=TABLE).execute({})
    assert (result["outcome"], result["since"], result["table"]) == (PUBLISHED, 3, TABLE)
    again = PublishIcebergOperator(task_id="publish", shard="orders", table=TABLE).execute({})
    assert (again["outcome"], again["snapshot_id"]) == (NOTHING_TO_PUBLISH, result["snapshot_id"])
    catalog = iceberg_catalog.open_catalog(catalog_properties(consensus.url, blob.root))
    try:
        assert by_key(catalog.load_table(TABLE).scan().to_arrow()) == expected_table(shard.config, history, 3)
    finally:
        iceberg_catalog.close_catalog(catalog)
    with pytest.raises(AirflowFailException, match="is not NAMESPACE.TABLE"):
        PublishIcebergOperator(task_id="publish", shard="orders", table="orders").execute({})


# -- an Iceberg catalog connection -----------------------------------------------------------


def test_a_catalog_connection_maps_its_extra_to_pyiceberg_properties_and_its_password_to_the_secret():
    rest = {"uri": "https://catalog.example.com/api", "warehouse": "lake", "scope": "catalog", "header.X-Team": "data",
            "rest.sigv4-enabled": False, "connect-timeout": 10}
    # A REST catalog: the password with a login is the OAuth2 client credential, alone the token.
    assert iceberg_catalog.connection_catalog_properties("sqlite:///c.db", "/b", rest, login="client", password="pw") == {
        "type": "rest", "uri": "https://catalog.example.com/api", "warehouse": "lake", "scope": "catalog",
        "header.X-Team": "data", "rest.sigv4-enabled": "false", "connect-timeout": "10", "credential": "client:pw"}
    assert iceberg_catalog.connection_catalog_properties("sqlite:///c.db", "/b", rest, password="tok")["token"] == "tok"
    assert "token" not in iceberg_catalog.connection_catalog_properties("sqlite:///c.db", "/b", rest)
    # A SQL catalog: the password goes into its URL; the default warehouse, unless the extra says.
    sql = iceberg_catalog.connection_catalog_properties("sqlite:///c.db", "/b", {"uri": "postgresql://ice@db:5432/cat"},
                                                password="pw")
    assert sql == {"type": "sql", "uri": "postgresql+psycopg://ice:pw@db:5432/cat", "warehouse": "file:///b/_iceberg"}
    assert "pw" not in iceberg_catalog.describe_catalog(sql)
    assert iceberg_catalog.connection_catalog_properties(
        "sqlite:///c.db", "/b", {"uri": "sqlite:///i.db", "type": "SQL", "warehouse": "s3://w"})["warehouse"] == "s3://w"


@pytest.mark.parametrize(("extra", "password", "field", "words"), [
    ({}, None, "uri", "its extra names no catalog 'uri'"),
    ({"uri": "garbage"}, None, "catalog_uri", "neither a REST catalog's"),
    ({"uri": "https://c/api", "type": "sql"}, None, "type", "extra 'type' is 'sql', but its uri is a REST catalog's"),
    ({"uri": "https://c/api", "scope": {"a": 1}}, None, "scope", "extra 'scope' is not a string, number or boolean"),
    ({"uri": "https://c/api", "token": "also-secret"}, "pw", "token", "give the secret once, in the password field"),
])
def test_a_catalog_connection_that_cannot_be_used_is_refused_naming_the_key(extra, password, field, words):
    with pytest.raises(ConfigurationError) as raised:
        iceberg_catalog.connection_catalog_properties("sqlite:///c.db", "/b", extra, password=password, connection="conn 'x'")
    assert words in raised.value.message and raised.value.details["field"] == field
    assert "also-secret" not in raised.value.message and "pw" not in raised.value.message
