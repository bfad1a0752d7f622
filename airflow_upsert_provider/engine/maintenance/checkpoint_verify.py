"""Verifying a checkpoint: every file its manifest lists is present and of the recorded size;
a full verify (``full=True``, and every restore) also reads each whole: the recorded SHA-256
and a readable Parquet footer. What to read is decided by ``checkpoint_plan``; this module
does the reads."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from airflow_upsert_provider.engine.blob.interface import Blob
from airflow_upsert_provider.engine.maintenance.checkpoint_catalog import Catalog, CheckpointCorrupt
from airflow_upsert_provider.engine.maintenance.checkpoint_manifest import read_manifest
from airflow_upsert_provider.engine.maintenance.checkpoint_plan import HASH, FileCheck, hashed_files, plan_file_checks
from airflow_upsert_provider.engine.store.consensus import Consensus
from airflow_upsert_provider.engine.table.runs import file_problem
from airflow_upsert_provider.engine.table.shard import MAX_REPORTED

# Files checked at once: hashlib releases the GIL while it digests, and a size check on object
# storage is one request that waits on the network.
CHECK_THREADS = 4


def run_file_checks(blob: Blob, checks: list[FileCheck], recorded_by: str) -> list[tuple[str | None, str | None]]:
    """Do ``checks``: per file (SHA-256 to record, None) when it passes, else (None, reason).
    A hashed file is checked as ``file_problem`` does; a size-checked one is present and of
    its recorded size (one HEAD on object storage)."""

    def check(one: FileCheck) -> tuple[str | None, str | None]:
        listed = {"path": one.path, "bytes": one.bytes, "sha256": one.sha256}
        return file_problem(blob, listed, recorded_by, read=one.how == HASH)

    with ThreadPoolExecutor(max_workers=CHECK_THREADS) as pool:
        return list(pool.map(check, checks))


def verify_checkpoint(
    blob: Blob, shard_id: str, checkpoint_id: str, consensus: Consensus | None = None, *, full: bool = True
) -> dict[str, Any]:
    """Check every file a checkpoint lists: present and of the recorded size, and with
    ``full`` (the default: restore and retention rely on it) read whole: same SHA-256, parses
    as Parquet. Without ``full`` no file is read: each was hashed when the checkpoint was
    created, and only a full verify finds one damaged since at the same size. Returns the
    manifest; raises CheckpointCorrupt naming every bad file. The checkpoint is looked up as
    ``list_checkpoints`` lists it."""
    entry = Catalog.load(blob, shard_id, consensus).get(checkpoint_id)
    manifest = read_manifest(blob, shard_id, checkpoint_id, entry.manifest_sha256)
    files = manifest["files"]
    checks = plan_file_checks(files, hashed_files(files), full=full)
    problems = [
        {"file": blob.path(check.path), "reason": reason}
        for check, (_digest, reason) in zip(checks, run_file_checks(blob, checks, "the manifest"))
        if reason is not None
    ]
    if problems:
        first = problems[0]
        raise CheckpointCorrupt(
            f"checkpoint {checkpoint_id} of shard {shard_id!r}: {len(problems)} of {len(files)} "
            f"file(s) bad; first: {first['file']}: {first['reason']}",
            shard=shard_id,
            checkpoint=checkpoint_id,
            file=first["file"],
            records=problems[:MAX_REPORTED],
            count=len(problems),
        )
    return manifest
