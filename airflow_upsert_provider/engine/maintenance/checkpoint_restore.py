"""Restoring a checkpoint: rebuild a shard's consensus state from a verified manifest."""

from __future__ import annotations

import logging

from airflow_upsert_provider.engine.blob.interface import Blob
from airflow_upsert_provider.engine.config import validate_shard_id
from airflow_upsert_provider.engine.errors import UpsertError
from airflow_upsert_provider.engine.maintenance.checkpoint_catalog import (
    MANIFEST_NAME,
    Catalog,
    CheckpointCorrupt,
    checkpoint_path,
)
from airflow_upsert_provider.engine.maintenance.checkpoint_manifest import snapshot_from_manifest
from airflow_upsert_provider.engine.maintenance.checkpoint_verify import verify_checkpoint
from airflow_upsert_provider.engine.store.consensus import Consensus
from airflow_upsert_provider.engine.store.gc_claims import mark_blob_owner
from airflow_upsert_provider.engine.store.records import ShardRecord
from airflow_upsert_provider.engine.store.restore import restore_shard

log = logging.getLogger(__name__)


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
