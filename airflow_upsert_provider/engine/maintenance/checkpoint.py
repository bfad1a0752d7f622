"""Checkpoints: immutable recovery points of a shard, listed in a catalog.

A checkpoint copies no data. It is a manifest naming every file the shard state at its upper
needs (size and SHA-256 of each), with the state, the compacted run, the batches and bindings
from since - 1 on (``ShardSnapshot``: the older ones are history, summed up in its rollups),
and the quarantined files, so that consensus can be rebuilt from it. On disk, below
``<blob>/<shard>/checkpoints/``::

    CATALOG.json        {"format": 1, "shard": ..., "checkpoints": [entry, ...]}
    <id>/MANIFEST.json  {"format": 1, "checkpoint": ..., "state": ..., "files": [...], ...}
    <id>/COMMIT         {"checkpoint": ..., "manifest_sha256": ...}

Every one of them is written atomically and durably (``Blob.write_atomic``), in the
order manifest, commit marker, catalog: a catalog entry never points at anything missing.
The catalog is written (empty) before the first checkpoint directory exists, so a missing
catalog beside committed checkpoint directories is corruption, never "no checkpoints"; a
checkpoint directory without a commit marker is a checkpoint being written (or abandoned).
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Any, Callable

from airflow_upsert_provider.engine.blob.interface import Blob
from airflow_upsert_provider.engine.store.catalog_lock import catalog_lock
from airflow_upsert_provider.engine.config import ShardConfig, validate_shard_id
from airflow_upsert_provider.engine.common.retry import CAS_CONTENTION
from airflow_upsert_provider.engine.store.consensus import (
    BatchRecord,
    Binding,
    CompactionRecord,
    Consensus,
    Rollup,
    ShardRecord,
    ShardSnapshot,
)
from airflow_upsert_provider.engine.errors import (
    BlobUnavailable,
    CommitRefused,
    ConfigurationError,
    IntegrityError,
    UpsertError,
)
from airflow_upsert_provider.engine.store.gc_claims import check_blob_owner, mark_blob_owner, refuse_claimed_checkpoints
from airflow_upsert_provider.engine.table.runs import file_problem
from airflow_upsert_provider.engine.table.shard import MAX_REPORTED, Shard

FORMAT = 1
CATALOG_NAME = "CATALOG.json"
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
    """The committed checkpoints of one shard. The in-memory list always equals the file:
    it changes only after the file was written, and a failed write is undone on disk.

    The file is the authoritative catalog. A change (``ensure``, ``add``, ``remove``,
    ``update``) is a compare-and-set: it holds the shard's catalog lock in consensus
    (``catalog_lock``), re-reads the file under it and applies itself to what it finds, so
    overlapping changes serialize and none is lost. Reading needs no consensus; changing does."""

    def __init__(
        self,
        blob: Blob,
        shard_id: str,
        entries: list[CheckpointEntry],
        exists: bool,
        consensus: Consensus | None = None,
    ) -> None:
        self.blob = blob
        self.shard_id = shard_id
        self.entries = entries
        self.exists = exists
        self.consensus = consensus

    @property
    def path(self) -> str:
        return self.blob.join(checkpoints_root(self.blob, self.shard_id), CATALOG_NAME)

    @classmethod
    def load(cls, blob: Blob, shard_id: str, consensus: Consensus | None = None) -> "Catalog":
        """Read the catalog. Refuses (CheckpointCorrupt) an empty, truncated or corrupt one,
        and a missing one while committed checkpoint directories exist. ``consensus`` (whose
        catalog lock every change holds) is needed to change it."""
        catalog = cls(blob, shard_id, [], exists=False, consensus=consensus)
        path = catalog.path
        try:
            data = blob.read_bytes(path)
        except FileNotFoundError:
            committed = [n for n in checkpoint_dirs(blob, shard_id) if is_committed(blob, shard_id, n)]
            if committed:
                raise CheckpointCorrupt(
                    f"checkpoint catalog {path} is missing but committed checkpoint directories exist "
                    f"({len(committed)}, first: {committed[0]}): refusing to treat it as empty; restore the "
                    "catalog file before running checkpoint or GC commands",
                    shard=shard_id,
                    file=path,
                    records=[{"file": blob.join(blob.parent(path), n), "reason": "committed, not in a catalog"}
                             for n in committed[:MAX_REPORTED]],
                ) from None
            # No catalog and nothing committed: no checkpoint yet (or the first one is being
            # written, which writes the catalog before its directory).
            return catalog
        except OSError as exc:
            raise CheckpointCorrupt(
                f"checkpoint catalog {path} is unreadable: {exc.strerror}", shard=shard_id, file=path
            ) from None
        catalog.entries = _parse_catalog(data, path, shard_id)
        catalog.exists = True
        return catalog

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
        """Write an empty catalog if there is none (before the first checkpoint directory)."""
        self.update(lambda entries: entries)

    def add(self, entry: CheckpointEntry) -> None:
        self.update(lambda entries: entries + [entry])

    def remove(self, ids: set[str]) -> None:
        self.update(lambda entries: [e for e in entries if e.id not in ids])

    def update(self, change: Callable[[list[CheckpointEntry]], list[CheckpointEntry]]) -> list[CheckpointEntry]:
        """Apply ``change`` to the catalog as it is on disk now, under the catalog lock, and
        write the result (also when there was no catalog yet). Returns the new list."""
        if self.consensus is None:
            raise ConfigurationError(
                f"changing the checkpoint catalog of shard {self.shard_id!r} needs the consensus store "
                "(its catalog lock): load it with Catalog.load(blob, shard_id, consensus)",
                shard=self.shard_id,
            )
        # The catalog of a shard restored into another store sharing the blob is that
        # store's: this one's retention must not drop what the restore came from.
        check_blob_owner(self.consensus, self.blob, self.shard_id, "change the checkpoint catalog")
        with catalog_lock(self.consensus, self.shard_id) as conn:
            current = Catalog.load(self.blob, self.shard_id)
            self.entries, self.exists = current.entries, current.exists
            entries = change(list(current.entries))
            added = {e.id for e in entries} - {e.id for e in current.entries}
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
            if entries != current.entries or not current.exists:
                self._write(entries)
        return list(self.entries)

    def _encode(self, entries: list[CheckpointEntry]) -> bytes:
        doc = {"format": FORMAT, "shard": self.shard_id, "checkpoints": [e.to_dict() for e in entries]}
        return json.dumps(doc, indent=1, sort_keys=True).encode()

    def _write(self, entries: list[CheckpointEntry]) -> None:
        old = self._encode(self.entries) if self.exists else None
        try:
            self.blob.write_atomic(self.path, self._encode(entries))
        except BaseException:
            self._undo(old)
            raise
        self.entries = list(entries)
        self.exists = True

    def _undo(self, old: bytes | None) -> None:
        """After a failed write, put the old catalog back on disk if the new one got there
        (the rename may have happened before the failure); memory keeps the old list. If
        even that fails, memory follows whatever the disk holds."""
        try:
            current = self.blob.read_bytes(self.path)
        except FileNotFoundError:
            current = None
        except (OSError, BlobUnavailable):
            current = b""
        if current == old:
            return
        try:
            if old is None:
                self.blob.delete_file(self.path)
            else:
                self.blob.write_atomic(self.path, old)
        except Exception:
            try:
                reloaded = Catalog.load(self.blob, self.shard_id)
            except Exception:
                return
            self.entries, self.exists = reloaded.entries, reloaded.exists


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
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise corrupt(manifest_path, f"truncated or corrupt: {exc}") from None
    return manifest


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


def list_checkpoints(blob: Blob, shard_id: str) -> list[CheckpointEntry]:
    return list(Catalog.load(blob, shard_id).entries)


def verify_checkpoint(blob: Blob, shard_id: str, checkpoint_id: str) -> dict[str, Any]:
    """Check every file a checkpoint lists: present, same size, same SHA-256, parses as
    Parquet. Returns the manifest; raises CheckpointCorrupt naming every bad file."""
    entry = Catalog.load(blob, shard_id).get(checkpoint_id)
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
    checkpoint's files where they are (no copy)."""
    target = validate_shard_id(target_shard_id or shard_id)
    manifest = verify_checkpoint(blob, shard_id, checkpoint_id)
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
    record = consensus.restore_shard(
        target, snapshot, actor=actor, reason=f"restored from checkpoint {checkpoint_id} of shard {shard_id!r}"
    )
    # The new generation the restore recorded, on blob: another store's GC keeps off it. A
    # crash before this line is repaired by ``recover seek``, which must run before any write.
    mark_blob_owner(consensus, blob, target)
    return record


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


def newest_verifying(blob: Blob, shard_id: str, verified: set[str] = frozenset()) -> str | None:
    """The id of the newest checkpoint the catalog lists now that verifies, trying newest
    first and stopping at the first (``verified``: ids known to verify, not read again);
    None if none does."""
    entries = Catalog.load(blob, shard_id).entries
    for entry in sorted(entries, key=lambda e: (e.upper, e.created_at), reverse=True):
        if entry.id in verified:
            return entry.id
        try:
            verify_checkpoint(blob, shard_id, entry.id)
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
    verified, not read again). The catalog is written first; the directories are then
    deleted, and whatever a failure leaves behind is no longer listed, so GC removes it."""
    check_retention(keep_last, keep_within)
    if keep_last is None and keep_within is None:
        return []
    now = time.time() if now is None else now
    removed: list[CheckpointEntry] = []
    # Read before the lock (verifying reads files); a checkpoint listed meanwhile only adds
    # to what is kept.
    protected = newest_verifying(catalog.blob, catalog.shard_id, verified)

    def drop(entries: list[CheckpointEntry]) -> list[CheckpointEntry]:
        # Decided on the catalog as it is under the lock, not as it was loaded.
        keep = retained_ids(entries, keep_last=keep_last, keep_within=keep_within, now=now, newest_verifying=protected)
        removed[:] = sorted((e for e in entries if e.id not in keep), key=lambda e: (e.upper, e.created_at))
        return [e for e in entries if e.id in keep]

    catalog.update(drop)
    for entry in removed:
        _delete_quietly(catalog.blob, checkpoint_path(catalog.blob, catalog.shard_id, entry.id))
    return removed


def _delete_quietly(blob: Blob, directory: str) -> None:
    """Delete an unlisted checkpoint directory; what a failure leaves is GC's to remove."""
    try:
        blob.delete_tree(directory)
    except (OSError, BlobUnavailable):
        pass
