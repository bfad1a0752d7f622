"""Checkpoint retention never drops the last checkpoint whose files verify: a pure sweep over
histories where newer checkpoints are damaged or unverified, and the incremental case end to
end (a newer checkpoint built over a file damaged after an older one hashed it)."""

from __future__ import annotations

import itertools
import random

import pytest

from airflow_upsert_provider.engine.maintenance.checkpoint import create_checkpoint, list_checkpoints
from airflow_upsert_provider.engine.maintenance.checkpoint_catalog import CheckpointEntry, checkpoint_dirs
from airflow_upsert_provider.engine.maintenance.checkpoint_restore import restore_checkpoint
from airflow_upsert_provider.engine.maintenance.checkpoint_retention import newest_verifying_id, retained_ids
from airflow_upsert_provider.engine.maintenance.checkpoint_verify import verify_checkpoint
from airflow_upsert_provider.engine.errors import IntegrityError
from airflow_upsert_provider.engine.maintenance.gc import collect_garbage
from airflow_upsert_provider.engine.table.shard import Shard
from tests.conftest import sqlite_only
from tests.maintenance.support import table, written_shard
from tests.maintenance.test_checkpoint_incremental import flip_a_byte, live_paths, more_batches


def entries_of(rng: random.Random, count: int) -> list[CheckpointEntry]:
    upper, entries = 0, []
    for index in range(count):
        upper += rng.choice([0, 0, 1, 3])
        entries.append(CheckpointEntry(f"c{index}", upper, 0, 1000.0 + 10 * index + rng.random(), 1, 1, "x"))
    rng.shuffle(entries)  # the catalog's order is not the age order
    return entries


def test_retention_keeps_the_newest_checkpoint_that_verifies_whatever_is_damaged_above_it():
    grid = itertools.product(range(1, 8), [None, 1, 2, 3], [None, 5.0, 35.0], [0.0, 0.4, 0.8, 1.0])
    cases = 0
    for count, keep_last, keep_within, damage_rate in grid:
        for seed in range(20):
            rng = random.Random(hash((count, keep_last, keep_within, damage_rate, seed)))
            entries = entries_of(rng, count)
            by_age = sorted(entries, key=lambda e: (e.upper, e.created_at))
            newest = by_age[-1]
            # Newer checkpoints are damaged more often; any may be.
            damaged = {e.id for i, e in enumerate(by_age) if rng.random() < damage_rate * (i + 1) / count}
            # The caller read every file of the one it just made, when that one is good.
            verified = {newest.id} if newest.id not in damaged and rng.random() < 0.5 else set()
            asked: list[str] = []

            def verifies(checkpoint_id: str) -> bool:
                asked.append(checkpoint_id)
                return checkpoint_id not in damaged

            good = newest_verifying_id(entries, verifies, verified)
            expected_good = next((e.id for e in reversed(by_age) if e.id not in damaged), None)
            assert good == expected_good
            # Newest first, nothing below the first that verifies, nothing the caller read.
            assert asked == [e.id for e in reversed(by_age) if e.id not in verified][:len(asked)]
            assert not set(asked) & verified
            assert all(a in damaged for a in asked[:-1])

            now = newest.created_at + 20
            kept = retained_ids(entries, keep_last=keep_last, keep_within=keep_within, now=now,
                                newest_verifying=good)
            rule = {e.id for e in by_age[-keep_last:]} if keep_last else set()
            if keep_within is not None:
                rule |= {e.id for e in by_age if now - e.created_at <= keep_within}
            assert kept == rule | {newest.id} | ({good} if good else set())
            cases += 1
    assert cases == 7 * 4 * 3 * 4 * 20


@sqlite_only
def test_a_newer_checkpoint_over_a_file_damaged_after_it_was_hashed_does_not_drop_the_last_good_one(
        spark, consensus, blob, tmp_path):
    shard = written_shard(spark, consensus, blob, tmp_path, batches=2)
    good = create_checkpoint(shard)
    good_table = table(shard)
    before = live_paths(shard)
    more_batches(spark, shard, 2)
    hashed = create_checkpoint(shard)  # hashes the two new batches' files
    victim = flip_a_byte(blob, sorted(live_paths(shard) - before)[0])

    # Incremental: the damaged file is only size-checked, so this checkpoint is made over it;
    # retention reads it (and the one before, which lists the same file) before dropping any.
    newest = create_checkpoint(shard, keep_last=1)
    assert [e.id for e in list_checkpoints(blob, shard.shard_id, consensus)] == [good.id, newest.id]
    assert sorted(checkpoint_dirs(blob, shard.shard_id)) == sorted([good.id, newest.id])
    assert hashed.id not in checkpoint_dirs(blob, shard.shard_id)
    with pytest.raises(IntegrityError) as caught:
        verify_checkpoint(blob, shard.shard_id, newest.id, consensus, full=True)
    assert caught.value.details["file"] == victim

    # GC keeps what the good one needs, and it restores.
    collect_garbage(consensus, blob, shard.shard_id, grace_seconds=0)
    record = restore_checkpoint(consensus, blob, shard.shard_id, good.id, target_shard_id="restored")
    assert record.upper == good.upper
    assert table(Shard.open(consensus, blob, "restored")) == good_table
