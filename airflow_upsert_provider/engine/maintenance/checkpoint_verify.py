"""Verifying a checkpoint: every file its manifest lists is present, of the recorded size and
SHA-256, and readable Parquet."""

from __future__ import annotations

from typing import Any

from airflow_upsert_provider.engine.blob.interface import Blob
from airflow_upsert_provider.engine.maintenance.checkpoint_catalog import Catalog, CheckpointCorrupt
from airflow_upsert_provider.engine.maintenance.checkpoint_manifest import read_manifest
from airflow_upsert_provider.engine.store.consensus import Consensus
from airflow_upsert_provider.engine.table.runs import file_problem
from airflow_upsert_provider.engine.table.shard import MAX_REPORTED


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
