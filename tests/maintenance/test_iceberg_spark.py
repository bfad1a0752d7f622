"""A publish whose data files Spark's executors write (engine/maintenance/iceberg_spark.py), on
the real Spark session fixture: runs written and compacted by the engine's Spark code, the
snapshot equal to the shard's own read at since and to the Arrow path's, every data file in
the table's schema with its Iceberg field ids and holding one bucket's rows, and the buckets
no batch touched kept."""

from __future__ import annotations

import random
import uuid

import pyarrow.parquet as pq
import pytest

from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.engine.maintenance import iceberg_spark
from airflow_upsert_provider.engine.maintenance.compaction import compact
from airflow_upsert_provider.engine.maintenance.iceberg import PUBLISHED, current_data_files, publish_iceberg
from airflow_upsert_provider.engine.maintenance.iceberg_buckets import bucket_of_data_file
from airflow_upsert_provider.engine.store.records import BatchRecord
from airflow_upsert_provider.engine.table.arrow_reader import read_table
from airflow_upsert_provider.engine.table.runs import bucket_column, run_schema, write_bucketed
from tests.arrow_runs import arrow_table, expected_table
from tests.conftest import sqlite_only
from tests.helpers import make_shard
from tests.maintenance.test_iceberg import TABLE, by_key, catalog  # noqa: F401

BUCKETS = 4


def buckets_of(spark, shard, keys: list[int]) -> dict[int, int]:
    frame = spark.createDataFrame([(k,) for k in keys], "id long")
    return {r["id"]: r["b"] for r in frame.select("id", bucket_column(shard.config).alias("b")).collect()}


def spark_batch(spark, shard, history: list[dict], rows: list[dict]) -> None:
    """Commit ``rows`` as the next batch, written by the engine's Spark run writer."""
    ts = shard.state().upper
    stamped = [{**r, "_ts": ts} for r in rows]
    frame = spark.createDataFrame(stamped, run_schema(shard.config)).withColumn("_bucket", bucket_column(shard.config))
    run = write_bucketed(frame, shard.config, shard.blob, shard.run_dir(ts, "w", uuid.uuid4().hex[:8]))
    assert shard.compare_and_append(ts, ts + 1, BatchRecord(ts, "w", f"t{ts}", run, {})).upper == ts + 1
    history += stamped


def updates(rng: random.Random, keys: list[int]) -> list[dict]:
    rows = []
    for key in keys:
        deleted = rng.random() < 0.15
        rows.append({"id": key, "name": None if deleted else f"n{key}-{rng.randrange(100)}",
                     "amount": None if deleted else float(rng.randrange(1000)),
                     "updated_at": rng.randrange(4), "_deleted": deleted})
    return rows


@sqlite_only
def test_executors_write_the_data_files_of_one_snapshot_equal_to_the_shards_read(spark, consensus, blob, tmp_path,
                                                                                 catalog):
    shard = make_shard(consensus, blob, tmp_path, buckets=BUCKETS)
    rng = random.Random(7)
    history: list[dict] = []
    bucket_of = buckets_of(spark, shard, list(range(80)))
    for _ in range(2):
        spark_batch(spark, shard, history, updates(rng, rng.sample(range(80), 50)))
    compact(spark, shard)
    since = shard.state().since

    result = publish_iceberg(shard, catalog, TABLE, spark=spark, retention=None)
    assert (result.outcome, result.since, result.buckets_rewritten) == (PUBLISHED, since, BUCKETS)
    table = catalog.load_table(TABLE)
    assert [s.snapshot_id for s in table.snapshots()] == [result.snapshot_id]
    expected = expected_table(shard.config, history, since)
    assert by_key(table.scan().to_arrow()) == expected == arrow_table(read_table(shard, as_of=since))
    # The Arrow path publishes the same rows.
    arrow = publish_iceberg(shard, catalog, "analytics.arrow", retention=None)
    assert by_key(catalog.load_table("analytics.arrow").scan().to_arrow()) == expected
    assert result.rows == arrow.rows == len(expected)

    files = list(current_data_files(table))
    assert files and sum(f.record_count for f in files) == len(expected)
    for data_file in files:
        path = data_file.file_path.removeprefix("file://")
        # The table's field ids in the file's schema: readers map columns by id.
        schema = pq.read_schema(path)
        assert [(f.name, f.metadata[b"PARQUET:field_id"]) for f in schema] == [
            (f.name, str(f.field_id).encode()) for f in table.schema().fields]
        # One bucket's rows, the bucket its name says.
        ids = pq.read_table(path, columns=["id"]).column("id").to_pylist()
        assert {str(bucket_of[i]) for i in ids} == {bucket_of_data_file(path)}

    # A batch in one bucket: the executors write that bucket again, the others' files stay.
    [one] = rng.sample(range(BUCKETS), 1)
    before = {f.file_path for f in files}
    spark_batch(spark, shard, history, updates(rng, [k for k in range(80) if bucket_of[k] == one][:6]))
    compact(spark, shard)
    second = publish_iceberg(shard, catalog, TABLE, spark=spark, retention=None)
    assert (second.outcome, second.buckets_rewritten, second.buckets_kept) == (PUBLISHED, 1, BUCKETS - 1)
    table = catalog.load_table(TABLE)
    after = {f.file_path for f in current_data_files(table)}
    assert {p for p in before if bucket_of_data_file(p) != str(one)} <= after
    assert all(bucket_of_data_file(p) == str(one) for p in after - before)
    assert by_key(table.scan().to_arrow()) == expected_table(shard.config, history, shard.state().since)
    assert by_key(table.scan(snapshot_id=result.snapshot_id).to_arrow()) == expected


@sqlite_only
def test_after_a_rebucket_the_executors_write_the_new_counts_buckets_and_keep_them_apart(spark, consensus, blob,
                                                                                        tmp_path, catalog):
    shard = make_shard(consensus, blob, tmp_path, buckets=BUCKETS)
    rng = random.Random(8)
    history: list[dict] = []
    spark_batch(spark, shard, history, updates(rng, rng.sample(range(80), 50)))
    compact(spark, shard)
    publish_iceberg(shard, catalog, TABLE, spark=spark, retention=None)
    spark_batch(spark, shard, history, updates(rng, rng.sample(range(80), 20)))
    compact(spark, shard, buckets=2 * BUCKETS)
    frame = spark.createDataFrame([(k,) for k in range(80)], "id long")
    bucket_of = {r["id"]: r["b"] for r in frame.select("id", bucket_column(shard.config, 2 * BUCKETS).alias("b"))
                 .collect()}

    for touched in (None, rng.randrange(2 * BUCKETS)):
        if touched is not None:  # a batch in one bucket of the new count
            spark_batch(spark, shard, history,
                        updates(rng, [k for k in range(80) if bucket_of[k] == touched][:5]))
            compact(spark, shard)
        result = publish_iceberg(shard, catalog, TABLE, spark=spark, retention=None)
        rewritten = 2 * BUCKETS if touched is None else 1
        assert (result.outcome, result.buckets_rewritten, result.buckets_kept) == (
            PUBLISHED, rewritten, 2 * BUCKETS - rewritten)
        table = catalog.load_table(TABLE)
        scanned = table.scan().to_arrow()
        expected = expected_table(shard.config, history, shard.state().since)
        assert scanned.num_rows == len(expected)  # no key twice
        assert by_key(scanned) == expected == arrow_table(read_table(shard, as_of=shard.state().since))
        for data_file in current_data_files(table):
            path = data_file.file_path.removeprefix("file://")
            ids = pq.read_table(path, columns=["id"]).column("id").to_pylist()
            # One bucket's rows among the new count, the bucket its name says.
            assert {str(bucket_of[i]) for i in ids} == {bucket_of_data_file(path)}


def test_executors_write_to_a_local_or_object_storage_location_and_an_unreachable_one_is_refused_naming_it():
    class At:
        def __init__(self, location):
            self._location = location

        def location(self):
            return self._location

        def name(self):
            return ("analytics", "orders")

    assert iceberg_spark.data_location(At("s3://lake/warehouse/analytics/orders/")) == \
        "s3://lake/warehouse/analytics/orders/data"
    assert iceberg_spark.data_location(At("file:///w/analytics/orders")) == "file:///w/analytics/orders/data"
    with pytest.raises(ConfigurationError, match="analytics.orders is at a location Spark executors cannot") as raised:
        iceberg_spark.data_location(At("oss://lake/warehouse/analytics/orders"))
    assert raised.value.details["field"] == "spark"


@sqlite_only
def test_the_operator_publishes_through_executors(spark, consensus, blob, tmp_path, catalog, monkeypatch):
    import json

    from airflow_upsert_provider.operators.maintenance import PublishIcebergOperator

    monkeypatch.setenv("AIRFLOW_CONN_UPSERT_DEFAULT", json.dumps(
        {"conn_type": "upsert", "extra": {"consensus_url": consensus.url, "blob_root": blob.root}}))
    shard = make_shard(consensus, blob, tmp_path, buckets=BUCKETS)
    history: list[dict] = []
    spark_batch(spark, shard, history, updates(random.Random(3), list(range(30))))
    compact(spark, shard)
    calls = []
    monkeypatch.setattr(iceberg_spark, "write_on_executors", _counting(iceberg_spark.write_on_executors, calls))
    result = PublishIcebergOperator(task_id="publish", shard="orders", table=TABLE, spark=True).execute({})
    assert (result["outcome"], result["buckets_rewritten"], len(calls)) == (PUBLISHED, BUCKETS, 1)
    assert by_key(catalog.load_table(TABLE).scan().to_arrow()) == expected_table(
        shard.config, history, shard.state().since)
    assert not spark.sparkContext._jsc.sc().isStopped()  # the session it did not start stays


def _counting(function, calls: list):
    def counted(*args, **kwargs):
        calls.append(args)
        return function(*args, **kwargs)

    return counted
