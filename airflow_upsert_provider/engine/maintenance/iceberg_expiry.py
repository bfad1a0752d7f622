"""Expiring old snapshots of a published Iceberg table and deleting the files only they used.

Each publish adds a snapshot and keeps every older one (time travel to an earlier
compaction); without expiry the table's storage grows by what each publish wrote, forever.
:func:`expire_snapshots` applies a :class:`Retention` (keep the last N snapshots, and those
younger than T), after each publish and on its own:

1. decide which snapshots to keep (:func:`snapshots_to_keep`, pure): the current snapshot and
   every branch or tag head always, then the newest ``keep_last``, then any younger than
   ``keep_within``;
2. commit the removal of the others from the table's metadata (one catalog commit);
3. delete the files that only removed snapshots referenced (:func:`unreferenced_files`,
   pure): data files first, then manifests, then manifest lists, then the table's previous
   metadata files (no reader of the current metadata needs them).

Crash safety: nothing is deleted before the commit; the previous metadata files, deleted
last, still describe the removed snapshots, so an expiry interrupted after its commit or in
the middle of the deletion leaves every kept snapshot readable, and the next expiry reads
those metadata files again and deletes what was left. Each level is deleted only once the
level that references it (below it in the list above) is gone, so what is left is always
reachable from what is left above it. Files a publish writes before its commit are in no
metadata file: expiry never lists directories, so it cannot delete them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_upsert_provider.engine.errors import ConfigurationError, IntegrityError, first_line

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyiceberg.table.metadata import TableMetadata

# Iceberg's own default keeps 1 snapshot younger than 5 days; a publish a compaction keeps
# the last 10 (time travel over the last 10 compactions) and none by age.
DEFAULT_KEEP_LAST = 10
DEFAULT_KEEP_WITHIN_SECONDS = 0.0


@dataclass(frozen=True)
class Retention:
    """Which snapshots of a published table expiry keeps: the newest ``keep_last`` (at
    least 1: the current one), and every one younger than ``keep_within_seconds`` (0: none by
    age)."""

    keep_last: int = DEFAULT_KEEP_LAST
    keep_within_seconds: float = DEFAULT_KEEP_WITHIN_SECONDS


def retention(keep_last: Any = None, keep_within_seconds: Any = None) -> Retention:
    """The :class:`Retention` of the given settings (None: the default), each checked: a
    ``keep_last`` that is not an integer of at least 1 or a ``keep_within_seconds`` that is
    not a finite number of at least 0 is a :class:`ConfigurationError` naming it."""
    last = DEFAULT_KEEP_LAST if keep_last is None else keep_last
    if isinstance(last, bool) or not isinstance(last, int) or last < 1:
        raise ConfigurationError(
            f"keep_last is the number of newest snapshots an Iceberg expiry keeps, an integer of at least 1 "
            f"(the current snapshot), not {keep_last!r}",
            field="keep_last",
        )
    within = DEFAULT_KEEP_WITHIN_SECONDS if keep_within_seconds is None else keep_within_seconds
    if isinstance(within, bool) or not isinstance(within, (int, float)) or not math.isfinite(within) or within < 0:
        raise ConfigurationError(
            f"keep_within is how long an Iceberg expiry keeps a snapshot, a number of seconds of at least 0, "
            f"not {keep_within_seconds!r}",
            field="keep_within",
        )
    return Retention(last, float(within))


@dataclass(frozen=True)
class SnapshotEntry:
    """A snapshot as retention sees it: its id, when it was committed and its order among
    the table's snapshots (Iceberg's sequence number)."""

    snapshot_id: int
    timestamp_ms: int
    sequence_number: int


def snapshots_to_keep(
    snapshots: Sequence[SnapshotEntry],
    current_id: int | None,
    protected_ids: Iterable[int],
    policy: Retention,
    now_ms: int,
) -> frozenset[int]:
    """The ids of ``snapshots`` expiry keeps under ``policy`` at ``now_ms``: the current one,
    every protected one (branch and tag heads), the newest ``keep_last`` by (sequence
    number, timestamp), and every one committed less than ``keep_within_seconds`` before
    ``now_ms``. Pure."""
    newest_first = sorted(snapshots, key=lambda s: (s.sequence_number, s.timestamp_ms), reverse=True)
    keep = {s.snapshot_id for s in newest_first[: policy.keep_last]}
    horizon = now_ms - policy.keep_within_seconds * 1000
    keep |= {s.snapshot_id for s in snapshots if policy.keep_within_seconds > 0 and s.timestamp_ms > horizon}
    known = {s.snapshot_id for s in snapshots}
    keep |= {i for i in [current_id, *protected_ids] if i is not None and i in known}
    return frozenset(keep)


@dataclass(frozen=True)
class SnapshotFiles:
    """The files a snapshot's readers open: its manifest list, its manifests and the data
    (and delete) files they list as live."""

    manifest_list: str
    manifests: frozenset[str] = field(default_factory=frozenset)
    data: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True)
class Deletions:
    """What an expiry deletes, in the order it deletes: ``data``, then ``manifests``, then
    ``manifest_lists``, then ``metadata`` (previous metadata files)."""

    data: tuple[str, ...] = ()
    manifests: tuple[str, ...] = ()
    manifest_lists: tuple[str, ...] = ()
    metadata: tuple[str, ...] = ()

    def levels(self) -> list[tuple[str, tuple[str, ...]]]:
        return [("data", self.data), ("manifests", self.manifests), ("manifest_lists", self.manifest_lists),
                ("metadata", self.metadata)]

    def __len__(self) -> int:
        return sum(len(paths) for _level, paths in self.levels())


def unreferenced_files(
    known: Mapping[int, SnapshotFiles], kept: Iterable[int], previous_metadata: Iterable[str] = ()
) -> Deletions:
    """The files of the ``known`` snapshots (every snapshot the current and the previous
    metadata files describe) that no ``kept`` snapshot references, and the
    ``previous_metadata`` files, in deletion order. A file a kept snapshot references is
    never in it, whatever else references it. Pure."""
    kept = set(kept)
    keep_files: set[str] = set()
    for snapshot_id in kept:
        files = known.get(snapshot_id)
        if files is not None:
            keep_files |= {files.manifest_list, *files.manifests, *files.data}
    gone = [files for snapshot_id, files in known.items() if snapshot_id not in kept]

    def unused(paths: Iterable[str]) -> tuple[str, ...]:
        return tuple(sorted(set(paths) - keep_files))

    return Deletions(
        data=unused(p for f in gone for p in f.data),
        manifests=unused(p for f in gone for p in f.manifests),
        manifest_lists=unused(f.manifest_list for f in gone),
        metadata=unused(previous_metadata),
    )


# -- effects ---------------------------------------------------------------------------------


@dataclass
class ExpiryResult:
    """Snapshot ids expired and kept, and the files deleted."""

    expired: list[int]
    kept: list[int]
    # Files deleted per level (data, manifests, manifest_lists, metadata).
    deleted: dict[str, int]


def snapshot_entries(metadata: "TableMetadata") -> list[SnapshotEntry]:
    return [SnapshotEntry(s.snapshot_id, s.timestamp_ms, s.sequence_number or 0) for s in metadata.snapshots]


def expire_snapshots(
    table: "Table",
    policy: Retention,
    *,
    now_ms: int,
    on_step: Callable[[str], None] | None = None,
) -> ExpiryResult:
    """Apply ``policy`` to ``table`` (module docstring): commit the removal of the snapshots
    it does not keep, then delete the files only removed snapshots (of this expiry or of an
    interrupted earlier one) referenced. ``on_step`` is called with ``"expired"`` after the
    commit and with ``"delete"`` before each file is deleted (tests crash there).

    A failed commit raises (nothing was deleted). A file already gone is skipped: an
    interrupted expiry deleted it."""
    step = on_step or (lambda _name: None)
    metadata = table.metadata
    protected = [ref.snapshot_id for ref in metadata.refs.values()]
    current = metadata.current_snapshot_id
    keep = snapshots_to_keep(snapshot_entries(metadata), current, protected, policy, now_ms)
    expired = sorted(s.snapshot_id for s in metadata.snapshots if s.snapshot_id not in keep)
    # Read before the commit: a kept snapshot's missing file stops the expiry unchanged.
    known = _known_snapshots(table, metadata, keep)
    if expired:
        table.maintenance.expire_snapshots().by_ids(expired).commit()
        table = table.refresh()
        step("expired")
    metadata = table.metadata
    kept = {s.snapshot_id for s in metadata.snapshots}
    # A publish that committed meanwhile added a snapshot: its files are kept too.
    known |= {
        s.snapshot_id: _snapshot_files(table, s, True) for s in metadata.snapshots if s.snapshot_id not in known
    }
    previous = [entry.metadata_file for entry in metadata.metadata_log if entry.metadata_file != table.metadata_location]
    plan = unreferenced_files(known, kept, previous)
    deleted: dict[str, int] = {}
    for level, paths in plan.levels():
        deleted[level] = 0
        for path in paths:
            step("delete")
            if _delete(table, path):
                deleted[level] += 1
    return ExpiryResult(expired=expired, kept=sorted(kept), deleted=deleted)


def _known_snapshots(table: "Table", metadata: "TableMetadata", kept: set[int]) -> dict[int, SnapshotFiles]:
    """Every snapshot the current metadata and its previous metadata files (those still
    present) describe, with the files each references that are still present. A file of a
    ``kept`` snapshot that is missing is an :class:`IntegrityError` naming it: its data files
    would otherwise not count as kept."""
    from pyiceberg.serializers import FromInputFile

    snapshots = {s.snapshot_id: s for s in metadata.snapshots}
    for entry in metadata.metadata_log:
        try:
            older = FromInputFile.table_metadata(table.io.new_input(entry.metadata_file))
        except FileNotFoundError:
            continue  # deleted by an earlier expiry
        for snapshot in older.snapshots:
            snapshots.setdefault(snapshot.snapshot_id, snapshot)
    return {
        snapshot_id: _snapshot_files(table, snapshot, snapshot_id in kept)
        for snapshot_id, snapshot in snapshots.items()
    }


def _snapshot_files(table: "Table", snapshot: Any, kept: bool) -> SnapshotFiles:
    def missing(path: str, exc: FileNotFoundError) -> None:
        if kept:
            raise IntegrityError(
                f"Iceberg table {'.'.join(table.name())}: file {path} of kept snapshot {snapshot.snapshot_id} "
                f"is missing ({first_line(exc)}); nothing was deleted",
                table=".".join(table.name()),
                file=path,
            ) from None

    try:
        manifests = snapshot.manifests(table.io)
    except FileNotFoundError as exc:
        # Of a removed snapshot: an earlier expiry deleted it after everything below it.
        missing(snapshot.manifest_list, exc)
        return SnapshotFiles(snapshot.manifest_list)
    data: set[str] = set()
    paths: set[str] = set()
    for manifest in manifests:
        try:
            entries = manifest.fetch_manifest_entry(table.io, discard_deleted=True)
        except FileNotFoundError as exc:
            missing(manifest.manifest_path, exc)
            continue  # deleted by an earlier expiry, after the data files it listed
        paths.add(manifest.manifest_path)
        data |= {entry.data_file.file_path for entry in entries}
    return SnapshotFiles(snapshot.manifest_list, frozenset(paths), frozenset(data))


def _delete(table: "Table", path: str) -> bool:
    """Delete ``path``; False when it was already gone."""
    try:
        table.io.delete(path)
    except FileNotFoundError:
        return False
    return True
