"""20 shards on one consensus store, each written by two racing writers at once."""

from __future__ import annotations

import os
import threading

import pytest

from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.engine.table.shard import Shard
from airflow_upsert_provider.engine.write.writer import ALREADY_PERSISTED, COMMITTED, Writer
from airflow_upsert_provider.sample_data import SampleSpec
from tests.helpers import make_shard, table
from tests.oracle import oracle_table

pytestmark = pytest.mark.slow

SHARDS = 20
WRITERS = 2
BATCHES = 2
# A writer that never reaches its barrier (it failed) must not hang its peer for ever.
BARRIER_TIMEOUT = 600.0


class RacingWriter(Writer):
    """Holds its append of batch 0 until every writer of its shard has staged batch 0: they all
    race for it, whatever the scheduling of the threads and of Spark's jobs."""

    def __init__(self, *args, barrier: threading.Barrier, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.barrier = barrier

    def append(self, staged):
        if staged.ts == 0:
            self.barrier.wait(BARRIER_TIMEOUT)
        return super().append(staged)


@pytest.mark.parametrize("store", ["sqlite", "postgresql"])
def test_twenty_shards_written_by_racing_writers_on_one_store(store, spark, blob, tmp_path, request):
    url = f"sqlite:///{tmp_path / 'consensus.db'}" if store == "sqlite" else request.getfixturevalue("pg_url")
    setup = open_consensus(url)
    shard_ids = [f"s{n:02d}" for n in range(SHARDS)]
    for n, shard_id in enumerate(shard_ids):
        # One partition, one file a batch: BATCHES small batches with updates and tombstones
        # across them (see test_multiprocess for why one partition).
        spec = SampleSpec(records=60, keys=20, partitions=1, segments_per_partition=BATCHES, delete_ratio=0.1,
                          seed=100 + n)
        make_shard(setup, blob, tmp_path / shard_id, spec=spec, shard_id=shard_id, max_files_per_batch=1, buckets=2)
    barriers = {shard_id: threading.Barrier(WRITERS) for shard_id in shard_ids}
    reports: dict[tuple[str, int], object] = {}
    errors: list[str] = []

    def write(shard_id: str, n: int) -> None:
        # Its own store, as a writer process has.
        consensus = open_consensus(url, create=False)
        try:
            writer = RacingWriter(Shard.open(consensus, blob, shard_id), f"{shard_id}-w{n}",
                                  spark_factory=lambda: spark, barrier=barriers[shard_id])
            reports[(shard_id, n)] = writer.run(max_batches=None, until_caught_up=True, with_lag=False)
        except BaseException as exc:  # reported below with the shard and writer
            errors.append(f"{shard_id}-w{n}: {type(exc).__name__}: {exc}")
            barriers[shard_id].abort()
        finally:
            consensus.dispose()

    threads = [threading.Thread(target=write, args=(shard_id, n)) for shard_id in shard_ids for n in range(WRITERS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []

    for shard_id in shard_ids:
        shard = Shard.open(setup, blob, shard_id)
        batches = shard.batches()
        # Every ts below the upper exactly once (no lost, no doubled batch), bindings contiguous.
        assert shard.state().upper == BATCHES and [b.ts for b in batches] == list(range(BATCHES)), shard_id
        for ts in range(1, BATCHES):
            assert shard.binding(ts).ranges["p0"]["from"] == shard.binding(ts - 1).ranges["p0"]["to"]
        results = [(n, r) for n in range(WRITERS) for r in reports[(shard_id, n)].results]
        # Each commit a writer reported is the one the shard records, and no writer ended below the upper.
        committed = sorted((r.ts, f"{shard_id}-w{n}") for n, r in results if r.outcome == COMMITTED)
        assert committed == [(b.ts, b.writer_id) for b in batches], shard_id
        assert [reports[(shard_id, n)].upper for n in range(WRITERS)] == [BATCHES] * WRITERS, shard_id
        # Both staged batch 0 before either appended it: exactly one lost that race.
        lost = [n for n, r in results if (r.ts, r.outcome) == (0, ALREADY_PERSISTED)]
        assert len(lost) == 1 and batches[0].writer_id != f"{shard_id}-w{lost[0]}", shard_id
        # The loser deleted its provably lost files: every run directory left is a committed one.
        runs_root = blob.path(shard_id, "runs")
        left = {os.path.join(runs_root, group, name) for group in os.listdir(runs_root)
                for name in os.listdir(os.path.join(runs_root, group))}
        assert left == {blob.path(b.run["path"]) for b in batches}, shard_id
        assert table(shard) == oracle_table(shard.source.root), shard_id
    setup.dispose()
