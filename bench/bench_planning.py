"""Planning one batch of a directory source with a large landing directory.

A partition holds ``--files`` segment files (default 100,000); all but the last few are
already bound by a history of ``--history`` bindings, so they lie below the frontier. Each
round lands ``--new`` files and mints the next binding (planning + the compare-and-set),
then commits an empty batch for it. The first round after start is reported apart (it may
build what later rounds reuse); the warm figure is the median of the other rounds.

The baseline, measured in the same run on the same directory, is what no planner can avoid:
listing the directory once (``os.scandir``, names only). Ratios are planning / baseline.

    .venv/bin/python bench/bench_planning.py [--files 100000] [--history 1000] [--new 64]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from airflow_upsert_provider.engine.blob.files import open_blob  # noqa: E402
from airflow_upsert_provider.engine.config import ShardConfig  # noqa: E402
from airflow_upsert_provider.engine.store.records import BatchRecord, Binding
from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.engine.table.shard import Shard  # noqa: E402
from airflow_upsert_provider.sample_data import sample_schema_json  # noqa: E402


def land(directory: str, offsets: range) -> None:
    for offset in offsets:
        with open(os.path.join(directory, f"{offset}.jsonl"), "w") as handle:
            handle.write('{"id": 1}\n')


def empty_batch(ts: int) -> BatchRecord:
    return BatchRecord(ts, "bench", f"t{ts}", {"path": f"x/{ts}", "files": [], "rows": 0}, {})


def scandir_seconds(directory: str, repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        with os.scandir(directory) as entries:
            names = [entry.name for entry in entries]
        best = min(best, time.perf_counter() - started)
    assert names
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--history", type=int, default=1000, help="bindings that bound the existing files")
    parser.add_argument("--new", type=int, default=64, help="files landed before each measured batch")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="bench-planning-")
    partition = os.path.join(work, "landing", "p0")
    os.makedirs(partition)
    bound = args.files - args.new
    started = time.perf_counter()
    land(partition, range(bound))
    print(f"landed {bound} bound files in {time.perf_counter() - started:.1f}s ({work})")

    consensus = open_consensus(f"sqlite:///{work}/consensus.db")
    blob = open_blob(os.path.join(work, "blob"))
    blob.ensure_root()
    config = ShardConfig(
        source=f"dir:{os.path.join(work, 'landing')}", keys=("id",), schema=sample_schema_json(),
        max_files_per_batch=args.new,
    )
    shard = Shard.create(consensus, blob, "bench", config)
    # The history, written straight to consensus: bindings of consecutive slices, in the
    # form the first bindings had (bare offsets), which every planner reads.
    per_binding = -(-bound // args.history)
    for ts, start in enumerate(range(0, bound, per_binding)):
        end = min(bound, start + per_binding)
        rng = {"from": start, "to": end, "files": list(range(start, end)), "count": end}
        consensus.mint_binding("bench", Binding(ts, {"p0": rng}), "bench")
        shard.compare_and_append(ts, ts + 1, empty_batch(ts))
    upper = shard.state().upper
    print(f"history: {upper} bindings over offsets [0, {bound})")

    baseline = scandir_seconds(partition)
    seconds: list[float] = []
    next_offset = bound
    for _ in range(args.rounds):
        land(partition, range(next_offset, next_offset + args.new))
        next_offset += args.new
        started = time.perf_counter()
        minted = shard.mint_binding(upper, minted_by="bench")
        seconds.append(time.perf_counter() - started)
        assert minted is not None and len(minted.ranges["p0"]["files"]) == args.new, minted
        shard.compare_and_append(upper, upper + 1, empty_batch(upper))
        upper += 1
    status_started = time.perf_counter()
    shard.status()
    status_seconds = time.perf_counter() - status_started

    listed = len(os.listdir(partition))
    warm = statistics.median(seconds[1:]) if len(seconds) > 1 else seconds[0]
    print(f"directory: {listed} files, {args.new} new per batch, {upper} bindings")
    print(f"baseline  os.scandir of the partition        {baseline * 1000:9.1f} ms")
    print(f"planning  first batch of this process        {seconds[0] * 1000:9.1f} ms  ({seconds[0] / baseline:6.1f}x baseline)")
    print(f"planning  warm batch (median of {len(seconds) - 1})           {warm * 1000:9.1f} ms  ({warm / baseline:6.1f}x baseline)")
    print(f"status    source scan + state                {status_seconds * 1000:9.1f} ms  ({status_seconds / baseline:6.1f}x baseline)")
    consensus.dispose()


if __name__ == "__main__":
    main()
