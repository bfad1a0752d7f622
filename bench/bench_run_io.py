"""Benchmark of run file I/O on local disk: executors writing and reading through pyarrow
(engine/table/run_io.py) against Spark's own Parquet writer and reader, in the same run.

    .venv/bin/python bench/bench_run_io.py            # runs of 1M and 5M rows, a 100k-row batch
    .venv/bin/python bench/bench_run_io.py --quick    # 100k and 500k rows, a 20k-row batch

Per size, each path, best of ``--repeat`` rounds (warm session):
  write        rows -> one sorted Parquet file per bucket, described ({path, bytes, sha256},
               rows) and durable: Spark's writer + the driver's checksum, footers and fsync
               (``describe_run``), against the executors' pyarrow writer that reports it all.
  read-merge   every file of the run read and merged per key (``merge_rows``), the result
               consumed whole by Spark's ``noop`` sink: Spark's reader against the run
               reader data source.
  compaction   read-merge and write again, the whole of a compaction's Spark work.
The ratio column is pyarrow / Spark (below 1: the pyarrow path is faster).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from airflow_upsert_provider.engine.blob.files import open_blob  # noqa: E402
from airflow_upsert_provider.engine.spark.session import get_spark  # noqa: E402
from airflow_upsert_provider.engine.table import runs  # noqa: E402
from airflow_upsert_provider.engine.table.run_io import write_run_files  # noqa: E402
from tests.helpers import sample_config  # noqa: E402


def run_rows(spark, config, rows: int):
    """``rows`` keys in the sample schema as run rows, with their bucket."""
    from pyspark.sql import functions as F

    return spark.range(rows).select(
        F.col("id"),
        F.concat(F.lit("name-"), F.col("id").cast("string")).alias("name"),
        (F.col("id") * 0.5).alias("amount"),
        (F.col("id") % 1000).alias("updated_at"),
        (F.col("id") % 17 == 0).alias("_deleted"),
        F.lit(0).cast("long").alias("_ts"),
        runs.bucket_column(config).alias("_bucket"),
    )


def write_native(rows, config, blob, run_dir: str) -> dict:
    rows = rows.repartition(config.buckets, "_bucket").sortWithinPartitions("_bucket", *config.keys)
    rows.write.mode("error").partitionBy("_bucket").parquet(run_dir)
    return runs.describe_run(blob, run_dir)


def write_executors(rows, config, blob, run_dir: str) -> dict:
    rows = rows.repartition(config.buckets, "_bucket").sortWithinPartitions("_bucket", *config.keys)
    blob.make_dirs(run_dir)
    return write_run_files(rows, runs.run_schema(config).fieldNames(), blob, run_dir)


def merged(spark, config, blob, run: dict, executor: bool):
    scanned = runs.scan_run_files(spark, runs.run_schema(config), blob, run["files"], executor=executor)
    return runs.merge_rows(scanned, config)


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def bench_size(spark, work: str, rows: int, repeat: int, *, read: bool) -> list[tuple[str, float, float]]:
    config = sample_config(work)
    blob = open_blob(os.path.join(work, f"blob-{rows}"))
    blob.ensure_root()
    frame = run_rows(spark, config, rows)
    counter = iter(range(10**6))

    def fresh() -> str:
        return blob.path("s", "runs", "ts=0", f"w-{next(counter)}")

    results = []
    native_run = write_native(frame, config, blob, fresh())
    executor_run = write_executors(frame, config, blob, fresh())
    assert native_run["rows"] == executor_run["rows"] == rows, (native_run["rows"], executor_run["rows"])
    native = best(lambda: write_native(frame, config, blob, fresh()), repeat)
    executors = best(lambda: write_executors(frame, config, blob, fresh()), repeat)
    results.append((f"write {rows:,}", native, executors))
    if read:
        def consume(executor: bool, run: dict):
            merged(spark, config, blob, run, executor).write.format("noop").mode("overwrite").save()

        native = best(lambda: consume(False, native_run), repeat)
        executors = best(lambda: consume(True, executor_run), repeat)
        results.append((f"read-merge {rows:,}", native, executors))

        def compaction(executor: bool, run: dict):
            out = merged(spark, config, blob, run, executor).withColumn("_bucket", runs.bucket_column(config))
            (write_executors if executor else write_native)(out, config, blob, fresh())

        native = best(lambda: compaction(False, native_run), repeat)
        executors = best(lambda: compaction(True, executor_run), repeat)
        results.append((f"compaction {rows:,}", native, executors))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sizes, batch = ([100_000, 500_000], 20_000) if args.quick else ([1_000_000, 5_000_000], 100_000)
    work = tempfile.mkdtemp(prefix="bench-run-io-")
    spark = get_spark("local[*]", app_name="upsert-bench-run-io", conf={"spark.driver.memory": "4g"})
    try:
        print(f"run file I/O on local disk ({os.cpu_count()} cores, Spark {spark.version}, best of {args.repeat})")
        results = bench_size(spark, work, batch, args.repeat, read=False)
        for rows in sizes:
            results += bench_size(spark, work, rows, args.repeat, read=True)
        print(f"{'step':<24}{'Spark (s)':>11}{'pyarrow (s)':>13}{'ratio':>8}")
        for step, native, executors in results:
            print(f"{step:<24}{native:>11.2f}{executors:>13.2f}{executors / native:>8.2f}")
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
