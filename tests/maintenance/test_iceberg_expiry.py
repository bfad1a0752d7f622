"""Snapshot expiry of published Iceberg tables (engine/maintenance/iceberg_expiry.py): the
decision (which snapshots stay, which files go) by properties over seeded histories of
publishes and every retention setting of a grid; then on real tables in the SQL catalog of
the consensus store (no Spark): storage bounded by the retention, every kept snapshot equal
to the shard's table at its since, and crashes after the expiry's commit and in the middle
of its deletions (by a hook) that the next expiry finishes."""

from __future__ import annotations

import itertools
import json
import math
import os
import random

import pytest

from airflow_upsert_provider.engine.errors import ConfigurationError, IntegrityError
from airflow_upsert_provider.engine.maintenance.iceberg import NOTHING_TO_PUBLISH, PUBLISHED, publish_iceberg
from airflow_upsert_provider.engine.maintenance.iceberg_expiry import (
    DEFAULT_KEEP_LAST,
    Retention,
    SnapshotEntry,
    SnapshotFiles,
    expire_snapshots,
    retention,
    snapshots_to_keep,
    unreferenced_files,
)
from tests.arrow_runs import commit_batch, compact_batches, expected_table
from tests.conftest import sqlite_only
from tests.helpers import make_shard, run_cli
from tests.maintenance.test_iceberg import TABLE, by_key, catalog, cli_shard, commit_batches, files_below  # noqa: F401

# -- pure: retention settings ----------------------------------------------------------------


def test_retention_defaults_and_refuses_a_bad_value_naming_it():
    assert retention() == Retention(DEFAULT_KEEP_LAST, 0.0)
    assert retention(3, 3600) == Retention(3, 3600.0)
    for keep_last in (0, -1, 1.5, "3", True):
        with pytest.raises(ConfigurationError, match="keep_last") as raised:
            retention(keep_last=keep_last)
        assert raised.value.details["field"] == "keep_last" and repr(keep_last) in str(raised.value)
    for keep_within in (-1, math.inf, math.nan, "1h", False):
        with pytest.raises(ConfigurationError, match="keep_within") as raised:
            retention(keep_within_seconds=keep_within)
        assert raised.value.details["field"] == "keep_within"


# -- pure: which snapshots stay, which files go ------------------------------------------------


def random_history(rng: random.Random, publishes: int, buckets: int):
    """A table's snapshots as publishes leave them: each publish rewrites some buckets (new
    data files, a new manifest) and keeps the others' files (through the previous manifests,
    some carried over whole); one manifest list each. (entries, files by snapshot id)."""
    entries: list[SnapshotEntry] = []
    files: dict[int, SnapshotFiles] = {}
    live = {b: f"data/b{b}-0.parquet" for b in range(buckets)}
    manifests: list[str] = ["m-0"]
    clock = 0
    for n in range(1, publishes + 1):
        changed = rng.sample(range(buckets), rng.randrange(0, buckets + 1))
        for b in changed:
            live[b] = f"data/b{b}-{n}.parquet"
        # Untouched snapshots keep a manifest now and then; a rewrite always adds one.
        manifests = ([m for m in manifests if rng.random() < 0.5] if changed else manifests) + [f"m-{n}"]
        clock += rng.randrange(1, 5000)
        snapshot_id = 1000 + n * 7
        entries.append(SnapshotEntry(snapshot_id, clock, n))
        files[snapshot_id] = SnapshotFiles(f"snap-{n}.avro", frozenset(manifests), frozenset(live.values()))
    return entries, files


RETENTIONS = [Retention(last, within) for last in (1, 2, 3, 5, 10, 13) for within in (0.0, 0.001, 2.5, 7.0, 1e6)]


def test_the_kept_snapshots_are_the_current_the_protected_the_newest_n_and_the_young_ones():
    rng = random.Random(35)
    cases = 0
    for seed, publishes in itertools.product(range(20), range(1, 13)):
        entries, _files = random_history(random.Random(seed), publishes, 4)
        current = entries[-1].snapshot_id
        now = entries[-1].timestamp_ms + rng.randrange(0, 3000)
        protected = [e.snapshot_id for e in rng.sample(entries, rng.randrange(0, 2))]
        for policy in RETENTIONS:
            kept = snapshots_to_keep(entries, current, protected, policy, now)
            newest = [e.snapshot_id for e in sorted(entries, key=lambda e: e.sequence_number)][-policy.keep_last:]
            young = {e.snapshot_id for e in entries if now - e.timestamp_ms < policy.keep_within_seconds * 1000}
            assert current in kept and set(protected) <= kept
            assert set(newest) <= kept and young <= kept
            # Nothing else: storage is bounded by the setting.
            assert kept == set(newest) | young | set(protected) | {current}
            if policy.keep_within_seconds == 0 and not protected:
                assert len(kept) == min(policy.keep_last, publishes)
            # More retention never keeps less.
            wider = snapshots_to_keep(entries, current, protected,
                                      Retention(policy.keep_last + 1, policy.keep_within_seconds * 2), now)
            assert kept <= wider
            cases += 1
    assert cases == 20 * 12 * len(RETENTIONS)


def test_expiry_deletes_exactly_the_files_no_kept_snapshot_references():
    for seed, publishes in itertools.product(range(30), range(1, 12)):
        rng = random.Random(seed)
        entries, files = random_history(rng, publishes, rng.randrange(1, 6))
        now = entries[-1].timestamp_ms
        for policy in RETENTIONS:
            kept = snapshots_to_keep(entries, entries[-1].snapshot_id, (), policy, now)
            previous = [f"v{n}.metadata.json" for n in range(publishes)]
            plan = unreferenced_files(files, kept, previous)
            kept_files = {p for i in kept for p in (files[i].manifest_list, *files[i].manifests, *files[i].data)}
            all_files = {p for f in files.values() for p in (f.manifest_list, *f.manifests, *f.data)}
            deleted = {*plan.data, *plan.manifests, *plan.manifest_lists}
            assert not deleted & kept_files, "a file a kept snapshot reads would be deleted"
            assert deleted == all_files - kept_files, "a file only expired snapshots read would stay"
            assert set(plan.metadata) == set(previous)
            # The levels do not overlap: each file is deleted once, at its level.
            assert len(plan) == len(deleted) + len(previous)
            assert {p for p in plan.data if not p.startswith("data/")} == set()
            # Nothing expires, nothing of a snapshot is deleted.
            assert not ({*unreferenced_files(files, set(files)).data} | set(unreferenced_files(files, set(files)).manifests))


# -- real tables -------------------------------------------------------------------------------


def local(path: str) -> str:
    return path.removeprefix("file://")


def referenced_files(table) -> set[str]:
    """Every file a reader of any of the table's snapshots opens, found by PyIceberg's own
    scan planning, and the current metadata file."""
    found = {local(table.metadata_location)}
    for snapshot in table.snapshots():
        found.add(local(snapshot.manifest_list))
        found |= {local(m.manifest_path) for m in snapshot.manifests(table.io)}
        found |= {local(task.file.file_path) for task in table.scan(snapshot_id=snapshot.snapshot_id).plan_files()}
    return found


def assert_on_disk_is_what_the_kept_snapshots_need(table, location: str) -> None:
    """The files under the table's location: every file a reader of a kept snapshot opens,
    the current metadata file, and for each kept snapshot but the current one exactly one
    previous metadata file whose current snapshot it is (the table can be registered from it)."""
    on_disk = files_below(location)
    referenced = referenced_files(table)
    assert referenced <= on_disk
    extra = on_disk - referenced
    assert all(path.endswith(".metadata.json") for path in extra), extra
    current_of = []
    for path in extra:
        with open(path, encoding="utf-8") as handle:
            current_of.append(json.load(handle)["current-snapshot-id"])
    current = table.current_snapshot().snapshot_id
    assert sorted(current_of) == sorted(s.snapshot_id for s in table.snapshots() if s.snapshot_id != current)


def publish_history(shard, catalog, history, rng, table: str, publishes: int, policy: Retention | None):
    """``publishes`` rounds of batches, a compaction and a publish; the since of each snapshot."""
    since_of: dict[int, int] = {}
    for _ in range(publishes):
        commit_batches(shard, rng, history, 2)
        since = shard.state().upper - 1
        compact_batches(shard, history, since)
        result = publish_iceberg(shard, catalog, table, retention=policy)
        assert result.outcome == PUBLISHED
        since_of[result.snapshot_id] = since
    return since_of


def assert_every_kept_snapshot_is_the_shard_at_its_since(table, shard, history, since_of) -> None:
    for snapshot in table.snapshots():
        scanned = table.scan(snapshot_id=snapshot.snapshot_id).to_arrow()
        assert by_key(scanned) == expected_table(shard.config, history, since_of[snapshot.snapshot_id])


@sqlite_only
def test_publishes_keep_the_last_n_snapshots_and_storage_stays_bounded(consensus, blob, tmp_path, catalog):
    shard = make_shard(consensus, blob, tmp_path, buckets=2)
    rng = random.Random(5)
    history: list[dict] = []
    since_of: dict[int, int] = {}
    location = None
    for round_ in range(1, 7):
        since_of |= publish_history(shard, catalog, history, rng, TABLE, 1, Retention(keep_last=3))
        table = catalog.load_table(TABLE)
        location = local(table.location())
        assert len(table.snapshots()) == min(round_, 3)
        assert table.current_snapshot().snapshot_id == max(since_of, key=since_of.get)
        # On disk: exactly what the kept snapshots read, the current metadata file, and one
        # metadata file per older kept snapshot.
        assert_on_disk_is_what_the_kept_snapshots_need(table, location)
        assert_every_kept_snapshot_is_the_shard_at_its_since(table, shard, history, since_of)
    # The same since again publishes nothing and deletes nothing.
    again = publish_iceberg(shard, catalog, TABLE, retention=Retention(keep_last=3))
    assert (again.outcome, again.expired, again.deleted_files) == (NOTHING_TO_PUBLISH, 0, 0)

    # Without expiry, every publish's files stay.
    unbounded = "analytics.unbounded"
    publish_history(shard, catalog, history, rng, unbounded, 6, None)
    kept_all = catalog.load_table(unbounded)
    assert len(kept_all.snapshots()) == 6
    previous = {local(entry.metadata_file) for entry in kept_all.metadata.metadata_log}
    assert files_below(local(kept_all.location())) == referenced_files(kept_all) | previous
    assert len(files_below(local(kept_all.location()))) > len(files_below(location))


@sqlite_only
@pytest.mark.parametrize("crash_at", ["expired", "delete:1", "delete:middle", "delete:last"])
def test_a_crash_in_an_expiry_leaves_every_kept_snapshot_readable_and_the_next_expiry_finishes(
    consensus, blob, tmp_path, catalog, crash_at
):
    shard = make_shard(consensus, blob, tmp_path, buckets=2)
    rng = random.Random(11)
    history: list[dict] = []
    since_of = publish_history(shard, catalog, history, rng, TABLE, 4, None)
    table = catalog.load_table(TABLE)
    location = local(table.location())
    before = files_below(location)

    steps: list[str] = []
    with pytest.raises(KeyboardInterrupt):
        def count_then_stop(step: str) -> None:
            steps.append(step)
            if step == "expired":
                raise KeyboardInterrupt(step)

        expire_snapshots(table, Retention(keep_last=1), now_ms=0, on_step=count_then_stop)
    assert steps == ["expired"]
    table = catalog.load_table(TABLE)
    # Committed (one more metadata file), nothing deleted.
    assert len(table.snapshots()) == 1 and files_below(location) == before | {local(table.metadata_location)}
    before = files_below(location)
    # What a whole expiry deletes: everything but what the one kept snapshot reads.
    deletions = len(before - referenced_files(table))
    assert deletions > 4, "the expiry deletes too little for a crash in its middle to mean anything"

    if crash_at != "expired":
        stop_at = {"delete:1": 1, "delete:middle": deletions // 2, "delete:last": deletions}[crash_at]
        seen = 0

        def crash(step: str) -> None:
            nonlocal seen
            if step == "delete":
                seen += 1
                if seen == stop_at:
                    raise KeyboardInterrupt(f"before deletion {seen}")

        with pytest.raises(KeyboardInterrupt, match=f"before deletion {stop_at}"):
            expire_snapshots(catalog.load_table(TABLE), Retention(keep_last=1), now_ms=0, on_step=crash)
        table = catalog.load_table(TABLE)
        left = files_below(location)
        assert before >= left >= referenced_files(table)
        assert len(before) - len(left) == stop_at - 1
    # Readable at every kept snapshot, whatever was left.
    table = catalog.load_table(TABLE)
    assert referenced_files(table) <= files_below(location)
    assert_every_kept_snapshot_is_the_shard_at_its_since(table, shard, history, since_of)

    # The next expiry (here: the next publish's) deletes what was left, and nothing more.
    commit_batch(shard, [{"id": 1, "name": "x", "amount": 1.0, "updated_at": 9, "_deleted": False}])
    history.append({"id": 1, "name": "x", "amount": 1.0, "updated_at": 9, "_deleted": False,
                    "_ts": shard.state().upper - 1})
    compact_batches(shard, history, shard.state().upper)
    result = publish_iceberg(shard, catalog, TABLE, retention=Retention(keep_last=2))
    since_of[result.snapshot_id] = shard.state().since
    table = catalog.load_table(TABLE)
    assert len(table.snapshots()) == 2 and result.expired == 0 and result.deleted_files > 0
    assert_on_disk_is_what_the_kept_snapshots_need(table, location)
    assert_every_kept_snapshot_is_the_shard_at_its_since(table, shard, history, since_of)


@sqlite_only
def test_a_missing_file_of_a_kept_snapshot_stops_the_expiry_before_any_deletion(consensus, blob, tmp_path, catalog):
    shard = make_shard(consensus, blob, tmp_path, buckets=2)
    publish_history(shard, catalog, [], random.Random(2), TABLE, 3, None)
    table = catalog.load_table(TABLE)
    [manifest, *_] = table.current_snapshot().manifests(table.io)
    os.remove(local(manifest.manifest_path))
    before = files_below(local(table.location()))
    with pytest.raises(IntegrityError, match="of kept snapshot .* is missing") as raised:
        expire_snapshots(table, Retention(keep_last=1), now_ms=0)
    assert raised.value.details["file"] == manifest.manifest_path
    assert files_below(local(table.location())) == before


def test_upsertctl_publish_refuses_a_bad_retention_naming_it(cli_shard, capsys):
    code, out, err = run_cli(capsys, "publish", "orders", "--iceberg", TABLE, "--keep-last", "0")
    assert code == 2 and "keep_last" in err and "not 0" in err, (code, out, err)
    code, out, err = run_cli(capsys, "publish", "orders", "--iceberg", TABLE, "--keep-within", "-5")
    assert code == 2 and "keep_within" in err, (code, out, err)


def test_upsertctl_publish_applies_the_retention(cli_shard, capsys):
    shard, history = cli_shard
    reports = []
    for since in (2, 3, 4):
        if since > 2:
            commit_batches(shard, random.Random(since), history, 1)
            compact_batches(shard, history, since)
        code, out, err = run_cli(capsys, "publish", "orders", "--iceberg", TABLE, "--keep-last", "1", "--json")
        assert code == 0, err
        reports.append(json.loads(out))
    assert [(r["outcome"], r["since"], r["expired"]) for r in reports] == [
        ("published", 2, 0), ("published", 3, 1), ("published", 4, 1)]
    assert all(r["deleted_files"] > 0 for r in reports[1:])
    code, out, err = run_cli(capsys, "publish", "orders", "--iceberg", TABLE)
    assert code == 0 and out.startswith("nothing to publish"), err


@sqlite_only
def test_the_operator_applies_its_retention_and_refuses_a_bad_one(consensus, blob, tmp_path, catalog, monkeypatch):
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_upsert_provider.operators.maintenance import PublishIcebergOperator

    monkeypatch.setenv("AIRFLOW_CONN_UPSERT_DEFAULT", json.dumps(
        {"conn_type": "upsert", "extra": {"consensus_url": consensus.url, "blob_root": blob.root}}))
    shard = make_shard(consensus, blob, tmp_path, buckets=2)
    history: list[dict] = []
    rng = random.Random(8)
    results = []
    for _ in range(3):
        commit_batches(shard, rng, history, 2)
        compact_batches(shard, history, shard.state().upper)
        results.append(PublishIcebergOperator(task_id="publish", shard="orders", table=TABLE, keep_last=2).execute({}))
    assert [r["expired"] for r in results] == [0, 0, 1]
    table = catalog.load_table(TABLE)
    assert [s.snapshot_id for s in table.snapshots()] == [r["snapshot_id"] for r in results[1:]]
    assert_on_disk_is_what_the_kept_snapshots_need(table, local(table.location()))
    for bad, field in (({"keep_last": 0}, "keep_last"), ({"keep_within": -1.0}, "keep_within")):
        with pytest.raises(AirflowFailException, match=field):
            PublishIcebergOperator(task_id="publish", shard="orders", table=TABLE, **bad).execute({})
    assert len(catalog.load_table(TABLE).snapshots()) == 2
