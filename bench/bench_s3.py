"""Benchmark of a micro-batch on object storage: the same batches into the same tables on the
loopback S3 server and on local disk, in one run, with the requests each batch sends.

    .venv/bin/python bench/bench_s3.py            # tables of 1M and 5M rows, batches of 100k changes
    .venv/bin/python bench/bench_s3.py --quick    # 100k and 500k rows, batches of 20k
    .venv/bin/python bench/bench_s3.py --warm-only --repeat 7   # no upsertctl processes, more rounds

For each table size, two shards over one landing directory, one rooted on local disk (the
baseline) and one on an S3 server this process starts on 127.0.0.1 (moto's server mode,
tests/s3server.py), each holding the table as batch 0. Each round lands a batch of changes
(updates of existing keys, new keys, 2% deletes, 8 JSON Lines segments in 4 partitions) and
runs it on both shards, twice over:
  warm     one ``Writer.step()`` in this process, Spark session warm: the batch's own time;
  process  one fresh ``upsertctl run-batch`` process per shard on the next batch: what an
           Airflow task sees (interpreter, JVM, root check, batch, observation).
Rounds alternate which store goes first; medians reported. The S3 server counts every request
it answers during each batch, by kind (PUT, GET, LIST = ListObjectsV2, DELETE, HEAD, other).
Targets (issue): a batch on S3 within 1.5x of local disk; requests per batch independent of
the table's size.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from airflow_upsert_provider.engine.blob.files import open_blob  # noqa: E402
from airflow_upsert_provider.engine.store.records import BatchRecord, Binding
from airflow_upsert_provider.engine.store.registry import open_consensus  # noqa: E402
from airflow_upsert_provider.engine.table.runs import bucket_column, write_bucketed  # noqa: E402
from airflow_upsert_provider.engine.table.shard import Shard  # noqa: E402
from airflow_upsert_provider.engine.spark.session import get_spark  # noqa: E402
from airflow_upsert_provider.engine.write.writer import Writer  # noqa: E402
from airflow_upsert_provider.sample_data import SampleSpec, generate  # noqa: E402
from tests.helpers import sample_config  # noqa: E402
from tests.s3server import REQUEST_KINDS, S3Server, request_kind  # noqa: E402

STORES = ("local", "s3")


def build_base_table(spark, shard: Shard, rows: int) -> None:
    """Commit a synthetic run of ``rows`` keys as batch 0 (written as a batch's run is: on S3
    by the executors through pyarrow, locally by Spark's writer)."""
    from pyspark.sql import functions as F

    base = spark.range(rows).select(
        F.col("id"),
        F.concat(F.lit("name-"), F.col("id").cast("string")).alias("name"),
        (F.col("id") * 0.5).alias("amount"),
        F.lit(0).cast("long").alias("updated_at"),
        F.lit(False).alias("_deleted"),
        F.lit(0).cast("long").alias("_ts"),
    ).withColumn("_bucket", bucket_column(shard.config))
    run = write_bucketed(base, shard.config, shard.blob, shard.run_dir(0, "bench-base", "0"))
    assert run["rows"] == rows, run["rows"]
    shard.consensus.mint_binding(shard.shard_id, Binding(0, {}), "bench")
    assert shard.compare_and_append(0, 1, BatchRecord(0, "bench-base", "base", run, {})).outcome.value == "committed"


def counted(server: S3Server, since: int) -> dict[str, int]:
    """Requests the server answered after the ``since``-th, by kind."""
    counts = collections.Counter(request_kind(method, target) for method, target in server.requests()[since:])
    return {kind: counts.get(kind, 0) for kind in REQUEST_KINDS}


def upsertctl(env: dict[str, str], *args: str) -> float:
    started = time.perf_counter()
    done = subprocess.run([os.path.join(REPO, ".venv", "bin", "upsertctl"), *args], env=env, capture_output=True,
                          text=True, timeout=900, cwd=REPO)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"upsertctl {' '.join(args)} exited {done.returncode}: {done.stderr[-3000:]}")
    return seconds


def bench_size(spark, server: S3Server, work: str, rows: int, batch: int, repeat: int,
               cli_env: dict[str, str] | None) -> dict:
    landing = os.path.join(work, f"landing-{rows}")
    os.makedirs(landing)
    consensus_url = f"sqlite:///{work}/consensus-{rows}.db"
    consensus = open_consensus(consensus_url)
    roots = {"local": os.path.join(work, f"blob-{rows}"), "s3": f"s3://{server.create_bucket()}/upsert"}
    shards = {}
    for store, root in roots.items():
        blob = open_blob(root)
        blob.ensure_root()
        shards[store] = Shard.create(consensus, blob, f"t-{store}",
                                     sample_config(landing, buckets=8, max_files_per_batch=64))
        print(f"[{rows:>9,} rows] building the table on {store} ...", flush=True)
        build_base_table(spark, shards[store], rows)
    samples = {store: {"warm": [], "process": [], "warm_requests": [], "process_requests": []} for store in STORES}
    seq = iter(range(1, 10**6))

    def land() -> None:
        n = next(seq)
        generate(landing, SampleSpec(records=batch, keys=int(rows * 1.1), partitions=4, segments_per_partition=2,
                                     first_seq=n * 100, seq_step=1, delete_ratio=0.02, seed=1000 + n))

    for r in range(repeat):
        order = STORES if r % 2 == 0 else STORES[::-1]
        land()
        for store in order:
            shard = shards[store]
            upper = shard.state().upper
            before = len(server.requests())
            writer = Writer(shard, f"bench-{r}", spark_factory=lambda: spark)
            started = time.perf_counter()
            result = writer.step()
            seconds = time.perf_counter() - started
            assert result.outcome == "committed" and shard.state().upper == upper + 1, result
            samples[store]["warm"].append(seconds)
            samples[store]["warm_requests"].append(counted(server, before))
        for store in order if cli_env is not None else ():
            if store == order[0]:
                land()
            shard = shards[store]
            upper = shard.state().upper
            before = len(server.requests())
            env = dict(cli_env, UPSERT_CONSENSUS_URL=consensus_url, UPSERT_BLOB_ROOT=roots[store])
            seconds = upsertctl(env, "run-batch", shard.shard_id, "--writer-id", f"bench-cli-{r}")
            assert shard.state().upper == upper + 1
            samples[store]["process"].append(seconds)
            samples[store]["process_requests"].append(counted(server, before))
        print(f"[{rows:>9,} rows] round {r + 1}: " + ", ".join(
            f"{store} warm {samples[store]['warm'][-1]:.2f}s"
            + (f" process {samples[store]['process'][-1]:.2f}s" if cli_env is not None else "")
            for store in STORES), flush=True)
    consensus.dispose()
    result = {}
    for store in STORES:
        s = samples[store]
        result[store] = {
            "warm_s": statistics.median(s["warm"]),
            "process_s": statistics.median(s["process"]) if s["process"] else float("nan"),
            "warm_all_s": s["warm"], "process_all_s": s["process"],
            # Requests per batch: the same in every round (printed if not).
            "warm_requests": s["warm_requests"], "process_requests": s["process_requests"],
        }
    return result


def requests_text(samples: list[dict[str, int]]) -> str:
    """One batch's requests by kind; a kind that varied between rounds as min-max."""
    if not samples:
        return "-"
    parts = []
    for kind in REQUEST_KINDS:
        values = sorted(sample[kind] for sample in samples)
        if values[-1]:
            parts.append(f"{kind} {values[0]}" if values[0] == values[-1] else f"{kind} {values[0]}-{values[-1]}")
    return ", ".join(parts) or "none"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--sizes", help="comma-separated table sizes (rows)")
    parser.add_argument("--batch", type=int, help="changes per batch")
    parser.add_argument("--repeat", type=int, default=3, help="rounds per size (median reported)")
    parser.add_argument("--warm-only", action="store_true", help="no upsertctl processes: more rounds in the time")
    parser.add_argument("--out", default=os.path.join(REPO, "bench", "results", "s3.json"))
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else (
        [100_000, 500_000] if args.quick else [1_000_000, 5_000_000]
    )
    batch = args.batch or (20_000 if args.quick else 100_000)
    work = tempfile.mkdtemp(prefix="bench-s3-")
    server = S3Server().start()
    # This process (its Spark executors' Python workers inherit it) and each upsertctl process
    # reach the server with its dummy credentials; nothing of the machine's AWS setup is read.
    aws = dict(server.environment(), AWS_CONFIG_FILE=os.path.join(work, "absent"),
               AWS_SHARED_CREDENTIALS_FILE=os.path.join(work, "absent"))
    os.environ.update(aws)
    cli_env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   SPARK_LOCAL_IP="127.0.0.1", UPSERT_SPARK_MASTER="local[*]")
    spark = get_spark("local[*]", app_name="upsert-bench-s3", conf={"spark.driver.memory": "4g"})
    load = os.getloadavg()
    try:
        print(f"batch of {batch:,} changes into tables of {', '.join(f'{s:,}' for s in sizes)} rows, local disk "
              f"and the S3 server on {server.endpoint} ({os.cpu_count()} cores, Spark {spark.version}, "
              f"{args.repeat} rounds)", flush=True)
        results = {rows: bench_size(spark, server, work, rows, batch, args.repeat, None if args.warm_only else cli_env)
                   for rows in sizes}
    finally:
        spark.stop()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    load = (load, os.getloadavg())

    print("\n| table rows | store | warm batch (s) | upsertctl run-batch (s) | requests per warm batch | "
          "requests per upsertctl run-batch |")
    print("|---:|---|---:|---:|---|---|")
    for rows in sizes:
        for store in STORES:
            r = results[rows][store]
            print(f"| {rows:,} | {store} | {r['warm_s']:.2f} | {r['process_s']:.2f} | "
                  f"{requests_text(r['warm_requests']) if store == 's3' else ''} | "
                  f"{requests_text(r['process_requests']) if store == 's3' else ''} |")
    print()
    ratios = {}
    for rows in sizes:
        local, s3 = results[rows]["local"], results[rows]["s3"]
        ratios[rows] = {"warm": s3["warm_s"] / local["warm_s"], "process": s3["process_s"] / local["process_s"]}
        print(f"S3 / local at {rows:,} rows: warm batch {ratios[rows]['warm']:.2f}x, "
              f"upsertctl run-batch {ratios[rows]['process']:.2f}x (target <= 1.5x)")
    for kind in ("warm_requests",) if args.warm_only else ("warm_requests", "process_requests"):
        per_size = {rows: requests_text(results[rows]["s3"][kind]) for rows in sizes}
        same = len(set(per_size.values())) == 1
        print(f"{kind.replace('_', ' ')} independent of table size: {'yes' if same else 'NO'} "
              f"({'; '.join(f'{rows:,}: {text}' for rows, text in per_size.items())})")
    print(f"load average (1, 5, 15 min) at start {load[0][0]:.1f} {load[0][1]:.1f} {load[0][2]:.1f}, "
          f"at end {load[1][0]:.1f} {load[1][1]:.1f} {load[1][2]:.1f}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as handle:
        json.dump({"sizes": {str(rows): results[rows] for rows in sizes}, "batch": batch, "ratios": {
            str(rows): ratio for rows, ratio in ratios.items()}, "load": load}, handle, indent=2)
    print(f"\nresults: {args.out}")


if __name__ == "__main__":
    main()
