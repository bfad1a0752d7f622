"""Creating a checkpoint: check every file the shard state at its upper needs (reading whole
only those the newest checkpoint did not read: checkpoint_plan.py), write the manifest, its
commit marker, then the catalog entry (the formats: checkpoint_catalog.py and
checkpoint_manifest.py)."""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from typing import Any, Callable, Mapping

from airflow_upsert_provider.engine.blob.interface import Blob
from airflow_upsert_provider.engine.common.retry import CAS_CONTENTION
from airflow_upsert_provider.engine.errors import (
    CommitRefused,
    ConsensusOutcomeUnknown,
    IntegrityError,
    UpsertError,
)
from airflow_upsert_provider.engine.maintenance.checkpoint_catalog import (
    COMMIT_NAME,
    MANIFEST_NAME,
    Catalog,
    CheckpointCorrupt,
    CheckpointEntry,
    checkpoint_path,
    delete_unlisted,
)
from airflow_upsert_provider.engine.maintenance.checkpoint_manifest import build_manifest, read_manifest
from airflow_upsert_provider.engine.maintenance.checkpoint_plan import count_checks, hashed_files, plan_file_checks
from airflow_upsert_provider.engine.maintenance.checkpoint_retention import apply_retention, check_retention
from airflow_upsert_provider.engine.maintenance.checkpoint_verify import run_file_checks
from airflow_upsert_provider.engine.store.consensus import Consensus
from airflow_upsert_provider.engine.store.records import ShardSnapshot
from airflow_upsert_provider.engine.table.shard import MAX_REPORTED, Shard

log = logging.getLogger(__name__)

# A checkpoint whose snapshot was overtaken by a compaction, or whose directory GC collected,
# is written again (see create).
MAX_ATTEMPTS = CAS_CONTENTION.max_attempts


class CommittedFileBad(IntegrityError):
    """A file the shard's committed state names is missing, or differs from what was recorded
    when it was written (size, SHA-256), or is not readable Parquet: no checkpoint is written
    over it. ``details["records"]`` names every such file."""


def trusted_files(blob: Blob, catalog: Catalog) -> tuple[str | None, dict[str, tuple[int, str]]]:
    """The files the newest committed checkpoint hashed (path -> size, SHA-256), and its id: what
    an incremental checkpoint need not read again. Only a catalog entry counts (its manifest
    was written after every file it lists was checked, and checked against its commit marker);
    a manifest that cannot be read gives no trust, and every file is hashed."""
    latest = catalog.latest()
    if latest is None:
        return None, {}
    try:
        manifest = read_manifest(blob, catalog.shard_id, latest.id, latest.manifest_sha256)
    except CheckpointCorrupt as exc:
        log.warning("checkpoint of shard %r hashes every file: the newest checkpoint's manifest: %s",
                    catalog.shard_id, exc)
        return None, {}
    return latest.id, hashed_files(manifest["files"])


def manifest_files(
    blob: Blob, snapshot: ShardSnapshot, trusted: Mapping[str, tuple[int, str]], *, full: bool
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """Every file the state of ``snapshot`` at its upper needs, with size and SHA-256, and how
    many were hashed and size-checked. A file ``trusted`` holds with the same path, size and
    recorded SHA-256 (an earlier checkpoint hashed it) is checked for presence and size only,
    unless ``full``; every other one is verified as ``verify`` would (present, the size and
    SHA-256 recorded when its run was written, a readable Parquet footer), so that a
    checkpoint never lists a file no checkpoint read (CommittedFileBad). A run written before
    checksums were recorded has its files hashed and listed with that hash."""
    listed = [
        {"path": f["path"], "bytes": f["bytes"], "sha256": f.get("sha256")}
        for run in snapshot.live_runs()
        for f in run["files"]
    ]
    checks = plan_file_checks(listed, trusted, full=full)
    files, problems = [], []
    for check, (digest, reason) in zip(checks, run_file_checks(blob, checks, "the shard's state")):
        if reason is not None:
            problems.append({"file": blob.path(check.path), "reason": reason})
        else:
            files.append({"path": check.path, "bytes": check.bytes, "sha256": digest})
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
    return files, count_checks(checks)


def create_checkpoint(
    shard: Shard,
    *,
    keep_last: int | None = None,
    keep_within: float | None = None,
    full: bool = False,
    on_step: Callable[[str], None] | None = None,
) -> CheckpointEntry:
    """Checkpoint the shard's state at its current upper and add it to the catalog. Files the
    newest checkpoint already hashed are checked for presence and size only; new files are
    hashed (``checkpoint_plan``).

    :param keep_last: after adding, keep only the last N checkpoints (see ``apply_retention``).
    :param keep_within: after adding, keep only checkpoints newer than this many seconds.
    :param full: read every file whole, as if no checkpoint had hashed any.
    :param on_step: called with ``"snapshot"``, ``"verified"``, ``"manifest"``, ``"commit"`` and
        ``"catalog"`` after each step (tests force races and crashes there).
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
    trusted_from, trusted = (None, {}) if full else trusted_files(blob, catalog)
    for _attempt in range(MAX_ATTEMPTS):
        snapshot = shard.consensus.snapshot(shard_id)
        step("snapshot")
        created_at = time.time()
        checkpoint_id = f"{snapshot.record.upper:012d}-{uuid.uuid4().hex[:8]}"
        directory = checkpoint_path(blob, shard_id, checkpoint_id)
        try:
            files, counts = manifest_files(blob, snapshot, trusted, full=full)
        except CommittedFileBad:
            # A compaction and a GC since the snapshot remove files legitimately: read again.
            if shard.consensus.get_shard(shard_id).since != snapshot.record.since:
                continue
            raise
        step("verified")
        verification = {"full": full, "trusted_from": trusted_from if counts["size_checked"] else None, **counts}
        manifest = build_manifest(checkpoint_id, snapshot, files, created_at, verification)
        data = json.dumps(manifest, indent=1, sort_keys=True).encode()
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
                delete_unlisted(blob, directory)
            raise
        step("catalog")
        if keep_last is not None or keep_within is not None:
            # Its files were all read just now: no need to read them again. A file only
            # size-checked may have been damaged since an earlier checkpoint read it: retention
            # then reads this checkpoint before it may drop an older one that verifies.
            read_now = {entry.id} if counts["size_checked"] == 0 else set()
            apply_retention(catalog, keep_last=keep_last, keep_within=keep_within, verified=read_now)
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
