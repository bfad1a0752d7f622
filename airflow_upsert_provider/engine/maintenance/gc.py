"""Garbage collection of a shard's blob files: the effect shell around the pure plans
(``gc_plan.plan_gc`` for a sweep, ``gc_plan.plan_from_state`` for a GC from state; both are
tested without a store).

Two ways, one set of rules. A GC **from state** (``sweep=False``) deletes the runs the store
recorded as replaced (``upsert_replaced_runs``) that nothing below references any more; it
lists no directory of the shard, so its requests follow the garbage, not the history
(``_collect_from_state``). A **sweep** (``sweep=True``) lists the shard's directory and also
deletes what no state names: staged directories of writers that failed, files of killed task
attempts, abandoned checkpoints, expired rejects. The rules below are the sweep's; GC from
state applies the same ones to the runs it was told about.

GC deletes a run directory (``<shard>/runs/<group>/<name>``, the unit a writer or a
compaction writes) only if

- no live state references it: the compacted run and the batches from since on, of every
  shard in the consensus (a shard restored under a new id reads another shard's files);
- no retained checkpoint references it: every manifest listed in every catalog in the blob,
  and every manifest of a checkpoint still being written (younger than the grace period);
- no in-flight writer can still commit it: its newest file and its newest directory are older
  than the grace period (a writer's staged batch, a compaction's output before its swap, an
  attempt directory Spark created and has not written a file into yet);
- no read can still be reading it: no compaction replaced it less than the grace period ago
  (a read planned before the swap reads the runs it listed then), whichever compaction did
  (``gc_claims.recently_replaced``).

Inside a run directory something references, a Parquet file no run and no manifest names (a
failed, killed or speculative task attempt's) is deleted once older than the grace period; a
file where a run directory belongs (``<shard>/runs/notes.txt``) is not this project's: it is
kept and reported as foreign.

GC trusts its listing only as far as the consensus store confirms it: every file of a live run
of the shard must be in it. One that is not is either a commit that landed after the listing
(listing its run directory again shows it) or a listing that cannot be trusted: GC deletes
nothing and refuses, with a ``ConfigurationError`` naming the store's behaviour when the file
is there but a second listing still leaves it out (a store whose delimiter listings leave out
nested prefixes), an ``IntegrityError`` naming the file when it is gone.

GC refuses to touch the directory of a shard restored into another consensus store that shares
the blob root (``gc_claims.check_blob_owner``).

Before deleting, GC claims the run directories in consensus (``gc_claims.claim_for_deletion``,
one transaction that also leaves out anything committed since GC planned); a commit naming a
claimed directory is refused inside its own transaction, so a writer paused past the grace
period restages instead of committing files that are gone (invariant 16).

Order matters: GC lists the files first, then reads consensus, then the checkpoints. A
checkpoint re-reads since after its manifest is on disk (see ``checkpoint.create_checkpoint``),
so a file a checkpoint lists is either live in the state GC read or in a manifest GC read.

Empty ``ts=…``/``since=…`` directories are removed only once they, too, are older than the
grace period: a writer may have just created one to stage into. A directory that a writer
(with a grace period shorter than it takes) fills while GC deletes it is left for the next GC
and reported as skipped; its claim already keeps any commit from naming it.

On object storage the same rules hold (docs/maintenance.md, "On object storage"): paths are
URIs, and every path GC records or compares is relative to the blob root (``Blob.relative``);
an object's age is its last-modified time, a prefix's that of its newest object. A sweep there
deletes whole the ``ts=``/``since=`` groups no commit can name again that hold only directory
markers or garbage it deletes (``gc_plan.removable_groups``), so that no marker stays behind.

Every catalog and manifest is read before the first deletion; any one that cannot be read
(a missing catalog beside committed checkpoints, an empty or truncated one, a corrupt
manifest) aborts GC with an error naming it, and nothing is deleted. A manifest that cannot be
read because retention removed its checkpoint meanwhile is not corruption: the catalog is read
again, and a checkpoint no longer listed pins nothing. The one exception is the catalog of a
directory no shard of the store owns (``gc_plan.unreadable_catalog_stops_gc``): it is reported
under ``unreadable_catalogs`` and every manifest in that directory pins its files, so that one
stray directory does not stop the GC of every shard. A shard's catalog is the consensus
store's (``checkpoint_catalog.Catalog``; its blob copy for a shard the store does not hold the catalog
of). Before deleting a checkpoint directory, GC writes the blob copy of the catalog's current
version if a crash or a failed write left it behind: no copy lists a deleted directory.
"""

from __future__ import annotations

import errno
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from airflow_upsert_provider.engine.blob.filesystems import split_uri
from airflow_upsert_provider.engine.blob.interface import Blob, BlobFile, BlobTree
from airflow_upsert_provider.engine.maintenance.checkpoint_catalog import (
    MANIFEST_NAME,
    Catalog,
    CheckpointCorrupt,
    checkpoint_dirs,
    checkpoints_root,
    is_committed,
    write_current_copy,
)
from airflow_upsert_provider.engine.maintenance.checkpoint_manifest import read_manifest
from airflow_upsert_provider.engine.maintenance.gc_plan import (
    IN_GRACE,
    PINNED,
    REFERENCED,
    REJECTS,
    REPLACED_IN_GRACE,
    RUN,
    TEMPORARY_FILE,
    UNLISTED_FILE,
    CheckpointListing,
    GcInputs,
    GcItem,
    Listed,
    Replaced,
    empty_groups,
    orphaned_index_owners,
    plan_from_state,
    removable_groups,
    plan_gc,
    plan_manifest_reads,
    unreadable_catalog_stops_gc,
)
from airflow_upsert_provider.engine.store.checkpoint_refs import (
    forget_owners,
    forget_references,
    indexed_owners,
    record_references,
    references_of,
)
from airflow_upsert_provider.engine.store.consensus import Consensus
from airflow_upsert_provider.engine.store.history import DEFAULT_CHUNK, truncate_history
from airflow_upsert_provider.engine.table.shard import Shard
from airflow_upsert_provider.engine.errors import ConfigurationError, IntegrityError, first_line
from airflow_upsert_provider.engine.store.gc_claims import (
    check_blob_owner,
    claim_for_deletion,
    forget_replaced,
    recently_replaced,
    recorded_files,
    replacements_of,
    run_dir_of_relative,
)

# Long enough for a writer to stage a batch and commit it; a staged batch older than this
# whose commit never landed is garbage.
DEFAULT_GRACE_SECONDS = 6 * 3600
# How long quarantined records (``<shard>/rejects/``) of batches below since are kept for a
# human to look at; 0 keeps them forever.
DEFAULT_REJECTS_RETENTION_SECONDS = 30 * 86400
MAX_LISTED = 1000


@dataclass
class GcReport:
    shard: str
    dry_run: bool
    grace_seconds: float
    items: list[GcItem] = field(default_factory=list)
    files_scanned: int = 0
    kept_referenced: int = 0
    kept_in_grace: int = 0
    # Retained manifests read from the blob, and retained checkpoints whose files the store's
    # index gave instead (each manifest is read once: store/checkpoint_refs.py).
    checkpoints_read: int = 0
    checkpoints_indexed: int = 0
    # Files not in the layout this project writes (``<shard>/runs/notes.txt``): kept, reported.
    foreign: list[dict[str, Any]] = field(default_factory=list)
    # Directories whose deletion a concurrent writer got in the way of: {path, reason}.
    skipped: list[dict[str, str]] = field(default_factory=list)
    # Directories no shard of the store owns whose catalog cannot be read: {path, reason}.
    unreadable_catalogs: list[dict[str, str]] = field(default_factory=list)
    rejects_retention_seconds: float = DEFAULT_REJECTS_RETENTION_SECONDS
    # Batch and binding rows below since rolled up and truncated (store/history.py).
    history: dict[str, int] = field(default_factory=dict)
    plan_seconds: float = 0.0
    delete_seconds: float = 0.0
    # Object storage: group prefixes the sweep deleted whole, markers included
    # (gc_plan.removable_groups).
    groups_removed: int = 0
    # A GC from state: replacements left recorded for a later GC, by reason (gc_plan.py).
    pending: dict[str, int] = field(default_factory=dict)
    swept: bool = True

    @property
    def bytes(self) -> int:
        return sum(i.bytes for i in self.items)

    @property
    def files(self) -> int:
        return sum(i.files for i in self.items)

    def to_dict(self) -> dict[str, Any]:
        return {
            "shard": self.shard,
            "dry_run": self.dry_run,
            "grace_seconds": self.grace_seconds,
            "deleted" if not self.dry_run else "would_delete": {"items": len(self.items), "files": self.files, "bytes": self.bytes},
            "items": [i.to_dict() for i in self.items[:MAX_LISTED]],
            "files_scanned": self.files_scanned,
            "kept_referenced": self.kept_referenced,
            "kept_in_grace": self.kept_in_grace,
            "checkpoints_read": self.checkpoints_read,
            "checkpoints_indexed": self.checkpoints_indexed,
            "skipped": self.skipped[:MAX_LISTED],
            "foreign": self.foreign[:MAX_LISTED],
            "unreadable_catalogs": self.unreadable_catalogs[:MAX_LISTED],
            "rejects_retention_seconds": self.rejects_retention_seconds,
            "history": self.history,
            "swept": self.swept,
            "groups_removed": self.groups_removed,
            "pending": self.pending,
            "plan_seconds": round(self.plan_seconds, 3),
            "delete_seconds": round(self.delete_seconds, 3),
        }


def run_dir_of(blob: Blob, path: str) -> str:
    """The run directory (``<shard>/runs/<group>/<name>``, relative to the blob root, as a
    run's ``path`` is recorded) that a file or directory of the blob (a path the blob made:
    absolute, or a URI) belongs to. A path recorded in consensus or a manifest is relative
    already: ``run_dir_of_relative``."""
    return run_dir_of_relative(blob.relative(path))


def collect_garbage(
    consensus: Consensus,
    blob: Blob,
    shard_id: str,
    *,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    rejects_retention_seconds: float = DEFAULT_REJECTS_RETENTION_SECONDS,
    dry_run: bool = False,
    on_step: Callable[[str], None] | None = None,
    now: float | None = None,
    history_chunk: int = DEFAULT_CHUNK,
    sweep: bool = True,
) -> GcReport:
    """Plan, then (unless ``dry_run``) delete the garbage of shard ``shard_id``, then roll up
    and truncate its batch history below since (``store/history.py``).

    :param sweep: also list the shard's directory and delete what no state names (attempt
        files, failed writers' staged directories, abandoned checkpoints, expired rejects);
        False deletes only the runs the store recorded as replaced (``_collect_from_state``),
        with requests that follow the garbage, not the shard's history.

    :param grace_seconds: files younger than this are kept whatever references them; batch
        rows committed inside it are kept too.
    :param rejects_retention_seconds: quarantined records of a batch below since are deleted
        once older than this; 0 keeps them forever.
    :param on_step: called with ``"listed"`` (a sweep only), ``"state"``, ``"checkpoints"``,
        ``"claimed"``, ``"deleting"``, ``"deleted"`` and ``"truncating"`` (tests force races
        and crashes there).
    :param history_chunk: batch rows truncated per transaction.
    """
    if grace_seconds < 0:
        raise ConfigurationError("the grace period cannot be negative", field="grace")
    check_rejects_retention(rejects_retention_seconds)
    consensus.get_shard(shard_id)  # an unknown shard is a usage error, not "nothing to do"
    # A shard restored into another store sharing this blob root is that store's to collect.
    check_blob_owner(consensus, blob, shard_id, "collect garbage")
    step = on_step or (lambda _name: None)
    report = GcReport(shard=shard_id, dry_run=dry_run, grace_seconds=grace_seconds,
                      rejects_retention_seconds=rejects_retention_seconds, swept=sweep)
    now = time.time() if now is None else now
    cutoff = now - grace_seconds
    if not sweep:
        _collect_from_state(consensus, blob, report, cutoff, step)
    else:
        _sweep(consensus, blob, report, now, cutoff, step)
    if not dry_run:
        # Consensus only, in short transactions of their own: no blob I/O under them.
        step("truncating")
        report.history = truncate_history(
            consensus, shard_id, committed_before=cutoff,
            source_partitions=_anchored_partitions(consensus, blob, shard_id), chunk=history_chunk,
        ).to_dict()
    return report


def _sweep(consensus: Consensus, blob: Blob, report: GcReport, now: float, cutoff: float,
           step: Callable[[str], None]) -> None:
    """The full GC: list the shard's directory, plan on the listing (``gc_plan.plan_gc``),
    claim, delete."""
    shard_id, dry_run = report.shard, report.dry_run
    started = time.monotonic()
    # 1. What exists now. Anything written after this listing is not a candidate. One flat
    # listing of the shard's directory (on object storage a request per page of keys, however
    # many prefixes the history left). Directory ages count as much as file ages: an attempt
    # directory with no file yet is a writer about to stage into it (on object storage a
    # prefix is as old as its newest object).
    listing = _split_listing(blob, shard_id, blob.list_tree(blob.path(shard_id)))
    run_files, run_dirs = listing.files("runs"), listing.dirs("runs")
    checkpoint_names = listing.checkpoint_names()
    ckpt_files = {name: listing.files("checkpoints", name) for name in checkpoint_names}
    ckpt_ages = {name: listing.checkpoint_ages(name) for name in checkpoint_names}
    temporary = [f for f in listing.files("checkpoints") if f.path.rsplit("/", 1)[-1].startswith(".tmp-")]
    # Quarantined records: <shard>/rejects/ts=T/<writer-attempt>, one directory per attempt.
    rejects_files: list[Listed] = []
    rejects_dirs: list[Listed] = []
    if report.rejects_retention_seconds > 0:
        rejects_files, rejects_dirs = listing.files("rejects"), listing.dirs("rejects")
    step("listed")

    # 2. Live state of every shard, read before any manifest (see the module docstring).
    refs = _live_references(consensus, shard_id, cutoff)
    step("state")
    # 3. Every retained checkpoint of every shard in the blob, and every checkpoint still
    # being written. Any unreadable manifest, or catalog of a shard of the store, raises here,
    # before any deletion.
    ours_listed = _checkpoint_references(consensus, blob, refs, cutoff, report)
    step("checkpoints")
    referenced_files, referenced_dirs, live_files = refs.files, refs.dirs, refs.live_files
    replaced_in_grace, planned_upper, planned_since = refs.replaced_in_grace, refs.upper, refs.since

    # 4. Decide (gc_plan.py), then refuse a listing that does not hold what the store names.
    plan = plan_gc(GcInputs(
        shard_id=shard_id, run_files=run_files, run_dirs=run_dirs, referenced_files=referenced_files,
        referenced_dirs=referenced_dirs, replaced_in_grace=replaced_in_grace, live_files=live_files,
        cutoff=cutoff,
        checkpoints={
            name: CheckpointListing(tuple(files), ckpt_ages[name],
                                    committed=name not in ours_listed and is_committed(blob, shard_id, name))
            for name, files in ckpt_files.items()
        },
        catalog_listed=ours_listed, temporary_files=temporary, rejects_files=rejects_files,
        rejects_dirs=rejects_dirs, rejects_cutoff=now - report.rejects_retention_seconds, since=planned_since,
    ))
    _check_listing(blob, shard_id, plan.missing_live)
    report.items = plan.delete
    report.foreign = [k.to_dict() for k in plan.foreign]
    report.files_scanned = plan.files_scanned
    report.kept_referenced = plan.kept_files(REFERENCED)
    report.kept_in_grace = plan.kept_files(IN_GRACE, REPLACED_IN_GRACE)
    report.plan_seconds = time.monotonic() - started
    if dry_run:
        return

    # 5. Claim the run and checkpoint directories in consensus (invariant 16), then delete. A
    # run a commit named, or a checkpoint the catalog listed, since the plan was read is kept.
    runs = [i for i in report.items if i.kind == RUN]
    checkpoints = [i for i in report.items if i.kind.endswith("_checkpoint")]
    check_blob_owner(consensus, blob, shard_id, "collect garbage")  # a restore while GC planned
    claimed_runs, claimed_checkpoints = claim_for_deletion(
        consensus, shard_id, [i.path for i in runs], planned_upper,
        checkpoint_candidates=[i.path for i in checkpoints],
    )
    claimed = set(claimed_runs) | set(claimed_checkpoints)
    for item in runs + checkpoints:
        if item.path not in claimed:
            report.items.remove(item)
            report.kept_referenced += item.files
    step("claimed")
    if claimed_checkpoints:
        # The catalog's blob copy of a version that lists none of them, before they go: a
        # restore from the blob alone never meets a listed checkpoint that is gone.
        write_current_copy(consensus, blob, shard_id)
    step("deleting")
    deleting = time.monotonic()
    # On object storage, a group emptied of everything (markers included) goes in one deletion,
    # not a deletion per run directory that leaves the group's marker behind: the same
    # requests, no marker (on disk, empty group directories are removed below).
    whole: set[str] = set()
    if split_uri(blob.root)[0]:
        whole = set(removable_groups(shard_id, listing.all_files, listing.markers,
                                     [i.path for i in report.items if i.kind in (RUN, REJECTS)],
                                     referenced_dirs, planned_upper, planned_since))
        for group in sorted(whole):
            blob.delete_tree(blob.path(group))  # no error for what a writer put there meanwhile
        report.groups_removed = len(whole)
    for item in list(report.items):
        path = blob.path(item.path)
        if item.kind in (RUN, REJECTS) and "/".join(item.path.split("/")[:3]) in whole:
            continue  # deleted with its group
        if item.kind in (TEMPORARY_FILE, UNLISTED_FILE):
            blob.delete_file(path)
            continue
        reason = _delete_claimed_tree(blob, path)
        if reason is not None:
            report.items.remove(item)
            report.skipped.append({"path": item.path, "reason": reason})
    _remove_empty_groups(blob, empty_groups(f"{shard_id}/runs", run_files, run_dirs, cutoff))
    _remove_empty_groups(blob, empty_groups(f"{shard_id}/rejects", rejects_files, rejects_dirs, cutoff))
    report.delete_seconds = time.monotonic() - deleting
    step("deleted")
    # Forget the replaced runs deleted now, and those the listing did not hold: a replaced
    # run was committed before the listing began, so one it does not hold is gone already (a
    # GC that stopped after deleting it).
    listed_dirs = {run_dir_of_relative(f.path) for f in run_files} | {run_dir_of_relative(d.path) for d in run_dirs}
    gone = [path for path, _ in replacements_of(consensus, shard_id) if path not in listed_dirs]
    forget_replaced(consensus, [i.path for i in report.items if i.kind == RUN] + gone)


@dataclass
class _References:
    """What live state names, read before any manifest (see the module docstring), and what
    the checkpoints name once ``_checkpoint_references`` added theirs."""

    shard_id: str
    files: set[str] = field(default_factory=set)
    dirs: set[str] = field(default_factory=set)
    live_files: set[str] = field(default_factory=set)  # this shard's own, below its runs/
    # Runs a compaction replaced less than the grace period ago: a read planned before the
    # swap may still be reading them.
    replaced_in_grace: set[str] = field(default_factory=set)
    shard_ids: set[str] = field(default_factory=set)
    upper: int = 0
    since: int = 0


def _live_references(consensus: Consensus, shard_id: str, cutoff: float) -> _References:
    """The live runs (the compacted run and the batches from since on, not the history) of
    every shard of the store, the rejects their batches name, and the runs replaced in grace."""
    refs = _References(shard_id, replaced_in_grace=recently_replaced(consensus, cutoff))
    own_runs = f"{shard_id}/runs/"
    for record in consensus.list_shards():
        refs.shard_ids.add(record.shard_id)
        view = consensus.live_view(record.shard_id)
        if record.shard_id == shard_id:
            refs.upper, refs.since = view.record.upper, view.record.since
            refs.live_files.update(
                f["path"] for run in view.runs for f in run["files"] if f["path"].startswith(own_runs))
        for run in view.runs:
            refs.dirs.add(run["path"])
            _reference(run["files"], refs.files, refs.dirs)
        for batch in view.batches:
            if batch.stats.get("rejects"):
                refs.dirs.add(run_dir_of_relative(batch.stats["rejects"]["path"]))
        if view.compaction is not None and view.compaction.compacted_at >= cutoff:
            refs.replaced_in_grace.update(view.compaction.run.get("replaces", []))
    return refs


def _checkpoint_references(consensus: Consensus, blob: Blob, refs: _References, cutoff: float,
                           report: GcReport) -> set[str]:
    """Add to ``refs`` what every retained checkpoint of every shard in the blob names, and
    every checkpoint still being written; return the ids the collected shard's catalog lists.
    A retained checkpoint's files come from the store's index (``checkpoint_refs``) once GC
    read its manifest; a manifest not indexed yet is read, checked, and indexed (not in a dry
    run). Any unreadable manifest, or catalog of a shard of the store, raises before any
    deletion."""
    owners = _shards_with_checkpoints(blob, refs.shard_id)
    catalogs: dict[str, list] = {}
    pin_every_checkpoint: set[str] = set()
    for owner in owners:
        try:
            catalogs[owner] = Catalog.load(blob, owner, consensus).entries
        except CheckpointCorrupt as exc:
            if unreadable_catalog_stops_gc(owner, refs.shard_id, refs.shard_ids):
                raise
            # Not a shard of this store: reported, and every checkpoint in it pins its files.
            report.unreadable_catalogs.append({"path": owner, "reason": first_line(exc)})
            pin_every_checkpoint.add(owner)
    index = references_of(consensus, catalogs)
    plan = plan_manifest_reads(
        {owner: {e.id: e.manifest_sha256 for e in entries} for owner, entries in catalogs.items()},
        {key: digest for key, (digest, _) in index.items()},
    )
    for key in plan.indexed:
        _reference_paths(index[key][1], refs.files, refs.dirs)
    report.checkpoints_indexed = len(plan.indexed)
    entry_of = {(owner, e.id): e for owner, entries in catalogs.items() for e in entries}
    read: list[tuple[tuple[str, str], str, list[str]]] = []
    for owner, checkpoint_id in plan.read:
        entry = entry_of[owner, checkpoint_id]
        manifest = _read_listed_manifest(consensus, blob, owner, entry)
        if manifest is not None:
            _reference(manifest["files"], refs.files, refs.dirs)
            report.checkpoints_read += 1
            read.append(((owner, checkpoint_id), entry.manifest_sha256, [f["path"] for f in manifest["files"]]))
    for owner in owners:
        listed = {e.id for e in catalogs.get(owner, ())}
        for name in checkpoint_dirs(blob, owner):
            if owner not in pin_every_checkpoint and (name in listed or not any(
                    f.mtime >= cutoff for f in blob.walk_files(blob.join(checkpoints_root(blob, owner), name)))):
                continue
            # A checkpoint being written (or any, in a directory whose catalog cannot be read):
            # its manifest, once on disk, pins its files.
            manifest_path = blob.join(checkpoints_root(blob, owner), name, MANIFEST_NAME)
            if blob.exists(manifest_path):
                try:
                    manifest = read_manifest(blob, owner, name)
                except CheckpointCorrupt:
                    if blob.exists(manifest_path):
                        raise
                    continue  # its writer gave up (a compaction overtook it) and deleted it
                _reference(manifest["files"], refs.files, refs.dirs)
                report.checkpoints_read += 1
    if not report.dry_run:
        # Consensus only, after every read: the next GC reads none of these manifests again.
        forget_references(consensus, plan.stale)
        forget_owners(consensus, orphaned_index_owners(indexed_owners(consensus), owners, refs.shard_ids))
        for (owner, checkpoint_id), digest, paths in read:
            record_references(consensus, owner, checkpoint_id, digest, paths)
    return {e.id for e in catalogs.get(refs.shard_id, ())}


def _collect_from_state(consensus: Consensus, blob: Blob, report: GcReport, cutoff: float,
                        step: Callable[[str], None]) -> None:
    """GC from state: delete the runs the store recorded as replaced that nothing pins any
    more (``gc_plan.plan_from_state``), without listing the shard's directory.

    The same rules as a sweep hold: the live state of every shard and every checkpoint are
    read before deciding, a run replaced inside the grace period is kept (a read planned
    before the swap), and the runs are claimed in consensus before they are deleted (a commit
    naming one since the plan is left out). A run is forgotten only after it was deleted: a
    GC that stops anywhere in between leaves its row, and the next GC finishes the job. A
    replaced run is a committed one: every file of it is older than its replacement, so no
    writer is still filling it."""
    shard_id = report.shard
    started = time.monotonic()
    refs = _live_references(consensus, shard_id, cutoff)
    step("state")
    _checkpoint_references(consensus, blob, refs, cutoff, report)
    step("checkpoints")
    replaced = [Replaced(path, at) for path, at in replacements_of(consensus, shard_id)]
    plan = plan_from_state(shard_id, replaced, refs.dirs, cutoff)
    recorded = recorded_files(consensus, shard_id, plan.delete)
    report.items = [_run_item(blob, path, recorded.get(path)) for path in plan.delete]
    report.files_scanned = sum(i.files for i in report.items)
    report.kept_referenced = plan.pending_count(PINNED)
    report.kept_in_grace = plan.pending_count(REPLACED_IN_GRACE)
    report.pending = {reason: len(paths) for reason, paths in sorted(plan.pending.items())}
    report.plan_seconds = time.monotonic() - started
    if report.dry_run:
        return
    check_blob_owner(consensus, blob, shard_id, "collect garbage")  # a restore while GC planned
    claimed = set(claim_for_deletion(consensus, shard_id, plan.delete, refs.upper)[0])
    report.items = [i for i in report.items if i.path in claimed]
    step("claimed")
    step("deleting")
    deleting = time.monotonic()
    deleted = []
    for item in list(report.items):
        reason = _delete_claimed_tree(blob, blob.path(item.path))
        if reason is None:
            deleted.append(item.path)
        else:
            report.items.remove(item)
            report.skipped.append({"path": item.path, "reason": reason})
    report.delete_seconds = time.monotonic() - deleting
    step("deleted")
    forget_replaced(consensus, deleted)


def _run_item(blob: Blob, path: str, recorded: list[dict[str, Any]] | None) -> GcItem:
    """A run directory to delete, with its files and bytes: those its batch row records
    (``recorded``; Spark's companions of them go with the directory, uncounted), else from one
    flat listing of it (a compacted run, a batch whose row was truncated)."""
    if recorded is not None:
        return GcItem(path, RUN, len(recorded), sum(int(f["bytes"]) for f in recorded))
    files = list(blob.list_files(blob.path(path)))
    return GcItem(path, RUN, len(files), sum(f.size for f in files))


def _listed(blob: Blob, entries: Iterable[BlobFile]) -> list[Listed]:
    """A listing as the plan takes it: paths relative to the blob root."""
    return [Listed(blob.relative(e.path), e.size, e.mtime) for e in entries]


def _reference(files: Iterable[dict[str, Any]], referenced_files: set[str], referenced_dirs: set[str]) -> None:
    """Note the files a run or a manifest names, and their run directories."""
    _reference_paths((f["path"] for f in files), referenced_files, referenced_dirs)


def _reference_paths(paths: Iterable[str], referenced_files: set[str], referenced_dirs: set[str]) -> None:
    for path in paths:
        referenced_files.add(path)
        referenced_dirs.add(run_dir_of_relative(path))


def _check_listing(blob: Blob, shard_id: str, missing: list[str]) -> None:
    """Refuse, before deleting anything, a listing that left out live files (``missing``, in
    path order). A file committed after the listing began shows in a second listing of its
    run directory; one that does not show although it exists means the store's listing
    cannot be trusted (a store whose delimiter listings leave out nested prefixes); one that
    does not exist is a live file gone."""
    by_dir: dict[str, list[str]] = {}
    for path in missing:
        by_dir.setdefault(run_dir_of_relative(path), []).append(path)
    for run_dir, paths in by_dir.items():
        listed_again = {blob.relative(f.path) for f in blob.walk_files(blob.path(run_dir))}
        for path in paths:
            if path in listed_again:
                continue
            if not blob.exists(blob.path(path)):
                raise IntegrityError(
                    f"GC of shard {shard_id!r} refused: live file {path} is missing from the blob; "
                    "nothing was deleted. Restore the shard from a checkpoint (docs/maintenance.md)",
                    shard=shard_id, path=path,
                )
            raise ConfigurationError(
                f"GC of shard {shard_id!r} refused: listing {blob.path(shard_id, 'runs')} left out live file "
                f"{path}, which exists ({len(missing)} live file(s) not listed). The store's listing leaves out "
                "nested prefixes or objects, so GC cannot see what it would delete; nothing was deleted. "
                "Use a store whose delimiter listings return every prefix (docs/maintenance.md, \"On object storage\")",
                field="blob_root", shard=shard_id, path=path,
            )


def _anchored_partitions(consensus: Consensus, blob: Blob, shard_id: str) -> list[str] | None:
    """A directory shard's partitions, each with its source index row anchored at
    binding(upper - 1) (so that truncation may go up to since - 1); None for Kafka."""
    return Shard.open(consensus, blob, shard_id).anchor_source_index()


def check_rejects_retention(seconds: float) -> None:
    """Refuse a rejects retention that is negative or not a finite number."""
    if not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds < 0:
        raise ConfigurationError(
            f"the rejects retention must be a finite number of seconds >= 0 (0 keeps them forever), not {seconds!r}",
            field="rejects_retention",
        )


def _read_listed_manifest(consensus: Consensus, blob: Blob, owner: str, entry) -> dict[str, Any] | None:
    """The manifest of a checkpoint the catalog listed, or None if retention removed the
    checkpoint since the catalog was read (a harmless race, not corruption)."""
    try:
        return read_manifest(blob, owner, entry.id, entry.manifest_sha256)
    except CheckpointCorrupt:
        if any(e.id == entry.id for e in Catalog.load(blob, owner, consensus).entries):
            raise
        return None


def _shards_with_checkpoints(blob: Blob, shard_id: str) -> list[str]:
    """Every shard directory in the blob that has a checkpoints directory (this one first,
    and always, so that its own catalog is checked even when it has none)."""
    others = [
        name for name in blob.listdir(blob.root)
        if name != shard_id and blob.is_dir(checkpoints_root(blob, name))
    ]
    return [shard_id] + others


def _delete_claimed_tree(blob: Blob, path: str) -> str | None:
    """Delete a claimed directory; the reason it could not be, or None. A writer whose grace
    ran out may still be writing into it (Spark's ``_temporary`` attempt directories) or
    renaming out of it: a directory that gains an entry, or an entry that vanishes, under the
    deletion is left for the next GC, which finishes it (the claim keeps any commit from
    naming it meanwhile)."""
    try:
        blob.delete_tree(path)
    except OSError as exc:
        if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
            raise
        if blob.exists(path):
            return f"a writer was still writing into it ({os.strerror(exc.errno)}); the next GC deletes it"
    return None


def _remove_empty_groups(blob: Blob, groups: list[str]) -> None:
    """Remove the empty ``ts=…``/``since=…`` directories the plan chose
    (``gc_plan.empty_groups``). A writer creating a run in one right now makes rmdir fail,
    which is fine."""
    for group in groups:
        try:
            blob.rmdir(blob.path(group))
        except OSError:
            pass


@dataclass
class _ShardListing:
    """One listing of a shard's directory, relative to the blob root, split by what it holds."""

    shard_id: str
    all_files: list[Listed]
    all_dirs: list[Listed]
    markers: list[str] = field(default_factory=list)

    def _below(self, entries: list[Listed], *parts: str) -> list[Listed]:
        prefix = "/".join((self.shard_id, *parts)) + "/"
        return [e for e in entries if e.path.startswith(prefix)]

    def files(self, *parts: str) -> list[Listed]:
        return self._below(self.all_files, *parts)

    def dirs(self, *parts: str) -> list[Listed]:
        return self._below(self.all_dirs, *parts)

    def checkpoint_names(self) -> list[str]:
        """The checkpoint directories (``<shard>/checkpoints/<id>``), committed or not."""
        names = {d.path.split("/")[2] for d in self.dirs("checkpoints")}
        return sorted(n for n in names if not n.startswith("."))

    def checkpoint_ages(self, name: str) -> tuple[float, ...]:
        """Every age that says a writer may still be filling a checkpoint directory: its
        own and its subdirectories'."""
        own = f"{self.shard_id}/checkpoints/{name}"
        return tuple(d.mtime for d in self.all_dirs if d.path == own or d.path.startswith(own + "/"))


def _split_listing(blob: Blob, shard_id: str, tree: BlobTree) -> _ShardListing:
    return _ShardListing(shard_id, _listed(blob, tree.files), _listed(blob, tree.dirs),
                         [blob.relative(m) for m in tree.markers])
