"""A publish whose data files Spark's executors write to a table on object storage (the
loopback S3 server, through the fault proxy that records every request): executors open the
store with their own credential chain, nothing of a credential crosses from the driver, the
driver checks each file's stored size and footer and commits one snapshot equal to the
shard's table at its since, and buckets no batch touched keep their files, across a
rebucket. A store that changes uploads is caught before the commit."""

from __future__ import annotations

import random
from collections import Counter
from functools import partial

import pyarrow.parquet as pq
import pytest

from airflow_upsert_provider.engine.blob.files import open_blob
from airflow_upsert_provider.engine.blob.filesystems import filesystem_for
from airflow_upsert_provider.engine.errors import IntegrityError
from airflow_upsert_provider.engine.maintenance import iceberg_catalog, iceberg_spark
from airflow_upsert_provider.engine.maintenance.compaction import compact
from airflow_upsert_provider.engine.maintenance.iceberg import PUBLISHED, current_data_files, publish_iceberg
from airflow_upsert_provider.engine.maintenance.iceberg_buckets import bucket_of_data_file
from airflow_upsert_provider.engine.maintenance.iceberg_catalog import catalog_properties
from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.engine.table.arrow_reader import read_table
from airflow_upsert_provider.engine.table.runs import bucket_column
from tests.arrow_runs import arrow_table, expected_table
from tests.helpers import make_shard
from tests.maintenance.test_iceberg import TABLE, by_key
from tests.maintenance.test_iceberg_spark import spark_batch, updates
from tests.s3server import ACCESS_KEY_ID, SECRET_ACCESS_KEY

BUCKETS = 4
DATA_PREFIX = "shards/_iceberg/analytics/orders/data/"


@pytest.fixture
def s3_shard(spark, s3_faults, s3_executors, tmp_path):
    """A shard and the default catalog on the S3 root behind the fault proxy, the session's
    executors reaching the proxy with the server's credentials in their own environment."""
    url = f"sqlite:///{tmp_path / 'c.db'}"
    consensus = open_consensus(url)
    shard = make_shard(consensus, open_blob(s3_faults.root), tmp_path, buckets=BUCKETS)
    catalog = iceberg_catalog.open_catalog(catalog_properties(url, s3_faults.root))
    yield shard, catalog
    iceberg_catalog.close_catalog(catalog)
    consensus.dispose()


def buckets_by(spark, shard, count: int, keys: range) -> dict[int, int]:
    frame = spark.createDataFrame([(k,) for k in keys], "id long")
    return {r["id"]: r["b"] for r in frame.select("id", bucket_column(shard.config, count).alias("b")).collect()}


def data_requests(requests) -> Counter:
    return Counter(r.method for r in requests if r.key.startswith(DATA_PREFIX))


def test_executors_publish_to_s3_equal_to_the_shard_across_batches_compactions_and_a_rebucket(
        spark, s3_shard, s3_faults):
    shard, catalog = s3_shard
    proxy = s3_faults.proxy
    rng = random.Random(35)
    history: list[dict] = []
    keys = range(120)
    published: dict[int, dict] = {}  # snapshot id -> the table it must hold

    def publish_and_check(count: int, rewritten: int) -> set[str]:
        seen = len(proxy.requests())
        before = {f.file_path for f in current_data_files(catalog.load_table(TABLE))} \
            if catalog.table_exists(TABLE) else set()
        result = publish_iceberg(shard, catalog, TABLE, spark=spark, retention=None)
        requests = data_requests(proxy.requests()[seen:])
        since = shard.state().since
        assert (result.outcome, result.since, result.buckets_rewritten, result.buckets_kept) == (
            PUBLISHED, since, rewritten, count - rewritten)
        table = catalog.load_table(TABLE)
        expected = expected_table(shard.config, history, since)
        scanned = table.scan().to_arrow()
        assert scanned.num_rows == len(expected)  # no key twice
        assert by_key(scanned) == expected == arrow_table(read_table(shard, as_of=since))
        published[result.snapshot_id] = expected
        after = {f.file_path for f in current_data_files(table)}
        new = after - before
        assert all(p.startswith(f"{s3_faults.root}/_iceberg/analytics/orders/data/") for p in after)
        assert len(new) == result.files and len({bucket_of_data_file(p) for p in new}) == rewritten
        # Each new file: one PUT by an executor; the driver's read-back one HEAD and one GET
        # (the footer); nothing listed, nothing read twice.
        assert (requests["PUT"], requests["HEAD"], requests["GET"]) == (len(new),) * 3, requests
        return after - new  # the files kept

    spark_batch(spark, shard, history, updates(rng, rng.sample(keys, 90)))
    spark_batch(spark, shard, history, updates(rng, rng.sample(keys, 40)))
    compact(spark, shard)
    publish_and_check(BUCKETS, BUCKETS)

    bucket_of = buckets_by(spark, shard, BUCKETS, keys)
    touched = rng.randrange(BUCKETS)
    spark_batch(spark, shard, history, updates(rng, [k for k in keys if bucket_of[k] == touched][:8]))
    compact(spark, shard)
    before = {f.file_path for f in current_data_files(catalog.load_table(TABLE))}
    kept = publish_and_check(BUCKETS, 1)
    assert kept == {p for p in before if bucket_of_data_file(p) != str(touched)}

    spark_batch(spark, shard, history, updates(rng, rng.sample(keys, 30)))
    compact(spark, shard, buckets=2 * BUCKETS)  # a rebucket: every file is written again
    publish_and_check(2 * BUCKETS, 2 * BUCKETS)

    bucket_of = buckets_by(spark, shard, 2 * BUCKETS, keys)
    touched = rng.randrange(2 * BUCKETS)
    spark_batch(spark, shard, history, updates(rng, [k for k in keys if bucket_of[k] == touched][:5]))
    compact(spark, shard)
    before = {f.file_path for f in current_data_files(catalog.load_table(TABLE))}
    kept = publish_and_check(2 * BUCKETS, 1)
    assert kept == {p for p in before if bucket_of_data_file(p) != str(touched)}

    table = catalog.load_table(TABLE)
    filesystem, _inner = filesystem_for(s3_faults.root)
    for data_file in current_data_files(table):
        path = data_file.file_path.removeprefix("s3://")
        # The table's field ids in the file's schema; one bucket's rows, the bucket its name says.
        schema = pq.read_schema(path, filesystem=filesystem)
        assert [(f.name, f.metadata[b"PARQUET:field_id"]) for f in schema] == [
            (f.name, str(f.field_id).encode()) for f in table.schema().fields]
        ids = pq.read_table(path, columns=["id"], filesystem=filesystem).column("id").to_pylist()
        assert {str(bucket_of[i]) for i in ids} == {bucket_of_data_file(path)}
    # Time travel: every snapshot still holds the table it was published with.
    for snapshot_id, expected in published.items():
        assert by_key(table.scan(snapshot_id=snapshot_id).to_arrow()) == expected


def test_what_crosses_to_the_executors_holds_no_credential(s3_shard):
    """The function each writing task runs, as Spark ships it (cloudpickle, into the plan): the
    data location, the schema, the attempt's uuid and the size target; the executors take the
    credentials from their own environment."""
    import pyarrow as pa
    from pyspark.cloudpickle import dumps

    from airflow_upsert_provider.engine.table.run_io import RunFileTarget, run_writer_task

    _shard, catalog = s3_shard
    catalog.create_namespace_if_not_exists(("analytics",))
    table = catalog.create_table(("analytics", "x"), schema=pa.schema([("id", pa.int64())]))
    location = iceberg_spark.data_location(table)
    shipped = dumps(run_writer_task(RunFileTarget(location, "", ("id",)), partial(
        iceberg_spark.write_data_files, schema=pa.schema([("id", pa.int64())]), write_uuid="u", target_bytes=1)))
    assert location.encode() in shipped
    assert SECRET_ACCESS_KEY.encode() not in shipped and ACCESS_KEY_ID.encode() not in shipped


def test_a_store_that_changes_the_uploads_is_caught_before_the_commit_naming_the_file(spark, s3_shard, s3_faults):
    shard, catalog = s3_shard
    history: list[dict] = []
    spark_batch(spark, shard, history, updates(random.Random(5), list(range(40))))
    compact(spark, shard)
    s3_faults.proxy.store_aws_chunked(DATA_PREFIX)
    with pytest.raises(IntegrityError) as raised:
        publish_iceberg(shard, catalog, TABLE, spark=spark, retention=None)
    error = raised.value
    assert error.details["file"].startswith(f"{s3_faults.root}/_iceberg/analytics/orders/data/")
    assert "the store changed the upload" in error.message and "nothing was published" in error.message
    assert catalog.load_table(TABLE).current_snapshot() is None
    # What the executors wrote is deleted: no snapshot references it.
    assert [k for k in s3_faults.server.keys(s3_faults.bucket, DATA_PREFIX) if not k.endswith("/")] == []
    s3_faults.proxy.clear()
    result = publish_iceberg(shard, catalog, TABLE, spark=spark, retention=None)
    assert result.outcome == PUBLISHED
    assert by_key(catalog.load_table(TABLE).scan().to_arrow()) == expected_table(
        shard.config, history, shard.state().since)


def test_the_read_back_rule_names_a_size_or_row_count_other_than_what_was_written():
    rng = random.Random(11)
    for _ in range(500):
        written, rows = rng.randrange(1, 10**9), rng.randrange(0, 10**7)
        stored = written if rng.random() < 0.5 else written + rng.choice([-1, 1]) * rng.randrange(1, 10**6)
        footer = rows if rng.random() < 0.5 else rows + rng.randrange(1, 100)
        problem = iceberg_spark.written_file_problem("s3://b/t/data/f.parquet", written, rows, stored, footer)
        if stored != written:
            assert problem is not None and f"holds {stored} bytes" in problem and "f.parquet" in problem
        elif footer != rows:
            assert problem is not None and f"holds {footer} rows" in problem
        else:
            assert problem is None
        # Before the footer is read, only the size is checked.
        assert (iceberg_spark.written_file_problem("f", written, rows, stored) is None) == (stored == written)


def test_upsertctl_publish_refuses_spark_settings_without_spark(tmp_path, monkeypatch, capsys):
    from tests.helpers import run_cli

    monkeypatch.setenv("UPSERT_CONSENSUS_URL", f"sqlite:///{tmp_path / 'c.db'}")
    monkeypatch.setenv("UPSERT_BLOB_ROOT", str(tmp_path / "blob"))
    (tmp_path / "blob").mkdir()
    code, _out, err = run_cli(capsys, "publish", "orders", "--iceberg", "analytics.orders",
                              "--conf", "spark.sql.shuffle.partitions=2")
    assert code == 2 and "--conf sets the Spark session of a publish with --spark" in err
