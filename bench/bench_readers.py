"""Which reader costs what: the Arrow reader (no JVM) against Spark's, and an Iceberg publish.

One shard from ``--rows`` change records of the sample data over as many key values (so about
six in ten keys end up in the table, some deleted) is written by the engine (`upsertctl run-batch`, local Spark) and compacted, then
each command below runs as a fresh process, as an Airflow task or a user runs it, ``--repeat``
times (medians), with the peak resident memory of its whole process tree (the JVM included,
sampled every 50 ms):

  arrow parquet   ``upsertctl read --format parquet --out F``: the Arrow reader, no JVM
  spark parquet   a process that starts Spark and writes ``Shard.read(spark)`` to Parquet:
                  the same output through Spark's reader
  spark jsonl     ``upsertctl read --out F``: Spark's reader, sorted by key, JSON Lines
  publish         ``upsertctl publish --iceberg`` into a new table each time: the table as of
                  since, through the Arrow reader, written by PyIceberg

and, warm in one process (after one read of each): ``read_table(...).read_all()`` against
``Shard.read(spark).toArrow()``. The ratios are to ``spark parquet`` measured in the same run.

``--memory ROWS [ROWS ...]`` measures instead what the Arrow reader holds on large tables: for
each size, a shard of ROWS distinct keys in ``--buckets`` buckets is written straight with
pyarrow (one committed run, no Spark: minutes of Spark for 20M rows say nothing about the
reader), then fresh processes stream ``read_table`` (counting rows, holding none), once with
the whole-bucket merge the reader used before (the baseline, patched in) and once with its
k-way streamed merge, and another runs ``upsertctl read --format parquet``; each one's peak
resident memory is printed beside the table's size in Arrow memory.

``--rebucket ROWS`` builds such a shard, compacts it (same count) and reads it, then commits a
batch of 1,000 updates, doubles the count with ``upsertctl compact --buckets`` and reads it
again: each read's seconds and peak memory, and each compaction's seconds.

    .venv/bin/python bench/bench_readers.py                   # 5M rows
    .venv/bin/python bench/bench_readers.py --rows 200000     # quick
    .venv/bin/python bench/bench_readers.py --memory 2000000 8000000 --buckets 8
    .venv/bin/python bench/bench_readers.py --rebucket 4000000 --buckets 8
"""

from __future__ import annotations

import argparse
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
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from process_memory import PeakRss  # noqa: E402 (bench/, the script's directory)

SHARD = "orders"
UPSERTCTL = [sys.executable, "-m", "airflow_upsert_provider.cli"]

SPARK_EXPORT = """
import sys
from airflow_upsert_provider.engine.blob.files import open_blob
from airflow_upsert_provider.engine.spark.session import get_spark
from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.engine.table.shard import Shard
url, root, shard_id, out = sys.argv[1:5]
spark = get_spark("local[*]")
Shard.open(open_consensus(url), open_blob(root), shard_id).read(spark).write.mode("overwrite").parquet(out)
"""


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, int]:
    """Wall seconds of a fresh process and the peak resident memory of its tree."""
    started = time.monotonic()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    with PeakRss(proc.pid, tree=True) as rss:
        _, err = proc.communicate()
    wall = time.monotonic() - started
    peak = rss.peak
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[2:5])} exited {proc.returncode}: {err[-2000:]}")
    return wall, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5_000_000, help="change records (default 5M)")
    parser.add_argument("--buckets", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workdir", default=None, help="default: a temporary directory, removed at the end")
    parser.add_argument("--memory", type=int, nargs="+", default=[], metavar="ROWS",
                        help="measure the Arrow reader's memory on tables of ROWS keys instead (one or more sizes)")
    parser.add_argument("--rebucket", type=int, default=None, metavar="ROWS",
                        help="measure a read and the Arrow reader's memory before and after doubling --buckets "
                             "on a table of ROWS keys, and the rebucketing compaction, instead")
    args = parser.parse_args()
    if args.rebucket:
        rebucket(args.rebucket, args.buckets, args.workdir)
        return
    if args.memory:
        for rows in args.memory:
            memory(rows, args.buckets, args.workdir and os.path.join(args.workdir, str(rows)))
        return

    from airflow_upsert_provider.sample_data import SAMPLE_SCHEMA_DDL, SampleSpec, generate

    workdir = args.workdir or tempfile.mkdtemp(prefix="bench-readers-")
    os.makedirs(workdir, exist_ok=True)
    url, root = f"sqlite:///{workdir}/consensus.db", os.path.join(workdir, "blob")
    landing, out = os.path.join(workdir, "landing"), os.path.join(workdir, "out")
    env = dict(os.environ, UPSERT_CONSENSUS_URL=url, UPSERT_BLOB_ROOT=root, PYTHONPATH=REPO)
    try:
        t = time.monotonic()
        generate(landing, SampleSpec(records=args.rows, keys=args.rows, partitions=4, segments_per_partition=4))
        subprocess.run([*UPSERTCTL, "init", SHARD, "--source", f"dir:{landing}", "--key", "id", "--order-by",
                        "updated_at", "--delete-marker", "deleted", "--schema", SAMPLE_SCHEMA_DDL, "--buckets",
                        str(args.buckets), "--max-files-per-batch", "16"], env=env, check=True,
                       stdout=subprocess.DEVNULL)
        for step in (["run-batch", SHARD, "--until-caught-up"], ["compact", SHARD]):
            subprocess.run([*UPSERTCTL, *step], env=env, check=True, stdout=subprocess.DEVNULL)
        status = json.loads(subprocess.run([*UPSERTCTL, "status", SHARD, "--json"], env=env, check=True,
                                           capture_output=True, text=True).stdout)
        print(f"shard: {status.get('rows', '?')} rows in {args.buckets} buckets, since {status['since']}, "
              f"written and compacted in {time.monotonic() - t:.0f} s", flush=True)

        commands = {
            "arrow parquet": lambda n: [*UPSERTCTL, "read", SHARD, "--format", "parquet", "--out",
                                        os.path.join(out, f"arrow-{n}.parquet")],
            "spark parquet": lambda n: [sys.executable, "-c", SPARK_EXPORT, url, root, SHARD,
                                        os.path.join(out, f"spark-{n}")],
            "spark jsonl": lambda n: [*UPSERTCTL, "read", SHARD, "--out", os.path.join(out, f"spark-{n}.jsonl")],
            "publish": lambda n: [*UPSERTCTL, "publish", SHARD, "--iceberg", f"bench.t{n}"],
        }
        figures: dict[str, list[tuple[float, int]]] = {name: [] for name in commands}
        os.makedirs(out, exist_ok=True)
        for n in range(args.repeat):
            for name, argv in commands.items():  # interleaved: drift hits every command alike
                figures[name].append(timed(argv(n), env))
                print(f"  {name:14s} run {n + 1}: {figures[name][-1][0]:6.1f} s", flush=True)
            for entry in os.listdir(out):  # the outputs are not kept: disk, not figures
                path = os.path.join(out, entry)
                shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)

        base_wall = statistics.median(w for w, _ in figures["spark parquet"])
        base_peak = statistics.median(p for _, p in figures["spark parquet"])
        print(f"\nfresh processes, {args.rows:,} records, medians of {args.repeat}:")
        print(f"| command | seconds | vs spark parquet | peak memory (MiB) | vs spark parquet |")
        print("|---|---:|---:|---:|---:|")
        for name, runs in figures.items():
            wall = statistics.median(w for w, _ in runs)
            peak = statistics.median(p for _, p in runs)
            print(f"| {name} | {wall:.1f} | {wall / base_wall:.2f}x | {peak / 2**20:.0f} | {peak / base_peak:.2f}x |")

        warm(url, root, args.repeat)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


STREAM = """
import resource, sys
from airflow_upsert_provider import read_table_from_store
if sys.argv[4] == "whole":  # the merge before streaming: every row of a bucket at once
    import pyarrow as pa
    from airflow_upsert_provider.engine.table import arrow_reader
    def whole_bucket(streams, config, output):
        yield arrow_reader.merge_bucket(pa.Table.from_batches([b for s in streams for b in s]), config, output)
    arrow_reader.merge_sorted_streams = whole_bucket
rows = sum(batch.num_rows for batch in read_table_from_store(sys.argv[1], sys.argv[2], sys.argv[3]))
print(rows, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def committed_table(rows: int, buckets: int, workdir: str, env: dict[str, str]) -> float:
    """A shard of ``rows`` distinct keys in ``buckets`` buckets, one committed run written straight
    with pyarrow (a bucket per key % buckets: each key once, so any split merges alike), in the
    store and blob root ``env`` names; the table's size in Arrow memory (bytes)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from airflow_upsert_provider.engine.blob.files import open_blob
    from airflow_upsert_provider.engine.store.records import BatchRecord
    from airflow_upsert_provider.engine.store.registry import open_consensus
    from airflow_upsert_provider.engine.table.shard import Shard
    from airflow_upsert_provider.sample_data import SAMPLE_SCHEMA_DDL
    from tests.arrow_runs import arrow_run_schema

    url, root = env["UPSERT_CONSENSUS_URL"], env["UPSERT_BLOB_ROOT"]
    os.makedirs(os.path.join(workdir, "landing"), exist_ok=True)
    subprocess.run([*UPSERTCTL, "init", SHARD, "--source", f"dir:{workdir}/landing", "--key", "id",
                    "--order-by", "updated_at", "--delete-marker", "deleted", "--schema", SAMPLE_SCHEMA_DDL,
                    "--buckets", str(buckets)], env=env, check=True, stdout=subprocess.DEVNULL)
    shard = Shard.open(open_consensus(url), open_blob(root), SHARD)
    schema = arrow_run_schema(shard.config)
    blob, run_dir = shard.blob, shard.blob.path(SHARD, "runs", "ts=000000000000", "w-bench")
    files, arrow_bytes, started = [], 0, time.monotonic()
    for bucket in range(buckets):
        ids = pa.array(np.arange(bucket, rows, buckets, dtype=np.int64))
        table = pa.Table.from_arrays([
            ids, pc.binary_join_element_wise("name-", pc.cast(ids, pa.string()), ""),
            pc.multiply(pc.cast(ids, pa.float64()), 0.5), ids,
            pa.nulls(len(ids), pa.bool_()).fill_null(False), pa.array(np.zeros(len(ids), dtype=np.int64)),
        ], schema=schema)
        arrow_bytes += table.nbytes
        path = blob.join(run_dir, f"_bucket={bucket}", "part-00000.parquet")
        blob.make_dirs(blob.parent(path))
        pq.write_table(table, path)
        files.append({"path": blob.relative(path), "bytes": os.path.getsize(path), "sha256": blob.checksum(path)})
    run = {"path": blob.relative(run_dir), "files": files, "rows": rows}
    shard.compare_and_append(0, 1, BatchRecord(ts=0, writer_id="bench", token="bench", run=run, stats={}))
    parquet_bytes = sum(f["bytes"] for f in files)
    print(f"table: {rows:,} rows in {buckets} buckets, {arrow_bytes / 2**20:,.0f} MiB in Arrow memory, "
          f"{parquet_bytes / 2**20:,.0f} MiB of Parquet; written in {time.monotonic() - started:.0f} s",
          flush=True)
    return arrow_bytes


def memory(rows: int, buckets: int, workdir: str | None) -> None:
    """The Arrow reader's peak memory on a table of ``rows`` keys against the table's size."""
    given = workdir is not None
    workdir = workdir or tempfile.mkdtemp(prefix="bench-readers-")
    os.makedirs(workdir, exist_ok=True)
    url, root = f"sqlite:///{workdir}/consensus.db", os.path.join(workdir, "blob")
    env = dict(os.environ, UPSERT_CONSENSUS_URL=url, UPSERT_BLOB_ROOT=root, PYTHONPATH=REPO)
    try:
        arrow_bytes = committed_table(rows, buckets, workdir, env)

        for merge, label in (("whole", "whole-bucket merge (before)"), ("streamed", "k-way streamed merge")):
            started = time.monotonic()
            done = subprocess.run([sys.executable, "-c", STREAM, url, root, SHARD, merge], env=env, check=True,
                                  capture_output=True, text=True)
            counted, peak = map(int, done.stdout.split())
            assert counted == rows, (counted, rows)
            print(f"| read_table, {label} (a fresh process) | {time.monotonic() - started:.1f} s | "
                  f"{peak / 2**20:,.0f} MiB | {peak / arrow_bytes:.2f}x the table |", flush=True)
        wall, peak = timed([*UPSERTCTL, "read", SHARD, "--format", "parquet", "--out",
                            os.path.join(workdir, "out.parquet")], env)
        print(f"| upsertctl read --format parquet | {wall:.1f} s | {peak / 2**20:,.0f} MiB | "
              f"{peak / arrow_bytes:.2f}x the table |")
    finally:
        if not given:
            shutil.rmtree(workdir, ignore_errors=True)


def rebucket(rows: int, buckets: int, workdir: str | None) -> None:
    """A read's time and the Arrow reader's peak memory before and after doubling the bucket
    count, and the compactions' time: a shard of ``rows`` keys in ``buckets`` buckets compacted
    (``upsertctl compact``, the same count), read; a batch of 1,000 updates; ``upsertctl
    compact --buckets 2*buckets`` (the rebucket, a full merge), read again."""
    from airflow_upsert_provider.engine.blob.files import open_blob
    from airflow_upsert_provider.engine.store.registry import open_consensus
    from airflow_upsert_provider.engine.table.shard import Shard
    from tests.arrow_runs import commit_batch

    given = workdir is not None
    workdir = workdir or tempfile.mkdtemp(prefix="bench-readers-")
    os.makedirs(workdir, exist_ok=True)
    url, root = f"sqlite:///{workdir}/consensus.db", os.path.join(workdir, "blob")
    env = dict(os.environ, UPSERT_CONSENSUS_URL=url, UPSERT_BLOB_ROOT=root, PYTHONPATH=REPO)

    def read() -> tuple[float, int]:
        started = time.monotonic()
        done = subprocess.run([sys.executable, "-c", STREAM, url, root, SHARD, "streamed"], env=env, check=True,
                              capture_output=True, text=True)
        counted, peak = map(int, done.stdout.split())
        assert counted == rows, (counted, rows)
        return time.monotonic() - started, peak

    try:
        arrow_bytes = committed_table(rows, buckets, workdir, env)
        compacted, _ = timed([*UPSERTCTL, "compact", SHARD], env)
        before = read()
        shard = Shard.open(open_consensus(url), open_blob(root), SHARD)
        commit_batch(shard, [{"id": key, "name": f"updated-{key}", "amount": 1.0, "updated_at": rows + key,
                              "_deleted": False} for key in range(0, rows, max(1, rows // 1000))])
        rebucketed, _ = timed([*UPSERTCTL, "compact", SHARD, "--buckets", str(2 * buckets)], env)
        assert shard.bucket_count() == 2 * buckets
        after = read()
        print(f"\n{rows:,} rows, a fresh process each (the JVM's start included in a compaction):")
        print("| buckets | compaction | streamed read_table | Arrow reader peak memory |")
        print("|---:|---|---:|---:|")
        print(f"| {buckets} | {compacted:.1f} s (full, same count) | {before[0]:.1f} s | {before[1] / 2**20:,.0f} MiB "
              f"({before[1] / arrow_bytes:.2f}x the table) |")
        print(f"| {2 * buckets} | {rebucketed:.1f} s (`--buckets {2 * buckets}`: full, new count) | "
              f"{after[0]:.1f} s | {after[1] / 2**20:,.0f} MiB ({after[1] / arrow_bytes:.2f}x the table) |")
    finally:
        if not given:
            shutil.rmtree(workdir, ignore_errors=True)


def warm(url: str, root: str, repeat: int) -> None:
    """Both readers in this process, after one read each: what a long-lived worker sees."""
    from airflow_upsert_provider import read_table
    from airflow_upsert_provider.engine.blob.files import open_blob
    from airflow_upsert_provider.engine.spark.session import get_spark
    from airflow_upsert_provider.engine.store.registry import open_consensus
    from airflow_upsert_provider.engine.table.shard import Shard

    shard = Shard.open(open_consensus(url), open_blob(root), SHARD)
    spark = get_spark("local[*]")
    readers = {"arrow read_all": lambda: read_table(shard).read_all().num_rows,
               "spark toArrow": lambda: shard.read(spark).toArrow().num_rows}
    times: dict[str, list[float]] = {name: [] for name in readers}
    for n in range(repeat + 1):
        for name, read in readers.items():
            started = time.monotonic()
            rows = read()
            if n:  # the first of each warms up
                times[name].append(time.monotonic() - started)
    base = statistics.median(times["spark toArrow"])
    print(f"\nwarm, in one process ({rows:,} rows), medians of {repeat}:")
    for name, values in times.items():
        print(f"  {name:15s} {statistics.median(values):6.2f} s  {statistics.median(values) / base:.2f}x")
    spark.stop()


if __name__ == "__main__":
    main()
