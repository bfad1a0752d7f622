"""Benchmark of tiered against full compaction as the table grows.

At each table size: two shards holding the same compacted table of N rows; then C cycles of
one batch of K updates (keys drawn over the whole table, ~2% tombstones) and one compaction,
tiered (the default policy) on one shard and full (``--full``) on the other. Reported: each
compaction's seconds and rows merged, their mean over the cycles (amortized), the compacted
runs a read merges afterwards, and a full read of the tiered shard against the fully
compacted one (target within 1.5x).

    .venv/bin/python bench/bench_compaction.py                  # 200k, 1M, 4M rows; 20k per cycle; 6 cycles
    .venv/bin/python bench/bench_compaction.py --quick          # 200k, 1M rows; 4 cycles
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
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from airflow_upsert_provider.engine.blob.files import open_blob  # noqa: E402
from airflow_upsert_provider.engine.config import ShardConfig  # noqa: E402
from airflow_upsert_provider.engine.maintenance.compaction import compact  # noqa: E402
from airflow_upsert_provider.engine.store.registry import open_consensus  # noqa: E402
from airflow_upsert_provider.engine.table.shard import Shard  # noqa: E402
from airflow_upsert_provider.sample_data import sample_schema_json  # noqa: E402
from bench.bench_maintenance import commit_run, read_seconds, synthetic_rows, timed  # noqa: E402


def compacted_shard(spark, consensus, blob, landing: str, shard_id: str, rows: int) -> Shard:
    """A shard whose table is ``rows`` rows, compacted (the state a cycle starts from)."""
    config = ShardConfig(
        source=f"dir:{landing}", keys=("id",), schema=sample_schema_json(),
        order_by="updated_at", delete_marker="deleted", buckets=8,
    )
    shard = Shard.create(consensus, blob, shard_id, config)
    commit_run(spark, shard, synthetic_rows(spark, shard, rows=rows, keys=rows, ts=0, seed=0), 0)
    compact(spark, shard, full=True)
    return shard


def bench_size(spark, workdir: str, rows: int, change: int, cycles: int) -> dict:
    root = os.path.join(workdir, f"rows-{rows}")
    os.makedirs(os.path.join(root, "landing"), exist_ok=True)
    consensus = open_consensus(f"sqlite:///{root}/consensus.db")
    blob = open_blob(os.path.join(root, "blob"))
    shards = {kind: compacted_shard(spark, consensus, blob, os.path.join(root, "landing"), kind, rows)
              for kind in ("tiered", "full")}
    seconds: dict[str, list[float]] = {kind: [] for kind in shards}
    merged: dict[str, list[int]] = {kind: [] for kind in shards}
    runs_below: dict[str, int] = {}
    for cycle in range(1, cycles + 1):
        for kind, shard in shards.items():
            commit_run(spark, shard, synthetic_rows(spark, shard, rows=change, keys=rows, ts=cycle, seed=cycle), cycle)
            result, spent = timed(lambda: compact(spark, shard, full=kind == "full"))
            seconds[kind].append(spent)
            merged[kind].append(result.runs_merged)
            runs_below[kind] = result.runs_below_since
        print(f"  {rows:>9,} rows, cycle {cycle}: tiered {seconds['tiered'][-1]:6.2f}s "
              f"({merged['tiered'][-1]} runs merged, {runs_below['tiered']} compacted runs), "
              f"full {seconds['full'][-1]:6.2f}s", flush=True)
    tiers = runs_below["tiered"]
    read_seconds(spark, shards["full"], repeat=1)  # warm-up: JIT and file cache, not measured
    reads = {kind: read_seconds(spark, shard) for kind, shard in shards.items()}
    consensus.dispose()
    return {
        "rows": rows, "tiered": sum(seconds["tiered"]) / cycles, "full": sum(seconds["full"]) / cycles,
        "tiers": tiers, "read_tiered": reads["tiered"], "read_full": reads["full"],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="200k and 1M rows, 4 cycles")
    parser.add_argument("--change", type=int, default=20_000, help="updates per cycle (default 20,000)")
    parser.add_argument("--cycles", type=int, default=None, help="cycles per size (default 6; --quick 4)")
    parser.add_argument("--workdir", help="where to build the shards (default: a temporary directory)")
    args = parser.parse_args(argv)
    sizes = (200_000, 1_000_000) if args.quick else (200_000, 1_000_000, 4_000_000)
    cycles = args.cycles or (4 if args.quick else 6)
    workdir = args.workdir or tempfile.mkdtemp(prefix="bench-compaction-")
    from airflow_upsert_provider.engine.spark.session import get_spark

    spark = get_spark("local[2]", app_name="bench-compaction", conf={"spark.driver.memory": "4g"})
    started = time.monotonic()
    try:
        print(f"bench_compaction: {cycles} cycles of {args.change:,} updates at {', '.join(f'{s:,}' for s in sizes)} "
              f"rows; {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}", flush=True)
        results = [bench_size(spark, workdir, rows, args.change, cycles) for rows in sizes]
    finally:
        spark.stop()
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"\n| table rows | tiered compaction, mean s | full compaction, mean s | full / tiered "
          f"| compacted runs | read tiered s | read full s | read ratio (target <= 1.5x) |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['rows']:,} | {r['tiered']:.2f} | {r['full']:.2f} | {r['full'] / r['tiered']:.1f}x | {r['tiers']} "
              f"| {r['read_tiered']:.2f} | {r['read_full']:.2f} | {r['read_tiered'] / r['read_full']:.2f}x |")
    first, last = results[0], results[-1]
    print(f"\ngrowth {first['rows']:,} -> {last['rows']:,} rows: tiered {last['tiered'] / first['tiered']:.2f}x, "
          f"full {last['full'] / first['full']:.2f}x; load {os.getloadavg()[0]:.1f}; "
          f"{time.monotonic() - started:.0f}s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
