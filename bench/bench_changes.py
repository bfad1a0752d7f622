"""The change feed of one batch against a full read of the table (issue 36 item 8, the feed half).

A shard of ``--rows`` distinct keys in ``--buckets`` buckets (one committed run at ts 0, written
straight with pyarrow in the engine's layout: a bucket per key % buckets, sorted by key; minutes
of Spark for 10M rows say nothing about the readers), then one batch at ts 1 of ``--changes``
changes: keys drawn over 1.1 times the key range (about one in eleven an insert), one in ten a
delete, the rest updates. Then, medians of ``--repeat``:

  warm      in one process, after one read of each: ``read_changes(shard, 1).read_all()``
            (and with ``preimages=True``) against ``read_table(shard).read_all()`` (the Arrow
            reader, the full table)
  process   fresh processes, as an Airflow task runs them: ``upsertctl changes SHARD --from 1
            --format parquet --out F`` (and with ``--preimages``) against ``upsertctl read SHARD
            --format parquet --out F``

The target: the feed at least 10x faster than the full read. The feed with pre-images is
printed beside it: it decodes the values of the table as of the range's start.

    .venv/bin/python bench/bench_changes.py --rows 1000000            # quick
    .venv/bin/python bench/bench_changes.py --rows 10000000 --changes 100000
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

SHARD = "orders"
UPSERTCTL = [sys.executable, "-m", "airflow_upsert_provider.cli"]
TARGET = 10.0


def write_run(shard, ts: int, columns_of, buckets: int, rows_of) -> dict:
    """A run at ``ts``: per bucket the rows ``columns_of(bucket)`` gives, sorted by key."""
    import pyarrow.parquet as pq

    blob = shard.blob
    run_dir = blob.path(SHARD, "runs", f"ts={ts:012d}", "w-bench")
    files = []
    for bucket in range(buckets):
        table = columns_of(bucket)
        path = blob.join(run_dir, f"_bucket={bucket}", "part-00000.parquet")
        blob.make_dirs(blob.parent(path))
        pq.write_table(table, path)
        files.append({"path": blob.relative(path), "bytes": os.path.getsize(path), "sha256": blob.checksum(path)})
    return {"path": blob.relative(run_dir), "files": files, "rows": rows_of}


def build(rows: int, changes: int, buckets: int, workdir: str, env: dict[str, str]) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from airflow_upsert_provider.engine.blob.files import open_blob
    from airflow_upsert_provider.engine.store.records import BatchRecord
    from airflow_upsert_provider.engine.store.registry import open_consensus
    from airflow_upsert_provider.engine.table.shard import Shard
    from airflow_upsert_provider.sample_data import SAMPLE_SCHEMA_DDL
    from tests.arrow_runs import arrow_run_schema

    os.makedirs(os.path.join(workdir, "landing"), exist_ok=True)
    subprocess.run([*UPSERTCTL, "init", SHARD, "--source", f"dir:{workdir}/landing", "--key", "id",
                    "--order-by", "updated_at", "--delete-marker", "deleted", "--schema", SAMPLE_SCHEMA_DDL,
                    "--buckets", str(buckets)], env=env, check=True, stdout=subprocess.DEVNULL)
    consensus = open_consensus(env["UPSERT_CONSENSUS_URL"])
    shard = Shard.open(consensus, open_blob(env["UPSERT_BLOB_ROOT"]), SHARD)
    schema = arrow_run_schema(shard.config)
    started = time.monotonic()

    def rows_with(ids, version: int, deleted) -> pa.Table:
        return pa.Table.from_arrays([
            ids, pc.binary_join_element_wise(f"name{version}-", pc.cast(ids, pa.string()), ""),
            pc.multiply(pc.cast(ids, pa.float64()), 0.5 + version), pa.array(np.full(len(ids), version, np.int64)),
            deleted, pa.array(np.full(len(ids), version, np.int64)),
        ], schema=schema)

    def base(bucket: int) -> pa.Table:
        ids = pa.array(np.arange(bucket, rows, buckets, dtype=np.int64))
        return rows_with(ids, 0, pa.array(np.zeros(len(ids), dtype=bool)))

    run = write_run(shard, 0, base, buckets, rows)
    shard.compare_and_append(0, 1, BatchRecord(ts=0, writer_id="bench", token="t0", run=run, stats={}))
    rng = np.random.default_rng(7)
    changed = np.unique(rng.integers(0, int(rows * 1.1), size=changes, dtype=np.int64))
    deletes = rng.random(len(changed)) < 0.1

    def change(bucket: int) -> pa.Table:
        mask = changed % buckets == bucket
        return rows_with(pa.array(changed[mask]), 1, pa.array(deletes[mask]))

    run = write_run(shard, 1, change, buckets, len(changed))
    shard.compare_and_append(1, 2, BatchRecord(ts=1, writer_id="bench", token="t1", run=run, stats={}))
    consensus.dispose()
    print(f"shard: {rows:,} rows in {buckets} buckets, then a batch of {len(changed):,} changes "
          f"({int(deletes.sum()):,} deletes); written in {time.monotonic() - started:.0f} s", flush=True)


Timing = tuple[float, float]  # medians of wall and CPU seconds


def warm(env: dict[str, str], repeat: int) -> tuple[Timing, Timing, Timing, int, int]:
    from airflow_upsert_provider.engine.blob.files import open_blob
    from airflow_upsert_provider.engine.store.registry import open_consensus
    from airflow_upsert_provider.engine.table.arrow_reader import read_table
    from airflow_upsert_provider.engine.table.changes import read_changes
    from airflow_upsert_provider.engine.table.shard import Shard

    consensus = open_consensus(env["UPSERT_CONSENSUS_URL"])
    shard = Shard.open(consensus, open_blob(env["UPSERT_BLOB_ROOT"]), SHARD)
    feed_rows = read_changes(shard, 1).read_all().num_rows
    preimage_rows = read_changes(shard, 1, preimages=True).read_all().num_rows
    read_table(shard).read_all()

    def median(read) -> tuple[float, float]:
        times, cpu = [], []
        for _ in range(repeat):
            started, started_cpu = time.monotonic(), time.process_time()
            read().read_all()
            times.append(time.monotonic() - started)
            cpu.append(time.process_time() - started_cpu)
        return statistics.median(times), statistics.median(cpu)

    feed = median(lambda: read_changes(shard, 1))
    preimages = median(lambda: read_changes(shard, 1, preimages=True))
    table = median(lambda: read_table(shard))
    consensus.dispose()
    return feed, preimages, table, feed_rows, preimage_rows


def fresh(argv: list[str], env: dict[str, str], repeat: int) -> tuple[float, float]:
    """Medians of the wall time and of the CPU time (user + system) of ``argv`` run whole:
    on a loaded machine a process waits for a core, and its CPU time says what it costs."""
    times, cpu = [], []
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
        times.append(time.monotonic() - started)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(times), statistics.median(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--changes", type=int, default=100_000)
    parser.add_argument("--buckets", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workdir", help="keep the shard here (default: a temporary directory, removed)")
    args = parser.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="bench-changes-")
    env = {**os.environ, "PYTHONPATH": REPO, "UPSERT_CONSENSUS_URL": f"sqlite:///{workdir}/consensus.db",
           "UPSERT_BLOB_ROOT": f"{workdir}/blob"}
    os.environ.update({k: env[k] for k in ("UPSERT_CONSENSUS_URL", "UPSERT_BLOB_ROOT")})
    try:
        build(args.rows, args.changes, args.buckets, workdir, env)
        print(f"load average before the reads: {os.getloadavg()}", flush=True)
        (feed, feed_cpu), (preimages, preimages_cpu), (table, table_cpu), feed_rows, preimage_rows = warm(
            env, args.repeat)
        print(f"warm:    feed {feed:.2f} s ({feed_rows:,} rows), with pre-images {preimages:.2f} s "
              f"({preimage_rows:,} rows), full read {table:.2f} s: {table / feed:.1f}x "
              f"(with pre-images {table / preimages:.1f}x)", flush=True)
        print(f"warm CPU: feed {feed_cpu:.2f} s, with pre-images {preimages_cpu:.2f} s, full read {table_cpu:.2f} s: "
              f"{table_cpu / feed_cpu:.1f}x (with pre-images {table_cpu / preimages_cpu:.1f}x)", flush=True)
        out = os.path.join(workdir, "out.parquet")
        feed_argv = [*UPSERTCTL, "changes", SHARD, "--from", "1", "--format", "parquet", "--out", out]
        feed_p, feed_cpu = fresh(feed_argv, env, args.repeat)
        preimages_p, preimages_cpu = fresh([*feed_argv, "--preimages"], env, args.repeat)
        table_p, table_cpu = fresh([*UPSERTCTL, "read", SHARD, "--format", "parquet", "--out", out], env,
                                   args.repeat)
        print(f"process: feed {feed_p:.2f} s, with pre-images {preimages_p:.2f} s, full read {table_p:.2f} s: "
              f"{table_p / feed_p:.1f}x (with pre-images {table_p / preimages_p:.1f}x; target {TARGET:.0f}x)",
              flush=True)
        print(f"process CPU: feed {feed_cpu:.2f} s, with pre-images {preimages_cpu:.2f} s, full read "
              f"{table_cpu:.2f} s: {table_cpu / feed_cpu:.1f}x (with pre-images {table_cpu / preimages_cpu:.1f}x)",
              flush=True)
        print(f"load average after: {os.getloadavg()}", flush=True)
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
