"""The Arrow change feed (engine/table/changes.py) against an independent model of the table:
over seeded random histories of batches (upserts and deletes, with and without an order
column), compactions and GC, for every pair from_ts <= to_ts of ts, the feed is the net change
between the plain-Python table as of from_ts and as of to_ts (tests/arrow_runs.py merges every
committed row by the engine's rule in plain Python); ranges below since are refused naming the
range, since and the retention setting. No Spark is started in this module."""

from __future__ import annotations

import datetime
import math
import random

import pytest

from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.engine.maintenance.gc import collect_garbage
from airflow_upsert_provider.engine.table.changes import read_changes
from tests.arrow_runs import commit_batch, compact_batches, expected_table, merged
from tests.conftest import sqlite_only
from tests.helpers import make_shard

VALUES = ("name", "amount", "updated_at")
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def random_rows(rng: random.Random, keys: int, *, order: bool) -> list[dict]:
    """One batch's rows, one per key: values from small ranges (so that a rewrite to the
    same values happens), order values with ties and nulls, some tombstones."""
    rows = []
    for key in rng.sample(range(keys), rng.randrange(1, keys + 1)):
        deleted = rng.random() < 0.25
        rows.append({
            "id": key,
            "name": None if deleted or rng.random() < 0.1 else f"n{rng.randrange(3)}",
            "amount": None if deleted else float(rng.randrange(3)),
            "updated_at": (None if rng.random() < 0.15 else rng.randrange(4)) if order else 0,
            "_deleted": deleted,
        })
    return rows


def build_history(shard, rng: random.Random, *, batches: int, keys: int) -> list[dict]:
    """Commit ``batches`` random batches (some empty), with compactions and GC (grace 0) at
    random points; every committed row with its ``_ts``."""
    history: list[dict] = []
    order = shard.config.order_by is not None
    for _ in range(batches):
        rows = [] if rng.random() < 0.1 else random_rows(rng, keys, order=order)
        ts = commit_batch(shard, rows)
        history += [{**r, "_ts": ts} for r in rows]
        state = shard.state()
        if rng.random() < 0.25 and state.upper > state.since:
            compact_batches(shard, history, rng.randrange(state.since + 1, state.upper + 1))
            if rng.random() < 0.7:
                collect_garbage(shard.consensus, shard.blob, shard.shard_id, grace_seconds=0)
    return history


def expected_feed(config, history: list[dict], from_ts: int, to_ts: int, committed_at: dict[int, float],
                  *, preimages: bool = True) -> list:
    """The net change from the model: per key its row as of from_ts and as of to_ts. Without
    pre-images: a present key whose winner as of to_ts is a row of the range is an update
    postimage alone (equal values or not), and a delete carries the key and nulls."""
    before = expected_table(config, history, from_ts)
    after = expected_table(config, history, to_ts)
    winners = {r["id"]: r["_ts"] for r in merged(config, [r for r in history if r["_ts"] < to_ts],
                                                  keep_tombstones=True)}
    rows = []
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key), after.get(key)
        version = winners[key[0]]
        if preimages and old == new or old is None and new is None:
            continue
        if old is None:
            kinds = [("insert", new)]
        elif new is None:
            kinds = [("delete", old if preimages else dict.fromkeys(VALUES))]
        elif preimages:
            kinds = [("update_preimage", old), ("update_postimage", new)]
        elif version >= from_ts:
            kinds = [("update_postimage", new)]
        else:
            continue  # every row of the range lost to the row as of from_ts
        for kind, row in kinds:
            micros = math.floor(committed_at[version] * 1_000_000)
            at = EPOCH + datetime.timedelta(microseconds=micros)
            rows.append((key[0], *(row[c] for c in VALUES), kind, version, at))
    return rows


def feed_rows(reader) -> list:
    table = reader.read_all()
    assert table.schema.names == ["id", *VALUES, "_change_type", "_commit_version", "_commit_timestamp"]
    return sorted((tuple(r.values()) for r in table.to_pylist()),
                  key=lambda r: (r[0], ["delete", "update_preimage", "update_postimage", "insert"].index(r[4])))


@sqlite_only
@pytest.mark.parametrize("seed", range(10))
def test_the_feed_of_every_range_is_the_net_change_of_the_model(consensus, blob, tmp_path, seed):
    """Both modes, with and without pre-images, over the same history."""
    rng = random.Random(seed)
    order_by = "updated_at" if seed % 3 else None
    shard = make_shard(consensus, blob, tmp_path, buckets=rng.choice([1, 2, 5]), order_by=order_by)
    history = build_history(shard, rng, batches=rng.randrange(4, 10), keys=rng.randrange(3, 25))
    state = shard.state()
    committed_at = {b.ts: b.committed_at for b in shard.batches()}
    answered = 0
    for from_ts in range(state.upper + 1):
        for to_ts in range(from_ts, state.upper + 1):
            if from_ts < state.since:
                with pytest.raises(ConfigurationError) as refused:
                    read_changes(shard, from_ts, to_ts)
                message = refused.value.message
                assert f"[{from_ts}, {to_ts})" in message and f"since {state.since}" in message
                assert "upsertctl changes retention" in message
                assert refused.value.details["since"] == state.since
                continue
            for preimages in (False, True):
                got = feed_rows(read_changes(shard, from_ts, to_ts, preimages=preimages,
                                             batch_rows=rng.choice([1, 3, 1000])))
                assert got == expected_feed(shard.config, history, from_ts, to_ts, committed_at,
                                            preimages=preimages), (
                    f"seed {seed}, range [{from_ts}, {to_ts}), since {state.since}, preimages {preimages}")
            answered += 1
    assert answered >= 1
    # The default end is the upper.
    assert feed_rows(read_changes(shard, state.since)) == feed_rows(read_changes(shard, state.since, state.upper))


@sqlite_only
def test_a_range_past_the_upper_or_backwards_is_refused_naming_it(consensus, blob, tmp_path):
    shard = make_shard(consensus, blob, tmp_path, buckets=2)
    commit_batch(shard, [{"id": 1, "name": "a", "amount": 1.0, "updated_at": 1, "_deleted": False}])
    with pytest.raises(ConfigurationError, match=r"\[0, 2\) of shard 'orders' ends past its upper 1"):
        read_changes(shard, 0, 2)
    with pytest.raises(ConfigurationError, match=r"\[1, 0\) of shard 'orders' ends before it starts"):
        read_changes(shard, 1, 0)
    with pytest.raises(ConfigurationError, match="from_ts must be a batch ts") as bad:
        read_changes(shard, "0")
    assert bad.value.details["field"] == "from_ts"
    assert read_changes(shard, 1).read_all().num_rows == 0
