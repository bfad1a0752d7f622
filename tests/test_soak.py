"""The soak, short: racing writer processes on PostgreSQL, one SIGKILLed at random now and then,
compaction, checkpoints and GC on their schedules and the frontier monitor throughout
(bench/soak.py; `make soak` runs the long one)."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

from airflow_upsert_provider.engine.blob.files import open_blob
from airflow_upsert_provider.engine.frontier.observations import load_alert_state
from airflow_upsert_provider.engine.store.gc_claims import run_dir_of_relative
from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.engine.table.shard import Shard
from tests.helpers import table
from tests.oracle import oracle_table

pytestmark = pytest.mark.slow

SOAK_PATH = os.path.join(os.path.dirname(os.path.dirname(__file__)), "bench", "soak.py")


def load_soak():
    spec = importlib.util.spec_from_file_location("bench_soak", SOAK_PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their annotations through it
    spec.loader.exec_module(module)
    return module


def run_dirs_on_disk(shard: Shard) -> set[str]:
    runs = shard.blob.path(shard.shard_id, "runs")
    return {os.path.join(runs, group, name) for group in os.listdir(runs) for name in os.listdir(os.path.join(runs, group))}


def referenced_run_dirs(shard: Shard) -> set[str]:
    """Directories of the live runs and of every retained checkpoint's files."""
    from airflow_upsert_provider.engine.maintenance.checkpoint_catalog import Catalog
    from airflow_upsert_provider.engine.maintenance.checkpoint_manifest import read_manifest

    paths = {f["path"] for run in shard.live_runs() for f in run["files"]}
    for entry in Catalog.load(shard.blob, shard.shard_id).entries:
        paths |= {f["path"] for f in read_manifest(shard.blob, shard.shard_id, entry.id)["files"]}
    return {shard.blob.path(run_dir_of_relative(p)) for p in paths}


# The whole soak with its final compaction and GC in fresh processes (its final read: the Arrow
# reader): generous for a slow CI.
@pytest.mark.timeout(1800)
def test_short_soak_ends_with_the_oracle_no_page_no_leak_each_batch_once(pg_url, tmp_path):
    soak_module = load_soak()
    # 20 batches: a SIGKILL about every 8, a compaction every 10 (each a fresh JVM), a
    # checkpoint every 10 (two kept), a GC every 8 with a 30 s grace, a history prune every 10;
    # the monitor's stall rule at its defaults (a stall after 5 minutes with records pending),
    # so a page would be a false one.
    opts = soak_module.SoakOptions(
        batches=20, writers=2, kill_every=8, seed=7, compact_every=10, checkpoint_every=10, keep_last=2,
        gc_every=8, prune_every=10, gc_grace_seconds=30.0, observe_every_seconds=2.0, cadence_seconds=60.0,
        min_stall_seconds=300.0, window=5, progress_seconds=60.0, workdir=str(tmp_path),
        consensus_url=pg_url,
    )
    soak = soak_module.Soak(opts)
    report = soak.run()

    assert report.failures == []
    counts = report.figures["counts"]
    assert counts["batches"] >= 20
    assert counts["sigkills"] >= 1 and counts["writer_starts"] == 2 + counts["sigkills"]
    # Scheduled ones while the writers ran, and the final compaction and GC.
    assert counts["compactions"] >= 2 and counts["checkpoints"] >= 1 and counts["gcs"] >= 2 and counts["prunes"] >= 1
    assert counts["monitor_rounds"] >= 1 and all(m["exit"] == 0 for m in soak.maintenance)

    shard = Shard.open(open_consensus(pg_url), open_blob(str(tmp_path / "blob")), soak_module.SHARD)
    state = shard.state()
    assert state.upper == counts["batches"] and state.since == state.upper  # the final compaction
    # Every segment the feeder wrote is bound, and the table is the oracle's.
    written = report.checks["segments_written"]
    assert written == {p: len(os.listdir(tmp_path / "landing" / p)) for p in soak_module.PARTITIONS}
    assert shard.bound_offsets(state.upper) == written
    assert table(shard) == oracle_table(str(tmp_path / "landing"))

    # No page: none decided, none sent, none waiting.
    alert, _ = load_alert_state(shard.consensus, shard.shard_id)
    assert soak.pages == [] and alert.pages_sent == 0 and not alert.firing and alert.outbox == ()

    # Each batch committed once: the kept batch rows are each ts once up to the upper, and no
    # ts was reported committed by two writer processes (or twice by one).
    kept = [b.ts for b in shard.batches()]
    assert kept and kept == list(range(kept[0], state.upper))
    committed: dict[int, list[str]] = {}
    for path in soak.writer_logs:
        for ts, outcome, _ in soak_module.parse_writer_log(path):
            if outcome == "committed":
                committed.setdefault(ts, []).append(path)
    assert committed and all(len(paths) == 1 for paths in committed.values())
    assert set(committed) <= set(range(state.upper))

    # No leaked files after the final GC: every run directory on disk is one the live state or
    # a retained checkpoint names, and every file is accounted for.
    assert run_dirs_on_disk(shard) == referenced_run_dirs(shard)
    assert soak_module.leaked_and_missing_files(shard) == ([], [])
