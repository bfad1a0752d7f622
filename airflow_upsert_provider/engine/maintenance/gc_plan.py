"""GC's decision: a pure function from what GC read to what it deletes, what it keeps and why.

``collect_garbage`` (gc.py) is the effect shell: it lists the blob, reads the consensus store
and the checkpoints, hands everything to :func:`plan_gc`, then claims and deletes what the plan
says. Nothing here touches a store, so every rule is tested over grids of listings, ages and
grace periods without Spark or a database (tests/maintenance/test_gc_plan.py).

The unit of deletion is a run directory (``<shard>/runs/<group>/<name>``, what one writer
attempt or one compaction writes), with three exceptions:

- Inside a run directory that live state or a retained checkpoint references, a Parquet data
  file no run and no manifest names (a failed, killed or speculative task attempt wrote it,
  and the run's description left it out) is deleted on its own once older than the grace
  period. A committed run's description never changes, so no later commit can name it. Spark's
  companions of a run's files (``.<name>.crc``, ``_SUCCESS``) stay with their directory.
- A file where a run directory (or the group above it) is expected, such as
  ``<shard>/runs/notes.txt``, was not written by this project: it is kept and reported as
  foreign, never deleted (a sync tool's marker, a note) and never mistaken for a directory.
- Quarantined records (``<shard>/rejects/ts=T/<name>``) and checkpoint directories follow
  their own retention (below).

Before anything is deleted the plan checks the listing against the store: every file of a
live run of the shard must appear in it (``missing_live`` names those that do not). A store
whose delimiter listings omit nested prefixes lists nothing below ``runs/``; trusting it would
mean planning on a listing that cannot see what it should delete. A file committed after the
listing began is missing too, harmlessly: the shell lists its directory again to tell the two
apart (gc.py).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_upsert_provider.engine.store.gc_claims import claim_needed, run_dir_of_relative

# Why the plan keeps something.
REFERENCED = "referenced"  # live state or a retained checkpoint names it (or its directory)
IN_GRACE = "in_grace"  # something in it is younger than the grace period
REPLACED_IN_GRACE = "replaced_in_grace"  # a compaction replaced it less than the grace period ago
FOREIGN = "foreign"  # not in the layout this project writes: never deleted, reported

# What the plan deletes.
RUN = "run"
UNLISTED_FILE = "unlisted_file"
REJECTS = "rejects"
ABANDONED_CHECKPOINT = "abandoned_checkpoint"
UNLISTED_CHECKPOINT = "unlisted_checkpoint"
TEMPORARY_FILE = "temporary_file"

# A ts group name that does not parse counts as the newest batch (kept).
NEWEST_TS = 2**62


@dataclass(frozen=True, slots=True)  # one per listed file: kept small
class Listed:
    """One entry of a listing: a file (or a directory, size 0) relative to the blob root,
    '/'-separated, and its age (a directory's mtime; on object storage a prefix's newest object)."""

    path: str
    size: int
    mtime: float


@dataclass
class GcItem:
    """One thing GC deletes: a run directory, a file of a live run directory that no run
    names, an abandoned checkpoint directory or a stray temporary file."""

    path: str
    kind: str
    files: int
    bytes: int

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "kind": self.kind, "files": self.files, "bytes": self.bytes}


@dataclass(frozen=True)
class CheckpointListing:
    """The listing of one checkpoint directory: its files, and every age that says a writer
    may still be filling it (the directory's own and its subdirectories')."""

    files: tuple[Listed, ...]
    ages: tuple[float, ...] = ()
    committed: bool = False


@dataclass(frozen=True)
class GcInputs:
    """Everything GC read, in the order it read it (listing, state, checkpoints).

    :param run_files: every file below ``<shard>/runs/``.
    :param run_dirs: every directory below ``<shard>/runs/`` (their ages).
    :param referenced_files: every file live state (of every shard) or a retained or
        in-progress checkpoint names.
    :param referenced_dirs: the run and rejects directories those name, and each live run's
        own ``path``.
    :param replaced_in_grace: run directories a compaction replaced after ``cutoff``.
    :param live_files: the files of the shard's own live runs below its ``runs/``.
    :param cutoff: now minus the grace period: anything at least this young is kept.
    :param checkpoints: the shard's checkpoint directories by name.
    :param catalog_listed: the ids the shard's catalog lists.
    :param temporary_files: ``.tmp-*`` files below the shard's checkpoints directory.
    :param rejects_files: every file below ``<shard>/rejects/`` (empty: retention keeps them forever).
    :param rejects_dirs: the directories below it.
    :param rejects_cutoff: now minus the rejects retention.
    :param since: the shard's since: rejects of batches at or above it are live.
    """

    shard_id: str
    run_files: Collection[Listed]
    run_dirs: Collection[Listed]
    referenced_files: Collection[str]
    referenced_dirs: Collection[str]
    replaced_in_grace: Collection[str]
    live_files: Collection[str]
    cutoff: float
    checkpoints: Mapping[str, CheckpointListing] = field(default_factory=dict)
    catalog_listed: Collection[str] = ()
    temporary_files: Collection[Listed] = ()
    rejects_files: Collection[Listed] = ()
    rejects_dirs: Collection[Listed] = ()
    rejects_cutoff: float = float("-inf")
    since: int = 0


@dataclass
class Kept:
    """Something the plan keeps, and why (one of the reasons above)."""

    path: str
    reason: str
    files: int
    bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "reason": self.reason, "files": self.files, "bytes": self.bytes}


@dataclass
class GcPlan:
    delete: list[GcItem] = field(default_factory=list)
    kept: list[Kept] = field(default_factory=list)
    # Live files of the shard the listing does not hold.
    missing_live: list[str] = field(default_factory=list)
    files_scanned: int = 0

    def kept_files(self, *reasons: str) -> int:
        return sum(k.files for k in self.kept if k.reason in reasons)

    @property
    def foreign(self) -> list[Kept]:
        return [k for k in self.kept if k.reason == FOREIGN]


def is_run_data_file(path: str) -> bool:
    """Whether ``path`` is a run's data file as this project names them: Parquet, neither
    hidden nor a Spark marker (``part-…parquet``; not ``.part-….parquet.crc``, ``_SUCCESS``)."""
    name = path.rsplit("/", 1)[-1]
    return name.endswith(".parquet") and not name.startswith((".", "_"))


def unreadable_catalog_stops_gc(directory: str, shard_id: str, shard_ids: Collection[str]) -> bool:
    """Whether a checkpoint catalog that cannot be read in blob directory ``directory`` stops
    the GC of shard ``shard_id`` (``shard_ids``: every shard of the consensus store).

    The catalog of the shard collected, or of any shard of the store, is that shard's state:
    unreadable, it stops GC before the first deletion (it may list checkpoints that pin these
    files). A directory no shard of the store owns (a stray copy, a dropped shard's remains) is
    a finding: reported and skipped, so that it does not stop the GC of every shard; its
    checkpoint manifests still pin their files (gc.py)."""
    return directory == shard_id or directory in shard_ids


@dataclass
class ManifestPlan:
    """Which retained checkpoints GC learns from the store's index and which manifests it
    reads, by (owner, checkpoint id); ``stale``: index rows to drop (a checkpoint its owner's
    catalog no longer lists, or a row whose digest is not the listed manifest's)."""

    indexed: list[tuple[str, str]] = field(default_factory=list)
    read: list[tuple[str, str]] = field(default_factory=list)
    stale: list[tuple[str, str]] = field(default_factory=list)


def plan_manifest_reads(
    listed: Mapping[str, Mapping[str, str]], indexed: Mapping[tuple[str, str], str]
) -> ManifestPlan:
    """``listed``: owner -> {checkpoint id: manifest digest} of every catalog GC read;
    ``indexed``: (owner, checkpoint id) -> digest of the index rows of those owners. A listed
    checkpoint whose row has its digest is taken from the index; any other is read (and then
    indexed), so each manifest is read once, not at every GC. Rows of a read owner that its
    catalog does not list with that digest are stale."""
    plan = ManifestPlan()
    for owner, checkpoints in sorted(listed.items()):
        for checkpoint_id, digest in sorted(checkpoints.items()):
            key = (owner, checkpoint_id)
            (plan.indexed if indexed.get(key) == digest else plan.read).append(key)
    plan.stale = sorted(key for key, digest in indexed.items()
                        if key[0] in listed and listed[key[0]].get(key[1]) != digest)
    return plan


def orphaned_index_owners(
    indexed_owners: Collection[str], blob_owners: Collection[str], shard_ids: Collection[str]
) -> list[str]:
    """The owners whose checkpoint-index rows GC drops: a directory the blob no longer holds
    checkpoints in (``blob_owners``: every directory with a checkpoints directory) that no
    shard of the store owns (``shard_ids``; a shard's own rows follow its catalog). A row
    dropped wrongly costs one manifest read if the directory comes back, never a file."""
    return sorted(set(indexed_owners) - set(blob_owners) - set(shard_ids))


def rejects_batch_ts(rejects_dir: str) -> int:
    """The ts of the batch a rejects directory (``<shard>/rejects/ts=T/<name>``) belongs to;
    a name that does not parse counts as the newest batch (kept)."""
    group = rejects_dir.split("/")[2] if rejects_dir.count("/") >= 2 else ""
    try:
        return int(group.removeprefix("ts=")) if group.startswith("ts=") else NEWEST_TS
    except ValueError:
        return NEWEST_TS


@dataclass
class _Dir:
    """One run directory of the listing: its files and its newest age."""

    files: list[Listed] = field(default_factory=list)
    newest: float | None = None

    def note(self, mtime: float) -> None:
        if self.newest is None or mtime > self.newest:
            self.newest = mtime

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)


def _group(files: Iterable[Listed], dirs: Iterable[Listed], plan: GcPlan) -> dict[str, _Dir]:
    """The listing by run directory. A file above the depth of a run directory is foreign."""
    grouped: dict[str, _Dir] = {}
    for f in files:
        if f.path.count("/") < 4:  # <shard>/runs/<x> or <shard>/runs/<group>/<x>: not in a run directory
            plan.kept.append(Kept(f.path, FOREIGN, 1, f.size))
            continue
        found = grouped.setdefault(run_dir_of_relative(f.path), _Dir())
        found.files.append(f)
        found.note(f.mtime)
    for d in dirs:
        if d.path.count("/") >= 3:  # <shard>/runs/<group>/<name>, or below
            grouped.setdefault(run_dir_of_relative(d.path), _Dir()).note(d.mtime)
    return grouped


def plan_gc(inputs: GcInputs) -> GcPlan:
    """What GC deletes and keeps, and why; see the module docstring for the rules."""
    plan = GcPlan(files_scanned=len(inputs.run_files))
    listed = {f.path for f in inputs.run_files}
    plan.missing_live = sorted(path for path in inputs.live_files if path not in listed)
    referenced_files = set(inputs.referenced_files)
    referenced_dirs = set(inputs.referenced_dirs)
    replaced = set(inputs.replaced_in_grace)
    cutoff = inputs.cutoff

    for run_dir, found in sorted(_group(inputs.run_files, inputs.run_dirs, plan).items()):
        if run_dir in referenced_dirs:
            _plan_live_dir(run_dir, found, referenced_files, cutoff, plan)
        elif found.newest is not None and found.newest >= cutoff:
            plan.kept.append(Kept(run_dir, IN_GRACE, len(found.files), found.bytes))
        elif run_dir in replaced:
            plan.kept.append(Kept(run_dir, REPLACED_IN_GRACE, len(found.files), found.bytes))
        else:
            plan.delete.append(GcItem(run_dir, RUN, len(found.files), found.bytes))

    doomed: set[str] = set()
    for name, listing in sorted(inputs.checkpoints.items()):
        if name in inputs.catalog_listed:
            continue
        relative = f"{inputs.shard_id}/checkpoints/{name}"
        size = sum(f.size for f in listing.files)
        if any(f.mtime >= cutoff for f in listing.files) or any(age >= cutoff for age in listing.ages):
            plan.kept.append(Kept(relative, IN_GRACE, len(listing.files), size))
            continue
        doomed.add(name)
        kind = UNLISTED_CHECKPOINT if listing.committed else ABANDONED_CHECKPOINT
        plan.delete.append(GcItem(relative, kind, len(listing.files), size))

    rejects_cutoff = min(inputs.rejects_cutoff, cutoff)  # younger than either: kept
    for rejects_dir, found in sorted(_group(inputs.rejects_files, inputs.rejects_dirs, plan).items()):
        if rejects_dir in referenced_dirs or rejects_batch_ts(rejects_dir) >= inputs.since:
            continue  # its batch is live (or not committed yet): only batches below since
        if found.newest is not None and found.newest >= rejects_cutoff:
            plan.kept.append(Kept(rejects_dir, IN_GRACE, len(found.files), found.bytes))
            continue
        plan.delete.append(GcItem(rejects_dir, REJECTS, len(found.files), found.bytes))

    for f in sorted(inputs.temporary_files, key=lambda f: f.path):
        # A temporary file a crash left behind an atomic write (the catalog's, a manifest's);
        # one inside a checkpoint directory being deleted goes with it.
        owner_dir = f.path.split("/")[2]  # <shard>/checkpoints/<id or the file's name>/...
        if f.mtime < cutoff and owner_dir not in doomed:
            plan.delete.append(GcItem(f.path, TEMPORARY_FILE, 1, f.size))
    return plan


def empty_groups(root: str, files: Iterable[Listed], dirs: Iterable[Listed], cutoff: float) -> list[str]:
    """The group directories right below ``root`` (``<shard>/runs/ts=…``, ``…/since=…``,
    ``<shard>/rejects/ts=…``) that the listing shows empty (no file, no directory below) and
    older than ``cutoff``: a younger one may be where a writer is about to stage (its age is
    that of its last entry added or removed)."""
    prefix = root.rstrip("/") + "/"
    busy = {e.path[len(prefix):].split("/", 1)[0] for e in [*files, *dirs]
            if e.path.startswith(prefix) and "/" in e.path[len(prefix):]}
    return sorted(d.path for d in dirs
                  if d.path.startswith(prefix) and "/" not in d.path[len(prefix):]
                  and d.path[len(prefix):] not in busy and d.mtime < cutoff)


def removable_groups(
    shard_id: str, files: Iterable[Listed], markers: Iterable[str], deleting: Collection[str],
    referenced_dirs: Collection[str], upper: int, since: int,
) -> list[str]:
    """The group prefixes (``<shard>/runs/ts=…``, ``…/since=…``, ``<shard>/rejects/ts=…``) on
    object storage that GC deletes whole, so that no directory marker stays behind (PyArrow's
    deletions leave one per emptied prefix, apache/arrow#36275): a group that holds markers
    (``markers``: prefixes the listing shows with no object below) or run directories being
    deleted (``deleting``), and no other listed file, that no commit can name again: no live
    run or retained checkpoint names a directory in it (``referenced_dirs``: a commit that
    landed after the listing) and ``gc_claims.claim_needed`` says no claim is needed (a batch
    group below ``upper``, a compaction group at or below ``since``: both only advance). A
    group at or above the upper is where a writer is about to stage: never chosen. Markers
    have no age, so this rule, not the grace period, is what makes their removal safe."""
    def group_of(path: str) -> str | None:
        parts = path.split("/")
        if len(parts) < 3 or parts[0] != shard_id or parts[1] not in ("runs", "rejects") or not parts[2]:
            return None
        return "/".join(parts[:3])

    going = set(deleting)
    busy = {group_of(f.path) for f in files if run_dir_of_relative(f.path) not in going}
    busy |= {group_of(d) for d in referenced_dirs}
    candidates = ({group_of(m) for m in markers} | {group_of(d) for d in going}) - busy - {None}
    return sorted(g for g in candidates if not claim_needed(g, upper, since))


def _plan_live_dir(run_dir: str, found: _Dir, referenced_files: set[str], cutoff: float, plan: GcPlan) -> None:
    """A run directory something references: its files stay, except data files no run names."""
    kept = [f for f in found.files if f.path in referenced_files or not is_run_data_file(f.path)]
    plan.kept.append(Kept(run_dir, REFERENCED, len(kept), sum(f.size for f in kept)))
    for f in found.files:
        if f.path in referenced_files or not is_run_data_file(f.path):
            continue
        if f.mtime >= cutoff:  # a speculative attempt may still be writing it
            plan.kept.append(Kept(f.path, IN_GRACE, 1, f.size))
        else:
            plan.delete.append(GcItem(f.path, UNLISTED_FILE, 1, f.size))


# -- GC from state: the runs the consensus store recorded as replaced ---------------------------

# Why a recorded replacement stays pending (recorded, retried by a later GC).
PINNED = "pinned"  # live state of some shard or a retained checkpoint still names it
NOT_A_RUN = "not_a_run"  # not a run directory of this shard: left for the GC of its owner


@dataclass(frozen=True)
class Replaced:
    """A run directory a compaction replaced (``upsert_replaced_runs``), and when."""

    path: str
    replaced_at: float


@dataclass
class StatePlan:
    """What a GC from state deletes (run directories), and the replacements it leaves
    pending, by reason (``PINNED``, ``REPLACED_IN_GRACE``, ``NOT_A_RUN``)."""

    delete: list[str] = field(default_factory=list)
    pending: dict[str, list[str]] = field(default_factory=dict)

    def pending_count(self, *reasons: str) -> int:
        return sum(len(self.pending.get(r, ())) for r in reasons or self.pending)


def is_run_dir_of(path: str, shard_id: str) -> bool:
    """Whether ``path`` is a run directory (``<shard>/runs/<group>/<name>``) of ``shard_id``."""
    parts = path.split("/")
    return len(parts) == 4 and parts[0] == shard_id and parts[1] == "runs" and all(parts[2:])


def plan_from_state(
    shard_id: str, replaced: Iterable[Replaced], referenced_dirs: Collection[str], cutoff: float
) -> StatePlan:
    """Which recorded replacements GC deletes now: a run directory of the shard that no live
    state and no checkpoint names (``referenced_dirs``) and that was replaced before
    ``cutoff`` (now minus the grace period: a read planned before the swap may still read
    it). Every other replacement stays recorded, so a later GC finds it again: nothing is
    lost behind what this GC handled. Nothing here lists the blob: the work is the garbage."""
    plan = StatePlan()
    for item in sorted(replaced, key=lambda r: r.path):
        if not is_run_dir_of(item.path, shard_id):
            reason = NOT_A_RUN
        elif item.path in referenced_dirs:
            reason = PINNED
        elif item.replaced_at >= cutoff:
            reason = REPLACED_IN_GRACE
        else:
            plan.delete.append(item.path)
            continue
        plan.pending.setdefault(reason, []).append(item.path)
    return plan
