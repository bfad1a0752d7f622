"""Benchmark of the upsert write path, with its baselines measured in the same run.

    .venv/bin/python bench/bench_upsert.py            # tables of 100k, 1M, 5M rows
    .venv/bin/python bench/bench_upsert.py --quick    # 10k, 100k, 500k rows; batches of 20k

For each table size: one micro-batch of `--batch` changes (updates of existing keys, new keys
and deletes) through the engine (bind, stage on Spark, compare-and-append), against
  (a) a naive Spark full rewrite: read the whole table, union the batch, latest per key,
      write the whole table anew;
  (b) a plain Parquet write of the same batch: the floor of any write.
Also: a lagging writer's skip of a persisted batch (no Spark), and compare-and-append latency
on SQLite and PostgreSQL. Peak RSS of the Spark JVM is sampled during each measured step.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from airflow_upsert_provider.engine.blob.files import open_blob  # noqa: E402
from airflow_upsert_provider.engine.store.records import BatchRecord, Binding
from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.engine.table.shard import Shard  # noqa: E402
from airflow_upsert_provider.engine.spark.session import get_spark  # noqa: E402
from airflow_upsert_provider.engine.table.runs import user_schema, write_bucketed  # noqa: E402
from airflow_upsert_provider.engine.write.writer import StagedBatch, Writer  # noqa: E402
from airflow_upsert_provider.sample_data import SampleSpec, generate  # noqa: E402
from tests.helpers import sample_config  # noqa: E402

from process_memory import PeakRss  # noqa: E402 (bench/, the script's directory)


def jvm_pid(spark) -> int:
    return int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())


def build_base_table(spark, shard: Shard, rows: int, naive_dir: str) -> None:
    """Commit a synthetic run of ``rows`` keys as batch 0, and the same table as one plain
    Parquet directory for the naive baseline."""
    from pyspark.sql import functions as F

    from airflow_upsert_provider.engine.table.runs import bucket_column

    base = spark.range(rows).select(
        F.col("id"),
        F.concat(F.lit("name-"), F.col("id").cast("string")).alias("name"),
        (F.col("id") * 0.5).alias("amount"),
        F.lit(0).cast("long").alias("updated_at"),
    )
    run_rows = base.select("*", F.lit(False).alias("_deleted"), F.lit(0).cast("long").alias("_ts"), bucket_column(shard.config).alias("_bucket"))
    run_dir = shard.run_dir(0, "bench-base", "0")
    run = write_bucketed(run_rows, shard.config, shard.blob, run_dir)
    shard.consensus.mint_binding(shard.shard_id, Binding(0, {}), "bench")
    record = BatchRecord(0, "bench-base", "base", run, {})
    assert shard.compare_and_append(0, 1, record).outcome.value == "committed"
    base.write.parquet(naive_dir)


def naive_full_rewrite(spark, config, table_dir: str, batch_files: list[str], out_dir: str) -> None:
    """Baseline (a): the table rewritten whole for one batch."""
    from pyspark.sql import functions as F

    schema = user_schema(config)
    table = spark.read.parquet(table_dir).select(
        "*", F.lit(False).alias("deleted"), F.lit(0).alias("_src"), F.lit(0).cast("long").alias("_pos")
    )
    batch = spark.read.schema(schema).json(batch_files).select(
        "id", "name", "amount", "updated_at", F.coalesce("deleted", F.lit(False)).alias("deleted"),
        F.lit(1).alias("_src"), F.monotonically_increasing_id().alias("_pos"),
    )
    merged = table.unionByName(batch)
    winner = F.max_by(F.struct("name", "amount", "updated_at", "deleted"), F.struct("updated_at", "_src", "_pos"))
    latest = merged.groupBy("id").agg(winner.alias("w")).where(~F.col("w.deleted"))
    latest.select("id", "w.name", "w.amount", "w.updated_at").write.mode("overwrite").parquet(out_dir)


def plain_parquet_write(spark, config, batch_files: list[str], out_dir: str) -> None:
    """Baseline (b): the batch parsed and written as Parquet, nothing else."""
    spark.read.schema(user_schema(config)).json(batch_files).write.mode("overwrite").parquet(out_dir)


def timed(fn, spark):
    with PeakRss(jvm_pid(spark)) as rss:
        started = time.perf_counter()
        fn()
        seconds = time.perf_counter() - started
    return seconds, rss.mib


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def bench_sizes(spark, work: str, sizes: list[int], batch: int, repeat: int) -> dict:
    consensus = open_consensus(f"sqlite:///{work}/consensus.db")
    blob = open_blob(f"{work}/blob")
    blob.ensure_root()
    results = {}
    for rows in sizes:
        landing = os.path.join(work, f"landing-{rows}")
        os.makedirs(landing)
        shard = Shard.create(consensus, blob, f"t{rows}", sample_config(landing, buckets=8, max_files_per_batch=64))
        naive_dir = os.path.join(work, f"naive-{rows}-0")
        print(f"[{rows:>9,} rows] building the table ...", flush=True)
        build_base_table(spark, shard, rows, naive_dir)
        engine, plain, naive = [], [], []
        engine_rss = plain_rss = naive_rss = 0
        for r in range(1, repeat + 1):
            files = generate(
                landing,
                SampleSpec(records=batch, keys=int(rows * 1.1), partitions=4, segments_per_partition=2,
                           first_seq=r * 100, seq_step=1, delete_ratio=0.02, seed=1000 + r),
            )
            writer = Writer(shard, f"bench-{r}", spark_factory=lambda: spark)
            seconds, mib = timed(lambda: writer.step(), spark)
            assert shard.state().upper == r + 1
            engine.append(seconds)
            engine_rss = max(engine_rss, mib)
            seconds, mib = timed(lambda: plain_parquet_write(spark, shard.config, files, f"{work}/plain-{rows}-{r}"), spark)
            plain.append(seconds)
            plain_rss = max(plain_rss, mib)
            if r == 1 or rows <= sizes[0]:
                # The naive rewrite at the largest size takes a while: one sample is enough to
                # show an order of magnitude, two more at the smallest size keep it honest.
                src, dst = f"{work}/naive-{rows}-{r - 1}", f"{work}/naive-{rows}-{r}"
                seconds, mib = timed(lambda: naive_full_rewrite(spark, shard.config, src, files, dst), spark)
                naive.append(seconds)
                naive_rss = max(naive_rss, mib)
            print(f"[{rows:>9,} rows] round {r}: engine {engine[-1]:.2f}s, plain write {plain[-1]:.2f}s"
                  + (f", naive rewrite {naive[-1]:.2f}s" if len(naive) == r or r == 1 else ""), flush=True)
        results[rows] = {
            "engine_s": statistics.median(engine),
            "plain_parquet_s": statistics.median(plain),
            "naive_rewrite_s": statistics.median(naive),
            "engine_all_s": engine,
            "engine_jvm_peak_mib": engine_rss,
            "plain_jvm_peak_mib": plain_rss,
            "naive_jvm_peak_mib": naive_rss,
        }
    consensus.dispose()
    return results


def bench_skip(work: str, trials: int) -> dict:
    """A lagging writer holding a persisted batch drops it: consensus reads only, no Spark."""
    consensus = open_consensus(f"sqlite:///{work}/skip.db")
    blob = open_blob(f"{work}/skip-blob")
    blob.ensure_root()
    landing = os.path.join(work, "skip-landing")
    os.makedirs(landing)
    shard = Shard.create(consensus, blob, "skip", sample_config(landing))
    shard.consensus.mint_binding("skip", Binding(0, {}), "bench")
    shard.compare_and_append(0, 1, BatchRecord(0, "peer", "peer-token", {"path": "x", "files": [], "rows": 0}, {}))

    def no_spark():
        raise AssertionError("a skip must not start Spark")

    skip, step = [], []
    for n in range(trials):
        writer = Writer(shard, f"lagging-{n}", spark_factory=no_spark)
        staged_dir = blob.path("skip", "runs", f"held-{n}")
        os.makedirs(staged_dir)
        writer.held[0] = StagedBatch(0, f"mine-{n}", {"path": os.path.relpath(staged_dir, blob.root), "files": [], "rows": 0}, None, 0, 0, 0, [], 0.0)
        started = time.perf_counter()
        writer.reconcile(shard.state().upper)
        skip.append((time.perf_counter() - started) * 1000)
        assert writer.held == {} and writer.progress == 1 and not os.path.exists(staged_dir)
        started = time.perf_counter()
        assert writer.step().outcome == "nothing_to_do"
        step.append((time.perf_counter() - started) * 1000)
    consensus.dispose()
    return {
        "skip_ms_p50": statistics.median(skip), "skip_ms_p99": percentile(skip, 0.99),
        "noop_step_ms_p50": statistics.median(step), "noop_step_ms_p99": percentile(step, 0.99),
    }


def bench_cas(url: str, appends: int) -> dict:
    consensus = open_consensus(url)
    consensus.create_shard("cas", "{}")
    latencies = []
    for ts in range(appends):
        record = BatchRecord(ts, "w", f"t{ts}", {"path": "x", "files": [], "rows": 0}, {})
        started = time.perf_counter()
        outcome = consensus.compare_and_append("cas", ts, ts + 1, record).outcome.value
        latencies.append((time.perf_counter() - started) * 1000)
        assert outcome == "committed"
    consensus.dispose()
    return {"p50_ms": statistics.median(latencies), "p99_ms": percentile(latencies, 0.99), "appends": appends}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--sizes", help="comma-separated table sizes (rows)")
    parser.add_argument("--batch", type=int, help="changes per batch")
    parser.add_argument("--repeat", type=int, default=3, help="batches per size (median reported)")
    parser.add_argument("--out", default=os.path.join(REPO, "bench", "results", "upsert.json"))
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else (
        [10_000, 100_000, 500_000] if args.quick else [100_000, 1_000_000, 5_000_000]
    )
    batch = args.batch or (20_000 if args.quick else 100_000)
    work = tempfile.mkdtemp(prefix="upsert-bench-")
    spark = get_spark("local[*]", app_name="upsert-bench", conf={"spark.driver.memory": "8g"})
    try:
        print(f"batch of {batch:,} changes into tables of {', '.join(f'{s:,}' for s in sizes)} rows "
              f"({os.cpu_count()} cores, Spark {spark.version}, {args.repeat} rounds)")
        sizes_result = bench_sizes(spark, work, sizes, batch, args.repeat)
        skip = bench_skip(work, 200)
        cas = {"sqlite": bench_cas(f"sqlite:///{work}/cas.db", 500)}
        from tests.pgserver import PostgresServer

        server = PostgresServer().start()
        try:
            cas["postgresql"] = bench_cas(server.create_database("bench"), 500)
        finally:
            server.stop()
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)

    small, large = sizes[0], sizes[-1]
    ratios = {
        "engine_largest_over_smallest": sizes_result[large]["engine_s"] / sizes_result[small]["engine_s"],
        "naive_over_engine_at_largest": sizes_result[large]["naive_rewrite_s"] / sizes_result[large]["engine_s"],
        "engine_over_plain_at_largest": sizes_result[large]["engine_s"] / sizes_result[large]["plain_parquet_s"],
    }
    print("\n| table rows | engine batch (s) | plain Parquet write (s) | naive full rewrite (s) | engine / plain | naive / engine | JVM peak MiB engine / naive |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for rows in sizes:
        r = sizes_result[rows]
        print(f"| {rows:,} | {r['engine_s']:.2f} | {r['plain_parquet_s']:.2f} | {r['naive_rewrite_s']:.2f} | "
              f"{r['engine_s'] / r['plain_parquet_s']:.2f}x | {r['naive_rewrite_s'] / r['engine_s']:.1f}x | "
              f"{r['engine_jvm_peak_mib']} / {r['naive_jvm_peak_mib']} |")
    print(f"\nengine at {large:,} / at {small:,}: {ratios['engine_largest_over_smallest']:.2f}x (target <= 1.25x)")
    print(f"naive rewrite / engine at {large:,}: {ratios['naive_over_engine_at_largest']:.1f}x (target >= 10x)")
    print(f"engine / plain Parquet write at {large:,}: {ratios['engine_over_plain_at_largest']:.2f}x (target <= 2x)")
    print(f"lagging writer skip of a persisted batch: p50 {skip['skip_ms_p50']:.2f} ms, p99 {skip['skip_ms_p99']:.2f} ms "
          f"(target < 50 ms, no Spark); whole no-op step p50 {skip['noop_step_ms_p50']:.2f} ms")
    for store, c in cas.items():
        print(f"compare_and_append on {store}: p50 {c['p50_ms']:.2f} ms, p99 {c['p99_ms']:.2f} ms ({c['appends']} appends)")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as handle:
        json.dump({"sizes": sizes_result, "batch": batch, "ratios": ratios, "skip": skip, "cas": cas}, handle, indent=2)
    print(f"\nresults: {args.out}")


if __name__ == "__main__":
    main()
