"""Maintenance at scale: what one cycle of the maintenance DAG costs as the table grows (issue 35 item 6).

Per table size (``--sizes``, default 2M, 10M and 50M rows), one shard on the loopback S3
server (moto's server mode, tests/s3server.py, in this process; ``--local`` adds the same on
local disk), built fast: one big Spark batch of generated rows as batch 0, ``compact --full``,
a full checkpoint and a first publish (none of it measured). Then ``--cycles`` cycles (at
least 4 for the targets), each of:

  batch       100,000 changes (``--change``) landed as JSON Lines, one ``Writer.step()``
  compact     the default (tiered) compaction
  checkpoint  ``checkpoint create`` (incremental, no retention: as the example DAG on a weekday;
              ``--keep-last N`` applies retention at each cycle, which reads the newest
              checkpoint whole, retention's rule, so its cost follows the table)
  gc          ``gc --grace 0 --no-sweep`` (the daily GC, from the store's record; nothing else writes:
              everything unreferenced goes); ``gc --sweep``, the weekly orphan sweep, beside it
  publish     ``publish --iceberg bench.t`` (the table as of since, through the Arrow reader)
  read        the whole table through the Arrow reader (``read_table``), rows counted

each timed warm, in this process, through the engine's public functions, with the requests
the S3 server answered during it, by kind. After the warm cycles, one more cycle runs every
operation as a fresh ``upsertctl`` process (what an Airflow task sees: interpreter, JVM where
the command needs one, the operation), the read as ``upsertctl read --format parquet`` with the
peak resident memory of its process tree (the Arrow reader's peak, as
``bench_readers.py --memory`` measures it). Options of this week's maintenance work are
taken when the installed ``upsertctl`` has them: ``gc --sweep`` (then measured as its own
operation, the orphan sweep, beside the cycle's GC) and a Spark-written publish
(``publish --spark``, then measured beside the Arrow one).

Printed: per operation and size the median seconds per cycle (warm) and per process, the
requests per cycle, the ratios of each size to the first, and the targets marked met/missed:
every maintenance operation within 1.5x at the second size (10M) of its figure at the first
(2M); the Arrow reader's peak memory at the largest size within 2x of its peak at the first.
Progress goes to stderr.

    .venv/bin/python bench/bench_maintenance_scale.py                                  # 2M, 10M, 50M; 4 cycles
    .venv/bin/python bench/bench_maintenance_scale.py --sizes 200000 1000000 --cycles 2  # a smoke run

``--read-memory`` measures only the Arrow reader's peak memory at each size, on local disk (the
shard built as above, one Spark batch, then read by a fresh ``upsertctl read --format parquet``):
the memory target where the cycles at the largest size take longer than the machine has.

    .venv/bin/python bench/bench_maintenance_scale.py --read-memory --sizes 2000000 10000000 50000000 --stream
"""

from __future__ import annotations

import argparse
import json
import os
import re
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

from airflow_upsert_provider.engine.blob.files import open_blob  # noqa: E402
from airflow_upsert_provider.engine.maintenance.checkpoint import create_checkpoint  # noqa: E402
from airflow_upsert_provider.engine.maintenance.compaction import compact  # noqa: E402
from airflow_upsert_provider.engine.maintenance.gc import collect_garbage  # noqa: E402
from airflow_upsert_provider.engine.maintenance.iceberg import publish_to_catalog  # noqa: E402
from airflow_upsert_provider.engine.spark.session import get_spark  # noqa: E402
from airflow_upsert_provider.engine.store.registry import open_consensus  # noqa: E402
from airflow_upsert_provider.engine.table.arrow_reader import read_table  # noqa: E402
from airflow_upsert_provider.engine.table.shard import Shard  # noqa: E402
from airflow_upsert_provider.engine.write.writer import Writer  # noqa: E402
from airflow_upsert_provider.sample_data import SampleSpec, generate  # noqa: E402
from bench_readers import STREAM  # noqa: E402 (bench/, the script's directory)
from bench_readers import timed as process_timed  # noqa: E402
from bench_s3 import build_base_table, counted, requests_text  # noqa: E402
from tests.helpers import sample_config  # noqa: E402
from tests.s3server import S3Server  # noqa: E402

UPSERTCTL = [sys.executable, "-m", "airflow_upsert_provider.cli"]
TABLE = "bench.t"
KEEP_LAST: int | None = None  # --keep-last
MAINTENANCE = ("compact", "checkpoint", "gc", "gc --sweep", "publish", "publish --spark")
TARGET_GROWTH = 1.5  # a maintenance operation at the second size against the first
TARGET_MEMORY = 2.0  # the Arrow reader's peak at the largest size against the first


def note(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def cli_options(*command: str) -> set[str]:
    """The options an ``upsertctl`` command has in this version, from its ``--help``."""
    text = subprocess.run([*UPSERTCTL, *command, "--help"], capture_output=True, text=True, check=True,
                          env=dict(os.environ, PYTHONPATH=REPO)).stdout
    return set(re.findall(r"(?m)^\s+(--[a-z][a-z0-9-]*)", text))


def in_process(argv: list[str]) -> None:
    """An ``upsertctl`` command run in this process (its Spark session the active one): the warm
    figure of an option the engine's functions may spell differently after this week's work."""
    from airflow_upsert_provider.cli import main

    with open(os.devnull, "w") as devnull:
        stdout, sys.stdout = sys.stdout, devnull
        try:
            code = main(argv)
        finally:
            sys.stdout = stdout
    if code != 0:
        raise SystemExit(f"upsertctl {' '.join(argv[:2])} exited {code}")


class Cycle:
    """One shard and the operations of a maintenance cycle on it, warm and as processes."""

    def __init__(self, spark, work: str, root: str, rows: int, change: int, server: S3Server | None,
                 extra: dict[str, bool]) -> None:
        self.spark, self.rows, self.change, self.server, self.extra = spark, rows, change, server, extra
        self.landing = os.path.join(work, "landing")
        os.makedirs(self.landing)
        self.url, self.root = f"sqlite:///{work}/consensus.db", root
        self.consensus = open_consensus(self.url)
        blob = open_blob(root)
        blob.ensure_root()
        self.shard = Shard.create(self.consensus, blob, "scale", sample_config(self.landing, buckets=8,
                                                                                max_files_per_batch=64))
        self.env = dict(os.environ, PYTHONPATH=REPO, UPSERT_CONSENSUS_URL=self.url, UPSERT_BLOB_ROOT=root)
        self.landed = 0
        self.out = os.path.join(work, "read.parquet")

    @classmethod
    def reopen(cls, spark, work: str, rows: int) -> "Cycle":
        """The local-disk shard a ``--read-memory --keep`` run left in ``work``."""
        cycle = cls.__new__(cls)
        cycle.spark, cycle.rows, cycle.change, cycle.server, cycle.extra = spark, rows, 1, None, {}
        cycle.url, cycle.root = f"sqlite:///{work}/consensus.db", os.path.join(work, "blob")
        cycle.consensus = open_consensus(cycle.url)
        cycle.shard = Shard.open(cycle.consensus, open_blob(cycle.root), "scale")
        cycle.env = dict(os.environ, PYTHONPATH=REPO, UPSERT_CONSENSUS_URL=cycle.url, UPSERT_BLOB_ROOT=cycle.root)
        cycle.landed, cycle.out = 0, os.path.join(work, "read.parquet")
        return cycle

    def build(self) -> None:
        build_base_table(self.spark, self.shard, self.rows)
        compact(self.spark, self.shard, full=True)
        create_checkpoint(self.shard, full=True)
        self.publish()

    def land(self) -> None:
        """The next 100k changes in the landing directory: updates, new keys, 2% deletes."""
        self.landed += 1
        generate(self.landing, SampleSpec(records=self.change, keys=int(self.rows * 1.1), partitions=4,
                                          segments_per_partition=2, first_seq=self.landed * 100, seq_step=1,
                                          delete_ratio=0.02, seed=1000 + self.landed))

    def publish(self) -> None:
        publish_to_catalog(self.shard, TABLE, consensus_url=self.url, blob_root=self.root)

    def warm_operations(self) -> dict:
        """The cycle's operations as engine calls in this process, in the cycle's order."""
        shard = self.shard
        stores = ["--consensus", self.url, "--blob-root", self.root]  # upsertctl takes them after the command
        operations = {
            "batch": lambda: Writer(shard, f"bench-{self.landed}", spark_factory=lambda: self.spark).step(),
            "compact": lambda: compact(self.spark, shard),
            "checkpoint": lambda: create_checkpoint(shard, keep_last=KEEP_LAST),
            # The daily GC, from the store's record of replaced runs; the sweep is the weekly one.
            "gc": lambda: collect_garbage(self.consensus, shard.blob, shard.shard_id, grace_seconds=0, sweep=False),
            "gc --sweep": lambda: in_process(["gc", shard.shard_id, *stores, "--grace", "0", "--sweep"]),
            "publish": self.publish,
            "publish --spark": lambda: in_process(["publish", shard.shard_id, *stores, "--iceberg", TABLE + "_spark",
                                                   "--spark"]),
            "read": lambda: sum(batch.num_rows for batch in read_table(shard)),
        }
        return {name: run for name, run in operations.items() if self.extra.get(name, True)}

    def process_commands(self) -> dict:
        """The same operations as the ``upsertctl`` commands an Airflow task runs."""
        shard_id = self.shard.shard_id
        commands = {
            "batch": ["run-batch", shard_id, "--writer-id", f"bench-cli-{self.landed}"],
            "compact": ["compact", shard_id],
            "checkpoint": ["checkpoint", "create", shard_id,
                           *(["--keep-last", str(KEEP_LAST)] if KEEP_LAST is not None else [])],
            "gc": ["gc", shard_id, "--grace", "0", "--no-sweep"],
            "gc --sweep": ["gc", shard_id, "--grace", "0", "--sweep"],
            "publish": ["publish", shard_id, "--iceberg", TABLE],
            "publish --spark": ["publish", shard_id, "--iceberg", TABLE + "_spark", "--spark"],
            "read": ["read", shard_id, "--format", "parquet", "--out", self.out],
        }
        return {name: [*UPSERTCTL, *argv] for name, argv in commands.items() if self.extra.get(name, True)}

    def requests_before(self) -> int:
        return len(self.server.requests()) if self.server else 0

    def requests_since(self, before: int) -> dict[str, int]:
        return counted(self.server, before) if self.server else {}

    def warm_cycle(self) -> dict[str, tuple[float, dict[str, int]]]:
        self.land()
        measured = {}
        for name, run in self.warm_operations().items():
            before = self.requests_before()
            started = time.perf_counter()
            run()
            measured[name] = (time.perf_counter() - started, self.requests_since(before))
        return measured

    def process_cycle(self) -> dict[str, tuple[float, dict[str, int], int]]:
        self.land()
        measured = {}
        for name, argv in self.process_commands().items():
            before = self.requests_before()
            seconds, peak = process_timed(argv, self.env)
            measured[name] = (seconds, self.requests_since(before), peak)
        return measured


def bench_size(spark, server: S3Server, work: str, rows: int, store: str, args, extra: dict[str, bool]) -> dict:
    work = os.path.join(work, f"{store}-{rows}")
    os.makedirs(work)
    root = f"s3://{server.create_bucket()}/upsert" if store == "s3" else os.path.join(work, "blob")
    cycle = Cycle(spark, work, root, rows, args.change, server if store == "s3" else None, extra)
    label = f"[{rows:>11,} rows, {store}]"
    note(f"{label} building the table (one Spark batch, compact --full, a full checkpoint, a first publish)")
    started = time.monotonic()
    cycle.build()
    note(f"{label} built in {time.monotonic() - started:.0f} s")
    warm: dict[str, list] = {}
    for number in range(1, args.cycles + 1):
        for name, sample in cycle.warm_cycle().items():
            warm.setdefault(name, []).append(sample)
        note(f"{label} warm cycle {number}/{args.cycles}: " + ", ".join(
            f"{name} {samples[-1][0]:.2f}s" + (f" ({requests_text([samples[-1][1]])})" if store == "s3" else "")
            for name, samples in warm.items()))
    process_all: dict[str, list] = {}
    for number in range(1, args.process_cycles + 1 if args.process else 1):
        for name, sample in cycle.process_cycle().items():
            process_all.setdefault(name, []).append(sample)
        note(f"{label} process cycle {number}/{args.process_cycles}: " + ", ".join(
            f"{name} {samples[-1][0]:.1f}s" + (f" ({requests_text([samples[-1][1]])})" if store == "s3" else "")
            for name, samples in process_all.items()))
    # Per operation the median of the process cycles, with that cycle's requests and peak memory.
    process = {name: sorted(samples, key=lambda sample: sample[0])[(len(samples) - 1) // 2]
               for name, samples in process_all.items()}
    cycle.consensus.dispose()
    if store == "s3":
        cycle.shard.blob.delete_tree(root)  # moto holds what it stores: free it for the next size
    shutil.rmtree(work, ignore_errors=True)
    return {
        "rows": rows, "store": store,
        "warm": {name: statistics.median(s for s, _ in samples) for name, samples in warm.items()},
        "warm_all": {name: [s for s, _ in samples] for name, samples in warm.items()},
        "requests": {name: [r for _, r in samples] for name, samples in warm.items()},
        "process": {name: seconds for name, (seconds, _, _) in process.items()},
        "process_requests": {name: requests for name, (_, requests, _) in process.items()},
        "process_all": {name: [seconds for seconds, _, _ in samples] for name, samples in process_all.items()},
        "read_peak_mib": max(peak for _, _, peak in process_all["read"]) / 2**20 if "read" in process_all else None,
    }


def read_memory_size(spark_factory, work: str, rows: int, compacted: bool, stream: bool, keep: bool) -> dict:
    """``--read-memory``: the Arrow reader's peak memory on a shard of ``rows`` keys on local disk,
    built as the cycles' shard is (one Spark batch of generated rows; ``compact --full`` with
    ``compacted``), or the one a previous run kept in ``work`` (``keep``), read by fresh
    processes: ``upsertctl read --format parquet`` (the process tree's peak, as the cycle's read
    is measured) and, with ``stream``, a process streaming ``read_table``, counting rows and
    holding none (its own peak, ``ru_maxrss``)."""
    import pyarrow.parquet as pq

    work = os.path.join(work, f"memory-{rows}")
    label = f"[{rows:>11,} rows, local]"
    if keep and os.path.exists(os.path.join(work, "consensus.db")):
        cycle = Cycle.reopen(None, work, rows)  # a kept shard is read without Spark
        note(f"{label} kept from an earlier run")
    else:
        os.makedirs(work)
        spark = spark_factory()
        cycle = Cycle(spark, work, os.path.join(work, "blob"), rows, 1, None, {})
        started = time.monotonic()
        build_base_table(spark, cycle.shard, rows)
        if compacted:
            compact(spark, cycle.shard, full=True)
        note(f"{label} built in {time.monotonic() - started:.0f} s")
    files = [f for run in cycle.shard.live_runs() for f in run["files"]]
    footers = [pq.read_metadata(cycle.shard.blob.path(f["path"])) for f in files]
    layout = {"files": len(files), "parquet_mib": sum(f["bytes"] for f in files) / 2**20,
              "row_groups": sum(m.num_row_groups for m in footers),
              "largest_row_group_rows": max(m.row_group(g).num_rows for m in footers for g in range(m.num_row_groups))}
    seconds, tree_peak = process_timed(cycle.process_commands()["read"], cycle.env)
    os.remove(cycle.out)
    stream_peak = None
    if stream:
        done = subprocess.run([sys.executable, "-c", STREAM, cycle.url, cycle.root, cycle.shard.shard_id,
                               "streamed"], env=cycle.env, check=True, capture_output=True, text=True)
        counted, stream_peak = map(int, done.stdout.split())
        if counted != rows:
            raise SystemExit(f"{label} read_table returned {counted:,} rows, not {rows:,}")
    note(f"{label} {layout}; upsertctl read --format parquet {seconds:.1f} s, peak {tree_peak / 2**20:.0f} MiB"
         + (f"; read_table streamed peak {stream_peak / 2**20:.0f} MiB" if stream else ""))
    cycle.consensus.dispose()
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    return {"rows": rows, "compacted": compacted, **layout, "read_seconds": seconds,
            "read_peak_mib": tree_peak / 2**20, "stream_peak_mib": stream_peak and stream_peak / 2**20}


def report_read_memory(results: list[dict], load: tuple) -> None:
    first = results[0]
    print("\n| table rows | run files | row groups (largest, rows) | Parquet MiB | `upsertctl read --format parquet` s "
          "| its peak RSS (process tree), MiB | streamed `read_table` peak RSS, MiB |")
    print("|---:|---:|---|---:|---:|---:|---:|")
    for r in results:
        stream = "" if r["stream_peak_mib"] is None else f"{r['stream_peak_mib']:,.0f}"
        print(f"| {r['rows']:,} | {r['files']} | {r['row_groups']} ({r['largest_row_group_rows']:,}) | "
              f"{r['parquet_mib']:,.0f} | {r['read_seconds']:.1f} | {r['read_peak_mib']:,.0f} | {stream} |")
    for r in results[1:]:
        memory = r["read_peak_mib"] / first["read_peak_mib"]
        print(f"\n{r['rows'] / 1e6:g}M / {first['rows'] / 1e6:g}M: upsertctl read {memory:.2f}x; target within "
              f"{TARGET_MEMORY}x: {verdict(memory, TARGET_MEMORY)}")
    print(f"\nload average (1, 5, 15 min) at start {' '.join(f'{x:.1f}' for x in load[0])}, "
          f"at end {' '.join(f'{x:.1f}' for x in load[1])}; {os.cpu_count()} cores")


def verdict(ratio: float, target: float) -> str:
    return "met" if ratio <= target else "**missed**"


def report(results: list[dict], load: tuple, args) -> None:
    for store in dict.fromkeys(r["store"] for r in results):
        rows = [r for r in results if r["store"] == store]
        first = rows[0]
        print(f"\n### {store}: {args.cycles} cycles of {args.change:,} changes; medians per cycle\n")
        print("| operation | table rows | warm s | upsertctl process s | requests per cycle (warm) | "
              "requests (process) |")
        print("|---|---:|---:|---:|---|---|")
        for name in first["warm"]:
            for r in rows:
                process = r["process"].get(name)
                print(f"| {name} | {r['rows']:,} | {r['warm'][name]:.2f} | "
                      f"{'' if process is None else f'{process:.1f}'} | "
                      f"{requests_text(r['requests'][name]) if store == 's3' else ''} | "
                      f"{requests_text([r['process_requests'][name]]) if store == 's3' and name in r['process_requests'] else ''} |")
        if len(rows) < 2:
            continue
        heads = " | ".join(f"warm {r['rows'] / 1e6:g}M / {first['rows'] / 1e6:g}M" for r in rows[1:])
        print(f"\n| operation | {heads} "
              f"| process {rows[1]['rows'] / 1e6:g}M / {first['rows'] / 1e6:g}M | target: within "
              f"{TARGET_GROWTH}x at {rows[1]['rows'] / 1e6:g}M |")
        print("|---|" + "---:|" * (len(rows) - 1) + "---:|---|")
        for name in first["warm"]:
            ratios = [r["warm"][name] / first["warm"][name] for r in rows[1:]]
            process = (f"{rows[1]['process'][name] / first['process'][name]:.2f}x"
                       if name in first["process"] and name in rows[1]["process"] else "")
            target = verdict(ratios[0], TARGET_GROWTH) if name in MAINTENANCE else "(no target)"
            print(f"| {name} | {' | '.join(f'{x:.2f}x' for x in ratios)} | {process} | {target} |")
        if first["read_peak_mib"] and rows[-1]["read_peak_mib"]:
            memory = rows[-1]["read_peak_mib"] / first["read_peak_mib"]
            print(f"\nArrow reader peak RSS (`upsertctl read --format parquet`, process tree): "
                  + ", ".join(f"{r['rows']:,} rows {r['read_peak_mib']:.0f} MiB" for r in rows)
                  + f"; {rows[-1]['rows'] / 1e6:g}M / {first['rows'] / 1e6:g}M {memory:.2f}x, "
                    f"target within {TARGET_MEMORY}x: {verdict(memory, TARGET_MEMORY)}")
    print(f"\nload average (1, 5, 15 min) at start {' '.join(f'{x:.1f}' for x in load[0])}, "
          f"at end {' '.join(f'{x:.1f}' for x in load[1])}; {os.cpu_count()} cores")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2_000_000, 10_000_000, 50_000_000], metavar="ROWS",
                        help="table sizes, smallest first (default 2M 10M 50M)")
    parser.add_argument("--cycles", type=int, default=4, help="warm cycles per size (default 4; the targets need 4)")
    parser.add_argument("--change", type=int, default=100_000, help="changes per cycle (default 100,000)")
    parser.add_argument("--local", action="store_true", help="also measure on local disk")
    parser.add_argument("--no-process", dest="process", action="store_false",
                        help="skip the cycle of upsertctl processes (and so the reader's peak memory)")
    parser.add_argument("--process-cycles", type=int, default=1, metavar="N",
                        help="cycles of upsertctl processes after the warm ones (default 1; medians reported)")
    parser.add_argument("--out", help="also write the results as JSON here (after each size)")
    parser.add_argument("--read-memory", action="store_true",
                        help="measure only the Arrow reader's peak memory at each size (a shard on local disk, one "
                             "Spark batch; no cycles, no S3 server): the memory target where the cycles at the "
                             "largest size take longer than the machine has")
    parser.add_argument("--compact", action="store_true",
                        help="with --read-memory: compact --full after the batch (the batch already writes one "
                             "sorted file per bucket, the layout a full compaction writes)")
    parser.add_argument("--stream", action="store_true",
                        help="with --read-memory: also a process streaming read_table (rows counted, none held)")
    parser.add_argument("--keep", metavar="DIR",
                        help="with --read-memory: build the shards in DIR and keep them; a shard a previous run kept "
                             "there is read again, not rebuilt")
    parser.add_argument("--keep-last", type=int, default=None, metavar="N",
                        help="apply retention at each cycle's checkpoint (default: none, as the example DAG's weekday "
                             "runs; retention reads the newest checkpoint whole)")
    args = parser.parse_args()
    global KEEP_LAST
    KEEP_LAST = args.keep_last
    if args.cycles < 1 or args.change < 1 or args.process_cycles < 1 or any(size < args.change for size in args.sizes):
        parser.error("--cycles, --process-cycles and --change must be positive and every size at least --change")
    if args.sizes != sorted(args.sizes):
        parser.error("--sizes: smallest first (ratios are to the first)")
    if args.read_memory:
        work = args.keep or tempfile.mkdtemp(prefix="bench-maintenance-scale-")
        os.makedirs(work, exist_ok=True)
        def spark_factory():  # started only when a shard is built
            return get_spark("local[*]", app_name="bench-maintenance-scale", conf={"spark.driver.memory": "4g"})

        load_start = os.getloadavg()
        results = []
        try:
            for rows in args.sizes:
                results.append(read_memory_size(spark_factory, work, rows, args.compact, args.stream, bool(args.keep)))
                if args.out:
                    with open(args.out, "w") as handle:
                        json.dump({"read_memory": results}, handle, indent=2)
        finally:
            from pyspark.sql import SparkSession

            if SparkSession.getActiveSession() is not None:
                SparkSession.getActiveSession().stop()
            if not args.keep:
                shutil.rmtree(work, ignore_errors=True)
        report_read_memory(results, (load_start, os.getloadavg()))
        return
    # Options of this week's GC and publish work, when the installed upsertctl has them.
    extra = {"gc --sweep": "--sweep" in cli_options("gc"), "publish --spark": "--spark" in cli_options("publish")}
    work = tempfile.mkdtemp(prefix="bench-maintenance-scale-")
    server = S3Server().start()
    # This process, its Spark executors' Python workers and every upsertctl process reach the
    # server with its dummy credentials; nothing of the machine's AWS setup is read.
    os.environ.update(server.environment(), AWS_CONFIG_FILE=os.path.join(work, "absent"),
                      AWS_SHARED_CREDENTIALS_FILE=os.path.join(work, "absent"))
    spark = get_spark("local[*]", app_name="bench-maintenance-scale", conf={"spark.driver.memory": "4g"})
    load_start = os.getloadavg()
    note(f"sizes {', '.join(f'{s:,}' for s in args.sizes)}; {args.cycles} cycles of {args.change:,} changes; "
         f"extra operations: {', '.join(name for name, present in extra.items() if present) or 'none'}; "
         f"load {load_start[0]:.1f}")
    results = []
    try:
        for store in ("s3", "local") if args.local else ("s3",):
            for rows in args.sizes:
                results.append(bench_size(spark, server, work, rows, store, args, extra))
                if args.out:  # after each size: a long run that stops early keeps what it measured
                    with open(args.out, "w") as handle:
                        json.dump({"results": results, "cycles": args.cycles, "change": args.change}, handle,
                                  indent=2)
    finally:
        spark.stop()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    report(results, (load_start, os.getloadavg()), args)


if __name__ == "__main__":
    main()
