"""What a checkpoint reads (checkpoint_plan, pure): property sweeps over seeded histories of
batches, compactions, damage, incremental and full checkpoints and crashed checkpoints."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field

from airflow_upsert_provider.engine.maintenance.checkpoint_plan import (
    HASH,
    SIZE,
    count_checks,
    hashed_files,
    plan_file_checks,
)

GOOD, FLIPPED, RESIZED, MISSING = "good", "flipped", "resized", "missing"


@dataclass
class World:
    """The blob as a model: each file's recorded size and SHA-256 and what it holds now."""

    rng: random.Random
    sizes: dict[str, int] = field(default_factory=dict)
    recorded: dict[str, str | None] = field(default_factory=dict)
    state: dict[str, str] = field(default_factory=dict)
    live: list[str] = field(default_factory=list)
    serial: itertools.count = field(default_factory=itertools.count)

    def new_file(self, legacy: bool) -> str:
        path = f"orders/ts={next(self.serial)}/part-0.parquet"
        self.sizes[path] = self.rng.randint(100, 10_000)
        # A run written before checksums were recorded has none: its first checkpoint hashes it.
        self.recorded[path] = None if legacy else f"sha-{path}"
        self.state[path] = GOOD
        return path

    def listed(self) -> list[dict]:
        return [{"path": p, "bytes": self.sizes[p], "sha256": self.recorded[p]} for p in self.live]

    def problem(self, check) -> str | None:
        """What doing ``check`` finds: hashing finds any damage, a size check only a file gone or
        resized."""
        state = self.state[check.path]
        if state in (MISSING, RESIZED):
            return state
        if check.how == HASH and state == FLIPPED:
            return "checksum"
        return None


def history(seed: int, steps: int, damage_rate: float, crash_rate: float, full_rate: float) -> None:
    rng = random.Random(seed)
    world = World(rng)
    committed: list[list[dict]] = []  # the manifests' files, oldest first
    # Paths a committed checkpoint hashed while they were good: the only ones a manifest may list.
    hashed_by_committed: set[str] = set()
    damaged_after_hash: set[str] = set()
    hashes_of: dict[str, int] = {}
    for _ in range(steps):
        event = rng.random()
        if event < 0.3:
            world.live += [world.new_file(legacy=rng.random() < 0.1) for _ in range(rng.randint(1, 3))]
        elif event < 0.4 and world.live:
            replaced = set(rng.sample(world.live, rng.randint(1, len(world.live))))
            world.live = [p for p in world.live if p not in replaced] + [world.new_file(legacy=False)]
        elif event < 0.4 + damage_rate and world.live:
            victim = rng.choice(world.live)
            world.state[victim] = rng.choice([FLIPPED, RESIZED, MISSING])
            if victim in hashed_by_committed:
                damaged_after_hash.add(victim)
        else:
            full = rng.random() < full_rate
            trusted = hashed_files(committed[-1]) if committed else {}
            checks = plan_file_checks(world.listed(), trusted, full=full)
            assert [c.path for c in checks] == world.live
            counts = count_checks(checks)
            if full:
                assert counts["size_checked"] == 0
            else:
                # Only what the newest committed checkpoint did not hash is read.
                new = [p for p in world.live if p not in trusted]
                assert counts["hashed"] == len(new), (seed, counts, new)
            for check in checks:
                if check.how == SIZE:
                    assert trusted[check.path] == (check.bytes, check.sha256)
            problems = {c.path: world.problem(c) for c in checks if world.problem(c) is not None}
            # Damage a checkpoint cannot miss: a file gone or resized, anything never hashed, and
            # anything at all when full.
            must_catch = {p for p in world.live if world.state[p] in (MISSING, RESIZED)
                          or (world.state[p] == FLIPPED and (full or p not in hashed_by_committed))}
            assert must_catch <= set(problems), (seed, must_catch, problems)
            if problems:
                continue  # refused: nothing written
            if rng.random() < crash_rate:
                continue  # crashed before its catalog entry: nothing it hashed is trusted
            for check in checks:
                if check.how == HASH:
                    hashed_by_committed.add(check.path)
                    hashes_of[check.path] = hashes_of.get(check.path, 0) + 1
            manifest = [{"path": c.path, "bytes": c.bytes, "sha256": c.sha256 or f"sha-{c.path}"} for c in checks]
            # Never names as verified a file no committed checkpoint hashed.
            assert {f["path"] for f in manifest} <= hashed_by_committed
            committed.append(manifest)
    # Incremental checkpoints of an undamaged file read it once; a full one reads it again.
    if full_rate == 0.0:
        assert all(n == 1 for n in hashes_of.values()), (seed, hashes_of)
    # A file damaged after it was hashed is caught by a full verify of any manifest listing it.
    for manifest in committed:
        full_checks = plan_file_checks(manifest, hashed_files(manifest), full=True)
        caught = {c.path for c in full_checks if world.problem(c) is not None}
        assert {f["path"] for f in manifest if world.state[f["path"]] != GOOD} == caught


def test_an_incremental_checkpoint_hashes_each_file_once_and_never_trusts_an_unhashed_one():
    grid = itertools.product([5, 40, 120], [0.0, 0.1, 0.3], [0.0, 0.3], [0.0, 0.2])
    runs = 0
    for steps, damage_rate, crash_rate, full_rate in grid:
        for seed in range(25):
            history(seed, steps, damage_rate, crash_rate, full_rate)
            runs += 1
    assert runs == 3 * 3 * 2 * 2 * 25


def test_a_file_is_trusted_only_with_the_same_path_size_and_recorded_sha256():
    trusted = {"a": (10, "x"), "b": (10, "y"), "c": (10, "z")}
    files = [
        {"path": "a", "bytes": 10, "sha256": "x"},  # same: size only
        {"path": "b", "bytes": 11, "sha256": "y"},  # another size
        {"path": "c", "bytes": 10, "sha256": "other"},  # another recorded checksum
        {"path": "d", "bytes": 10, "sha256": "x"},  # never hashed
        {"path": "c", "bytes": 10, "sha256": None},  # none recorded: the one hashed is kept
    ]
    checks = plan_file_checks(files, trusted, full=False)
    assert [(c.path, c.how, c.sha256) for c in checks] == [
        ("a", SIZE, "x"), ("b", HASH, "y"), ("c", HASH, "other"), ("d", HASH, "x"), ("c", SIZE, "z"),
    ]
    assert [c.how for c in plan_file_checks(files, trusted, full=True)] == [HASH] * 5
    assert count_checks(checks) == {"hashed": 3, "size_checked": 2}
