"""What the stream fence costs compare_and_append, on SQLite and on PostgreSQL.

Every append runs the commit hooks inside its transaction. The stream fence
(``streams.fence_commit``) reads the shard's stream row (``SELECT ... FOR SHARE`` on
PostgreSQL; a plain SELECT on SQLite, whose transaction already holds the write lock since
BEGIN IMMEDIATE) and checks its status and epoch. Three configurations of the hook list, in
the same run, on the same shard, interleaved in blocks (rotating which goes first) so that
drift of the machine or of the store's size falls on all of them alike:

  no hooks   every commit hook removed (the bare conditional UPDATE + batch INSERT)
  before     the fence removed, the GC-claims hook kept (what an append cost before)
  after      every hook, fence included (what an append costs now)

The stream row exists before measuring (one stop, finalize and resume), so no figure
includes the one-time insert of a shard's first fenced commit. Each append passes the
stream's epoch, as a writer does. Ratios are after / before.

Also, per store: a fresh process that imports ``airflow_upsert_provider.engine.store.streams``,
opens the store and appends once (what an Airflow task sees), before and after, beside the
warm figure.

    .venv/bin/python bench/bench_fencing.py [--sqlite-appends 2000] [--pg-appends 1000]
                                            [--block 50] [--fresh 10] [--quick]
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

from airflow_upsert_provider.engine.store.registry import STORE_SCHEMA  # noqa: E402
from airflow_upsert_provider.engine.store import streams  # noqa: E402
from airflow_upsert_provider.engine.store.consensus import Consensus
from airflow_upsert_provider.engine.store.records import BatchRecord
from airflow_upsert_provider.engine.store.registry import open_consensus

CONFIGS = ("no hooks", "before", "after")
SHARD = "bench"
# Every hook the registry gives a store (GC claims, the stream fence).
ALL_HOOKS = list(STORE_SCHEMA.commit_hooks)


def hooks_for(config: str) -> list:
    if config == "no hooks":
        return []
    if config == "before":
        return [hook for hook in ALL_HOOKS if hook is not streams.fence_commit]
    return list(ALL_HOOKS)


def use_hooks(consensus: Consensus, config: str) -> None:
    # In place: compare_and_append reads the store's list object.
    consensus.commit_hooks[:] = hooks_for(config)


def batch_record(ts: int) -> BatchRecord:
    """A batch shaped like a writer's: one run directory with a few files (the GC-claims
    hook looks its directory up)."""
    run = f"{SHARD}/runs/ts={ts}/w-bench"
    files = [{"path": f"{run}/bucket={b}/part-0.parquet", "rows": 1} for b in range(4)]
    return BatchRecord(ts, "w-bench", f"t{ts}", {"path": run, "files": files, "rows": 4}, {})


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def summary(latencies_ms: list[float]) -> dict:
    return {
        "p50_ms": statistics.median(latencies_ms),
        "p99_ms": percentile(latencies_ms, 0.99),
        "mean_ms": statistics.fmean(latencies_ms),
        "appends": len(latencies_ms),
    }


def prepare(consensus: Consensus) -> int:
    """The shard, with its stream row written by one stop -> finalize -> resume; its epoch."""
    consensus.create_shard(SHARD, "{}")
    stopped = streams.stop(consensus, SHARD, "bench", "create the stream row")
    streams.finalize_stop(consensus, stopped.state, "bench")
    resumed = streams.resume(consensus, SHARD, "bench")
    assert resumed.state.status.value == "READY", resumed.to_dict()
    return resumed.state.epoch


def append(consensus: Consensus, ts: int, epoch: int) -> float:
    record = batch_record(ts)
    started = time.perf_counter()
    result = consensus.compare_and_append(SHARD, ts, ts + 1, record, epoch=epoch)
    seconds = time.perf_counter() - started
    assert result.outcome.value == "committed", result
    return seconds * 1000


def measure_warm(consensus: Consensus, epoch: int, appends: int, block: int, start_ts: int) -> tuple[dict, int]:
    """``appends`` per configuration, in blocks of ``block``, after one unrecorded warm-up
    block of each. Returns the latencies per configuration and the next ts."""
    ts = start_ts
    for config in CONFIGS:
        use_hooks(consensus, config)
        for _ in range(block):
            append(consensus, ts, epoch)
            ts += 1
    latencies: dict[str, list[float]] = {config: [] for config in CONFIGS}
    rounds = -(-appends // block)
    for r in range(rounds):
        order = CONFIGS[r % len(CONFIGS):] + CONFIGS[: r % len(CONFIGS)]
        for config in order:
            use_hooks(consensus, config)
            for _ in range(min(block, appends - len(latencies[config]))):
                latencies[config].append(append(consensus, ts, epoch))
                ts += 1
    use_hooks(consensus, "after")
    return latencies, ts


# Run in a new interpreter: the import a task pays, opening the store, one append.
FRESH_CHILD = r"""
import json, sys, time
started = time.perf_counter()
import airflow_upsert_provider.engine.store.streams as streams
imported = time.perf_counter()
from airflow_upsert_provider.engine.store.consensus import BatchRecord
from airflow_upsert_provider.engine.store.registry import open_consensus
url, shard, ts, epoch, config = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
opening = time.perf_counter()
consensus = open_consensus(url)
opened = time.perf_counter()
if config == "before":
    consensus.commit_hooks.remove(streams.fence_commit)
run = f"{shard}/runs/ts={ts}/w-fresh"
files = [{"path": f"{run}/bucket={b}/part-0.parquet", "rows": 1} for b in range(4)]
record = BatchRecord(ts, "w-fresh", f"t{ts}", {"path": run, "files": files, "rows": 4}, {})
result = consensus.compare_and_append(shard, ts, ts + 1, record, epoch=epoch)
appended = time.perf_counter()
assert result.outcome.value == "committed", result
print(json.dumps({"import_ms": (imported - started) * 1000, "open_ms": (opened - opening) * 1000,
                  "append_ms": (appended - opened) * 1000}))
"""


def measure_fresh(url: str, epoch: int, processes: int, start_ts: int) -> tuple[dict, int]:
    """``processes`` new interpreters per configuration (before, after alternating), each
    appending once. Returns the medians per configuration and the next ts."""
    samples: dict[str, list[dict]] = {"before": [], "after": []}
    ts = start_ts
    for n in range(processes):
        for config in (("before", "after") if n % 2 == 0 else ("after", "before")):
            started = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-c", FRESH_CHILD, url, SHARD, str(ts), str(epoch), config],
                cwd=REPO, env={**os.environ, "PYTHONPATH": REPO}, check=True, capture_output=True, text=True,
            )
            wall_ms = (time.perf_counter() - started) * 1000
            samples[config].append({**json.loads(done.stdout.strip().splitlines()[-1]), "process_ms": wall_ms})
            ts += 1
    medians = {
        config: {key: statistics.median(s[key] for s in rows) for key in rows[0]} | {"processes": len(rows)}
        for config, rows in samples.items()
    }
    return medians, ts


def bench_store(store: str, url: str, appends: int, block: int, fresh: int) -> dict:
    consensus = open_consensus(url)
    epoch = prepare(consensus)
    warm, ts = measure_warm(consensus, epoch, appends, block, 0)
    consensus.dispose()
    fresh_result, ts = measure_fresh(url, epoch, fresh, ts)
    check = open_consensus(url)
    assert check.get_shard(SHARD).upper == ts, (check.get_shard(SHARD).upper, ts)
    assert streams.read_stream(check, SHARD).status.value == "READY"
    check.dispose()
    result = {"warm": {config: summary(values) for config, values in warm.items()}, "fresh": fresh_result}
    print(f"[{store}] done: {appends} appends per configuration, {fresh} fresh processes per configuration",
          flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="200 appends per configuration, 3 fresh processes")
    parser.add_argument("--sqlite-appends", type=int, help="appends per configuration on SQLite (default 2000)")
    parser.add_argument("--pg-appends", type=int, help="appends per configuration on PostgreSQL (default 1000)")
    parser.add_argument("--block", type=int, default=50, help="consecutive appends of one configuration")
    parser.add_argument("--fresh", type=int, help="fresh processes per configuration (default 10)")
    parser.add_argument("--no-postgresql", action="store_true", help="SQLite only")
    args = parser.parse_args()
    sqlite_appends = args.sqlite_appends or (200 if args.quick else 2000)
    pg_appends = args.pg_appends or (200 if args.quick else 1000)
    fresh = args.fresh or (3 if args.quick else 10)
    for field, value in (("--sqlite-appends", sqlite_appends), ("--pg-appends", pg_appends),
                         ("--block", args.block), ("--fresh", fresh)):
        if value < 1:
            parser.error(f"{field} must be at least 1, got {value}")
    names = [getattr(hook, "__name__", repr(hook)) for hook in ALL_HOOKS]
    if streams.fence_commit not in ALL_HOOKS:
        parser.error(f"the stream fence is not among the commit hooks ({names}): nothing to measure")

    work = tempfile.mkdtemp(prefix="bench-fencing-")
    print(f"commit hooks: {', '.join(names)}; {os.cpu_count()} cores; Python {sys.version.split()[0]}; "
          f"blocks of {args.block}; load average {os.getloadavg()[0]:.2f}", flush=True)
    results: dict[str, dict] = {}
    try:
        results["SQLite"] = bench_store("SQLite", f"sqlite:///{work}/consensus.db", sqlite_appends, args.block, fresh)
        if not args.no_postgresql:
            from tests.pgserver import PostgresServer

            server = PostgresServer().start()
            try:
                results["PostgreSQL"] = bench_store(
                    "PostgreSQL", server.create_database("bench"), pg_appends, args.block, fresh
                )
            finally:
                server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    # Other work on the machine shows in p99 and the means first; p50 and its ratio hold up best.
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    print("\nWarm process: compare_and_append latency (ratios against 'before' of the same store)\n")
    print("| store | config | appends | p50 ms | p99 ms | mean ms | p50 ratio | mean ratio |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for store, result in results.items():
        base = result["warm"]["before"]
        for config in CONFIGS:
            r = result["warm"][config]
            print(f"| {store} | {config} | {r['appends']} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | {r['mean_ms']:.3f} | "
                  f"{r['p50_ms'] / base['p50_ms']:.2f}x | {r['mean_ms'] / base['mean_ms']:.2f}x |")
    print()
    for store, result in results.items():
        w = result["warm"]
        fence = w["after"]["mean_ms"] - w["before"]["mean_ms"]
        gc = w["before"]["mean_ms"] - w["no hooks"]["mean_ms"]
        print(f"{store}: the fence adds {fence * 1000:+.0f} us per commit (mean; p50 "
              f"{(w['after']['p50_ms'] - w['before']['p50_ms']) * 1000:+.0f} us); "
              f"the GC-claims hook {gc * 1000:+.0f} us (mean)")

    print("\nFresh process: import streams + open the store + one append (medians)\n")
    print("| store | config | processes | process wall ms | import ms | open ms | first append ms | warm mean ms | first append ratio |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for store, result in results.items():
        base = result["fresh"]["before"]
        for config in ("before", "after"):
            f = result["fresh"][config]
            print(f"| {store} | {config} | {f['processes']} | {f['process_ms']:.0f} | {f['import_ms']:.0f} | "
                  f"{f['open_ms']:.1f} | {f['append_ms']:.2f} | {result['warm'][config]['mean_ms']:.3f} | "
                  f"{f['append_ms'] / base['append_ms']:.2f}x |")


if __name__ == "__main__":
    main()
