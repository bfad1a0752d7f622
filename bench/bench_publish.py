"""Benchmark of an Iceberg publish: only changed buckets written against a whole rewrite, and
the table's storage with and without snapshot expiry.

At each table size N (default buckets, 8): a shard holding N rows, compacted, is published to
two tables: ``bench.changed`` by the publish as it is (only the buckets whose runs changed are
written) and ``bench.whole`` by the same publish with every bucket rewritten (the behaviour
before, patched in). Then, each followed by a tiered compaction and a publish to both tables:

  clustered   a batch of K updates whose keys all fall in one bucket
  random      a batch of K updates over the whole key range (every bucket)

Reported per publish: seconds, rows and bytes written, buckets rewritten. Then ``--cycles``
rounds of a random batch, a compaction and a publish to two new tables, one with the default
retention replaced by ``keep_last=3`` and one with expiry off: the bytes under each table's
location after the last round.

With ``--object-storage``, instead: the shard and the tables on the loopback S3 server (moto,
tests/s3server.py), and each publish made twice, to two tables: by the Arrow path (this
process reads the runs and PyIceberg writes the files) and by Spark's executors (they merge
and write the files through pyarrow, the driver reads each footer back). Reported per publish:
seconds, bytes of data files written, and the S3 requests by kind.

    .venv/bin/python bench/bench_publish.py                   # 1M and 4M rows, 20k updates
    .venv/bin/python bench/bench_publish.py --rows 200000     # quick
    .venv/bin/python bench/bench_publish.py --object-storage --rows 1000000
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from unittest import mock

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from airflow_upsert_provider.engine.blob.files import open_blob  # noqa: E402
from airflow_upsert_provider.engine.config import ShardConfig  # noqa: E402
from airflow_upsert_provider.engine.maintenance import iceberg, iceberg_catalog  # noqa: E402
from airflow_upsert_provider.engine.maintenance.compaction import compact  # noqa: E402
from airflow_upsert_provider.engine.maintenance.iceberg_buckets import plan_buckets  # noqa: E402
from airflow_upsert_provider.engine.maintenance.iceberg_expiry import Retention  # noqa: E402
from airflow_upsert_provider.engine.spark.session import get_spark  # noqa: E402
from airflow_upsert_provider.engine.store.registry import open_consensus  # noqa: E402
from airflow_upsert_provider.engine.table.shard import Shard  # noqa: E402
from airflow_upsert_provider.sample_data import sample_schema_json  # noqa: E402
from bench.bench_maintenance import commit_run, synthetic_rows, timed  # noqa: E402


def whole_rewrite(live, published, current_files):
    """The plan of the publish before buckets were kept: every bucket, every file replaced."""
    return plan_buckets(live, None, current_files)


def publish(shard, catalog, table: str, *, whole: bool, retention=None, spark=None) -> dict:
    def run():
        return iceberg.publish_iceberg(shard, catalog, table, retention=retention, spark=spark)

    if whole:
        with mock.patch.object(iceberg, "plan_buckets", whole_rewrite):
            result, seconds = timed(run)
    else:
        result, seconds = timed(run)
    assert result.outcome == iceberg.PUBLISHED, result
    return {"seconds": seconds, "rows": result.rows, "bytes": result.bytes, "buckets": result.buckets_rewritten}


def batch(spark, shard, *, keys: int, change: int, ts: int, bucket: int | None) -> None:
    from pyspark.sql import functions as F

    if bucket is None:
        rows = synthetic_rows(spark, shard, rows=change, keys=keys, ts=ts, seed=ts)
    else:
        # About as many updates, every key in one bucket: draw buckets x as many, keep one bucket's.
        drawn = min(change * shard.config.buckets, keys)
        rows = synthetic_rows(spark, shard, rows=drawn, keys=keys, ts=ts, seed=ts).where(F.col("_bucket") == bucket)
    commit_run(spark, shard, rows, ts)
    compact(spark, shard)


def directory_bytes(path: str) -> tuple[int, int]:
    files = [os.path.join(d, n) for d, _, names in os.walk(path) for n in names]
    return len(files), sum(os.path.getsize(f) for f in files)


def compacted_shard(spark, root: str, blob_root: str, rows: int):
    """A shard of ``rows`` keys (8 buckets) under ``blob_root``, fully compacted, its store
    under ``root``, and the default Iceberg catalog: (consensus, shard, catalog)."""
    os.makedirs(os.path.join(root, "landing"), exist_ok=True)
    consensus = open_consensus(f"sqlite:///{root}/consensus.db")
    blob = open_blob(blob_root)
    config = ShardConfig(source=f"dir:{os.path.join(root, 'landing')}", keys=("id",), schema=sample_schema_json(),
                         order_by="updated_at", delete_marker="deleted", buckets=8)
    shard = Shard.create(consensus, blob, "bench", config)
    commit_run(spark, shard, synthetic_rows(spark, shard, rows=rows, keys=rows, ts=0, seed=0), 0)
    compact(spark, shard, full=True)
    catalog = iceberg_catalog.open_catalog(iceberg_catalog.catalog_properties(consensus.url, blob.root))
    return consensus, shard, catalog


def bench_size(spark, workdir: str, rows: int, change: int, cycles: int) -> None:
    root = os.path.join(workdir, f"rows-{rows}")
    consensus, shard, catalog = compacted_shard(spark, root, os.path.join(root, "blob"), rows)
    config = shard.config
    print(f"\n{rows:,} rows, {config.buckets} buckets, {change:,} updates per batch")
    print(f"{'publish':34s} {'changed s':>9s} {'whole s':>8s} {'changed MB':>10s} {'whole MB':>9s} {'buckets':>7s}")

    def row(name: str) -> None:
        changed = publish(shard, catalog, "bench.changed", whole=False)
        whole = publish(shard, catalog, "bench.whole", whole=True)
        print(f"{name:34s} {changed['seconds']:9.2f} {whole['seconds']:8.2f} {changed['bytes'] / 1e6:10.2f} "
              f"{whole['bytes'] / 1e6:9.2f} {changed['buckets']:>3d}/{config.buckets}", flush=True)

    row("first publish")
    ts = shard.state().upper
    batch(spark, shard, keys=rows, change=change, ts=ts, bucket=3)
    row("after a clustered batch (1 bucket)")
    batch(spark, shard, keys=rows, change=change, ts=ts + 1, bucket=None)
    row("after a random batch (all buckets)")

    tables = {"expiry (keep_last=3)": ("bench.expiring", Retention(keep_last=3)), "no expiry": ("bench.kept", None)}
    for n in range(cycles):
        if n:
            batch(spark, shard, keys=rows, change=change, ts=shard.state().upper, bucket=None)
        for table, retention in tables.values():
            publish(shard, catalog, table, whole=False, retention=retention)
    for name, (table, _retention) in tables.items():
        location = catalog.load_table(table).location().removeprefix("file://")
        files, size = directory_bytes(location)
        print(f"_iceberg after {cycles} publishes (random batches), {name:20s}: {files:4d} files, {size / 1e6:8.1f} MB")
    iceberg_catalog.close_catalog(catalog)
    consensus.dispose()


def bench_object_storage(spark, server, workdir: str, rows: int, change: int) -> None:
    """The Arrow path against Spark's executors, both publishing to tables on the S3 server."""
    import collections

    from tests.s3server import REQUEST_KINDS, request_kind

    root = os.path.join(workdir, f"s3-rows-{rows}")
    consensus, shard, catalog = compacted_shard(spark, root, f"s3://{server.create_bucket()}/upsert", rows)
    config = shard.config
    print(f"\n{rows:,} rows on S3 (moto), {config.buckets} buckets, {change:,} updates per batch")
    print("| publish | path | seconds | data MB written | files | requests |")
    print("|---|---|---:|---:|---:|---|")

    def row(name: str) -> None:
        for path, table, session in (("Arrow (this process)", "bench.arrow", None),
                                     ("Spark executors", "bench.spark", spark)):
            seen = len(server.requests())
            result = publish(shard, catalog, table, whole=False, spark=session)
            counts = collections.Counter(request_kind(m, t) for m, t in server.requests()[seen:])
            requests = ", ".join(f"{kind} {counts[kind]}" for kind in REQUEST_KINDS if counts[kind])
            print(f"| {name} | {path} | {result['seconds']:.2f} | {result['bytes'] / 1e6:.2f} | "
                  f"{result['buckets']} buckets | {requests} |", flush=True)

    row("first publish (whole table)")
    batch(spark, shard, keys=rows, change=change, ts=shard.state().upper, bucket=3)
    row("after a clustered batch (1 bucket)")
    batch(spark, shard, keys=rows, change=change, ts=shard.state().upper, bucket=None)
    row("after a random batch (all buckets)")
    iceberg_catalog.close_catalog(catalog)
    consensus.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 4_000_000])
    parser.add_argument("--change", type=int, default=20_000, help="updates per batch (default 20k)")
    parser.add_argument("--cycles", type=int, default=10, help="publishes for the storage figure (default 10)")
    parser.add_argument("--workdir", default=None, help="default: a temporary directory, removed at the end")
    parser.add_argument("--object-storage", action="store_true",
                        help="the Arrow path against Spark's executors, on the loopback S3 server")
    args = parser.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="bench-publish-")
    server = None
    if args.object_storage:
        from tests.s3server import S3Server

        server = S3Server().start()
        # Before the session starts: its executors' Python workers inherit the environment.
        os.environ.update(server.environment())
    spark = get_spark("local[*]")
    try:
        for rows in args.rows:
            if server is not None:
                bench_object_storage(spark, server, workdir, rows, args.change)
            else:
                bench_size(spark, workdir, rows, args.change, args.cycles)
    finally:
        spark.stop()
        if server is not None:
            server.stop()
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
