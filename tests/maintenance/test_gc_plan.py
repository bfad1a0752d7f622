"""GC's plan (engine/maintenance/gc_plan.py), pure: properties over seeded random listings,
grace periods and references, without Spark, a database or a blob."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from airflow_upsert_provider.engine.maintenance.gc_plan import (
    ABANDONED_CHECKPOINT,
    FOREIGN,
    IN_GRACE,
    REFERENCED,
    REJECTS,
    REPLACED_IN_GRACE,
    RUN,
    TEMPORARY_FILE,
    UNLISTED_CHECKPOINT,
    UNLISTED_FILE,
    CheckpointListing,
    GcInputs,
    Listed,
    is_run_data_file,
    plan_gc,
    unreadable_catalog_stops_gc,
)
from airflow_upsert_provider.engine.store.gc_claims import run_dir_of_relative

NOW = 1_000_000.0
SHARD = "s"
GRACES = (0.0, 1.0, 60.0, 600.0, 6 * 3600.0)
AGES = (0.0, 0.5, 1.0, 30.0, 59.0, 60.0, 61.0, 599.0, 600.0, 601.0, 3600.0, 6 * 3600.0, 86400.0)
SEEDS = range(300)


def random_listing(rng: random.Random):
    """(inputs without grace, the listed run files, directory ages): run directories of data
    files and Spark companions, some named by live state or a checkpoint, some replaced by a
    compaction, and foreign files where a run directory or group is expected."""
    files: list[Listed] = []
    dirs: list[Listed] = []
    referenced_files: set[str] = set()
    referenced_dirs: set[str] = set()
    replaced: set[str] = set()
    for g in range(rng.randint(0, 3)):
        group = f"{SHARD}/runs/ts={g:012d}"
        for w in range(rng.randint(0, 3)):
            run_dir = f"{group}/w{w}-{rng.randrange(16**6):06x}"
            dirs.append(Listed(run_dir, 0, NOW - rng.choice(AGES)))
            named = rng.random() < 0.5
            if named:
                referenced_dirs.add(run_dir)
            for b in range(rng.randint(0, 2)):
                dirs.append(Listed(f"{run_dir}/_bucket={b}", 0, NOW - rng.choice(AGES)))
                for t in range(rng.randint(0, 3)):
                    name = f"part-t{t}-{rng.randrange(16**8):08x}.parquet"
                    path = f"{run_dir}/_bucket={b}/{name}"
                    files.append(Listed(path, rng.randint(1, 99), NOW - rng.choice(AGES)))
                    if named and rng.random() < 0.7:
                        referenced_files.add(path)
                    if rng.random() < 0.3:  # Spark's checksum companion
                        files.append(Listed(f"{run_dir}/_bucket={b}/.{name}.crc", 1, NOW - rng.choice(AGES)))
            if rng.random() < 0.3:
                files.append(Listed(f"{run_dir}/_SUCCESS", 0, NOW - rng.choice(AGES)))
            if rng.random() < 0.2:
                replaced.add(run_dir)
        if rng.random() < 0.3:
            files.append(Listed(f"{group}/notes.txt", 5, NOW - rng.choice(AGES)))
    if rng.random() < 0.3:
        files.append(Listed(f"{SHARD}/runs/foreign.txt", 8, NOW - rng.choice(AGES)))
    return files, dirs, referenced_files, referenced_dirs, replaced


def inputs_for(rng: random.Random, grace: float) -> GcInputs:
    files, dirs, referenced_files, referenced_dirs, replaced = random_listing(rng)
    return GcInputs(
        shard_id=SHARD, run_files=files, run_dirs=dirs, referenced_files=referenced_files,
        referenced_dirs=referenced_dirs, replaced_in_grace=replaced, live_files=set(referenced_files),
        cutoff=NOW - grace,
    )


def sweep(grace: float):
    """(seed, inputs, plan) for every seed of the sweep at ``grace``."""
    for seed in SEEDS:
        inputs = inputs_for(random.Random(seed), grace)
        yield seed, inputs, plan_gc(inputs)


def covered(path: str, items) -> bool:
    return any(path == i.path or path.startswith(i.path + "/") for i in items)


def provably_garbage(f: Listed, inputs: GcInputs) -> bool:
    """The rule, written from the docs: a file GC must delete."""
    if f.path.count("/") < 4:
        return False  # foreign
    run_dir = run_dir_of_relative(f.path)
    if run_dir in inputs.referenced_dirs:
        return f.path not in inputs.referenced_files and is_run_data_file(f.path) and f.mtime < inputs.cutoff
    ages = [g.mtime for g in inputs.run_files if run_dir_of_relative(g.path) == run_dir and g.path.count("/") >= 4]
    ages += [d.mtime for d in inputs.run_dirs if run_dir_of_relative(d.path) == run_dir]
    return max(ages) < inputs.cutoff and run_dir not in inputs.replaced_in_grace


@pytest.mark.parametrize("grace", GRACES)
def test_the_plan_never_deletes_a_referenced_young_replaced_or_foreign_file(grace):
    for seed, inputs, plan in sweep(grace):
        for f in inputs.run_files:
            if not covered(f.path, plan.delete):
                continue
            context = (seed, grace, f)
            assert f.path not in inputs.referenced_files, context
            assert f.mtime < inputs.cutoff, context
            assert f.path.count("/") >= 4, context
            run_dir = run_dir_of_relative(f.path)
            assert run_dir not in inputs.replaced_in_grace or run_dir in inputs.referenced_dirs, context
            if run_dir in inputs.referenced_dirs:
                assert is_run_data_file(f.path), context  # a companion stays with its directory
        for item in plan.delete:
            assert item.kind in (RUN, UNLISTED_FILE), (seed, grace, item)
            # No directory a writer touched inside the grace period.
            assert all(d.mtime < inputs.cutoff for d in inputs.run_dirs if covered(d.path, [item])), (seed, item)


@pytest.mark.parametrize("grace", GRACES)
def test_the_plan_deletes_every_provably_unreferenced_file_older_than_grace(grace):
    for seed, inputs, plan in sweep(grace):
        for f in inputs.run_files:
            assert covered(f.path, plan.delete) == provably_garbage(f, inputs), (seed, grace, f)


@pytest.mark.parametrize("grace", GRACES)
def test_every_listed_file_is_deleted_or_kept_for_a_reason_once(grace):
    for seed, inputs, plan in sweep(grace):
        assert plan.files_scanned == len(inputs.run_files)
        assert sum(i.files for i in plan.delete) + sum(k.files for k in plan.kept) == len(inputs.run_files), seed
        assert {k.reason for k in plan.kept} <= {REFERENCED, IN_GRACE, REPLACED_IN_GRACE, FOREIGN}
        foreign = {f.path for f in inputs.run_files if f.path.count("/") < 4}
        assert {k.path for k in plan.foreign} == foreign, seed
        assert not any(covered(p, plan.delete) for p in foreign), seed
        assert plan.missing_live == []  # every live file was listed


def test_a_foreign_file_where_a_run_directory_belongs_is_reported_never_deleted():
    old = NOW - 86400
    inputs = GcInputs(
        shard_id=SHARD,
        run_files=[Listed("s/runs/foreign.txt", 8, old), Listed("s/runs/ts=000000000001/notes", 3, old),
                   Listed("s/runs/ts=000000000001/w-1/_bucket=0/part-t0-1.parquet", 10, old)],
        run_dirs=[Listed("s/runs/ts=000000000001", 0, old), Listed("s/runs/ts=000000000001/w-1", 0, old)],
        referenced_files=(), referenced_dirs=(), replaced_in_grace=(), live_files=(), cutoff=NOW,
    )
    plan = plan_gc(inputs)
    assert [(i.path, i.kind, i.files, i.bytes) for i in plan.delete] == [("s/runs/ts=000000000001/w-1", RUN, 1, 10)]
    assert [(k.path, k.reason, k.bytes) for k in plan.foreign] == [
        ("s/runs/foreign.txt", FOREIGN, 8), ("s/runs/ts=000000000001/notes", FOREIGN, 3)]


def test_a_live_file_not_in_the_listing_is_missing_and_nothing_else_is():
    for seed in SEEDS:
        rng = random.Random(seed)
        inputs = inputs_for(rng, 600.0)
        absent = {f"s/runs/ts=000000000009/w-{i}/_bucket=0/part-t0-{i}.parquet" for i in range(rng.randint(0, 3))}
        inputs = replace(inputs, live_files=set(inputs.live_files) | absent)
        plan = plan_gc(inputs)
        assert plan.missing_live == sorted(absent), seed
        assert not any(covered(p, plan.delete) for p in absent)


def test_an_empty_listing_of_a_shard_with_live_files_is_not_trusted():
    """What a store that omits nested prefixes from delimiter listings returns: nothing below
    runs/. The plan names every live file committed before the listing."""
    live = {f"s/runs/ts={t:012d}/w/_bucket=0/part-t0-{t}.parquet" for t in range(3)}
    inputs = GcInputs(shard_id=SHARD, run_files=[], run_dirs=[], referenced_files=set(live),
                      referenced_dirs={run_dir_of_relative(p) for p in live}, replaced_in_grace=(),
                      live_files=live, cutoff=NOW)
    assert plan_gc(inputs).missing_live == sorted(live)


@pytest.mark.parametrize("grace", GRACES)
def test_checkpoints_rejects_and_temporary_files_follow_their_own_rules(grace):
    cutoff = NOW - grace
    for seed in SEEDS:
        rng = random.Random(seed)
        checkpoints = {}
        for c in range(rng.randint(0, 4)):
            files = tuple(Listed(f"s/checkpoints/c{c}/f{i}", 2, NOW - rng.choice(AGES)) for i in range(rng.randint(0, 3)))
            checkpoints[f"c{c}"] = CheckpointListing(files, (NOW - rng.choice(AGES),), committed=rng.random() < 0.5)
        catalog = {name for name in checkpoints if rng.random() < 0.5}
        temporary = [Listed(f"s/checkpoints/{rng.choice(['c0', 'c1', '.tmp-catalog'])}/.tmp-{i}", 1, NOW - rng.choice(AGES))
                     for i in range(rng.randint(0, 2))]
        since = rng.randint(0, 4)
        retention = rng.choice([1.0, 600.0, 86400.0 * 2])
        rejects = [Listed(f"s/rejects/ts={t:012d}/w{t}/part-t0.json", 3, NOW - rng.choice(AGES)) for t in range(5)]
        live_rejects = {run_dir_of_relative(r.path) for r in rejects if rng.random() < 0.2}
        inputs = GcInputs(
            shard_id=SHARD, run_files=[], run_dirs=[], referenced_files=(), referenced_dirs=live_rejects,
            replaced_in_grace=(), live_files=(), cutoff=cutoff, checkpoints=checkpoints,
            catalog_listed=catalog, temporary_files=temporary, rejects_files=rejects, rejects_dirs=[],
            rejects_cutoff=NOW - retention, since=since,
        )
        plan = plan_gc(inputs)
        deleted = {i.path: i.kind for i in plan.delete}
        doomed = set()
        for name, listing in checkpoints.items():
            path = f"s/checkpoints/{name}"
            old = all(f.mtime < cutoff for f in listing.files) and all(a < cutoff for a in listing.ages)
            expected = None if name in catalog or not old else (UNLISTED_CHECKPOINT if listing.committed else ABANDONED_CHECKPOINT)
            assert deleted.get(path) == expected, (seed, grace, name)
            if expected:
                doomed.add(name)
        for r in rejects:
            run_dir = run_dir_of_relative(r.path)
            ts = int(run_dir.split("/")[2].removeprefix("ts="))
            expected = ts < since and run_dir not in live_rejects and r.mtime < min(cutoff, NOW - retention)
            assert (deleted.get(run_dir) == REJECTS) == expected, (seed, grace, r)
        for t in temporary:
            expected = t.mtime < cutoff and t.path.split("/")[2] not in doomed
            assert (deleted.get(t.path) == TEMPORARY_FILE) == expected, (seed, grace, t)


def test_an_unreadable_catalog_stops_gc_only_in_a_directory_a_shard_of_the_store_owns() -> None:
    """The shard collected, and every shard of the store, stop GC on an unreadable catalog; any
    other directory of the root (a stray copy, a prefix of names, a dropped shard) does not."""
    rng = random.Random(34)
    alphabet = "ab-_.0é"
    for _ in range(300):
        names = {"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 6))}
        shard_id = rng.choice(sorted(names))
        shard_ids = set(rng.sample(sorted(names), rng.randint(0, len(names)))) | ({shard_id} if rng.random() < 0.5 else set())
        for directory in names | {shard_id + "-copy", shard_id[:-1] or "x", shard_id.upper()}:
            expected = directory == shard_id or directory in shard_ids
            assert unreadable_catalog_stops_gc(directory, shard_id, shard_ids) is expected, (directory, shard_id, shard_ids)
    # The shard collected stops GC even when the store's list of shards is read without it.
    assert unreadable_catalog_stops_gc("orders", "orders", ()) is True
    assert unreadable_catalog_stops_gc("orders-copy", "orders", ("orders", "returns")) is False


def test_empty_groups_are_the_old_group_directories_a_listing_shows_nothing_below():
    """The sweep removes ``ts=``/``since=`` directories from its one listing (no lookup per
    group): exactly the directories right below the root with no file and no directory below
    them, older than the cutoff."""
    from airflow_upsert_provider.engine.maintenance.gc_plan import empty_groups

    rng = random.Random(36)
    root = "s/runs"
    for _ in range(2000):
        groups = [f"{root}/{rng.choice(['ts', 'since'])}={i}" for i in range(rng.randrange(0, 8))]
        dirs, files = [], []
        for group in groups:
            dirs.append(Listed(group, 0, float(rng.randrange(20))))
            shape = rng.choice(["empty", "dir", "file", "deep"])
            if shape == "dir":
                dirs.append(Listed(f"{group}/w", 0, float(rng.randrange(20))))
            elif shape == "file":
                files.append(Listed(f"{group}/stray", 3, float(rng.randrange(20))))
            elif shape == "deep":
                files.append(Listed(f"{group}/w/_bucket=0/part-0.parquet", 3, float(rng.randrange(20))))
        files.append(Listed("s/runs-other/x", 1, 0.0))  # a sibling sharing the root's first characters
        cutoff = float(rng.randrange(21))
        below = {e.path.rsplit("/", 1)[0] for e in files + dirs} | {e.path.split("/w/")[0] for e in files}
        expected = sorted(d.path for d in dirs if d.path in groups and d.path not in below and d.mtime < cutoff)
        assert empty_groups(root, files, dirs, cutoff) == expected


def test_groups_are_deleted_whole_only_below_the_upper_when_nothing_else_a_commit_names_is_in_them():
    """Every case of a group on object storage: each kind of group (batch, compaction,
    rejects, a name that does not parse), each position against the upper and since, with and
    without a marker, a run directory being deleted, another listed file, or a referenced
    directory in it. A group at or above the upper (where a writer is about to stage) is never
    chosen."""
    from itertools import product

    from airflow_upsert_provider.engine.maintenance.gc_plan import removable_groups

    for upper, since in [(u, s) for u in range(0, 5) for s in range(0, u + 1)]:
        for area, kind, n, marker, going, other, referenced in product(
                ("runs", "rejects"), ("ts", "since", "bucket"), range(0, 6),
                (None, "group", "deep"), (False, True), (False, True), (False, True)):
            group = f"{SHARD}/{area}/{kind}={n:012d}"
            markers = {None: [], "group": [group], "deep": [f"{group}/w-1", f"{group}/w-1/_bucket=0"]}[marker]
            markers += [f"{SHARD}/runs", f"{SHARD}-other/runs/ts=000000000000"]  # above any group; another shard
            files = [Listed(f"{SHARD}/checkpoints/c1/MANIFEST.json", 1, 0.0)]
            deleting = []
            if going:
                files.append(Listed(f"{group}/w-4/_bucket=0/part-0.parquet", 1, 0.0))
                deleting.append(f"{group}/w-4")
            if other:
                files.append(Listed(f"{group}/w-2/_bucket=0/part-0.parquet", 1, 0.0))
            referenced = [f"{group}/w-3"] if referenced else []
            below_frontier = (kind == "ts" and n < upper) or (kind == "since" and n <= since)
            chosen = (marker or going) and not other and not referenced and below_frontier
            assert removable_groups(SHARD, files, markers, deleting, referenced, upper, since) == (
                [group] if chosen else []), (upper, since, group, marker, going, other, referenced)
