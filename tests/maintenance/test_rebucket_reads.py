"""Reads across runs of different bucket counts, without Spark or a store: the rules of a growing
bucket count (``compaction_policy.check_bucket_count`` / ``next_bucket_count``,
``runs.read_group_count``) over every value of small grids, and the Arrow reader (its streamed
k-way merge and, for floating-point keys, its whole-group merge) against the oracle at every ts
of seeded random schedules of batches, compactions and compactions that multiply the count,
with batches of writers that planned with a count a compaction has grown since.

Run files are written with pyarrow in the layout the engine's writers give them; a key's bucket
among N is ``h(key) mod N`` for one fixed hash ``h`` standing in for Spark's xxhash64 (the reader
never hashes: what it relies on is that every count's bucket is the same hash modulo it)."""

from __future__ import annotations

import io
import random
import uuid
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql.types import BooleanType, DoubleType, LongType, StringType, StructField, StructType

from airflow_upsert_provider.engine.blob.files import open_blob
from airflow_upsert_provider.engine.config import MAX_BUCKETS, ShardConfig
from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.engine.maintenance.compaction_policy import check_bucket_count, next_bucket_count
from airflow_upsert_provider.engine.table.arrow_reader import read_runs_arrow
from airflow_upsert_provider.engine.table.runs import current_buckets, read_group_count, run_buckets
from tests.arrow_runs import arrow_run_schema, arrow_table, expected_table, merged


# -- the count rules, over every value of a grid ---------------------------------------------

@pytest.mark.parametrize("current", [1, 2, 3, 5, 8, 64, 1000, 2048, 4096])
def test_a_count_may_become_exactly_the_whole_multiples_of_the_current_one_up_to_the_maximum(current):
    for value in [*range(0, 3 * current + 2), MAX_BUCKETS - 1, MAX_BUCKETS, MAX_BUCKETS + current, 2.0 * current,
                  str(2 * current), True, None]:
        allowed = (type(value) is int and value >= current and value % current == 0 and value <= MAX_BUCKETS)
        if allowed:
            assert check_bucket_count(value, current) == value
            assert next_bucket_count(current, requested=value, target_bucket_bytes=1, run_bytes=10**12) == value
            continue
        with pytest.raises(ConfigurationError) as raised:
            check_bucket_count(value, current)
        message = str(raised.value)
        assert raised.value.details["field"] == "buckets"
        assert f"buckets {value!r} is not allowed" in message
        assert f"current count {current}" in message


def test_the_size_target_doubles_the_count_only_above_it_and_never_past_the_maximum():
    for current in [1, 2, 3, 8, 100, 2048, 4096]:
        for target in [1, 7, 1000, 10**6]:
            for run_bytes in sorted({0, 1, target * current - 1, target * current, target * current + 1,
                                     3 * target * current}):
                expected = 2 * current if run_bytes > target * current and 2 * current <= MAX_BUCKETS else current
                assert next_bucket_count(current, target_bucket_bytes=target, run_bytes=run_bytes) == expected
        assert next_bucket_count(current, target_bucket_bytes=None, run_bytes=10**15) == current


def shape_config(key_type, order_type, buckets: int) -> ShardConfig:
    fields = [StructField("id", key_type), StructField("name", StringType()), StructField("deleted", BooleanType())]
    if order_type is not None:
        fields.append(StructField("version", order_type))
    return ShardConfig(source="dir:/nonexistent", keys=("id",), schema=StructType(fields).json(),
                       order_by="version" if order_type is not None else None, delete_marker="deleted",
                       buckets=buckets)


def test_every_count_a_shard_can_reach_refines_the_read_groups():
    """For every chain of counts a shard can go through (each a whole multiple of the one
    before) and every subset of it live at once, a key's bucket in any live run is in one and
    the same read group: the group of its hash."""
    config = shape_config(LongType(), None, 1)
    for start in range(1, 7):
        for factors in [(2,), (3,), (2, 2), (2, 3), (3, 2), (2, 2, 2), (5,)]:
            chain = [start]
            for factor in factors:
                chain.append(chain[-1] * factor)
            for mask in range(1, 2 ** len(chain)):
                live = [{"buckets": c} for i, c in enumerate(chain) if mask >> i & 1]
                groups = read_group_count(config, live)
                assert groups == min(run_buckets(r, config) for r in live)
                for h in range(3 * chain[-1]):
                    assert {(h % run["buckets"]) % groups for run in live} == {h % groups}
    assert read_group_count(config, []) == 1
    assert read_group_count(shape_config(LongType(), None, 6), [{"files": []}, {"buckets": 12}]) == 6
    assert current_buckets(shape_config(LongType(), None, 6), None) == 6
    assert current_buckets(shape_config(LongType(), None, 6), {"buckets": 24}) == 24


# -- the Arrow reader against the oracle over schedules --------------------------------------

def key_hash(key) -> int:
    """The stand-in for Spark's xxhash64: any fixed function of the key, taken modulo a count."""
    return (int(key) * 2654435761 + 12345) % (2**31)


class Schedule:
    """A shard without a store: its blob, its compacted run and since, its batches, and every
    row ever committed (the oracle's history)."""

    def __init__(self, blob, config: ShardConfig) -> None:
        self.blob, self.config = blob, config
        self.schema = arrow_run_schema(config)
        self.compacted: dict[str, Any] | None = None
        self.since = 0
        self.batches: list[tuple[int, dict[str, Any]]] = []
        self.history: list[dict[str, Any]] = []
        self.counts = [config.buckets]  # every count the shard had, oldest first

    @property
    def upper(self) -> int:
        return len(self.batches)

    @property
    def buckets(self) -> int:
        return current_buckets(self.config, self.compacted)

    def write_run(self, group: str, rows: list[dict[str, Any]], buckets: int) -> dict[str, Any]:
        run_dir = self.blob.path("s", "runs", group, f"w-{uuid.uuid4().hex[:8]}")
        by_bucket: dict[int, list[dict[str, Any]]] = {}
        for row in rows:
            by_bucket.setdefault(key_hash(row["id"]) % buckets, []).append(row)
        files = []
        for bucket, members in sorted(by_bucket.items()):
            members.sort(key=lambda r: r["id"])
            sink = io.BytesIO()
            pq.write_table(pa.Table.from_pylist(members, schema=self.schema), sink, row_group_size=3)
            path = self.blob.join(run_dir, f"_bucket={bucket}", "part-00000.parquet")
            self.blob.make_dirs(self.blob.parent(path))
            self.blob.write_file(path, sink.getvalue(), sync=False)
            files.append({"path": self.blob.relative(path), "bytes": len(sink.getvalue()), "sha256": None})
        return {"path": self.blob.relative(run_dir), "files": files, "rows": len(rows), "buckets": buckets}

    def commit_batch(self, rng: random.Random, buckets: int) -> None:
        ts = self.upper
        rows = []
        for key in rng.sample(range(40), rng.randrange(1, 14)):
            row = {"id": float(key) if self.schema.field("id").type == pa.float64() else key,
                   "name": f"n{key}-{ts}", "_deleted": rng.random() < 0.2, "_ts": ts}
            if self.config.order_by is not None:
                row["version"] = None if rng.random() < 0.1 else rng.randrange(4)
            rows.append(row)
        self.batches.append((ts, self.write_run(f"ts={ts:012d}", rows, buckets)))
        self.history += rows

    def compact(self, target: int, buckets: int) -> None:
        """As the engine compacts: every row below ``target`` merged into one run of ``buckets``
        (tombstones kept: always correct), the count recorded with it."""
        survivors = merged(self.config, [r for r in self.history if r["_ts"] < target], keep_tombstones=True)
        self.compacted = self.write_run(f"since={target:012d}", survivors, buckets)
        self.since = target
        if buckets != self.counts[-1]:
            self.counts.append(buckets)

    def runs(self, as_of: int) -> list[dict[str, Any]]:
        return ([self.compacted] if self.compacted else []) + [r for ts, r in self.batches if self.since <= ts < as_of]


SHAPES = [(LongType(), None), (LongType(), LongType()), (DoubleType(), LongType())]


@pytest.mark.parametrize("key_type,order_type", SHAPES, ids=["long", "long-ordered", "double-ordered"])
@pytest.mark.parametrize("initial", [1, 2, 3])
def test_reads_across_runs_of_every_count_equal_the_oracle_at_every_ts(tmp_path, key_type, order_type, initial):
    """Seeded schedules: batches (some by a writer that planned with a count a compaction has
    grown since), compactions at the current count and compactions that multiply it by 2 or 3;
    after every step the Arrow reader, at a read batch size of 2 or 1000 rows, gives the
    oracle's table at every ts from since to the upper, every key once."""
    reads = 0
    grew = stale_batches = 0
    for seed in range(3):
        rng = random.Random(seed * 100 + initial)
        config = shape_config(key_type, order_type, initial)
        shard = Schedule(open_blob(str(tmp_path / f"{initial}-{seed}")), config)
        for _step in range(12):
            roll = rng.random()
            if roll < 0.55 or shard.upper == shard.since:
                # A racing writer planned with an older count than the shard has now.
                planned = rng.choice(shard.counts) if rng.random() < 0.4 else shard.buckets
                stale_batches += planned != shard.buckets
                shard.commit_batch(rng, planned)
            else:
                target = rng.randrange(shard.since + 1, shard.upper + 1)
                factor = rng.choice([1, 1, 2, 3]) if shard.buckets * 3 <= 64 else 1
                grew += factor > 1
                shard.compact(target, shard.buckets * factor)
            for as_of in range(shard.since, shard.upper + 1):
                runs = shard.runs(as_of)
                reader = read_runs_arrow(config, shard.blob, runs, batch_rows=rng.choice((2, 1000)))
                assert arrow_table(reader) == expected_table(config, shard.history, as_of), (
                    f"seed {seed}, as_of {as_of}, counts {[run_buckets(r, config) for r in runs]}")
                reads += 1
    assert grew and stale_batches and reads > 40
