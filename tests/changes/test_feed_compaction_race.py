"""A feed read racing a compaction, at every point of the read: a hook in the read compacts the
shard (to each since from the read's start to the upper) after the read has planned its runs
and read some of its files, with or without a GC (grace 0) after it. The read either answers
the feed of its range exactly, or fails with the retryable ReadOutdated, and only when GC
deleted a file it still had to read: a compaction alone leaves the runs a read planned in
place. Never wrong rows. The GC-only race: test_feed_race.py. No Spark in this module; both
consensus stores."""

from __future__ import annotations

import random

import pytest

from airflow_upsert_provider.engine.errors import ReadOutdated
from airflow_upsert_provider.engine.maintenance.gc import collect_garbage
from airflow_upsert_provider.engine.table import run_io
from airflow_upsert_provider.engine.table.changes import read_changes
from tests.arrow_runs import commit_batch, compact_batches
from tests.changes.test_feed_oracle import expected_feed, feed_rows, random_rows
from tests.helpers import make_shard

BATCHES = 5
KEYS = 8


def _history_shard(consensus, blob, tmp_path, shard_id: str, seed: int):
    """A shard of ``BATCHES`` random batches over 2 buckets and every row committed (with ``_ts``)."""
    rng = random.Random(seed)
    order = seed % 2 == 0
    shard = make_shard(consensus, blob, tmp_path, shard_id=shard_id, buckets=2,
                       order_by="updated_at" if order else None)
    history: list[dict] = []
    for _ in range(BATCHES):
        rows = random_rows(rng, KEYS, order=order)
        ts = commit_batch(shard, rows)
        history += [{**r, "_ts": ts} for r in rows]
    return shard, history


def test_a_feed_read_racing_a_compaction_answers_exactly_or_fails_retryably(consensus, blob, tmp_path):
    outcomes = {"answered": 0, "outdated": 0}
    case = 0
    for seed, from_ts in ((1, 1), (2, 2)):
        for gc in (False, True):
            for since in range(from_ts + 1, BATCHES + 1):
                for hold_at in range(4):
                    case += 1
                    shard, history = _history_shard(consensus, blob, tmp_path, f"s{case}", seed)
                    committed_at = {b.ts: b.committed_at for b in shard.batches()}
                    expected = expected_feed(shard.config, history, from_ts, BATCHES, committed_at, preimages=False)
                    calls: list[str] = []

                    def read_file(root, listed, schema, shard=shard, history=history, since=since,
                                  hold_at=hold_at, gc=gc, calls=calls):
                        if len(calls) == hold_at:
                            # The runs are planned and some read: the shard moves under the read.
                            compact_batches(shard, history, since)
                            if gc:
                                collect_garbage(shard.consensus, shard.blob, shard.shard_id, grace_seconds=0)
                        calls.append(listed["path"])
                        return run_io.read_files(root, [listed["path"]], schema, sizes=[listed["bytes"]])

                    where = f"seed {seed}, range [{from_ts}, {BATCHES}), since {since}, hold at {hold_at}, gc {gc}"
                    try:
                        got = feed_rows(read_changes(shard, from_ts, read_file=read_file))
                    except ReadOutdated as error:
                        assert gc, f"a compaction without GC failed the read: {where}: {error}"
                        assert error.retryable and error.exit_code == 2, where
                        outcomes["outdated"] += 1
                        continue
                    assert got == expected, where
                    assert shard.state().since == since or len(calls) <= hold_at, where
                    outcomes["answered"] += 1
    # Both outcomes happened: the sweep reaches reads that lose a file and reads that do not.
    assert outcomes["answered"] > 0 and outcomes["outdated"] > 0, outcomes
