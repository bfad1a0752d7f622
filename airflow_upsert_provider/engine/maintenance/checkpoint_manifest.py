"""The manifest of a checkpoint (``<id>/MANIFEST.json``): what it records of the shard's
state, how it is built from a snapshot, read back (checked against its commit marker and the
catalog), and turned back into consensus state. A manifest is data read back from storage:
every path it records is checked to stay below the blob root."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict
from typing import Any

from airflow_upsert_provider.engine.blob.interface import Blob
from airflow_upsert_provider.engine.config import ShardConfig
from airflow_upsert_provider.engine.maintenance.checkpoint_catalog import (
    COMMIT_NAME,
    FORMAT,
    MANIFEST_NAME,
    CheckpointCorrupt,
    checkpoint_path,
)
from airflow_upsert_provider.engine.store.records import (
    BatchRecord,
    Binding,
    CompactionRecord,
    Rollup,
    ShardRecord,
    ShardSnapshot,
)


def build_manifest(
    checkpoint_id: str,
    snapshot: ShardSnapshot,
    files: list[dict[str, Any]],
    created_at: float,
    verification: dict[str, Any],
) -> dict[str, Any]:
    """The manifest of a checkpoint of ``snapshot`` listing ``files``. ``verification`` says
    how its files were checked: ``full``, how many were ``hashed`` and how many only
    ``size_checked`` because the checkpoint ``trusted_from`` hashed them."""
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
        # The schema versions its runs were written with (none: every run is at version 1).
        "table_schemas": snapshot.table_schemas,
        "files": files,
        "verification": verification,
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
        # Absent from manifests written before schema versions: every run is at version 1.
        table_schemas=list(manifest.get("table_schemas", [])),
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
