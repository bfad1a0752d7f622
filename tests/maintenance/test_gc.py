"""Garbage collection: what it deletes, what it never deletes, and races with checkpoint
commits, compactions and writers at every step either side exposes."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from airflow_upsert_provider.engine.maintenance.checkpoint import create_checkpoint, list_checkpoints
from airflow_upsert_provider.engine.maintenance.checkpoint_catalog import (
    MANIFEST_NAME,
    Catalog,
    CheckpointCorrupt,
    checkpoints_root,
)
from airflow_upsert_provider.engine.maintenance.checkpoint_restore import restore_checkpoint
from airflow_upsert_provider.engine.maintenance.checkpoint_retention import apply_retention
from airflow_upsert_provider.engine.maintenance.checkpoint_verify import verify_checkpoint
from airflow_upsert_provider.engine.maintenance.compaction import compact
from airflow_upsert_provider.engine.maintenance.gc import collect_garbage
from airflow_upsert_provider.engine.table.shard import Shard
from airflow_upsert_provider.engine.write.writer import Writer
from tests.conftest import sqlite_only
from tests.helpers import table
from tests.maintenance.support import age_compaction, age_files, files_of, oracle, tree, written_shard
from tests.oracle import table_from_rows

GRACE = 600


def lost_run(shard, ts: int) -> str:
    """A run directory of a writer whose append lost (a copy of a committed one)."""
    source = shard.blob.path(shard.batches()[ts].run["path"])
    target = os.path.join(os.path.dirname(source), "lost-writer-0123456789ab")
    shutil.copytree(source, target)
    return target


def stage_uncommitted(shard, spark):
    """A writer that staged batch ``upper`` and has not committed it yet."""
    writer = Writer(shard, "in-flight", spark_factory=lambda: spark)
    upper = shard.state().upper
    shard.mint_binding(upper, minted_by="in-flight")
    return writer, writer.stage(upper)


def test_gc_deletes_only_what_nothing_references(spark, consensus, blob, tmp_path):
    shard = written_shard(spark, consensus, blob, tmp_path, batches=4)
    batch_runs = [b.run for b in shard.batches()]
    old = create_checkpoint(shard)  # pins the four batch runs
    compact(spark, shard)
    lost = lost_run(shard, 1)
    age_files(blob.root)
    writer, staged = stage_uncommitted(shard, spark)  # young: the grace period protects it
    expected_lost = os.path.relpath(lost, blob.root)

    before = tree(blob.root)
    plan = collect_garbage(consensus, blob, shard.shard_id, grace_seconds=GRACE, dry_run=True)
    assert [(i.path, i.kind) for i in plan.items] == [(expected_lost, "run")]
    assert plan.bytes == sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(lost) for f in fs) > 0
    assert tree(blob.root) == before  # a dry run deletes nothing

    new = create_checkpoint(shard)
    apply_retention(Catalog.load(blob, shard.shard_id, consensus), keep_last=1)
    assert [e.id for e in list_checkpoints(blob, shard.shard_id)] == [new.id]
    age_files(checkpoints_root(blob, shard.shard_id))
    age_compaction(consensus, shard.shard_id)
    report = collect_garbage(consensus, blob, shard.shard_id, grace_seconds=GRACE)
    deleted = {i.path for i in report.items}
    assert deleted == {expected_lost} | {r["path"] for r in batch_runs}
    assert not os.path.exists(lost) and not any(os.path.exists(p) for p in files_of(blob, batch_runs))
    assert os.path.isdir(checkpoints_root(blob, shard.shard_id) + "/" + new.id)
    assert not os.path.exists(checkpoints_root(blob, shard.shard_id) + "/" + old.id)
    verify_checkpoint(blob, shard.shard_id, new.id)
    assert all(os.path.exists(p) for p in files_of(blob, [staged.run]))

    # The in-flight writer commits after GC: its batch is readable.
    assert writer.append(staged) == "committed"
    assert table(shard) == oracle(shard)


@sqlite_only
def test_gc_aborts_before_any_deletion_on_a_corrupt_retained_manifest(spark, consensus, blob, tmp_path):
    shard = written_shard(spark, consensus, blob, tmp_path, batches=2)
    create_checkpoint(shard)  # A
    Writer(shard, "w", spark_factory=lambda: spark).run(max_batches=1, with_lag=False)
    b = create_checkpoint(shard)  # B
    c = create_checkpoint(shard)  # C: every file of B is also in C
    compact(spark, shard)
    create_checkpoint(shard)  # D
    lost_run(shard, 0)
    root = checkpoints_root(blob, shard.shard_id)
    manifest_of = lambda e: json.load(open(os.path.join(root, e.id, MANIFEST_NAME)))  # noqa: E731
    c_files = files_of(blob, [manifest_of(c)])
    assert files_of(blob, [manifest_of(b)]) <= c_files
    c_manifest = os.path.join(root, c.id, MANIFEST_NAME)
    with open(c_manifest, "r+b") as handle:
        handle.truncate(os.path.getsize(c_manifest) // 2)
    age_files(blob.root)
    before = tree(blob.root)

    with pytest.raises(CheckpointCorrupt) as caught:
        collect_garbage(consensus, blob, shard.shard_id, grace_seconds=0)
    assert c_manifest in str(caught.value)
    assert tree(blob.root) == before
    assert all(os.path.exists(p) for p in c_files)


def test_a_read_planned_before_a_compaction_survives_gc(spark, consensus, blob, tmp_path):
    """GC keeps the runs a compaction replaced for its grace period after the swap."""
    shard = written_shard(spark, consensus, blob, tmp_path, batches=3)
    expected = table(shard)
    planned = shard.read(spark)  # lists the three batch runs
    replaced = {b.run["path"] for b in shard.batches()}
    compact(spark, shard)
    age_files(blob.root)
    report = collect_garbage(consensus, blob, shard.shard_id, grace_seconds=GRACE)
    in_replaced = sum(len(files) for p in replaced for _, _, files in os.walk(blob.path(p)))
    assert report.items == [] and report.kept_in_grace == in_replaced > 0
    assert table_from_rows(planned.collect()) == expected

    age_compaction(consensus, shard.shard_id)
    report = collect_garbage(consensus, blob, shard.shard_id, grace_seconds=GRACE)
    assert {i.path for i in report.items} == replaced
    assert table(shard) == expected


CHECKPOINT_STEPS = ["snapshot", "manifest", "commit", "catalog"]
GC_STEPS = ["listed", "state", "checkpoints", "deleting"]


def race_setup(spark, consensus, blob, tmp_path):
    shard = written_shard(spark, consensus, blob, tmp_path, batches=3)
    age_files(blob.root)
    writer, staged = stage_uncommitted(shard, spark)
    return shard, writer, staged


def race_outcome(spark, consensus, blob, shard, writer, staged, entry, expected_at_entry):
    """After the race: nothing referenced is gone, the checkpoint restores, the writer's
    commit is readable."""
    if shard.state().upper == staged.ts:
        assert writer.append(staged) == "committed"
    age_files(blob.root)
    collect_garbage(consensus, blob, shard.shard_id, grace_seconds=0)
    verify_checkpoint(blob, shard.shard_id, entry.id)
    restore_checkpoint(consensus, blob, shard.shard_id, entry.id, target_shard_id="restored")
    assert table(Shard.open(consensus, blob, "restored")) == expected_at_entry[entry.upper]
    assert table(shard) == oracle(shard)


@pytest.mark.parametrize("at", CHECKPOINT_STEPS)
def test_gc_and_compaction_inside_every_checkpoint_step(spark, sqlite_url, tmp_path, at):
    """At each step of a checkpoint commit a compaction moves since, GC runs to completion,
    and the writer commits its staged batch."""
    from airflow_upsert_provider.engine.blob.files import open_blob
    from airflow_upsert_provider.engine.store.registry import open_consensus

    consensus, blob = open_consensus(sqlite_url), open_blob(str(tmp_path / "blob"))
    shard, writer, staged = race_setup(spark, consensus, blob, tmp_path)
    expected = {3: table(shard), 4: None}

    def interleave(step: str) -> None:
        if step != at or expected.get("done"):
            return
        expected["done"] = True
        compact(spark, shard)
        age_files(os.path.join(blob.root, shard.shard_id, "runs", "since=000000000003"))
        age_compaction(consensus, shard.shard_id)
        collect_garbage(consensus, blob, shard.shard_id, grace_seconds=GRACE)
        assert writer.append(staged) == "committed"
        expected[4] = table(shard)

    entry = create_checkpoint(shard, on_step=interleave)
    race_outcome(spark, consensus, blob, shard, writer, staged, entry, expected)
    consensus.dispose()


@pytest.mark.parametrize("at", GC_STEPS)
def test_checkpoint_compaction_and_commit_inside_every_gc_step(spark, sqlite_url, tmp_path, at):
    """At each step of GC a checkpoint commits, a compaction moves since and the writer commits."""
    from airflow_upsert_provider.engine.blob.files import open_blob
    from airflow_upsert_provider.engine.store.registry import open_consensus

    consensus, blob = open_consensus(sqlite_url), open_blob(str(tmp_path / "blob"))
    shard, writer, staged = race_setup(spark, consensus, blob, tmp_path)
    expected = {3: table(shard)}
    made = []

    def interleave(step: str) -> None:
        if step != at:
            return
        made.append(create_checkpoint(shard))
        compact(spark, shard)
        age_files(os.path.join(blob.root, shard.shard_id, "runs", "since=000000000003"))
        age_compaction(consensus, shard.shard_id)
        assert writer.append(staged) == "committed"

    collect_garbage(consensus, blob, shard.shard_id, grace_seconds=GRACE, on_step=interleave)
    assert len(made) == 1
    verify_checkpoint(blob, shard.shard_id, made[0].id)
    race_outcome(spark, consensus, blob, shard, writer, staged, made[0], expected)
    consensus.dispose()


def _age_dir(path: str, seconds: float = 3 * 3600) -> None:
    past = os.stat(path).st_mtime - seconds
    os.utime(path, (past, past))


def test_empty_directories_inside_the_grace_period_stay(consensus, blob, tmp_path):
    """A writer creates ``runs/ts=…`` and its attempt directory before Spark writes a file:
    GC keeps both while they are younger than the grace period, and removes them after."""
    from tests.helpers import make_shard

    shard = make_shard(consensus, blob, tmp_path)
    runs = blob.path(shard.shard_id, "runs")
    empty_group = os.path.join(runs, "ts=000000000001")
    staging = os.path.join(runs, "ts=000000000000", "writer-0123456789ab")
    os.makedirs(empty_group)
    os.makedirs(os.path.join(staging, "_temporary", "0"))

    report = collect_garbage(consensus, blob, shard.shard_id, grace_seconds=GRACE)
    assert report.items == []
    assert os.path.isdir(empty_group) and os.path.isdir(os.path.join(staging, "_temporary", "0"))

    for path in (os.path.join(staging, "_temporary", "0"), os.path.join(staging, "_temporary"), staging,
                 os.path.dirname(staging), empty_group):
        _age_dir(path)
    report = collect_garbage(consensus, blob, shard.shard_id, grace_seconds=GRACE)
    rel = os.path.relpath(staging, blob.root)
    assert [(i.path, i.kind, i.files) for i in report.items] == [(rel, "run", 0)]
    assert not os.path.exists(staging) and not os.path.exists(empty_group)
    # The group the deletion just emptied is young again (it just changed): the next GC
    # after the grace period removes it.
    assert os.listdir(runs) == ["ts=000000000000"]
    _age_dir(os.path.dirname(staging))
    collect_garbage(consensus, blob, shard.shard_id, grace_seconds=GRACE)
    assert os.listdir(runs) == []


def test_gc_skips_a_directory_a_writer_fills_while_it_is_deleted(consensus, blob, tmp_path):
    """``gc --grace 0`` beside a writer: Spark adds a file to the attempt directory GC is
    deleting. GC reports the directory as skipped instead of failing, and the next GC
    deletes it; the claim already refuses a commit naming it."""
    from airflow_upsert_provider.engine.blob.files import LocalBlob
    from airflow_upsert_provider.engine.store.gc_claims import claims
    from tests.helpers import make_shard

    shard = make_shard(consensus, blob, tmp_path)
    attempt = blob.path(shard.shard_id, "runs", "ts=000000000000", "writer-0123456789ab",
                        "_temporary", "0", "_temporary", "attempt_1")
    os.makedirs(attempt)
    with open(os.path.join(attempt, "part-0.parquet"), "wb") as handle:
        handle.write(b"x" * 10)

    class SparkWritesDuringDeletion(LocalBlob):
        wrote = False

        def rmdir(self, path: str) -> None:
            if path == attempt and not self.wrote:
                self.wrote = True
                with open(os.path.join(path, "part-1.parquet"), "wb") as handle:
                    handle.write(b"y")
            super().rmdir(path)

    racing = SparkWritesDuringDeletion(blob.root)
    report = collect_garbage(consensus, racing, shard.shard_id, grace_seconds=0)
    run_dir = os.path.join(shard.shard_id, "runs", "ts=000000000000", "writer-0123456789ab")
    assert racing.wrote
    assert report.items == []
    assert [s["path"] for s in report.skipped] == [run_dir]
    assert "still writing into it" in report.skipped[0]["reason"]
    assert report.to_dict()["skipped"] == report.skipped
    assert os.listdir(attempt) == ["part-1.parquet"]
    assert claims(consensus, shard.shard_id) == [run_dir]

    report = collect_garbage(consensus, blob, shard.shard_id, grace_seconds=0)
    assert [i.path for i in report.items] == [run_dir] and report.skipped == []
    assert not os.path.exists(blob.path(run_dir))


def test_an_unreadable_catalog_in_a_stray_directory_is_reported_and_the_shard_collected(spark, consensus, blob, tmp_path):
    """A directory of the root that no shard of the store owns (here a copy of a checkpoint,
    beside a damaged catalog) does not stop GC: it is reported, its manifest still pins the
    files it names, and the shard's garbage is collected. The same damage in a directory a
    shard of the store owns still stops GC before any deletion."""
    from tests.helpers import make_shard

    shard = written_shard(spark, consensus, blob, tmp_path, batches=2)
    entry = create_checkpoint(shard)
    batch_runs = [blob.path(b.run["path"]) for b in shard.batches()]
    stray_root = checkpoints_root(blob, "orders-copy")
    shutil.copytree(os.path.join(checkpoints_root(blob, shard.shard_id), entry.id), os.path.join(stray_root, entry.id))
    stray_catalog = os.path.join(stray_root, "CATALOG.json")
    with open(stray_catalog, "w") as handle:
        handle.write('{"checkpoints": [')
    # The shard's own catalog drops the checkpoint: only the stray copy still names the batch runs.
    Catalog.load(blob, shard.shard_id, consensus).remove({entry.id})
    compact(spark, shard)
    lost = lost_run(shard, 0)
    age_files(blob.root)
    age_compaction(consensus, shard.shard_id)
    stray_before = tree(os.path.join(blob.root, "orders-copy"))

    report = collect_garbage(consensus, blob, shard.shard_id, grace_seconds=0)
    assert [c["path"] for c in report.unreadable_catalogs] == ["orders-copy"]
    assert stray_catalog in report.unreadable_catalogs[0]["reason"]
    assert "corrupt" in report.unreadable_catalogs[0]["reason"]
    assert report.to_dict()["unreadable_catalogs"] == report.unreadable_catalogs
    deleted = {(i.kind, i.path) for i in report.items}
    assert ("run", os.path.relpath(lost, blob.root)) in deleted
    assert ("unlisted_checkpoint", os.path.join(shard.shard_id, "checkpoints", entry.id)) in deleted
    assert not os.path.exists(lost)
    assert all(os.path.isdir(run) for run in batch_runs)  # pinned by the stray manifest
    assert tree(os.path.join(blob.root, "orders-copy")) == stray_before
    assert table(shard, shard.state().upper) == oracle(shard)

    # A shard of the store with the same damage: its catalog may pin these files, GC stops.
    other = make_shard(consensus, blob, tmp_path, shard_id="returns")
    other_catalog = os.path.join(checkpoints_root(blob, other.shard_id), "CATALOG.json")
    os.makedirs(os.path.dirname(other_catalog))
    shutil.copyfile(stray_catalog, other_catalog)
    shutil.copytree(batch_runs[0], lost)  # garbage again: nothing may be deleted now
    age_files(blob.root)
    before = tree(blob.root)
    with pytest.raises(CheckpointCorrupt) as caught:
        collect_garbage(consensus, blob, shard.shard_id, grace_seconds=0)
    assert other_catalog in str(caught.value)
    assert tree(blob.root) == before
