"""GC from state (gc_plan.plan_from_state), pure: seeded histories of batches, compactions,
checkpoints and GCs that crash between claim, delete and forget, without Spark, a database
or a blob. The history model holds what the store and the blob hold: the replacement rows,
the run directories on disk, live state and the checkpoints' pins."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest

from airflow_upsert_provider.engine.maintenance.gc_plan import (
    NOT_A_RUN,
    PINNED,
    REPLACED_IN_GRACE,
    Replaced,
    is_run_dir_of,
    plan_from_state,
)

SHARD = "s"
GRACES = (0.0, 1.0, 5.0, 30.0)
SEEDS = range(150)
CRASHES = ("none", "after_claim", "after_delete")


@dataclass
class History:
    """A shard as the store and the blob hold it, advanced one event at a time."""

    now: float = 0.0
    upper: int = 0
    since: int = 0
    live: list[str] = field(default_factory=list)  # the compacted tiers, then batches from since on
    on_disk: set[str] = field(default_factory=set)
    replaced_rows: dict[str, float] = field(default_factory=dict)  # upsert_replaced_runs
    replaced_ever: dict[str, float] = field(default_factory=dict)
    checkpoints: list[frozenset[str]] = field(default_factory=list)
    deleted: set[str] = field(default_factory=set)

    def commit(self) -> None:
        path = f"{SHARD}/runs/ts={self.upper:012d}/w-{self.upper}"
        self.on_disk.add(path)
        self.live.append(path)
        self.upper += 1

    def compact(self, rng: random.Random) -> None:
        """Merge the newest runs (some tiers and every batch) into one new tier, as a swap does."""
        if not self.live:
            return
        keep = rng.randint(0, len(self.live) - 1)
        merged = self.live[keep:]
        self.since = self.upper
        output = f"{SHARD}/runs/since={self.since:012d}/c-{rng.randrange(16**6):06x}"
        self.on_disk.add(output)
        self.live = self.live[:keep] + [output]
        for path in merged:
            self.replaced_rows[path] = self.now
            self.replaced_ever[path] = self.now

    def pinned(self) -> set[str]:
        return set().union(*self.checkpoints) if self.checkpoints else set()

    def gc(self, grace: float, crash: str) -> None:
        """The shell's steps around the plan: claim, delete, forget; ``crash`` stops it."""
        referenced = set(self.live) | self.pinned()
        rows = [Replaced(path, at) for path, at in self.replaced_rows.items()]
        plan = plan_from_state(SHARD, rows, referenced, self.now - grace)
        planned = plan.delete + [p for paths in plan.pending.values() for p in paths]
        assert sorted(planned) == sorted(self.replaced_rows), "every row is deleted or pending, once"
        assert not set(plan.delete) & referenced, "a live or pinned run would be deleted"
        assert all(self.replaced_rows[p] < self.now - grace for p in plan.delete), "a run in grace"
        if crash == "after_claim":
            return
        self.on_disk -= set(plan.delete)
        self.deleted |= set(plan.delete)
        if crash == "after_delete":
            return
        for path in plan.delete:
            del self.replaced_rows[path]

    def check(self) -> None:
        # Nothing live or pinned is gone; every replaced run still on disk is still recorded.
        assert not (set(self.live) | self.pinned()) & self.deleted
        assert {p for p in self.replaced_ever if p in self.on_disk} <= set(self.replaced_rows)
        assert not self.deleted - set(self.replaced_ever), "only replaced runs are deleted"


def run_history(seed: int, grace: float) -> History:
    rng = random.Random(seed)
    history = History()
    for _ in range(rng.randint(5, 60)):
        history.now += rng.choice((0.0, 0.5, 1.0, 3.0, 10.0))
        event = rng.random()
        if event < 0.45:
            history.commit()
        elif event < 0.65:
            history.compact(rng)
        elif event < 0.75:
            history.checkpoints.append(frozenset(history.live))
        elif event < 0.82 and history.checkpoints:
            history.checkpoints.pop(rng.randrange(len(history.checkpoints)))
        else:
            history.gc(grace, rng.choice(CRASHES))
        history.check()
    return history


@pytest.mark.parametrize("grace", GRACES)
def test_no_history_of_crashed_gcs_deletes_a_live_pinned_or_young_run_or_forgets_one(grace):
    for seed in SEEDS:
        run_history(seed, grace)  # every step checks the properties


@pytest.mark.parametrize("grace", GRACES)
def test_once_nothing_pins_them_and_grace_passed_one_gc_deletes_every_replaced_run(grace):
    for seed in SEEDS:
        history = run_history(seed, grace)
        history.checkpoints.clear()
        history.now += grace + 1
        history.gc(grace, "none")
        assert history.replaced_rows == {}, seed
        assert not set(history.replaced_ever) & history.on_disk, seed
        assert set(history.live) <= history.on_disk, seed


def test_a_row_pinned_by_a_checkpoint_stays_pending_until_the_checkpoint_goes():
    history = History()
    for _ in range(3):
        history.commit()
    history.checkpoints.append(frozenset(history.live))
    history.compact(random.Random(1))
    history.now = 100.0
    pinned = sorted(history.replaced_rows)
    history.gc(10.0, "none")
    assert sorted(history.replaced_rows) == pinned and set(pinned) <= history.on_disk
    history.checkpoints.clear()
    history.gc(10.0, "none")
    assert history.replaced_rows == {} and not set(pinned) & history.on_disk


def test_the_plan_names_the_reason_each_replacement_stays():
    rows = [
        Replaced(f"{SHARD}/runs/ts=1/a", 0.0),
        Replaced(f"{SHARD}/runs/ts=2/b", 0.0),
        Replaced(f"{SHARD}/runs/ts=3/c", 95.0),
        Replaced(f"{SHARD}/runs/ts=4", 0.0),  # a group, not a run directory
        Replaced(f"{SHARD}/runs/ts=5/d/_bucket=0", 0.0),
        Replaced(f"{SHARD}x/runs/ts=6/e", 0.0),
    ]
    plan = plan_from_state(SHARD, rows, {f"{SHARD}/runs/ts=2/b"}, cutoff=90.0)
    assert plan.delete == [f"{SHARD}/runs/ts=1/a"]
    assert plan.pending == {
        PINNED: [f"{SHARD}/runs/ts=2/b"],
        REPLACED_IN_GRACE: [f"{SHARD}/runs/ts=3/c"],
        NOT_A_RUN: [f"{SHARD}/runs/ts=4", f"{SHARD}/runs/ts=5/d/_bucket=0", f"{SHARD}x/runs/ts=6/e"],
    }
    assert plan.pending_count() == 5 and plan.pending_count(PINNED, REPLACED_IN_GRACE) == 2


def test_a_run_directory_is_four_non_empty_parts_below_the_shards_runs():
    assert is_run_dir_of("s/runs/ts=1/w", "s")
    for path in ("s/runs/ts=1", "s/runs/ts=1/w/x", "s/runs//w", "t/runs/ts=1/w", "s/rejects/ts=1/w", "s/runs/ts=1/"):
        assert not is_run_dir_of(path, "s"), path
