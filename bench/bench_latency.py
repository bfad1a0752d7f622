"""Whole-process latency of one micro-batch task, as Airflow runs it (a fresh process):
Spark in the process against Spark Connect on a warm local server (issue 11, first part).

    .venv/bin/python bench/bench_latency.py                 # 1M-row table, 100k changes
    .venv/bin/python bench/bench_latency.py --rows 200000 --batch 20000   # quick

Two shards read the same landing directory: a base of about ``--rows`` keys is committed to
each (through the warm server, not measured), then ``--batch`` changes (updates, new keys,
deletes) land and each shard runs one batch in a fresh ``upsertctl run-batch --max-batches 1``
process: one in-process (it starts its own JVM), one with ``--remote`` on the server. The
wall time of each process is what a task pays. Both tables are then compared (they must be
equal). The server is started by this script (``upsertctl spark-server start``, its own state
directory) and stopped at the end, unless ``--remote`` names one already running.

Not yet here (issue 11): delta-rs MERGE on the same data, tables of 5M and 20M rows, the
cold-JVM settings, and the example DAG's ``airflow dags test`` time per task in both modes.
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

from airflow_upsert_provider.engine.spark_server import SparkServer, parse_remote, port_answers  # noqa: E402
from airflow_upsert_provider.sample_data import SampleSpec, generate  # noqa: E402

UPSERTCTL = [sys.executable, "-m", "airflow_upsert_provider.cli"]


def upsertctl(env: dict[str, str], *argv: str, timeout: float = 1800) -> tuple[float, dict]:
    """Run ``upsertctl ARGV --json`` in a fresh process: (wall seconds, its JSON output)."""
    started = time.monotonic()
    done = subprocess.run([*UPSERTCTL, *argv, "--json"], env=env, capture_output=True, text=True, timeout=timeout)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"upsertctl {' '.join(argv)} failed ({done.returncode}): {done.stderr[-2000:]}")
    return seconds, (json.loads(done.stdout) if done.stdout.strip() else {})


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tables_equal(remote: str, env: dict[str, str], shards: list[str]) -> tuple[bool, int]:
    """Whether the shards' tables hold the same rows (through the server); the row count."""
    os.environ.update({k: env[k] for k in ("UPSERT_CONSENSUS_URL", "UPSERT_BLOB_ROOT")})
    from airflow_upsert_provider.engine.blob import open_blob
    from airflow_upsert_provider.engine.consensus import open_consensus
    from airflow_upsert_provider.engine.shard import Shard
    from airflow_upsert_provider.engine.spark import get_spark

    spark = get_spark(remote=remote)
    consensus, blob = open_consensus(env["UPSERT_CONSENSUS_URL"]), open_blob(env["UPSERT_BLOB_ROOT"])
    frames = [Shard.open(consensus, blob, s).read(spark) for s in shards]
    first, second = frames
    try:
        equal = first.exceptAll(second).count() == 0 and second.exceptAll(first).count() == 0
        return equal, first.count()
    finally:
        # Released before the server stops: a client left open retries a gone server for
        # minutes at interpreter exit.
        spark.stop()
        consensus.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000, help="keys in the base table (about)")
    parser.add_argument("--batch", type=int, default=100_000, help="changes in the measured batch")
    parser.add_argument("--repeat", type=int, default=1, help="measured batches per mode (median reported)")
    parser.add_argument("--remote", default=None, help="a running server (default: start one for this run)")
    parser.add_argument("--memory", default=None, help="driver memory of the server this run starts")
    parser.add_argument("--work", default=None, help="work directory (default: a temporary one, removed)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    work = args.work or tempfile.mkdtemp(prefix="bench-latency-")
    os.makedirs(work, exist_ok=True)
    landing = os.path.join(work, "landing")
    env = {**os.environ, "UPSERT_CONSENSUS_URL": f"sqlite:///{work}/consensus.db",
           "UPSERT_BLOB_ROOT": os.path.join(work, "blob"), "PYTHONPATH": REPO}
    env.pop("UPSERT_SPARK_REMOTE", None)
    server = None
    remote = args.remote
    results: dict = {"rows": args.rows, "batch": args.batch}
    try:
        if remote is None:
            server = SparkServer(os.path.join(work, "state"))
            port = free_port()
            started = time.monotonic()
            status = server.start(port=port, memory=args.memory)
            results["server_start_seconds"] = round(time.monotonic() - started, 2)
            results["server_driver_memory"] = status["driver_memory"]
            remote = status["address"]
        elif not port_answers(*parse_remote(remote)):
            raise SystemExit(f"no server answers at {remote}")

        # Base: about --rows keys, committed to both shards through the warm server.
        base_records = int(args.rows * 1.6)  # random keys: ~80% of the key space appears
        generate(landing, SampleSpec(records=base_records, keys=args.rows, partitions=4, segments_per_partition=8,
                                     delete_ratio=0.0, seed=1))
        shards = {"in_process": "lat_inproc", "connect": "lat_connect"}
        for shard in shards.values():
            upsertctl(env, "--remote", remote, "init", shard, "--source", f"dir:{landing}", "--key", "id",
                      "--order-by", "updated_at", "--delete-marker", "deleted", "--schema",
                      "id BIGINT, name STRING, amount DOUBLE, updated_at BIGINT, deleted BOOLEAN",
                      "--max-files-per-batch", "1000")
            seconds, _ = upsertctl(env, "--remote", remote, "run-batch", shard, "--max-batches", "1")
            results.setdefault("base_seconds", {})[shard] = round(seconds, 2)

        timings: dict[str, list[float]] = {mode: [] for mode in shards}
        batch_seconds: dict[str, list[float]] = {mode: [] for mode in shards}
        for attempt in range(args.repeat):
            # 10% new keys, 2% deletes; a later clock than the base (seed).
            generate(landing, SampleSpec(records=args.batch, keys=int(args.rows * 1.1), partitions=4,
                                         segments_per_partition=2, delete_ratio=0.02, first_seq=1000 + 100 * attempt,
                                         seed=2 + attempt))
            for mode, shard in shards.items():
                argv = ["run-batch", shard, "--max-batches", "1"]
                if mode == "connect":
                    argv = ["--remote", remote, *argv]
                seconds, out = upsertctl(env, *argv)
                timings[mode].append(seconds)
                committed = [b for b in out["batches"] if b["outcome"] == "committed"]
                assert len(committed) == 1 and committed[0]["rows_in"] == args.batch, out
                batch_seconds[mode].append(committed[0]["seconds"])
        results["task_seconds"] = {m: round(statistics.median(v), 2) for m, v in timings.items()}
        results["batch_seconds"] = {m: round(statistics.median(v), 2) for m, v in batch_seconds.items()}
        results["startup_seconds"] = {m: round(results["task_seconds"][m] - results["batch_seconds"][m], 2)
                                      for m in shards}
        equal, rows = tables_equal(remote, env, list(shards.values()))
        results["tables_equal"], results["table_rows"] = equal, rows
        results["speedup"] = round(results["task_seconds"]["in_process"] / results["task_seconds"]["connect"], 2)
    finally:
        if server is not None:
            server.stop()
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(results))
        return
    print(f"table ~{results['table_rows']:,} rows, batch {args.batch:,} changes, tables equal: {results['tables_equal']}")
    print("| mode | task wall (s) | batch step, incl. session start (s) | rest of the process (s) |")
    print("|---|---:|---:|---:|")
    for mode in ("in_process", "connect"):
        print(f"| {mode} | {results['task_seconds'][mode]} | {results['batch_seconds'][mode]} | "
              f"{results['startup_seconds'][mode]} |")
    print(f"in-process / connect: {results['speedup']}x; server start {results.get('server_start_seconds')} s "
          f"(driver memory {results.get('server_driver_memory')})")


if __name__ == "__main__":
    main()
