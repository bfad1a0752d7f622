"""What a shard's costs do as its history grows: 1k, 10k, 100k and 500k committed batches.

One shard's history is seeded through the engine's own commit path: each batch mints its
binding by compare-and-set (``Consensus.mint_binding``), writes a tiny real Parquet run
(one row) into the blob, describes it as a writer does (``runs.describe_run``: size,
SHA-256, fsync) and commits it with the writer's ``compare_and_append``. No Spark job per
batch (500k of them would take days): the run is written with pyarrow. Maintenance runs as
a schedule would, every ``--compact-every`` batches (1440: daily, for minute batches):
compaction (a real Spark job), a checkpoint (keep the last one), GC (grace 0, so that the
history seeded in minutes counts as older than the grace period, as a year's would).

At each level, on the same shard, in the same process (warm), medians of:

  commit        one batch: mint, write, describe, compare_and_append
  retry         compare_and_append of a persisted batch (an old ts, its own token): the
                skip a lagging or retrying writer takes
  status        ``Shard.status()`` (what ``upsertctl status`` computes)
  monitor       ``observations.evaluate_shard``: observe, record, evaluate the stall rules
                (``frontier observe`` and the monitor's poke)
  checkpoint    ``create_checkpoint(keep_last=1)``
  compaction    ``compact`` of the batches committed since the last one (the same number at
                every level)
  gc            ``collect_garbage`` right after that compaction (grace 0)
  read          ``shard.read(spark).count()``

and the consensus store's size (rows per table, bytes), then a fresh ``upsertctl status``
process at the first and the last level. The table gives each cost's ratio to its figure at
the first level, measured in the same run.

The landing directory holds no segment files (as after ``source prune``): the bench measures
history, not the source's retention.

    .venv/bin/python bench/bench_history.py                         # 1k, 10k, 100k, 500k on SQLite
    .venv/bin/python bench/bench_history.py --max-batches 10000     # a quick run: 1k, 10k
    .venv/bin/python bench/bench_history.py --consensus postgresql://USER@HOST:PORT/DB

The 500k level takes about an hour of seeding. To keep the figures off a busy machine, seed
first (nothing is timed, it may share the machine) and measure every level later, one after
another in one quiet window, from a copy of the store kept at each level:

    .venv/bin/python bench/bench_history.py --workdir /dev/shm/bh --snapshot-only
    .venv/bin/python bench/bench_history.py --workdir /dev/shm/bh --from-snapshots --json F
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
import uuid

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import sqlalchemy as sa  # noqa: E402

from airflow_upsert_provider.engine.blob.files import open_blob  # noqa: E402
from airflow_upsert_provider.engine.config import ShardConfig  # noqa: E402
from airflow_upsert_provider.engine.frontier import observations  # noqa: E402
from airflow_upsert_provider.engine.frontier.model import StallSettings  # noqa: E402
from airflow_upsert_provider.engine.maintenance.checkpoint import create_checkpoint  # noqa: E402
from airflow_upsert_provider.engine.maintenance.compaction import compact  # noqa: E402
from airflow_upsert_provider.engine.maintenance.gc import collect_garbage  # noqa: E402
from airflow_upsert_provider.engine.store.records import BatchRecord, Binding
from airflow_upsert_provider.engine.store.registry import STORE_SCHEMA, open_consensus  # noqa: E402
from airflow_upsert_provider.engine.table.runs import describe_run  # noqa: E402
from airflow_upsert_provider.engine.table.shard import Shard  # noqa: E402
from airflow_upsert_provider.sample_data import sample_schema_json  # noqa: E402

LEVELS = (1_000, 10_000, 100_000, 500_000)
SHARD = "history"
PARTITION = "p0"
COSTS = ("commit", "retry", "status", "monitor", "checkpoint", "compaction", "gc", "read")
RUN_SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("amount", pa.float64()),
                        ("updated_at", pa.int64()), ("_deleted", pa.bool_()), ("_ts", pa.int64())])


def timed(fn):
    started = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - started


class History:
    """The shard under test and the engine calls that grow and maintain its history."""

    def __init__(self, workdir: str, consensus_url: str, keys: int, *, existing: bool = False) -> None:
        self.workdir = workdir
        self.consensus_url = consensus_url
        self.consensus = open_consensus(consensus_url)
        self.blob = open_blob(os.path.join(workdir, "blob"))
        self.landing = os.path.join(workdir, "landing")
        os.makedirs(os.path.join(self.landing, PARTITION), exist_ok=True)
        if existing:
            self.shard = Shard.open(self.consensus, self.blob, SHARD)
        else:
            config = ShardConfig(source=f"dir:{self.landing}", keys=("id",), schema=sample_schema_json(),
                                 order_by="updated_at", delete_marker="deleted", buckets=1)
            self.shard = Shard.create(self.consensus, self.blob, SHARD, config)
        self.keys = keys

    @staticmethod
    def token(ts: int) -> str:
        """Batch ``ts``'s commit token: derived from ts, so that a history measured from a
        snapshot retries with the token its batch committed with."""
        return uuid.UUID(int=ts + 1).hex

    @property
    def upper(self) -> int:
        return self.shard.state().upper

    def commit(self, ts: int) -> None:
        """Batch ``ts`` through the writer's steps: bind, write the run, describe, append."""
        binding = Binding(ts=ts, ranges={PARTITION: {"from": ts, "to": ts + 1,
                                                     "files": [[ts, f"{ts:020d}.jsonl"]], "count": 1}})
        self.consensus.mint_binding(SHARD, binding, "bench")
        run_dir = self.shard.run_dir(ts, "bench", uuid.uuid4().hex[:12])
        os.makedirs(os.path.join(run_dir, "_bucket=0"))
        key = ts % self.keys
        rows = pa.table({"id": [key], "name": [f"name-{key}-{ts}"], "amount": [float(ts)], "updated_at": [ts],
                         "_deleted": [False], "_ts": [ts]}, schema=RUN_SCHEMA)
        pq.write_table(rows, os.path.join(run_dir, "_bucket=0", f"part-00000-{uuid.uuid4().hex[:8]}.c000.snappy.parquet"))
        run = describe_run(self.blob, run_dir)
        token = self.token(ts)
        stats = {"rows_in": 1, "rows_out": 1, "rejected": 0, "rejects": None, "quarantined_files": []}
        result = self.shard.compare_and_append(ts, ts + 1, BatchRecord(ts, "bench", token, run, stats))
        if result.outcome.value != "committed":
            raise SystemExit(f"batch {ts} did not commit: {result}")

    def retry(self, ts: int) -> str:
        """The append of persisted batch ``ts`` again, with its own token (a writer that lost
        the answer, or a lagging one): what the store answers."""
        run = {"path": "unused", "files": [], "rows": 0}
        record = BatchRecord(ts, "bench", self.token(ts), run, {})
        return self.shard.compare_and_append(ts, ts + 1, record).outcome.value

    def maintain(self, spark) -> dict[str, float]:
        """What the maintenance DAG runs: compact, checkpoint (keep the last), GC."""
        _, compaction = timed(lambda: compact(spark, self.shard))
        _, checkpoint = timed(lambda: create_checkpoint(self.shard, keep_last=1))
        _, gc = timed(lambda: collect_garbage(self.consensus, self.blob, SHARD, grace_seconds=0))
        return {"compaction": compaction, "checkpoint": checkpoint, "gc": gc}

    def seed_to(self, spark, target: int, compact_every: int) -> None:
        start = self.upper
        started = time.monotonic()
        step = max((target - start) // 20, 1)
        for ts in range(start, target):
            self.commit(ts)
            if (ts + 1) % compact_every == 0:
                self.maintain(spark)
            if (ts + 1 - start) % step == 0:
                done = ts + 1 - start
                rate = done / (time.monotonic() - started)
                print(f"  seeding: {ts + 1:,} of {target:,} batches ({rate:,.0f}/s, "
                      f"{(target - ts - 1) / rate / 60:.1f} min left)", flush=True)

    def store_size(self) -> dict[str, object]:
        tables = [t.name for t in STORE_SCHEMA.tables]
        with self.consensus.engine.connect() as conn:
            rows = {name: conn.execute(sa.text(f"SELECT count(*) FROM {name}")).scalar() for name in tables}
            if self.consensus.dialect == "postgresql":
                size = sum(conn.execute(sa.text(f"SELECT pg_total_relation_size('{name}')")).scalar() for name in tables)
            else:
                path = self.consensus.engine.url.database
                size = sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))
        return {"rows": rows, "bytes": size}


def median(fn, repeat: int) -> float:
    return statistics.median(timed(fn)[1] for _ in range(repeat))


def measure(history: History, spark, repeat: int, compact_batches: int) -> dict[str, float]:
    """Every cost at the shard's current history, medians of ``repeat`` (fewer for the
    Spark ones). Compaction and GC are of ``compact_batches`` new batches, at every level."""
    shard, consensus = history.shard, history.consensus
    figures: dict[str, float] = {}
    # The schedule's maintenance first (not measured): every level starts from the same
    # steady state, so the compaction and GC below handle ``compact_batches`` new batches.
    history.maintain(spark)
    upper = history.upper
    commits = []
    for ts in range(upper, upper + compact_batches):
        commits.append(timed(lambda ts=ts: history.commit(ts))[1])
    figures["commit"] = statistics.median(commits)
    # An old batch, half way through the history: its row may be truncated (that is the point).
    old = max(upper // 2, 0)
    outcomes = set()
    figures["retry"] = median(lambda: outcomes.add(history.retry(old)), repeat)
    figures["status"] = median(shard.status, repeat)
    settings = StallSettings()
    figures["monitor"] = median(
        lambda: observations.evaluate_shard(consensus, history.blob, SHARD, settings, observer="bench"), repeat
    )
    _, figures["compaction"] = timed(lambda: compact(spark, shard))
    _, figures["gc"] = timed(lambda: collect_garbage(consensus, history.blob, SHARD, grace_seconds=0))
    # As many samples as the warm figures: a create is milliseconds, and a median of 3 moved
    # by a third between runs at the same level.
    figures["checkpoint"] = median(lambda: create_checkpoint(shard, keep_last=1), repeat)
    shard.read(spark).count()  # warm
    figures["read"] = median(lambda: shard.read(spark).count(), 3)
    figures["retry_outcome"] = ",".join(sorted(outcomes))  # type: ignore[assignment]
    return figures


def fresh_status(history: History) -> float:
    """One ``upsertctl status`` process, whole (imports, store, source listing)."""
    env = dict(os.environ, UPSERT_CONSENSUS_URL=history.consensus_url, UPSERT_BLOB_ROOT=history.blob.root,
               PYTHONPATH=REPO)
    cli = os.path.join(REPO, ".venv", "bin", "upsertctl")
    command = [cli] if os.path.exists(cli) else [sys.executable, "-m", "airflow_upsert_provider.cli"]
    _, seconds = timed(lambda: subprocess.run(command + ["status", SHARD, "--json"], env=env, check=True,
                                              capture_output=True))
    return seconds


LIVE_ENTRIES = ("consensus.db", "consensus.db-wal", "blob", "landing")


def snapshot_dir(base: str, level: int) -> str:
    return os.path.join(base, "snapshots", str(level))


def copy_live_entries(source_dir: str, target_dir: str) -> None:
    """Copy the store's files and the blob and landing directories from one directory to another."""
    for name in LIVE_ENTRIES:
        source = os.path.join(source_dir, name)
        if os.path.isdir(source):
            shutil.copytree(source, os.path.join(target_dir, name), symlinks=True)
        elif os.path.exists(source):
            shutil.copy2(source, os.path.join(target_dir, name))


def save_snapshot(base: str, level: int) -> None:
    """Copy the SQLite store (file and WAL, as they are: nothing writes between batches) and
    the blob and landing directories, at the same paths the measurement will use."""
    target = snapshot_dir(base, level)
    shutil.rmtree(target, ignore_errors=True)
    os.makedirs(target)
    copy_live_entries(base, target)


def restore_snapshot(base: str, level: int) -> None:
    """Put level's copy back at the live paths (the store names the blob's files by path)."""
    source = snapshot_dir(base, level)
    if not os.path.isdir(source):
        raise SystemExit(f"no snapshot of level {level:,} in {source}: seed with --snapshot-only first")
    for name in LIVE_ENTRIES + ("consensus.db-shm",):
        live = os.path.join(base, name)
        if os.path.isdir(live):
            shutil.rmtree(live)
        elif os.path.exists(live):
            os.remove(live)
    copy_live_entries(source, base)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--consensus", help="consensus URL (default: a SQLite file in the work directory)")
    parser.add_argument("--max-batches", type=int, default=LEVELS[-1], help="stop at this level (default 500000)")
    parser.add_argument("--levels", help="comma-separated levels instead of 1000,10000,100000,500000")
    parser.add_argument("--compact-every", type=int, default=1440,
                        help="batches between scheduled compaction, checkpoint and GC (default 1440)")
    parser.add_argument("--keys", type=int, default=1000, help="distinct keys the batches update (default 1000)")
    parser.add_argument("--repeat", type=int, default=20, help="samples per warm median (default 20)")
    parser.add_argument("--workdir", help="where the blob, landing and SQLite file go (default: a temporary "
                        "directory, on /dev/shm when it exists)")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--snapshot-only", action="store_true",
                        help="seed to every level and keep a copy of the store and blob at each (WORKDIR/snapshots/"
                             "LEVEL), measuring nothing: the seeding may share the machine")
    parser.add_argument("--from-snapshots", action="store_true",
                        help="measure every level from its copy under WORKDIR/snapshots, one after another in this "
                             "process: all levels in one quiet window")
    args = parser.parse_args()
    chosen = [int(x) for x in args.levels.split(",")] if args.levels else LEVELS
    levels = [level for level in chosen if level <= args.max_batches] or [args.max_batches]
    if (args.snapshot_only or args.from_snapshots) and (args.consensus or not args.workdir):
        parser.error("--snapshot-only and --from-snapshots take --workdir and the SQLite store (no --consensus)")
    if args.snapshot_only and args.from_snapshots:
        parser.error("--snapshot-only and --from-snapshots are two runs: seed first, then measure")

    from airflow_upsert_provider.engine.spark.session import get_spark

    base = args.workdir or tempfile.mkdtemp(prefix="bench-history-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    os.makedirs(base, exist_ok=True)
    url = args.consensus or f"sqlite:///{os.path.join(base, 'consensus.db')}"
    # The seeding may be paused (SIGSTOP) for as long as a measurement elsewhere needs the
    # machine: with Spark's default heartbeat the local executor exits when it resumes.
    spark = get_spark("local[2]", app_name="bench-history",
                      conf={"spark.executor.heartbeatInterval": "3600s", "spark.network.timeout": "7200s"})
    results: dict[str, object] = {"levels": {}, "compact_every": args.compact_every, "keys": args.keys,
                                  "store": "postgresql" if url.startswith("postgres") else "sqlite"}
    try:
        if args.snapshot_only:
            # An interrupted seeding goes on from the store's upper (each batch commits whole).
            resuming = os.path.exists(os.path.join(base, "consensus.db"))
            history = History(base, url, args.keys, existing=resuming)
            if resuming:
                print(f"resuming the seeding at {history.upper:,} batches", flush=True)
            for level in levels:
                if level < history.upper and os.path.isdir(snapshot_dir(base, level)):
                    continue
                history.seed_to(spark, level, args.compact_every)
                history.maintain(spark)
                save_snapshot(base, level)
                print(f"[{level:,} batches] kept in {snapshot_dir(base, level)}", flush=True)
            return 0
        history = None
        fresh: dict[int, float] = {}
        # From snapshots, the first level is measured twice and the first pass dropped: it
        # warms the JVM (its first compaction took 5x a later one), which a seeded run's
        # first level cannot avoid but a measured-later one can.
        passes = [(levels[0], False)] if args.from_snapshots else []
        passes += [(level, True) for level in levels]
        for level, kept in passes:
            index = levels.index(level)
            print(f"[{level:,} batches]" + ("" if kept else " (warm-up, not kept)"), flush=True)
            if args.from_snapshots:
                if history is not None:
                    history.consensus.engine.dispose()
                restore_snapshot(base, level)
                history = History(base, url, args.keys, existing=True)
                if history.upper != level:
                    raise SystemExit(f"{snapshot_dir(base, level)} holds upper {history.upper}, not {level}")
            else:
                history = history or History(base, url, args.keys)
                history.seed_to(spark, level, args.compact_every)
            figures = measure(history, spark, args.repeat, compact_batches=50)
            if not kept:
                continue
            figures["store"] = history.store_size()  # type: ignore[assignment]
            if index in (0, len(levels) - 1):
                fresh[level] = fresh_status(history)
            results["levels"][level] = figures  # type: ignore[index]
            print("  " + ", ".join(f"{k} {figures[k] * 1000:.1f} ms" for k in COSTS), flush=True)
            print(f"  retry answered: {figures['retry_outcome']}; store: {figures['store']}", flush=True)
        results["fresh_status"] = fresh
    finally:
        spark.stop()
        if not args.workdir:
            shutil.rmtree(base, ignore_errors=True)

    first = levels[0]
    table = results["levels"]  # type: ignore[assignment]
    print()
    print("| cost | " + " | ".join(f"{level:,}" for level in levels) + f" | {levels[-1]:,} / {first:,} |")
    print("|---|" + "---:|" * (len(levels) + 1))
    for cost in COSTS:
        cells = [f"{table[level][cost] * 1000:.1f} ms" for level in levels]
        print(f"| {cost} | " + " | ".join(cells) + f" | {table[levels[-1]][cost] / table[first][cost]:.2f}x |")
    for name in ("upsert_batches", "upsert_bindings", "upsert_batch_rollups"):
        cells = [str(table[level]["store"]["rows"].get(name, "-")) for level in levels]
        print(f"| rows of {name} | " + " | ".join(cells) + " | |")
    cells = [f"{table[level]['store']['bytes'] / 1024:.0f} KiB" for level in levels]
    last_bytes, first_bytes = table[levels[-1]]["store"]["bytes"], table[first]["store"]["bytes"]
    print("| consensus bytes | " + " | ".join(cells) + f" | {last_bytes / first_bytes:.2f}x |")
    if len(fresh) == 2:
        a, b = fresh[first], fresh[levels[-1]]
        print(f"\nfresh `upsertctl status` process: {a:.2f} s at {first:,}, {b:.2f} s at {levels[-1]:,} ({b / a:.2f}x)")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
