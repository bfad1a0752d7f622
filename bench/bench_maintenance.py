"""Benchmark of compaction, checkpoints and GC planning.

1. Read cost: a shard of N rows written as one run (the baseline), then B update batches on
   top (uncompacted), then compacted; each read fully materialised. Ratios against the
   single run read in the same process.
2. Compaction throughput: rows and bytes merged per second.
3. Checkpoint of the N-row shard, which verifies every file it lists (size, SHA-256, Parquet
   footer), against reading the listed bytes once, the floor of that check.
4. GC planning over F files (run directories committed, lost and pinned by checkpoints).

    .venv/bin/python bench/bench_maintenance.py            # 5M rows, 50 batches, 100k files
    .venv/bin/python bench/bench_maintenance.py --quick    # 500k rows, 10 batches, 10k files
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import sys
import tempfile
import time
import uuid

import pyarrow as pa
import pyarrow.parquet as pq

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from airflow_upsert_provider.engine.blob.files import open_blob  # noqa: E402
from airflow_upsert_provider.engine.maintenance.checkpoint import create_checkpoint, manifest_files  # noqa: E402
from airflow_upsert_provider.engine.maintenance.compaction import compact  # noqa: E402
from airflow_upsert_provider.engine.config import ShardConfig  # noqa: E402
from airflow_upsert_provider.engine.store.records import BatchRecord
from airflow_upsert_provider.engine.store.registry import open_consensus  # noqa: E402
from airflow_upsert_provider.engine.maintenance.gc import collect_garbage  # noqa: E402
from airflow_upsert_provider.engine.table.shard import Shard  # noqa: E402
from airflow_upsert_provider.sample_data import sample_schema_json  # noqa: E402


def timed(fn):
    started = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - started


def synthetic_rows(spark, shard: Shard, *, rows: int, keys: int, ts: int, seed: int):
    """``rows`` run rows at ``ts`` for distinct keys drawn from 0..keys-1 (a batch keeps
    one row per key); about 2% of an update batch are tombstones."""
    from pyspark.sql import functions as F

    from airflow_upsert_provider.engine.table.runs import bucket_column

    frame = spark.range(rows)
    if ts > 0:
        # 7919 is prime and coprime with the key counts used here: distinct keys within a
        # batch, a different spread per batch.
        frame = frame.select(((F.col("id") * 7919 + seed * 104729) % keys).alias("id"))
    deleted = (F.xxhash64("id", F.lit(seed)) % 50 == 0) if ts > 0 else F.lit(False)
    return frame.select(
        F.col("id").cast("long").alias("id"),
        F.concat(F.lit("name-"), F.col("id").cast("string"), F.lit(f"-{ts}")).alias("name"),
        (F.col("id") % 1000 + ts / 100.0).cast("double").alias("amount"),
        F.lit(ts).cast("long").alias("updated_at"),
        deleted.alias("_deleted"),
        F.lit(ts).cast("long").alias("_ts"),
    ).withColumn("_bucket", bucket_column(shard.config))


def commit_run(spark, shard: Shard, rows_frame, ts: int) -> dict:
    from airflow_upsert_provider.engine.table.runs import write_bucketed

    run_dir = shard.run_dir(ts, "bench", uuid.uuid4().hex[:12])
    run = write_bucketed(rows_frame, shard.config, shard.blob, run_dir)
    result = shard.compare_and_append(ts, ts + 1, BatchRecord(ts, "bench", uuid.uuid4().hex, run, {}))
    assert result.outcome.value == "committed", result
    return run


def read_seconds(spark, shard: Shard, as_of: int | None = None, repeat: int = 3) -> float:
    """Best of ``repeat`` full reads (every column materialised, nothing collected)."""
    best = float("inf")
    for _ in range(repeat):
        _, seconds = timed(lambda: shard.read(spark, as_of=as_of).write.format("noop").mode("overwrite").save())
        best = min(best, seconds)
    return best


def bench_read_compact_checkpoint(spark, workdir: str, rows: int, batches: int, update_rows: int) -> dict:
    consensus = open_consensus(f"sqlite:///{workdir}/consensus.db")
    blob = open_blob(os.path.join(workdir, "blob"))
    landing = os.path.join(workdir, "landing")
    os.makedirs(landing, exist_ok=True)
    config = ShardConfig(
        source=f"dir:{landing}", keys=("id",), schema=sample_schema_json(),
        order_by="updated_at", delete_marker="deleted", buckets=8,
    )
    shard = Shard.create(consensus, blob, "bench", config)
    _, base_seconds = timed(lambda: commit_run(spark, shard, synthetic_rows(spark, shard, rows=rows, keys=rows, ts=0, seed=0), 0))
    _, batch_seconds = timed(lambda: [
        commit_run(spark, shard, synthetic_rows(spark, shard, rows=update_rows, keys=rows, ts=ts, seed=ts), ts)
        for ts in range(1, batches + 1)
    ])
    print(f"setup: base run of {rows:,} rows {base_seconds:.1f}s; {batches} update batches of "
          f"{update_rows:,} rows {batch_seconds:.1f}s")

    read_seconds(spark, shard, as_of=1, repeat=1)  # warm-up: JIT and file cache, not measured
    single = read_seconds(spark, shard, as_of=1)
    uncompacted = read_seconds(spark, shard)
    result, compact_seconds = timed(lambda: compact(spark, shard))
    compacted = read_seconds(spark, shard)
    rows_in = rows + batches * update_rows
    bytes_in = sum(f["bytes"] for b in shard.batches() for f in b.run["files"])
    print(f"read, single run ({rows:,} rows):           {single:6.2f}s  (baseline)")
    print(f"read, {batches} uncompacted batches on top:     {uncompacted:6.2f}s  {uncompacted / single:5.2f}x")
    print(f"read, after compaction:                   {compacted:6.2f}s  {compacted / single:5.2f}x  (target <= 1.2x)")
    print(f"compaction: {result.runs_merged} runs, {rows_in:,} rows in, {result.rows:,} out, "
          f"{compact_seconds:.1f}s = {rows_in / compact_seconds:,.0f} rows/s, "
          f"{bytes_in / compact_seconds / 1e6:.1f} MB/s in")

    # A checkpoint lists every live file and checks each as verify does (present, recorded size
    # and SHA-256, a readable Parquet footer), so it never lists a file that fails verify. The
    # baseline is the floor of that check: reading every listed byte once, sequentially.
    for _ in range(2):  # keep_last=1: the second is the steady state (retention included)
        entry, checkpoint_seconds = timed(lambda: create_checkpoint(shard, keep_last=1))
    snapshot = consensus.snapshot("bench")
    paths = [blob.path(f["path"]) for run in snapshot.live_runs() for f in run["files"]]

    def read_every_byte() -> None:
        for path in paths:
            with open(path, "rb") as handle:
                while handle.read(1 << 20):
                    pass

    _, reading_seconds = timed(read_every_byte)
    _, verifying_seconds = timed(lambda: manifest_files(blob, snapshot))
    print(f"checkpoint of {result.rows:,} rows ({entry.files} files, {entry.bytes / 1e6:.0f} MB), every file "
          f"verified: {checkpoint_seconds:.3f}s (target < 2s), of which verifying the files "
          f"{verifying_seconds:.3f}s; reading the same bytes once: {reading_seconds:.3f}s "
          f"({verifying_seconds / reading_seconds:.2f}x)")
    consensus.dispose()
    return {
        "single": single, "uncompacted": uncompacted, "compacted": compacted,
        "compact_seconds": compact_seconds, "checkpoint_seconds": checkpoint_seconds,
    }


def bench_gc_planning(workdir: str, files: int, files_per_run: int = 50) -> dict:
    """A shard of ``files`` small files in run directories: a third committed, a third lost
    (garbage), a third committed below a since and pinned by a checkpoint."""
    consensus = open_consensus(f"sqlite:///{workdir}/gc-consensus.db")
    blob = open_blob(os.path.join(workdir, "gc-blob"))
    landing = os.path.join(workdir, "landing")
    os.makedirs(landing, exist_ok=True)
    config = ShardConfig(source=f"dir:{landing}", keys=("id",), schema=sample_schema_json())
    shard = Shard.create(consensus, blob, "gcbench", config)
    started = time.perf_counter()
    runs = files // files_per_run
    ts = 0
    past = time.time() - 86400
    # Every file is one small, real Parquet file: a checkpoint verifies what it lists.
    sample_path = os.path.join(workdir, "sample.parquet")
    pq.write_table(pa.table({"id": [1]}), sample_path)
    with open(sample_path, "rb") as handle:
        sample = handle.read()
    sample_sha256 = hashlib.sha256(sample).hexdigest()
    for index in range(runs):
        run_dir = shard.run_dir(ts, "bench", f"{index:012d}")
        os.makedirs(run_dir)
        listed = []
        for part in range(files_per_run):
            path = os.path.join(run_dir, f"part-{part:05d}.parquet")
            with open(path, "wb") as handle:
                handle.write(sample)
            os.utime(path, (past, past))
            listed.append({"path": os.path.relpath(path, blob.root), "bytes": len(sample), "sha256": sample_sha256})
        for directory in (run_dir, os.path.dirname(run_dir)):  # GC ages directories too
            os.utime(directory, (past, past))
        if index % 3 != 1:  # every third run is a lost writer's
            run = {"path": os.path.relpath(run_dir, blob.root), "files": listed, "rows": 0}
            shard.compare_and_append(ts, ts + 1, BatchRecord(ts, "bench", uuid.uuid4().hex, run, {}))
            ts += 1
    create_checkpoint(shard)
    # Advance since past the first half of the batches without Spark: a compacted run of one file.
    half = ts // 2
    run = consensus.snapshot("gcbench").batches[half].run
    consensus.compare_and_set_since("gcbench", 0, half, {"path": run["path"], "files": run["files"][:1], "rows": 0})
    create_checkpoint(shard)
    setup = time.perf_counter() - started
    report, plan_seconds = timed(lambda: collect_garbage(consensus, blob, "gcbench", grace_seconds=3600, dry_run=True))
    print(f"GC planning over {report.files_scanned:,} files ({runs:,} run directories, setup {setup:.1f}s): "
          f"{plan_seconds:.2f}s (target < 10s); would delete {report.files:,} files, "
          f"{report.kept_referenced:,} referenced")
    consensus.dispose()
    return {"gc_plan_seconds": plan_seconds, "files": report.files_scanned}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="500k rows, 10 batches, 10k files")
    parser.add_argument("--workdir", help="where to build the shards (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    rows, batches, update_rows, files = (500_000, 10, 20_000, 10_000) if args.quick else (5_000_000, 50, 100_000, 100_000)
    workdir = args.workdir or tempfile.mkdtemp(prefix="bench-maintenance-")
    os.makedirs(workdir, exist_ok=True)
    from airflow_upsert_provider.engine.spark.session import get_spark

    spark = get_spark("local[2]", app_name="bench-maintenance", conf={"spark.driver.memory": "4g"})
    try:
        print(f"bench_maintenance: {rows:,} rows, {batches} batches of {update_rows:,}, {files:,} files for GC; "
              f"{os.cpu_count()} cores; workdir {workdir}")
        bench_read_compact_checkpoint(spark, workdir, rows, batches, update_rows)
        bench_gc_planning(workdir, files)
    finally:
        spark.stop()
        if not args.keep and not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
