"""The tiered compaction policy, pure: properties over every valid setting and seeded random
schedules of batches and compactions, against an in-memory model of runs and an oracle."""

from __future__ import annotations

import math
import random

import pytest

from airflow_upsert_provider.engine.errors import ConfigurationError, IntegrityError
from airflow_upsert_provider.engine.maintenance.compaction_policy import (
    DEFAULT_MAX_RUNS,
    SIZE_RATIO,
    Tier,
    TierRun,
    check_max_runs,
    compaction_run,
    drops_tombstones,
    merge_count,
    merged_tier,
    tier_runs,
)

MAX_RUNS = range(1, 13)


class Model:
    """A shard in memory: batches (key -> (ts, deleted)), since, and compacted tiers of rows,
    compacted by the policy as ``compaction.compact`` does (no order column)."""

    def __init__(self, max_runs: int) -> None:
        self.max_runs = max_runs
        self.batches: list[dict[int, tuple[int, bool]]] = []
        self.since = 0
        self.tiers: list[tuple[Tier, dict[int, tuple[int, bool]]]] = []
        self.work = 0  # rows read by merges
        self.forced = False

    def append(self, rows: dict[int, bool]) -> None:
        ts = len(self.batches)
        self.batches.append({key: (ts, deleted) for key, deleted in rows.items()})

    def compact(self, target: int, full: bool = False) -> int:
        tiers = [t for t, _ in self.tiers]
        new = [self.batches[ts] for ts in range(self.since, target)]
        count = merge_count(tiers, sum(len(b) for b in new), max_runs=self.max_runs, full=full)
        unforced = merge_count(tiers, sum(len(b) for b in new), max_runs=len(tiers) + 1, full=full)
        self.forced = self.forced or count != unforced
        inputs = [rows for _, rows in self.tiers[len(tiers) - count :]] + new
        self.work += sum(len(rows) for rows in inputs)
        merged = merge(inputs)
        if drops_tombstones(count, tiers, has_order_column=False):
            merged = {k: v for k, v in merged.items() if not v[1]}
        tier = merged_tier(tiers, count, self.since, target, len(merged))
        self.tiers = self.tiers[: len(tiers) - count] + [(tier, merged)]
        self.since = target
        return count

    def read(self, as_of: int) -> set[int]:
        assert self.since <= as_of <= len(self.batches)
        merged = merge([rows for _, rows in self.tiers] + self.batches[self.since : as_of])
        return {key for key, (_, deleted) in merged.items() if not deleted}

    def oracle(self, as_of: int) -> set[int]:
        live: set[int] = set()
        for batch in self.batches[:as_of]:
            for key, (_, deleted) in batch.items():
                (live.discard if deleted else live.add)(key)
        return live


def merge(runs: list[dict[int, tuple[int, bool]]]) -> dict[int, tuple[int, bool]]:
    """Per key the row of the highest ts, tombstones kept (``runs.merge_rows``)."""
    merged: dict[int, tuple[int, bool]] = {}
    for rows in runs:
        for key, row in rows.items():
            if key not in merged or row[0] > merged[key][0]:
                merged[key] = row
    return merged


def check_shape(model: Model) -> None:
    tiers = [t for t, _ in model.tiers]
    assert len(tiers) <= model.max_runs
    # Contiguous in ts order, from 0 up to since.
    assert [t.from_ts for t in tiers] == [0] + [t.to_ts for t in tiers[:-1]]
    assert tiers[-1].to_ts == model.since
    assert [t.rows for t in tiers] == [len(rows) for _, rows in model.tiers]


def test_every_schedule_reads_what_the_oracle_holds_with_the_runs_bounded():
    """Every max_runs 1..12, 25 schedules each: random batches (updates and deletes over a
    small key space, empty ones too) and compactions to random targets, some full. After
    each compaction the tiers are at most max_runs, contiguous in ts from 0 to since, and a
    read as of every ts from since to the upper equals the oracle."""
    schedules = 0
    for max_runs in MAX_RUNS:
        for seed in range(25):
            rng = random.Random(f"{max_runs}/{seed}")
            model = Model(max_runs)
            keys = rng.choice([20, 200, 2000])
            for _ in range(60):
                if rng.random() < 0.6 or len(model.batches) == model.since:
                    size = rng.choice([0, 1, 5, 30, 120])
                    model.append({rng.randrange(keys): rng.random() < 0.15 for _ in range(size)})
                    continue
                target = rng.randint(model.since + 1, len(model.batches))
                full = rng.random() < 0.1
                count = model.compact(target, full=full)
                if full:
                    assert len(model.tiers) == 1 and count >= 0
                check_shape(model)
                for as_of in range(model.since, len(model.batches) + 1):
                    assert model.read(as_of) == model.oracle(as_of), (max_runs, seed, as_of)
            schedules += 1
    assert schedules == len(MAX_RUNS) * 25


def test_unforced_tiers_shrink_geometrically():
    """Without the max_runs bound forcing a merge, every tier holds more than SIZE_RATIO times
    the rows of the next newer one, so there are at most log2(largest / smallest) + 1."""
    for seed in range(200):
        rng = random.Random(seed)
        model = Model(max_runs=64)
        low = rng.choice([1, 10, 100])
        for _ in range(rng.randint(1, 300)):
            model.append({len(model.batches) * 10_000 + i: False for i in range(rng.randint(low, 3 * low))})
            model.compact(len(model.batches))
            rows = [t.rows for t, _ in model.tiers]
            assert all(older > SIZE_RATIO * newer for older, newer in zip(rows, rows[1:])), rows
            assert len(rows) <= math.log2(rows[0] / low) + 1 + 1e-9
        assert not model.forced


def simulate_sizes(rng: random.Random, max_runs: int, cycles: int, low: int, high: int, overlap: float):
    """Sizes only: a compaction per batch of ``low``..``high`` rows, a fraction ``overlap`` of a
    merge's rows being updates of others. Returns (tiered work, full work, change, max tiers)."""
    tiers: list[Tier] = []
    table = 0.0
    work = full_work = change = most = 0
    for ts in range(cycles):
        new = rng.randint(low, high)
        change += new
        count = merge_count(tiers, new, max_runs=max_runs)
        inputs = sum(t.rows for t in tiers[len(tiers) - count :]) + new
        work += inputs
        kept_rows = new + int(sum(t.rows for t in tiers[len(tiers) - count :]) * (1 - overlap))
        tiers = tiers[: len(tiers) - count] + [merged_tier(tiers, count, ts, ts + 1, kept_rows)]
        full_work += table + new
        table += new * (1 - overlap)
        most = max(most, len(tiers))
    return work, full_work, change, most


def test_work_is_the_change_times_its_log_amortized():
    """For every max_runs that holds the table's levels (log2(table / smallest change) + 2),
    the rows merged over a schedule are at most the change times log_1.5(table / change) + 2,
    and a full compaction each cycle (today's) does quadratically more."""
    for seed in range(60):
        rng = random.Random(seed)
        low = rng.choice([1, 20, 500])
        high = low * rng.choice([1, 2, 4])
        cycles = rng.choice([50, 400, 2000])
        overlap = rng.choice([0.0, 0.3, 0.9])
        levels = math.ceil(math.log2(cycles * high / low)) + 2
        for max_runs in (levels, levels + 3, 64):
            work, full_work, change, most = simulate_sizes(rng, max_runs, cycles, low, high, overlap)
            bound = change * (math.log(cycles * high / low, 1.5) + 2)
            assert work <= bound, (seed, max_runs, work, bound)
            assert most <= max_runs
            if cycles >= 400 and overlap < 0.9:
                assert work * 10 < full_work


def test_the_bound_holds_for_every_max_runs_whatever_the_sizes():
    """Every max_runs 1..12 and any sizes (empty batches, a huge one, shrinking ones): the
    tiers after each compaction never exceed max_runs, and the merge is a suffix of them."""
    for max_runs in MAX_RUNS:
        for seed in range(40):
            rng = random.Random(seed)
            tiers: list[Tier] = []
            for ts in range(150):
                new = rng.choice([0, 0, 1, 7, 100, 10_000, max(0, 1000 - ts * 7)])
                count = merge_count(tiers, new, max_runs=max_runs)
                assert 0 <= count <= len(tiers)
                assert len(tiers) - count + 1 <= max_runs
                tiers = tiers[: len(tiers) - count] + [merged_tier(tiers, count, ts, ts + 1, new)]


def test_full_compaction_merges_every_run_whatever_the_setting():
    """Full compaction is today's: every tier joins, one run results, tombstones drop (no order
    column) because the oldest tier is in the merge."""
    for max_runs in MAX_RUNS:
        for n in range(0, 15):
            tiers = [Tier(i, i + 1, 2 ** (20 - i)) for i in range(n)]
            assert merge_count(tiers, 1, max_runs=max_runs, full=True) == n
            assert merged_tier(tiers, n, n, n + 1, 5) == Tier(0 if n else n, n + 1, 5)
            assert drops_tombstones(n, tiers, has_order_column=False)
            assert not drops_tombstones(n, tiers, has_order_column=True)
            if n:
                assert not drops_tombstones(n - 1, tiers, has_order_column=False)


@pytest.mark.parametrize("value", [0, -1, True, False, "3", 2.5, None])
def test_a_bad_max_runs_is_refused_naming_it(value):
    with pytest.raises(ConfigurationError, match=r"max_runs must be an integer >= 1") as info:
        merge_count([], 1, max_runs=value)
    assert info.value.details["field"] == "max_runs"
    with pytest.raises(ConfigurationError, match=r"^--max-runs must"):
        check_max_runs(value, "--max-runs")


def test_the_default_is_valid():
    assert check_max_runs(DEFAULT_MAX_RUNS) == DEFAULT_MAX_RUNS


def tier_run(path: str, from_ts: int, to_ts: int, buckets: int = 2) -> TierRun:
    files = tuple({"path": f"{path}/_bucket={b}/part-0.parquet", "bytes": 10 + b, "sha256": "x"} for b in range(buckets))
    return TierRun(Tier(from_ts, to_ts, 7 * (to_ts - from_ts)), path, files)


def test_the_compaction_record_round_trips_its_tiers_and_names_what_it_replaces():
    tiers = [tier_run("s/runs/since=000000000004/compaction-a", 0, 4),
             tier_run("s/runs/since=000000000006/compaction-a1", 4, 6),
             tier_run("s/runs/since=000000000007/compaction-b", 6, 7, buckets=1)]
    run = compaction_run(tiers, ["s/runs/ts=000000000006/w-1"])
    assert run["path"] == tiers[-1].path
    assert len(run["files"]) == 5 and run["rows"] == 7 * 7
    assert run["replaces"] == ["s/runs/ts=000000000006/w-1"]
    assert tier_runs(run, since=7) == tiers
    # A record written before tiers is one tier of every ts below since.
    legacy = {"path": "s/runs/since=000000000004/compaction-a", "files": list(tiers[0].files), "rows": 9,
              "replaces": []}
    assert tier_runs(legacy, since=4) == [TierRun(Tier(0, 4, 9), legacy["path"], tiers[0].files)]
    assert tier_runs(None, since=0) == []
    stray = {**run, "files": run["files"] + [{"path": "s/runs/since=000000000009/other/p.parquet"}]}
    with pytest.raises(IntegrityError, match="compacted file s/runs/since=000000000009/other/p.parquet"):
        tier_runs(stray, since=7)
