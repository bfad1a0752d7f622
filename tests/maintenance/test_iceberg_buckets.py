"""A publish rewrites only the buckets whose live runs changed (engine/maintenance/iceberg_buckets.py):
the plan by properties over seeded random digests and snapshots; then real publishes (no
Spark) over a history of clustered and random batches, tiered and full compactions, each
snapshot compared with the shard's own read at its since, and the data files of untouched
buckets carried over unchanged."""

from __future__ import annotations

import itertools
import random

import pytest

from airflow_upsert_provider.engine.maintenance.compaction_policy import Tier, TierRun, compaction_run, tier_runs
from airflow_upsert_provider.engine.maintenance.iceberg import PUBLISHED, current_data_files, publish_iceberg
from airflow_upsert_provider.engine.maintenance.iceberg_buckets import (
    SUMMARY_BUCKETS,
    TASKS_PER_BUCKET,
    WHOLE,
    bucket_digests,
    bucket_files,
    bucket_of_data_file,
    plan_buckets,
    published_digests,
    summary_digests,
    task_id,
)
from airflow_upsert_provider.engine.table.arrow_reader import read_table
from tests.arrow_runs import arrow_table, commit_batch, compact_batches, expected_table, merged, write_run
from tests.conftest import sqlite_only
from tests.helpers import make_shard
from tests.maintenance.test_iceberg import TABLE, by_key, catalog  # noqa: F401

UUID = "1b4e28ba-2fa1-11d2-883f-0016d3cca427"

# -- pure ------------------------------------------------------------------------------------


def test_a_data_files_bucket_is_read_back_from_its_name_for_every_bucket_and_task():
    for bucket in [WHOLE, *map(str, range(0, 4100, 7))]:
        for n in (0, 1, 2, 999, TASKS_PER_BUCKET - 1):
            name = f"00000-{task_id(bucket, n)}-{UUID}.parquet"
            assert bucket_of_data_file(f"s3://lake/t/data/{name}") == bucket
            # An object-store location provider's hash before the name.
            assert bucket_of_data_file(f"s3://lake/t/data/0110/1010/0011/10110011-{name}") == bucket
    with pytest.raises(ValueError, match="more than"):
        task_id("3", TASKS_PER_BUCKET)
    for other in ("part-00000.parquet", f"00000-12-{UUID}.orc", f"00000-x-{UUID}.parquet", "00000-5-abc.parquet"):
        assert bucket_of_data_file(f"/t/data/{other}") is None


def test_digests_follow_the_files_not_their_order_and_round_trip_through_the_summary():
    files = [{"path": f"s/runs/ts=1/w/_bucket={b}/part-{i}.parquet", "bytes": 10 + i} for b in range(3) for i in range(2)]
    digests = bucket_digests({"0": files[:2], "1": files[2:4]}, 3)
    assert digests == bucket_digests({"1": files[3:1:-1], "0": files[1::-1]}, 3)
    assert digests["0"] != bucket_digests({"0": [files[0]]}, 3)["0"]
    assert digests["0"] != bucket_digests({"0": [files[0], {**files[1], "bytes": 99}]}, 3)["0"]
    assert published_digests({SUMMARY_BUCKETS: summary_digests(digests)}) == digests
    for bad in (None, {}, {SUMMARY_BUCKETS: "{"}, {SUMMARY_BUCKETS: "[1]"}, {SUMMARY_BUCKETS: '{"0": 1}'}):
        assert published_digests(bad) is None


def test_the_plan_keeps_exactly_the_files_of_unchanged_buckets_and_rewrites_the_rest():
    cases = 0
    for seed, buckets in itertools.product(range(60), (1, 2, 3, 8, 17)):
        rng = random.Random(seed * 100 + buckets)
        keys = [str(b) for b in range(buckets)] if rng.random() < 0.9 else [WHOLE]
        published = {k: f"d{rng.randrange(3)}" for k in keys if rng.random() < 0.9}
        live = {k: (published[k] if k in published and rng.random() < 0.6 else f"d{rng.randrange(3, 6)}")
                for k in keys if rng.random() < 0.9}
        current = [f"/t/data/00000-{task_id(k, n)}-{UUID}.parquet" for k in published for n in range(rng.randrange(3))]
        stray = rng.random() < 0.1
        if stray:
            current.append("/t/data/part-0.parquet")
        recorded = None if rng.random() < 0.1 else published
        plan = plan_buckets(live, recorded, current)
        assert set(plan.keep) | set(plan.delete) == set(current) and not set(plan.keep) & set(plan.delete)
        assert set(plan.rewrite) <= set(live)
        unchanged = {k for k in live if recorded is not None and recorded.get(k) == live[k]}
        if recorded is None or stray:
            # Nothing can be told for sure: a whole rewrite.
            assert (set(plan.rewrite), plan.keep) == (set(live), ())
        else:
            assert set(plan.rewrite) == set(live) - unchanged
            assert {bucket_of_data_file(p) for p in plan.keep} <= unchanged
            # A file of a bucket rewritten or gone is removed: no key is in the snapshot twice.
            assert all(bucket_of_data_file(p) not in unchanged for p in plan.delete)
        cases += 1
    assert cases == 300


# -- publishing ------------------------------------------------------------------------------


def compact_tier(shard, history: list[dict], since: int) -> None:
    """A tiered compaction to ``since`` that keeps every tier and adds one of the batches
    from the current since (their winners, tombstones kept): as the engine's compaction does
    when it merges no tier, so the buckets no batch touched keep their files."""
    state = shard.state()
    view = shard.consensus.live_view(shard.shard_id, since)
    tiers = tier_runs(view.compaction.run if view.compaction else None, state.since)
    survivors = merged(shard.config, [r for r in history if state.since <= r["_ts"] < since], keep_tombstones=True)
    run = write_run(shard, f"since={since:012d}", survivors)
    new = TierRun(Tier(state.since, since, len(survivors)), run["path"], tuple(run["files"]))
    record = compaction_run([*tiers, new], [b.run["path"] for b in view.batches])
    assert shard.consensus.compare_and_set_since(shard.shard_id, state.since, since, record)


def batch_in_buckets(rng: random.Random, shard, history: list[dict], buckets: set[int], keys: int = 64) -> None:
    """A batch of updates and tombstones to keys of ``buckets`` only (the test's runs bucket
    by ``id % buckets``)."""
    count = shard.config.buckets
    chosen = [k for k in range(keys) if k % count in buckets]
    rows = []
    for key in rng.sample(chosen, rng.randrange(1, len(chosen) + 1)):
        deleted = rng.random() < 0.15
        rows.append({"id": key, "name": None if deleted else f"n{key}-{rng.randrange(100)}",
                     "amount": None if deleted else float(rng.randrange(1000)),
                     "updated_at": rng.randrange(4), "_deleted": deleted})
    ts = commit_batch(shard, rows)
    history += [{**r, "_ts": ts} for r in rows]


def files_by_bucket(table) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for data_file in current_data_files(table):
        out.setdefault(bucket_of_data_file(data_file.file_path), set()).add(data_file.file_path)
    return out


@sqlite_only
def test_a_publish_rewrites_only_the_buckets_that_changed_and_equals_the_shards_read(consensus, blob, tmp_path,
                                                                                     catalog):
    buckets = 8
    shard = make_shard(consensus, blob, tmp_path, buckets=buckets)
    rng = random.Random(35)
    history: list[dict] = []
    since_of: dict[int, int] = {}
    # (buckets each batch of the round touches, how the round compacts): clustered rounds,
    # a round of random keys (every bucket), a full compaction.
    schedule = [
        ([set(range(buckets))], compact_tier),
        ([{2}], compact_tier),
        ([{5}, {5, 6}], compact_tier),
        ([set(), {1}], compact_tier),
        ([set(range(buckets))], compact_tier),
        ([{3}], compact_batches),
        ([{0}], compact_tier),
    ]
    before: dict[str, set[str]] = {}
    for touched_per_batch, compact in schedule:
        touched: set[int] = set()
        for touched_buckets in touched_per_batch:
            if touched_buckets:
                batch_in_buckets(rng, shard, history, touched_buckets)
            else:
                commit_batch(shard, [])
            touched |= touched_buckets
        since = shard.state().upper
        compact(shard, history, since)
        result = publish_iceberg(shard, catalog, TABLE, retention=None)
        assert result.outcome == PUBLISHED and result.since == since
        since_of[result.snapshot_id] = since
        table = catalog.load_table(TABLE)
        after = files_by_bucket(table)
        full = compact is compact_batches or not before
        expected_rewritten = set(map(str, range(buckets))) if full else set(map(str, touched))
        assert result.buckets_rewritten == len(expected_rewritten), (touched, result)
        assert result.buckets_kept == buckets - len(expected_rewritten)
        # Untouched buckets keep their very files; touched ones have new ones (or none left).
        for key in set(before) | set(after):
            if key in expected_rewritten:
                assert not after.get(key, set()) & before.get(key, set()), key
            else:
                assert after.get(key) == before.get(key), key
        assert None not in after
        # The snapshot is the shard's table at its since: the oracle and the shard's own read.
        scanned = by_key(table.scan().to_arrow())
        assert scanned == expected_table(shard.config, history, since) == arrow_table(read_table(shard, as_of=since))
        assert result.rows == sum(1 for key in scanned if str(key[0] % buckets) in expected_rewritten)
        before = after
    # Time travel: every snapshot is still the table at its since.
    table = catalog.load_table(TABLE)
    for snapshot_id, since in since_of.items():
        assert by_key(table.scan(snapshot_id=snapshot_id).to_arrow()) == expected_table(shard.config, history, since)


@sqlite_only
def test_publishes_across_rebuckets_and_a_batch_of_the_old_count_hold_each_key_once(consensus, blob, tmp_path,
                                                                                      catalog):
    # 4 buckets, a compaction to 8, a batch of a writer that planned with 4 (a key of bucket
    # 5 among 8 is in its bucket 1) compacted at 8, then a compaction to 16: every publish
    # is the shard's table with each key once, whatever the data files' groups were before.
    shard = make_shard(consensus, blob, tmp_path, buckets=4)
    rng = random.Random(36)
    history: list[dict] = []
    for batch_buckets, compact_to in [(None, 4), (None, 8), (4, 8), (8, 16), (16, 16)]:
        rows = [{"id": key, "name": f"n{key}-{rng.randrange(100)}", "amount": float(rng.randrange(1000)),
                 "updated_at": 3, "_deleted": False} for key in rng.sample(range(64), 20)]
        ts = commit_batch(shard, rows, batch_buckets)
        history += [{**r, "_ts": ts} for r in rows]
        compact_batches(shard, history, shard.state().upper, compact_to)
        result = publish_iceberg(shard, catalog, TABLE, retention=None)
        assert result.outcome == PUBLISHED
        scanned = catalog.load_table(TABLE).scan().to_arrow()
        expected = expected_table(shard.config, history, result.since)
        # No key twice: a dictionary by key would hide a second row.
        assert scanned.num_rows == len(expected), (batch_buckets, compact_to)
        assert by_key(scanned) == expected == arrow_table(read_table(shard, as_of=result.since))


def test_a_groups_digest_changes_with_the_count_its_files_were_grouped_by():
    files = [{"path": f"s/runs/ts=1/w/_bucket={b}/part-0.parquet", "bytes": 10} for b in (1, 5)]
    assert bucket_files(files, 4) == {"1": files}
    assert bucket_files(files, 8) == {"1": files[:1], "5": files[1:]}
    assert bucket_digests({"1": files[:1]}, 8) != bucket_digests({"1": files[:1]}, 4)
