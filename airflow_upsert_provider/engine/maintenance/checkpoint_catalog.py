"""Checkpoints: immutable recovery points of a shard, listed in a catalog. This module owns the
catalog, its entries, its blob copies and the paths of checkpoint directories (the manifest:
checkpoint_manifest.py; create: checkpoint.py; verify: checkpoint_verify.py; restore:
checkpoint_restore.py; retention: checkpoint_retention.py).

A checkpoint copies no data. It is a manifest naming every file the shard state at its upper
needs (size and SHA-256 of each), with the state, the compacted run, the batches and bindings
from since - 1 on (``ShardSnapshot``: the older ones are history, summed up in its rollups),
and the quarantined files, so that consensus can be rebuilt from it. On disk, below
``<blob>/<shard>/checkpoints/``::

    catalog-v<version>.json  {"format": 1, "shard": ..., "version": V, "checkpoints": [entry, ...]}
    <id>/MANIFEST.json       {"format": 1, "checkpoint": ..., "state": ..., "files": [...], ...}
    <id>/COMMIT              {"checkpoint": ..., "manifest_sha256": ...}

The catalog itself lives in the consensus store (store/catalog_rows.py), changed in short
transactions with no blob I/O; ``catalog-v<version>.json`` is the blob copy of its version V,
written after the change committed, write-once, the older ones pruned: what ``checkpoint
restore`` reads into an empty store. ``CATALOG.json`` is the catalog file of a release before
the store held catalogs: read (and imported into the store by the first change) while no copy
exists, then pruned.

Every file is written atomically and durably (``Blob.write_atomic``), in the order manifest,
commit marker, catalog entry: a catalog entry never points at anything missing. The catalog
(and its copy) is made, empty, before the first checkpoint directory exists, so a missing
catalog beside committed checkpoint directories is corruption, never "no checkpoints"; a
checkpoint directory without a commit marker is a checkpoint being written (or abandoned).
Before a listed checkpoint's directory is deleted (retention, GC), the copy of a version that
no longer lists it is written: a copy never lists a deleted directory.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from typing import Any, Callable

from airflow_upsert_provider.engine.blob.interface import Blob
from airflow_upsert_provider.engine.errors import (
    BlobUnavailable,
    CommitRefused,
    ConfigurationError,
    IntegrityError,
    UpsertError,
)
from airflow_upsert_provider.engine.store.catalog_lock import catalog_lock
from airflow_upsert_provider.engine.store.catalog_rows import (
    entry_order,
    read_catalog,
    read_catalog_in,
    write_catalog_in,
)
from airflow_upsert_provider.engine.store.checkpoint_refs import forget_references_in
from airflow_upsert_provider.engine.store.consensus import Consensus
from airflow_upsert_provider.engine.store.gc_claims import (
    check_blob_owner,
    claimed_checkpoints,
    refuse_claimed_checkpoints,
)
from airflow_upsert_provider.engine.table.shard import MAX_REPORTED

log = logging.getLogger(__name__)

FORMAT = 1
# The catalog file of a release before the store held catalogs.
CATALOG_NAME = "CATALOG.json"
# The blob copies of the catalog's versions: catalog-v<version, 12 digits>.json.
COPY_PREFIX = "catalog-v"
COPY_SUFFIX = ".json"
MANIFEST_NAME = "MANIFEST.json"
COMMIT_NAME = "COMMIT"


class CheckpointCorrupt(IntegrityError):
    """A catalog, manifest, commit marker or listed file is missing, unreadable or does not
    match what was recorded. ``details["records"]`` names every offending file."""


@dataclass(frozen=True)
class CheckpointEntry:
    """One committed checkpoint as the catalog lists it."""

    id: str
    upper: int
    since: int
    created_at: float
    files: int
    bytes: int
    manifest_sha256: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CheckpointEntry":
        return cls(
            id=str(data["id"]),
            upper=int(data["upper"]),
            since=int(data["since"]),
            created_at=float(data["created_at"]),
            files=int(data["files"]),
            bytes=int(data["bytes"]),
            manifest_sha256=str(data["manifest_sha256"]),
        )


def checkpoints_root(blob: Blob, shard_id: str) -> str:
    return blob.path(shard_id, "checkpoints")


def checkpoint_path(blob: Blob, shard_id: str, checkpoint_id: str, *names: str) -> str:
    """The directory of a checkpoint, or a file in it (``names``)."""
    return blob.path(shard_id, "checkpoints", checkpoint_id, *names)


def checkpoint_dirs(blob: Blob, shard_id: str) -> list[str]:
    """Names of the checkpoint directories of a shard, committed or not."""
    root = checkpoints_root(blob, shard_id)
    return [n for n in blob.listdir(root) if not n.startswith(".") and blob.is_dir(blob.join(root, n))]


def is_committed(blob: Blob, shard_id: str, checkpoint_id: str) -> bool:
    return blob.exists(checkpoint_path(blob, shard_id, checkpoint_id, COMMIT_NAME))


class Catalog:
    """The committed checkpoints of one shard.

    The consensus store holds the authoritative catalog (store/catalog_rows.py). A change
    (``ensure``, ``add``, ``remove``, ``update``) is one short transaction under the shard's
    catalog lock that reads the rows, applies itself to what it finds and writes them back
    with the next version, so overlapping changes serialize and none is lost; no blob I/O runs
    inside it. After it, the change writes the blob copy of its version (``write_copy``), from
    which ``checkpoint restore`` works with the blob alone. A store that does not hold a
    shard's catalog yet (written before the store held catalogs, or restored from the blob)
    imports the blob's on its first change. Reading needs no consensus (the blob copy is
    read); changing does."""

    def __init__(
        self,
        blob: Blob,
        shard_id: str,
        entries: list[CheckpointEntry],
        exists: bool,
        consensus: Consensus | None = None,
        *,
        version: int = 0,
        in_store: bool = False,
    ) -> None:
        self.blob = blob
        self.shard_id = shard_id
        self.entries = entries
        self.exists = exists
        self.consensus = consensus
        # The catalog's version (0: none yet), and whether the store holds it.
        self.version = version
        self.in_store = in_store
        # Whether the blob copy of ``version`` is known to be written (see ``update``).
        self.copy_written = True

    @property
    def path(self) -> str:
        """The catalog file of a release before the store held catalogs (read, then pruned)."""
        return self.blob.join(checkpoints_root(self.blob, self.shard_id), CATALOG_NAME)

    def copy_path(self, version: int) -> str:
        return self.blob.join(checkpoints_root(self.blob, self.shard_id), copy_name(version))

    @classmethod
    def load(cls, blob: Blob, shard_id: str, consensus: Consensus | None = None) -> "Catalog":
        """Read the catalog: from ``consensus`` when given and it holds the shard's catalog,
        else from the blob copy (``read_blob_catalog``: refuses an empty, truncated or corrupt
        one, and a missing one while committed checkpoint directories exist). ``consensus``
        is needed to change it."""
        if consensus is not None:
            stored = read_catalog(consensus, shard_id)
            if stored is not None:
                entries = [CheckpointEntry.from_dict(e) for e in stored.entries]
                return cls(blob, shard_id, entries, True, consensus, version=stored.version, in_store=True)
        found = read_blob_catalog(blob, shard_id)
        return cls(blob, shard_id, found.entries, found.exists, consensus, version=found.version)

    def get(self, checkpoint_id: str) -> CheckpointEntry:
        for entry in self.entries:
            if entry.id == checkpoint_id:
                return entry
        raise ConfigurationError(
            f"shard {self.shard_id!r} has no checkpoint {checkpoint_id!r} in its catalog "
            f"(checkpoints: {', '.join(e.id for e in self.entries) or 'none'})",
            shard=self.shard_id,
            checkpoint=checkpoint_id,
        )

    def latest(self) -> CheckpointEntry | None:
        return max(self.entries, key=lambda e: (e.upper, e.created_at), default=None)

    def ensure(self) -> None:
        """Make the store hold the catalog (importing the blob's) and its blob copy exist,
        before the first checkpoint directory."""
        self.update(lambda entries: entries)

    def add(self, entry: CheckpointEntry) -> None:
        self.update(lambda entries: entries + [entry])

    def remove(self, ids: set[str]) -> None:
        self.update(lambda entries: [e for e in entries if e.id not in ids])

    def update(self, change: Callable[[list[CheckpointEntry]], list[CheckpointEntry]]) -> list[CheckpointEntry]:
        """Apply ``change`` to the catalog as the store holds it now, under the catalog lock,
        then write the blob copy of the result. Returns the new list.

        A failed copy write does not fail the change (it is committed): it is logged, and
        ``copy_written`` says so; the next change or GC writes the copy."""
        if self.consensus is None:
            raise ConfigurationError(
                f"changing the checkpoint catalog of shard {self.shard_id!r} needs the consensus store "
                "(its catalog lock): load it with Catalog.load(blob, shard_id, consensus)",
                shard=self.shard_id,
            )
        # The catalog of a shard restored into another store sharing the blob is that
        # store's: this one's retention must not drop what the restore came from.
        check_blob_owner(self.consensus, self.blob, self.shard_id, "change the checkpoint catalog")
        # The blob's catalog, read before the lock, for a store that does not hold it yet.
        imported = None if read_catalog(self.consensus, self.shard_id) is not None else read_blob_catalog(
            self.blob, self.shard_id
        )
        with catalog_lock(self.consensus, self.shard_id) as conn:
            stored = read_catalog_in(conn, self.shard_id)
            if stored is not None:
                base_version, current = stored.version, [CheckpointEntry.from_dict(e) for e in stored.entries]
            elif imported is not None:
                # A checkpoint GC claimed (and deletes) is never listed, imported or added.
                claimed = claimed_checkpoints(conn, self.shard_id, [e.id for e in imported.entries])
                base_version, current = imported.version, [e for e in imported.entries if e.id not in claimed]
            else:
                # The rows were there before the lock and are gone now: only a drop of the
                # shard's catalog does that.
                raise UpsertError(
                    f"the checkpoint catalog of shard {self.shard_id!r} was removed from the consensus store "
                    "while it was being changed; nothing was changed",
                    shard=self.shard_id,
                )
            entries = _ordered(change(list(current)))
            added = {e.id for e in entries} - {e.id for e in current}
            if added:
                # Under the lock GC takes to claim checkpoint directories: a directory GC
                # claimed (and deletes) is never listed.
                reason = refuse_claimed_checkpoints(conn, self.shard_id, sorted(added))
                if reason is not None:
                    raise CommitRefused(
                        f"adding checkpoint(s) {', '.join(sorted(added))} to the catalog of shard "
                        f"{self.shard_id!r} refused: {reason}",
                        shard=self.shard_id,
                        reason=reason,
                    )
            # The index of what a dropped checkpoint's manifest names goes with its entry.
            forget_references_in(conn, self.shard_id, {e.id for e in current} - {e.id for e in entries})
            version = base_version
            if stored is None or entries != _ordered(current):
                version = base_version + 1
                write_catalog_in(conn, self.shard_id, stored, [e.to_dict() for e in entries], version)
        self.entries, self.exists, self.version, self.in_store = entries, True, version, True
        self.copy_written = self.write_copy()
        return list(self.entries)

    def write_copy(self) -> bool:
        """Make sure the blob holds the copy of this catalog's version (or of a later one),
        then prune the older copies. False (logged) if the blob failed: a change is committed
        in the store whatever its copy does."""
        try:
            self.write_copy_or_raise()
        except (OSError, BlobUnavailable) as exc:
            log.warning(
                "checkpoint catalog of shard %r: version %d is committed in the consensus store, but its "
                "blob copy %s could not be written (%s); the next catalog change or GC writes it",
                self.shard_id, self.version, self.copy_path(self.version), exc,
            )
            return False
        return True

    def write_copy_or_raise(self) -> None:
        """``write_copy``, raising what the blob raised. Copies are write-once: version V has
        one content, whoever writes it, and a copy is never written below an existing one."""
        root = checkpoints_root(self.blob, self.shard_id)
        names = self.blob.listdir(root)
        versions = [v for v in map(copy_version, names) if v is not None]
        if not any(v >= self.version for v in versions):
            self.blob.write_atomic(self.copy_path(self.version), self._encode())
        # Older copies (and the file of a release before copies) are superseded; what a failure
        # leaves is pruned by the next write.
        stale = [copy_name(v) for v in versions if v < self.version] + [n for n in names if n == CATALOG_NAME]
        for name in stale:
            try:
                self.blob.delete_file(self.blob.join(root, name))
            except (OSError, BlobUnavailable):
                pass

    def _encode(self) -> bytes:
        doc = {
            "format": FORMAT,
            "shard": self.shard_id,
            "version": self.version,
            "checkpoints": [e.to_dict() for e in _ordered(self.entries)],
        }
        return json.dumps(doc, indent=1, sort_keys=True).encode()


def _ordered(entries: list[CheckpointEntry]) -> list[CheckpointEntry]:
    return sorted(entries, key=lambda e: entry_order(e.to_dict()))


def copy_name(version: int) -> str:
    """The name of the blob copy of a catalog's version (zero-padded: names sort as versions)."""
    return f"{COPY_PREFIX}{version:012d}{COPY_SUFFIX}"


def copy_version(name: str) -> int | None:
    """The version a copy's file name carries; None for any other name."""
    if not (name.startswith(COPY_PREFIX) and name.endswith(COPY_SUFFIX)):
        return None
    number = name[len(COPY_PREFIX) : -len(COPY_SUFFIX)]
    return int(number) if number.isdigit() else None


@dataclass(frozen=True)
class BlobCatalog:
    """A catalog as the blob holds it: the copy's version (0 for a catalog file of a release
    before copies, or none), its entries, and whether there is one."""

    version: int
    entries: list[CheckpointEntry]
    exists: bool


def read_blob_catalog(blob: Blob, shard_id: str) -> BlobCatalog:
    """The catalog of ``shard_id`` as its blob copies give it: the highest version that parses
    (a change's copy lags the store's version only after a crash or a failed write), else the
    catalog file of a release before copies. Refuses (CheckpointCorrupt) when no copy parses,
    an empty, truncated or corrupt catalog file, and none at all while committed checkpoint
    directories exist."""
    root = checkpoints_root(blob, shard_id)
    versions = sorted((v for v in map(copy_version, blob.listdir(root)) if v is not None), reverse=True)
    first_problem: CheckpointCorrupt | None = None
    for version in versions:
        path = blob.join(root, copy_name(version))
        try:
            return BlobCatalog(version, _parse_catalog(blob.read_bytes(path), path, shard_id), True)
        except FileNotFoundError:
            continue  # pruned after a later one was written
        except OSError as exc:
            problem = CheckpointCorrupt(f"checkpoint catalog {path} is unreadable: {exc.strerror}", shard=shard_id, file=path)
        except CheckpointCorrupt as exc:
            problem = exc
        first_problem = first_problem or problem
    if first_problem is not None:
        raise first_problem
    path = blob.join(root, CATALOG_NAME)
    try:
        data = blob.read_bytes(path)
    except FileNotFoundError:
        committed = [n for n in checkpoint_dirs(blob, shard_id) if is_committed(blob, shard_id, n)]
        if committed:
            raise CheckpointCorrupt(
                f"checkpoint catalog {path} is missing but committed checkpoint directories exist ({len(committed)}, "
                f"first: {committed[0]}), and there is no copy ({COPY_PREFIX}<version>{COPY_SUFFIX}) beside it: "
                "refusing to treat it as empty; restore the catalog file before running checkpoint or GC commands",
                shard=shard_id,
                file=path,
                records=[{"file": blob.join(root, n), "reason": "committed, not in a catalog"}
                         for n in committed[:MAX_REPORTED]],
            ) from None
        # No catalog and nothing committed: no checkpoint yet (or the first one is being
        # written, which writes the catalog before its directory).
        return BlobCatalog(0, [], False)
    except OSError as exc:
        raise CheckpointCorrupt(
            f"checkpoint catalog {path} is unreadable: {exc.strerror}", shard=shard_id, file=path
        ) from None
    return BlobCatalog(0, _parse_catalog(data, path, shard_id), True)


def write_current_copy(consensus: Consensus, blob: Blob, shard_id: str) -> None:
    """Write the blob copy of the catalog's current version if it is missing (raising what the
    blob raises): before a checkpoint directory is deleted, so that no copy a restore may read
    lists it. Nothing to do while the store does not hold the catalog (the blob's is the one)."""
    catalog = Catalog.load(blob, shard_id, consensus)
    if catalog.in_store:
        catalog.write_copy_or_raise()


def _parse_catalog(data: bytes, path: str, shard_id: str) -> list[CheckpointEntry]:
    if not data.strip():
        raise CheckpointCorrupt(
            f"checkpoint catalog {path} is empty ({len(data)} bytes): refusing to treat it as no checkpoints",
            shard=shard_id,
            file=path,
        )
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise CheckpointCorrupt(
            f"checkpoint catalog {path} is truncated or corrupt ({len(data)} bytes): {exc}",
            shard=shard_id,
            file=path,
        ) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("checkpoints"), list):
        raise CheckpointCorrupt(
            f"checkpoint catalog {path} is not a format-{FORMAT} catalog", shard=shard_id, file=path
        )
    try:
        return [CheckpointEntry.from_dict(e) for e in doc["checkpoints"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointCorrupt(
            f"checkpoint catalog {path} has a malformed entry: {exc!r}", shard=shard_id, file=path
        ) from None


def delete_unlisted(blob: Blob, directory: str) -> None:
    """Delete an unlisted checkpoint directory; what a failure leaves is GC's to remove."""
    try:
        blob.delete_tree(directory)
    except (OSError, BlobUnavailable):
        pass
