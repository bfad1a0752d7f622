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
   metadata files (no reader of the current metadata needs them), but for each kept
   snapshot the newest one written while it was current (:func:`metadata_files_to_keep`,
   pure), from which the table can be registered again with that snapshot current.

What exists is known from ONE listing of the table's ``metadata/`` directory
(:class:`MetadataListing`): a file an earlier expiry deleted is never asked for.

Crash safety: nothing is deleted before the commit; the previous metadata files, deleted
last, still describe the removed snapshots, so an expiry interrupted after its commit or in
the middle of the deletion leaves every kept snapshot readable, and the next expiry reads
those metadata files again and deletes what was left. Each level is deleted only once the
level that references it (below it in the list above) is gone, so what is left is always
reachable from what is left above it. Files a publish writes before its commit are in no
metadata file: expiry lists only ``metadata/`` and deletes only files a metadata file names,
so it cannot delete them.
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


def metadata_files_to_keep(
    log: Sequence[tuple[str, int]], became_current: Mapping[int, int], kept: Iterable[int], commits: Iterable[int]
) -> frozenset[str]:
    """The previous metadata files an expiry keeps: for each ``kept`` snapshot, the newest
    entry of the metadata ``log`` (``(file, its last-updated ms)``, oldest first) written
    while that snapshot was the current one, i.e. from when it became current
    (``became_current``, the snapshot log) until the next snapshot's commit (``commits``: the
    commit times of every snapshot known). Registering the table from that file gives the
    table with that snapshot current, as it was after its publish (and the expiry that
    followed it). Give the kept snapshots but the current one, whose metadata file is the
    table's own. A kept snapshot no entry matches (its file pruned from the log) keeps none.
    Pure."""
    times = sorted(set(commits))
    keep: set[str] = set()
    for snapshot_id in set(kept):
        start = became_current.get(snapshot_id)
        if start is None:
            continue
        end = next((t for t in times if t > start), math.inf)
        inside = [path for path, timestamp in log if start <= timestamp < end]
        if inside:
            keep.add(inside[-1])
    return frozenset(keep)


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

    What it reads: one listing of the table's ``metadata/`` directory (:class:`MetadataListing`)
    says which previous metadata files, manifest lists and manifests are still present; only
    those are read (an entry of the metadata log an earlier expiry deleted costs nothing), each
    manifest once, and the kept snapshots' files only when something is to be deleted.

    A failed commit raises (nothing was deleted). A file already gone is skipped: an
    interrupted expiry deleted it."""
    step = on_step or (lambda _name: None)
    metadata = table.metadata
    listing = MetadataListing.of(table)
    protected = [ref.snapshot_id for ref in metadata.refs.values()]
    current = metadata.current_snapshot_id
    keep = snapshots_to_keep(snapshot_entries(metadata), current, protected, policy, now_ms)
    expired = sorted(s.snapshot_id for s in metadata.snapshots if s.snapshot_id not in keep)
    snapshots = _described_snapshots(table, listing)
    if not expired and set(snapshots) <= keep and not _previous_metadata(table, listing):
        # Nothing removed, nothing left by an interrupted expiry: nothing to read or delete.
        return ExpiryResult(expired=[], kept=sorted(keep), deleted={level: 0 for level, _ in Deletions().levels()})
    manifests: dict[str, frozenset[str]] = {}
    # Read before the commit: a kept snapshot's missing file stops the expiry unchanged.
    known = {i: _snapshot_files(table, s, i in keep, listing, manifests) for i, s in snapshots.items()}
    if expired:
        table.maintenance.expire_snapshots().by_ids(expired).commit()
        table = table.refresh()
        step("expired")
    metadata = table.metadata
    kept = {s.snapshot_id for s in metadata.snapshots}
    # A publish that committed meanwhile added a snapshot: its files are kept too (read
    # without the listing, which is older than they are).
    known |= {
        s.snapshot_id: _snapshot_files(table, s, True, NO_LISTING, manifests)
        for s in metadata.snapshots if s.snapshot_id not in known
    }
    plan = unreferenced_files(known, kept, _previous_metadata(table, listing))
    deleted: dict[str, int] = {}
    for level, paths in plan.levels():
        deleted[level] = 0
        for path in paths:
            step("delete")
            if _delete(table, path):
                deleted[level] += 1
    return ExpiryResult(expired=expired, kept=sorted(kept), deleted=deleted)


class MetadataListing:
    """The files present in a table's ``metadata/`` directory (its metadata files, manifest
    lists and manifests, where PyIceberg writes them), from ONE listing through the table's
    own file IO: :meth:`absent` answers without a request. A file outside that directory, or
    a table whose IO cannot list (not PyArrow's) or whose listing failed, is never called
    absent: it is read, and a missing one found so, as without the listing."""

    def __init__(self, directory: str | None, present: frozenset[str], parse: Callable[[str], str] | None) -> None:
        self.directory, self.present, self._parse = directory, present, parse

    @classmethod
    def of(cls, table: "Table") -> "MetadataListing":
        import pyarrow.fs

        io = table.io
        parse_location = getattr(io, "parse_location", None)
        fs_by_scheme = getattr(io, "fs_by_scheme", None)
        if parse_location is None or fs_by_scheme is None:
            return cls(None, frozenset(), None)

        def parse(uri: str) -> str:
            return parse_location(uri, io.properties)[2]

        scheme, netloc, directory = parse_location(f"{table.location().rstrip('/')}/metadata", io.properties)
        try:
            infos = fs_by_scheme(scheme, netloc).get_file_info(pyarrow.fs.FileSelector(directory, allow_not_found=True))
        except Exception:  # the reads that follow report the store's failure, file by file
            return cls(None, frozenset(), None)
        return cls(directory.rstrip("/"), frozenset(i.path for i in infos), parse)

    def absent(self, uri: str) -> bool:
        """Whether ``uri`` is provably gone: in the listed directory and not listed."""
        if self.directory is None or self._parse is None:
            return False
        path = self._parse(uri)
        return path.rpartition("/")[0] == self.directory and path not in self.present


# For files written after the listing: every one is read.
NO_LISTING = MetadataListing(None, frozenset(), None)


def _previous_metadata(table: "Table", listing: MetadataListing) -> list[str]:
    """The table's previous metadata files (its metadata log) still present, but those of its
    snapshots (:func:`metadata_files_to_keep`)."""
    metadata = table.metadata
    kept = metadata_files_to_keep(
        [(entry.metadata_file, entry.timestamp_ms) for entry in metadata.metadata_log],
        {entry.snapshot_id: entry.timestamp_ms for entry in metadata.snapshot_log},
        [s.snapshot_id for s in metadata.snapshots if s.snapshot_id != metadata.current_snapshot_id],
        [s.timestamp_ms for s in metadata.snapshots],
    )
    return [entry.metadata_file for entry in metadata.metadata_log
            if entry.metadata_file != table.metadata_location and entry.metadata_file not in kept
            and not listing.absent(entry.metadata_file)]


def _described_snapshots(table: "Table", listing: MetadataListing) -> dict[int, Any]:
    """Every snapshot the current metadata and its previous metadata files still present
    describe (one read each), those of a removed snapshot whose manifest list is gone left
    out: an earlier expiry deleted everything below it."""
    from pyiceberg.serializers import FromInputFile

    snapshots = {s.snapshot_id: s for s in table.metadata.snapshots}
    for path in _previous_metadata(table, listing):
        try:
            older = FromInputFile.table_metadata(table.io.new_input(path))
        except FileNotFoundError:
            continue  # deleted by an earlier expiry
        for snapshot in older.snapshots:
            if snapshot.snapshot_id not in snapshots and not listing.absent(snapshot.manifest_list):
                snapshots[snapshot.snapshot_id] = snapshot
    return snapshots


def _snapshot_files(table: "Table", snapshot: Any, kept: bool, listing: MetadataListing,
                    manifests: dict[str, frozenset[str]]) -> SnapshotFiles:
    """The files ``snapshot`` references that are still present; ``manifests`` caches each
    manifest's live data files (read once per expiry). A missing file of a ``kept`` snapshot
    is an :class:`IntegrityError` naming it: its data files would otherwise not count as kept."""
    def missing(path: str, reason: str) -> None:
        if kept:
            raise IntegrityError(
                f"Iceberg table {'.'.join(table.name())}: file {path} of kept snapshot {snapshot.snapshot_id} "
                f"is missing ({reason}); nothing was deleted",
                table=".".join(table.name()),
                file=path,
            ) from None

    if listing.absent(snapshot.manifest_list):
        missing(snapshot.manifest_list, "not in a listing of the table's metadata directory")
        return SnapshotFiles(snapshot.manifest_list)
    try:
        listed = snapshot.manifests(table.io)
    except FileNotFoundError as exc:
        # Of a removed snapshot: an earlier expiry deleted it after everything below it.
        missing(snapshot.manifest_list, first_line(exc))
        return SnapshotFiles(snapshot.manifest_list)
    data: set[str] = set()
    paths: set[str] = set()
    for manifest in listed:
        path = manifest.manifest_path
        if path not in manifests:
            if listing.absent(path):
                missing(path, "not in a listing of the table's metadata directory")
                continue  # deleted by an earlier expiry, after the data files it listed
            try:
                entries = manifest.fetch_manifest_entry(table.io, discard_deleted=True)
            except FileNotFoundError as exc:
                missing(path, first_line(exc))
                continue
            manifests[path] = frozenset(entry.data_file.file_path for entry in entries)
        paths.add(path)
        data |= manifests[path]
    return SnapshotFiles(snapshot.manifest_list, frozenset(paths), frozenset(data))


def _delete(table: "Table", path: str) -> bool:
    """Delete ``path``; False when it was already gone."""
    try:
        table.io.delete(path)
    except FileNotFoundError:
        return False
    return True
