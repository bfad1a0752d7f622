"""What one frontier observation round costs, for 100 shards, on SQLite and on PostgreSQL.

Per store, 100 shards, each with its own landing directory (2 partitions x 4 segments), a
few batches committed (empty runs: an observation never reads data files) and a history of
observations already recorded (a window full of samples, as a monitor running for a while
leaves it). Four kinds of round over every shard, each measured in the same run, interleaved
(rotating which goes first) so that drift of the machine or of the store falls on all alike:

  survey      baseline: Shard.open + shard.status() per shard, what `upsertctl status
              --no-rows` does (the frontier, the source survey, the stream)
  writer      what a writer adds after each step: observe() given the status it computed
              anyway + record_observation (the status itself is not counted: a writer
              computed it before this work existed, for its lag)
  observe     observe() + record_observation per shard: `upsertctl frontier observe`
  evaluate    evaluate_shards: observe, record, read the window, evaluate the rules,
              advance the alert state, compare-and-set it: the sensor's round

Statements are counted with a SQLAlchemy ``before_cursor_execute`` listener: every statement
sent to the store, including the ``BEGIN IMMEDIATE`` the SQLite store issues per transaction
(so on SQLite the count is statements + transactions; PostgreSQL's BEGIN/COMMIT are not
statements here). Ratios are against the survey of the same
store. Also, per store, fresh processes (import, open the store, one round: what an Airflow
task of the monitor DAG sees), survey and evaluate alternating.

    .venv/bin/python bench/bench_observation.py [--shards 100] [--rounds 5] [--fresh 3]
                                                [--no-postgresql]
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

import sqlalchemy as sa  # noqa: E402

from airflow_upsert_provider.engine.frontier import observations  # noqa: E402
from airflow_upsert_provider.engine.blob.files import open_blob  # noqa: E402
from airflow_upsert_provider.engine.store.consensus import Consensus
from airflow_upsert_provider.engine.store.records import BatchRecord
from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.engine.frontier.model import StallSettings  # noqa: E402
from airflow_upsert_provider.engine.table.shard import Shard  # noqa: E402
from airflow_upsert_provider.sample_data import SampleSpec, generate  # noqa: E402

KINDS = ("survey", "writer", "observe", "evaluate")
SPEC = SampleSpec(records=80, keys=20, partitions=2, segments_per_partition=4, seed=3)
# Observations per shard recorded before measuring: 30 minutes at a 30 s poke interval.
HISTORY = 60
HISTORY_STEP_SECONDS = 30.0
SETTINGS = StallSettings()


def shard_ids(count: int) -> list[str]:
    return [f"s{i:03d}" for i in range(count)]


def prepare(consensus: Consensus, blob_root: str, work: str, count: int) -> None:
    """The shards, two batches committed in each, and their observation history."""
    from tests.helpers import sample_config

    blob = open_blob(blob_root)
    blob.ensure_root()
    now = time.time()
    for shard_id in shard_ids(count):
        landing = os.path.join(work, "landing", shard_id)
        generate(landing, SPEC)
        shard = Shard.create(consensus, blob, shard_id, sample_config(landing, max_files_per_batch=2))
        for ts in range(2):
            assert shard.mint_binding(ts, minted_by="bench") is not None
            record = BatchRecord(ts, "bench", f"t{ts}", {"path": f"{shard_id}/runs/{ts}", "files": [], "rows": 0}, {})
            assert shard.compare_and_append(ts, ts + 1, record, epoch=0).upper == ts + 1
        seen = observations.observe(shard, observer="bench")
        for n in range(HISTORY):
            at = now - HISTORY_STEP_SECONDS * (HISTORY - n)
            observations.record_observation(consensus, type(seen).from_dict({**seen.to_dict(), "observed_at": at}))


class StatementCounter:
    def __init__(self, engine: sa.Engine) -> None:
        self.count = 0
        sa.event.listen(engine, "before_cursor_execute", self._count)

    def _count(self, *args) -> None:
        self.count += 1


def one_round(kind: str, consensus: Consensus, blob, ids: list[str]) -> None:
    if kind == "evaluate":
        rounds = observations.evaluate_shards(consensus, blob, ids, SETTINGS, "bench:evaluate")
        assert len(rounds) == len(ids)
        return
    for shard_id in ids:
        shard = Shard.open(consensus, blob, shard_id)
        if kind == "survey":
            shard.status()
        else:
            observations.record_observation(consensus, observations.observe(shard, observer="bench:observe"))


def writer_round(consensus: Consensus, blob, ids: list[str], counter: StatementCounter) -> tuple[float, int]:
    """Only the writer's added work is timed and counted: observe(status given) + record."""
    seconds, statements = 0.0, 0
    for shard_id in ids:
        shard = Shard.open(consensus, blob, shard_id)
        status = shard.status()
        before_count = counter.count
        started = time.perf_counter()
        obs = observations.observe(shard, observer="writer:bench", writer_outcome="nothing_to_do", status=status)
        observations.record_observation(consensus, obs)
        seconds += time.perf_counter() - started
        statements += counter.count - before_count
    return seconds * 1000, statements


def measure_warm(url: str, blob_root: str, ids: list[str], rounds: int) -> dict[str, dict]:
    consensus = open_consensus(url)
    blob = open_blob(blob_root)
    counter = StatementCounter(consensus.engine)
    samples: dict[str, list[tuple[float, int]]] = {kind: [] for kind in KINDS}
    for r in range(rounds + 1):  # round 0 warms up every kind and is not recorded
        order = KINDS[r % len(KINDS):] + KINDS[: r % len(KINDS)]
        for kind in order:
            if kind == "writer":
                ms, statements = writer_round(consensus, blob, ids, counter)
            else:
                before_count = counter.count
                started = time.perf_counter()
                one_round(kind, consensus, blob, ids)
                ms = (time.perf_counter() - started) * 1000
                statements = counter.count - before_count
            if r:
                samples[kind].append((ms, statements))
    consensus.dispose()
    return {
        kind: {
            "round_ms": statistics.median(ms for ms, _ in values),
            "min_ms": min(ms for ms, _ in values),
            "statements": statistics.median(n for _, n in values),
            "rounds": len(values),
        }
        for kind, values in samples.items()
    }


# Run in a new interpreter: the import a task pays, opening the store, one round.
FRESH_CHILD = r"""
import json, sys, time
started = time.perf_counter()
import sqlalchemy as sa
from airflow_upsert_provider.engine.frontier import observations
from airflow_upsert_provider.engine.blob.files import open_blob
from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.engine.frontier.model import StallSettings
from airflow_upsert_provider.engine.table.shard import Shard
imported = time.perf_counter()
url, blob_root, kind = sys.argv[1], sys.argv[2], sys.argv[3]
consensus = open_consensus(url)
blob = open_blob(blob_root)
opened = time.perf_counter()
count = [0]
sa.event.listen(consensus.engine, "before_cursor_execute", lambda *a: count.__setitem__(0, count[0] + 1))
ids = [r.shard_id for r in consensus.list_shards()]
if kind == "evaluate":
    observations.evaluate_shards(consensus, blob, ids, StallSettings(), "bench:fresh")
else:
    for shard_id in ids:
        Shard.open(consensus, blob, shard_id).status()
done = time.perf_counter()
print(json.dumps({"import_ms": (imported - started) * 1000, "open_ms": (opened - imported) * 1000,
                  "round_ms": (done - opened) * 1000, "statements": count[0]}))
"""


def measure_fresh(url: str, blob_root: str, processes: int) -> dict[str, dict]:
    samples: dict[str, list[dict]] = {"survey": [], "evaluate": []}
    for n in range(processes):
        for kind in (("survey", "evaluate") if n % 2 == 0 else ("evaluate", "survey")):
            started = time.perf_counter()
            done = subprocess.run(
                [sys.executable, "-c", FRESH_CHILD, url, blob_root, kind],
                cwd=REPO, env={**os.environ, "PYTHONPATH": REPO}, check=True, capture_output=True, text=True,
            )
            wall_ms = (time.perf_counter() - started) * 1000
            samples[kind].append({**json.loads(done.stdout.strip().splitlines()[-1]), "process_ms": wall_ms})
    return {
        kind: {key: statistics.median(s[key] for s in rows) for key in rows[0]} | {"processes": len(rows)}
        for kind, rows in samples.items()
    }


def bench_store(store: str, url: str, work: str, count: int, rounds: int, fresh: int) -> dict:
    blob_root = os.path.join(work, f"blob-{store}")
    consensus = open_consensus(url)
    started = time.perf_counter()
    prepare(consensus, blob_root, os.path.join(work, store), count)
    consensus.dispose()
    print(f"[{store}] {count} shards prepared in {time.perf_counter() - started:.1f}s", flush=True)
    ids = shard_ids(count)
    warm = measure_warm(url, blob_root, ids, rounds)
    fresh_result = measure_fresh(url, blob_root, fresh)
    check = open_consensus(url)
    kept = observations.observation_count(check, ids[0])
    check.dispose()
    print(f"[{store}] done: {rounds} warm rounds per kind, {fresh} fresh processes per kind; "
          f"{kept} observations kept for {ids[0]}", flush=True)
    return {"warm": warm, "fresh": fresh_result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5, help="warm rounds per kind (after one warm-up)")
    parser.add_argument("--fresh", type=int, default=3, help="fresh processes per kind")
    parser.add_argument("--no-postgresql", action="store_true", help="SQLite only")
    args = parser.parse_args()
    for field, value in (("--shards", args.shards), ("--rounds", args.rounds), ("--fresh", args.fresh)):
        if value < 1:
            parser.error(f"{field} must be at least 1, got {value}")

    work = tempfile.mkdtemp(prefix="bench-observation-")
    print(f"{args.shards} shards; {os.cpu_count()} cores; Python {sys.version.split()[0]}; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    results: dict[str, dict] = {}
    try:
        results["SQLite"] = bench_store("SQLite", f"sqlite:///{work}/consensus.db", work, args.shards,
                                        args.rounds, args.fresh)
        if not args.no_postgresql:
            from tests.pgserver import PostgresServer

            server = PostgresServer().start()
            try:
                results["PostgreSQL"] = bench_store("PostgreSQL", server.create_database("bench"), work,
                                                    args.shards, args.rounds, args.fresh)
            finally:
                server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"load average at the end: {os.getloadavg()[0]:.2f}")

    n = args.shards
    print(f"\nWarm process: one round over {n} shards (medians of {args.rounds} rounds; ratios against the survey)\n")
    print("| store | round | ms per round | ms per shard | statements per round | per shard | ms ratio | statements ratio |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for store, result in results.items():
        base = result["warm"]["survey"]
        for kind in KINDS:
            r = result["warm"][kind]
            print(f"| {store} | {kind} | {r['round_ms']:.1f} | {r['round_ms'] / n:.2f} | {r['statements']:.0f} | "
                  f"{r['statements'] / n:.1f} | {r['round_ms'] / base['round_ms']:.2f}x | "
                  f"{r['statements'] / base['statements']:.2f}x |")

    print(f"\nFresh process: import + open the store + one round over {n} shards (medians)\n")
    print("| store | round | processes | process wall ms | import ms | open ms | round ms | statements | round ratio |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for store, result in results.items():
        base = result["fresh"]["survey"]
        for kind in ("survey", "evaluate"):
            f = result["fresh"][kind]
            print(f"| {store} | {kind} | {f['processes']} | {f['process_ms']:.0f} | {f['import_ms']:.0f} | "
                  f"{f['open_ms']:.1f} | {f['round_ms']:.0f} | {f['statements']:.0f} | "
                  f"{f['round_ms'] / base['round_ms']:.2f}x |")


if __name__ == "__main__":
    main()
