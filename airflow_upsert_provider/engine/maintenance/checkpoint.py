"""Checkpoints: immutable recovery points of a shard, listed in a catalog.

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

import hashlib
import json
import logging
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Callable

from airflow_upsert_provider.engine.blob.interface import Blob
from airflow_upsert_provider.engine.store.catalog_lock import catalog_lock
from airflow_upsert_provider.engine.store.catalog_rows import (
    entry_order,
    read_catalog,
    read_catalog_in,
    write_catalog_in,
)
from airflow_upsert_provider.engine.config import ShardConfig, validate_shard_id
from airflow_upsert_provider.engine.common.retry import CAS_CONTENTION
from airflow_upsert_provider.engine.store.consensus import Consensus
from airflow_upsert_provider.engine.store.restore import restore_shard
from airflow_upsert_provider.engine.store.records import (
    BatchRecord,
    Binding,
    CompactionRecord,
    Rollup,
    ShardRecord,
    ShardSnapshot,
)
from airflow_upsert_provider.engine.errors import (
    BlobUnavailable,
    CommitRefused,
    ConfigurationError,
    ConsensusOutcomeUnknown,
    IntegrityError,
    UpsertError,
)
from airflow_upsert_provider.engine.store.gc_claims import (
    check_blob_owner,
    claimed_checkpoints,
    mark_blob_owner,
    refuse_claimed_checkpoints,
)
from airflow_upsert_provider.engine.table.runs import file_problem
from airflow_upsert_provider.engine.table.shard import MAX_REPORTED, Shard

log = logging.getLogger(__name__)

FORMAT = 1
# The catalog file of a release before the store held catalogs.
CATALOG_NAME = "CATALOG.json"
# The blob copies of the catalog's versions: catalog-v<version, 12 digits>.json.
COPY_PREFIX = "catalog-v"
COPY_SUFFIX = ".json"
MANIFEST_NAME = "MANIFEST.json"
COMMIT_NAME = "COMMIT"
# A checkpoint whose snapshot was overtaken by a compaction, or whose directory GC collected,
# is written again (see create).
MAX_ATTEMPTS = CAS_CONTENTION.max_attempts


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


# -- manifests --------------------------------------------------------------------------------


class CommittedFileBad(IntegrityError):
    """A file the shard's committed state names is missing, or differs from what was recorded
    when it was written (size, SHA-256), or is not readable Parquet: no checkpoint is written
    over it. ``details["records"]`` names every such file."""


# Files hashed at once by a checkpoint create: hashlib releases the GIL while it digests.
HASH_THREADS = 4


def manifest_files(blob: Blob, snapshot: ShardSnapshot) -> list[dict[str, Any]]:
    """Every file the state of ``snapshot`` at its upper needs, with size and SHA-256, each
    verified as ``verify`` would (present, the size and SHA-256 recorded when its run was
    written, a readable Parquet footer), so that a checkpoint never lists a file that fails
    ``verify`` or could not be restored (CommittedFileBad). A run written before checksums
    were recorded has its files hashed here and listed with that hash."""
    from concurrent.futures import ThreadPoolExecutor

    listed = [
        {"path": f["path"], "bytes": f["bytes"], "sha256": f.get("sha256")}
        for run in snapshot.live_runs()
        for f in run["files"]
    ]
    with ThreadPoolExecutor(max_workers=HASH_THREADS) as pool:
        checked = list(pool.map(lambda f: file_problem(blob, f, "the shard's state"), listed))
    files, problems = [], []
    for f, (digest, reason) in zip(listed, checked):
        if reason is not None:
            problems.append({"file": blob.path(f["path"]), "reason": reason})
        else:
            files.append({"path": f["path"], "bytes": f["bytes"], "sha256": digest})
    if problems:
        shard_id = snapshot.record.shard_id
        raise CommittedFileBad(
            f"cannot checkpoint shard {shard_id!r} at upper {snapshot.record.upper}: {len(problems)} committed "
            f"file(s) bad; first: {problems[0]['file']}: {problems[0]['reason']} (restore an earlier checkpoint)",
            shard=shard_id,
            file=problems[0]["file"],
            records=problems[:MAX_REPORTED],
            count=len(problems),
        )
    return files


def build_manifest(checkpoint_id: str, snapshot: ShardSnapshot, files: list[dict[str, Any]], created_at: float) -> dict[str, Any]:
    record = snapshot.record
    # The bindings below the upper, and up to the one a source index row is anchored at: a
    # row saved as binding(upper) was minted is checked against it after a restore (it is
    # immutable, so the restored shard's next batch is that very binding).
    last_binding = max([record.upper - 1] + [int(r["through_ts"]) for r in snapshot.source_index])
    return {
        "format": FORMAT,
        "checkpoint": checkpoint_id,
        "shard": record.shard_id,
        "created_at": created_at,
        "state": {"upper": record.upper, "since": record.since, "seqno": record.seqno, "config": record.config},
        "compaction": None if snapshot.compaction is None else asdict(snapshot.compaction),
        "batches": [asdict(b) for b in snapshot.batches if b.ts < record.upper],
        "bindings": [
            {"ts": b.ts, "ranges": b.ranges, "quarantined": b.quarantined, "minted_by": b.minted_by}
            for b in snapshot.bindings
            if b.ts <= last_binding
        ],
        "quarantined": snapshot.quarantined,
        # The audit summary of the history below since - 1, whose rows are not recorded.
        "rollups": [r.to_dict() for r in snapshot.rollups],
        # What planning knows of the source, anchored at a binding the manifest holds.
        "source_index": snapshot.source_index,
        "files": files,
    }


def snapshot_from_manifest(manifest: dict[str, Any], shard_id: str) -> ShardSnapshot:
    """The consensus state a manifest records, as shard ``shard_id``."""
    state = manifest["state"]
    ShardConfig.from_json(state["config"])  # a config that does not parse must fail here
    compaction = manifest["compaction"]
    return ShardSnapshot(
        record=ShardRecord(
            shard_id=shard_id,
            upper=int(state["upper"]),
            since=int(state["since"]),
            seqno=int(state["seqno"]),
            config=state["config"],
            created_at=time.time(),
        ),
        compaction=None if compaction is None else CompactionRecord(**compaction),
        batches=[BatchRecord(**b) for b in manifest["batches"]],
        bindings=[Binding(**b) for b in manifest["bindings"]],
        quarantined=list(manifest["quarantined"]),
        # Absent from manifests written before history was truncated.
        rollups=[Rollup(**r) for r in manifest.get("rollups", [])],
        # Without it (older manifests hold every binding) planning rebuilds it from the bindings.
        source_index=list(manifest.get("source_index", [])),
    )


def read_manifest(blob: Blob, shard_id: str, checkpoint_id: str, expected_sha256: str | None = None) -> dict[str, Any]:
    """The parsed manifest of a checkpoint, checked against its commit marker (and the
    catalog's checksum when given). Raises CheckpointCorrupt naming the file."""
    manifest_path = checkpoint_path(blob, shard_id, checkpoint_id, MANIFEST_NAME)
    commit_path = checkpoint_path(blob, shard_id, checkpoint_id, COMMIT_NAME)

    def corrupt(path: str, reason: str) -> CheckpointCorrupt:
        return CheckpointCorrupt(
            f"checkpoint {checkpoint_id} of shard {shard_id!r}: {path}: {reason}",
            shard=shard_id,
            checkpoint=checkpoint_id,
            file=path,
            records=[{"file": path, "reason": reason}],
        )

    try:
        data = blob.read_bytes(manifest_path)
    except FileNotFoundError:
        raise corrupt(manifest_path, "missing") from None
    except OSError as exc:
        raise corrupt(manifest_path, f"unreadable: {exc.strerror}") from None
    digest = hashlib.sha256(data).hexdigest()
    if expected_sha256 is not None:
        try:
            marker = json.loads(blob.read_bytes(commit_path))
        except FileNotFoundError:
            raise corrupt(commit_path, "missing (the checkpoint never committed)") from None
        except (OSError, ValueError) as exc:
            raise corrupt(commit_path, f"unreadable or corrupt: {exc}") from None
        recorded = {expected_sha256, marker.get("manifest_sha256") if isinstance(marker, dict) else None}
        if recorded != {digest}:
            raise corrupt(manifest_path, f"checksum {digest[:12]}… does not match the recorded {expected_sha256[:12]}…")
    try:
        manifest = json.loads(data)
        if manifest.get("format") != FORMAT or manifest.get("checkpoint") != checkpoint_id:
            raise ValueError(f"not the format-{FORMAT} manifest of {checkpoint_id}")
        for f in manifest["files"]:
            f["path"], f["bytes"], f["sha256"]  # noqa: B018 - shape check
        escaping = [(name, path, reason) for name, path in manifest_paths(manifest)
                    if (reason := blob_path_problem(path)) is not None]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise corrupt(manifest_path, f"truncated or corrupt: {exc}") from None
    if escaping:
        name, path, reason = escaping[0]
        raise corrupt(manifest_path, f"field {name}: path {path!r} {reason}")
    return manifest


def blob_path_problem(path: Any) -> str | None:
    """Pure: why ``path`` is not a path below a blob root as the engine records one
    ('/'-separated, relative, no empty, '.' or '..' part), or None. A manifest is data read
    back from storage: a path that is absolute or climbs out would make a restore read, and
    GC keep or delete, files outside the blob root."""
    if not isinstance(path, str) or not path:
        return "is not a non-empty string"
    if path.startswith(("/", "\\")) or "\\" in path or "://" in path or (len(path) > 1 and path[1] == ":"):
        return "is absolute: paths are relative to the blob root"
    if any(part in ("", ".", "..") for part in path.split("/")):
        return "has an empty, '.' or '..' part: paths must stay below the blob root"
    return None


def manifest_paths(manifest: dict[str, Any]) -> list[tuple[str, Any]]:
    """Pure: (field, path) of every blob path a manifest records: its files, and the runs
    (and rejects) of its batches and of its compaction."""
    found: list[tuple[str, Any]] = [(f"files[{i}].path", f["path"]) for i, f in enumerate(manifest["files"])]

    def run_paths(prefix: str, run: dict[str, Any] | None) -> None:
        if not run:
            return
        found.append((f"{prefix}.path", run["path"]))
        found.extend((f"{prefix}.files[{i}].path", f["path"]) for i, f in enumerate(run.get("files", [])))

    for i, batch in enumerate(manifest["batches"]):
        run_paths(f"batches[{i}].run", batch["run"])
        rejects = (batch.get("stats") or {}).get("rejects")
        if rejects:
            found.append((f"batches[{i}].stats.rejects.path", rejects["path"]))
    if manifest.get("compaction"):
        run_paths("compaction.run", manifest["compaction"]["run"])
    return found


# -- create, verify, restore, retention --------------------------------------------------------


def create_checkpoint(
    shard: Shard,
    *,
    keep_last: int | None = None,
    keep_within: float | None = None,
    on_step: Callable[[str], None] | None = None,
) -> CheckpointEntry:
    """Checkpoint the shard's state at its current upper and add it to the catalog.

    :param keep_last: after adding, keep only the last N checkpoints (see ``apply_retention``).
    :param keep_within: after adding, keep only checkpoints newer than this many seconds.
    :param on_step: called with ``"snapshot"``, ``"manifest"``, ``"commit"`` and ``"catalog"``
        after each step (tests force races and crashes there).
    """
    blob, shard_id = shard.blob, shard.shard_id
    step = on_step or (lambda _name: None)
    check_retention(keep_last, keep_within)
    catalog = Catalog.load(blob, shard_id, shard.consensus)
    catalog.ensure()
    # The snapshot records the bindings from since - 1 only (and from the lowest source index
    # anchor): a directory shard's index rows are anchored first, so that the restored shard
    # plans from them instead of rebuilding them from binding 0, which it does not have.
    shard.anchor_source_index()
    for _attempt in range(MAX_ATTEMPTS):
        snapshot = shard.consensus.snapshot(shard_id)
        step("snapshot")
        created_at = time.time()
        checkpoint_id = f"{snapshot.record.upper:012d}-{uuid.uuid4().hex[:8]}"
        directory = checkpoint_path(blob, shard_id, checkpoint_id)
        try:
            files = manifest_files(blob, snapshot)
        except CommittedFileBad:
            # A compaction and a GC since the snapshot remove files legitimately: read again.
            if shard.consensus.get_shard(shard_id).since != snapshot.record.since:
                continue
            raise
        data = json.dumps(build_manifest(checkpoint_id, snapshot, files, created_at), indent=1, sort_keys=True).encode()
        digest = hashlib.sha256(data).hexdigest()
        try:
            blob.write_atomic(blob.join(directory, MANIFEST_NAME), data)
        except FileNotFoundError:
            continue  # GC collected the directory as it was being made (see below)
        step("manifest")
        # The files of the snapshot stay live until since moves (batches >= since are
        # immutable), and GC reads state before manifests: if since did not move between
        # the snapshot and the manifest being on disk, no GC can have deleted a listed file.
        if shard.consensus.get_shard(shard_id).since != snapshot.record.since:
            blob.delete_tree(directory)
            continue
        marker = {"checkpoint": checkpoint_id, "manifest_sha256": digest}
        try:
            blob.write_atomic(blob.join(directory, COMMIT_NAME), json.dumps(marker, sort_keys=True).encode())
        except FileNotFoundError:
            # GC collected the directory under the write (the create paused past the grace
            # period): it claimed it, so it is GC's to delete; write the checkpoint again
            # under a new id.
            continue
        step("commit")
        entry = CheckpointEntry(
            id=checkpoint_id,
            upper=snapshot.record.upper,
            since=snapshot.record.since,
            created_at=created_at,
            files=len(files),
            bytes=sum(f["bytes"] for f in files),
            manifest_sha256=digest,
        )
        try:
            catalog.add(entry)
        except CommitRefused:
            # GC collected this checkpoint's directory (the create paused past its grace
            # period): the directory is GC's to delete; write the checkpoint again.
            continue
        except ConsensusOutcomeUnknown:
            raise  # it may be listed: an unlisted directory is GC's to delete
        except BaseException:
            if all(e.id != checkpoint_id for e in catalog.entries):
                _delete_quietly(blob, directory)
            raise
        step("catalog")
        if keep_last is not None or keep_within is not None:
            # Its files were verified just now: no need to read them again.
            apply_retention(catalog, keep_last=keep_last, keep_within=keep_within, verified={entry.id})
        return entry
    raise UpsertError(
        f"checkpoint of shard {shard_id!r} was overtaken by a compaction or collected by GC {MAX_ATTEMPTS} "
        "times in a row",
        shard=shard_id,
    )


def list_checkpoints(blob: Blob, shard_id: str, consensus: Consensus | None = None) -> list[CheckpointEntry]:
    """The committed checkpoints of a shard: the store's catalog when ``consensus`` holds it,
    else the blob copy's."""
    return list(Catalog.load(blob, shard_id, consensus).entries)


def verify_checkpoint(
    blob: Blob, shard_id: str, checkpoint_id: str, consensus: Consensus | None = None
) -> dict[str, Any]:
    """Check every file a checkpoint lists: present, same size, same SHA-256, parses as
    Parquet. Returns the manifest; raises CheckpointCorrupt naming every bad file. The
    checkpoint is looked up as ``list_checkpoints`` lists it."""
    entry = Catalog.load(blob, shard_id, consensus).get(checkpoint_id)
    manifest = read_manifest(blob, shard_id, checkpoint_id, entry.manifest_sha256)
    problems = [
        {"file": blob.path(f["path"]), "reason": reason}
        for f in manifest["files"]
        if (reason := file_problem(blob, f, "the manifest")[1]) is not None
    ]
    if problems:
        first = problems[0]
        raise CheckpointCorrupt(
            f"checkpoint {checkpoint_id} of shard {shard_id!r}: {len(problems)} of {len(manifest['files'])} "
            f"file(s) bad; first: {first['file']}: {first['reason']}",
            shard=shard_id,
            checkpoint=checkpoint_id,
            file=first["file"],
            records=problems[:MAX_REPORTED],
            count=len(problems),
        )
    return manifest


def restore_checkpoint(
    consensus: Consensus,
    blob: Blob,
    shard_id: str,
    checkpoint_id: str,
    *,
    target_shard_id: str | None = None,
    actor: str = "",
) -> ShardRecord:
    """Rebuild a shard's consensus state from a checkpoint, after verifying every file.
    The restored shard's stream is RECOVERING in a new epoch: nothing writes to it until a
    recovery's seek and resume have run (``engine/lifecycle/recovery.py``).

    The target (default: the checkpoint's own shard id, into an empty consensus) must not
    exist: a restore never moves an existing upper backwards. The restored shard reads the
    checkpoint's files where they are (no copy). The checkpoint is looked up in this store's
    catalog of ``shard_id`` if it holds one, else in the blob copy; a restore under the
    checkpoint's own shard id then imports the blob copy into this store."""
    target = validate_shard_id(target_shard_id or shard_id)
    manifest = verify_checkpoint(blob, shard_id, checkpoint_id, consensus)
    try:
        snapshot = snapshot_from_manifest(manifest, target)
    except (KeyError, TypeError, ValueError) as exc:
        path = checkpoint_path(blob, shard_id, checkpoint_id, MANIFEST_NAME)
        raise CheckpointCorrupt(
            f"checkpoint {checkpoint_id} of shard {shard_id!r}: {path}: state does not parse: {exc!r}",
            shard=shard_id,
            checkpoint=checkpoint_id,
            file=path,
        ) from None
    record = restore_shard(
        consensus, target, snapshot, actor=actor,
        reason=f"restored from checkpoint {checkpoint_id} of shard {shard_id!r}",
    )
    # The new generation the restore recorded, on blob: another store's GC keeps off it. A
    # crash before this line is repaired by ``recover seek``, which must run before any write.
    mark_blob_owner(consensus, blob, target)
    if target == shard_id:
        _import_catalog(consensus, blob, target)
    return record


def _import_catalog(consensus: Consensus, blob: Blob, shard_id: str) -> None:
    """Make this store hold the restored shard's catalog, from its blob copy. The restore is
    done whatever this does: a failure is logged, and the first catalog change imports it."""
    try:
        catalog = Catalog.load(blob, shard_id, consensus)
        if not catalog.in_store and catalog.exists:
            catalog.ensure()
    except UpsertError as exc:
        log.warning("shard %r restored; its checkpoint catalog is imported by its first change: %s", shard_id, exc)


def check_retention(keep_last: int | None, keep_within: float | None) -> None:
    if keep_last is not None and keep_last < 1:
        raise ConfigurationError("keep-last must be >= 1 (a shard always keeps one checkpoint)", field="keep_last")
    if keep_within is not None and keep_within <= 0:
        raise ConfigurationError("keep-within must be a positive number of seconds", field="keep_within")


def retained_ids(
    entries: list[CheckpointEntry],
    *,
    keep_last: int | None,
    keep_within: float | None,
    now: float,
    newest_verifying: str | None,
) -> set[str]:
    """The checkpoints retention keeps: the last ``keep_last``, those newer than
    ``keep_within`` seconds, the newest one, and the newest one that verifies (dropping it
    could leave nothing to restore from)."""
    ordered = sorted(entries, key=lambda e: (e.upper, e.created_at))
    keep = {e.id for e in ordered[-keep_last:]} if keep_last else set()
    if keep_within is not None:
        keep |= {e.id for e in ordered if now - e.created_at <= keep_within}
    if ordered:
        keep.add(ordered[-1].id)
    if newest_verifying is not None:
        keep.add(newest_verifying)
    return keep


def newest_verifying(
    blob: Blob, shard_id: str, verified: set[str] = frozenset(), consensus: Consensus | None = None
) -> str | None:
    """The id of the newest checkpoint the catalog lists now that verifies, trying newest
    first and stopping at the first (``verified``: ids known to verify, not read again);
    None if none does."""
    entries = Catalog.load(blob, shard_id, consensus).entries
    for entry in sorted(entries, key=lambda e: (e.upper, e.created_at), reverse=True):
        if entry.id in verified:
            return entry.id
        try:
            verify_checkpoint(blob, shard_id, entry.id, consensus)
        except (CheckpointCorrupt, ConfigurationError):  # damaged, or dropped meanwhile
            continue
        return entry.id
    return None


def apply_retention(
    catalog: Catalog,
    *,
    keep_last: int | None = None,
    keep_within: float | None = None,
    now: float | None = None,
    verified: set[str] = frozenset(),
) -> list[CheckpointEntry]:
    """Drop from the catalog every checkpoint that is neither among the last ``keep_last``
    nor newer than ``keep_within`` seconds (a checkpoint either rule keeps is kept), never
    the newest one and never the newest one that verifies (``verified``: ids the caller
    verified, not read again). The catalog is changed first, then its blob copy written;
    the directories are deleted only once that copy is on the blob (a copy never lists a
    deleted directory). Whatever is left behind is no longer listed, so GC removes it."""
    check_retention(keep_last, keep_within)
    if keep_last is None and keep_within is None:
        return []
    now = time.time() if now is None else now
    removed: list[CheckpointEntry] = []
    # Read before the lock (verifying reads files); a checkpoint listed meanwhile only adds
    # to what is kept.
    protected = newest_verifying(catalog.blob, catalog.shard_id, verified, catalog.consensus)

    def drop(entries: list[CheckpointEntry]) -> list[CheckpointEntry]:
        # Decided on the catalog as it is under the lock, not as it was loaded.
        keep = retained_ids(entries, keep_last=keep_last, keep_within=keep_within, now=now, newest_verifying=protected)
        removed[:] = sorted((e for e in entries if e.id not in keep), key=lambda e: (e.upper, e.created_at))
        return [e for e in entries if e.id in keep]

    catalog.update(drop)
    if not catalog.copy_written:
        return removed  # GC deletes them once it has written the copy
    for entry in removed:
        _delete_quietly(catalog.blob, checkpoint_path(catalog.blob, catalog.shard_id, entry.id))
    return removed


def _delete_quietly(blob: Blob, directory: str) -> None:
    """Delete an unlisted checkpoint directory; what a failure leaves is GC's to remove."""
    try:
        blob.delete_tree(directory)
    except (OSError, BlobUnavailable):
        pass
