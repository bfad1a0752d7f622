"""Checkpoint retention: which checkpoints a shard keeps (``retained_ids``), and dropping the
others from the catalog before deleting their directories (``apply_retention``)."""

from __future__ import annotations

import time

from airflow_upsert_provider.engine.blob.interface import Blob
from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.engine.maintenance.checkpoint_catalog import (
    Catalog,
    CheckpointCorrupt,
    CheckpointEntry,
    checkpoint_path,
    delete_unlisted,
)
from airflow_upsert_provider.engine.maintenance.checkpoint_verify import verify_checkpoint
from airflow_upsert_provider.engine.store.consensus import Consensus


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
        delete_unlisted(catalog.blob, checkpoint_path(catalog.blob, catalog.shard_id, entry.id))
    return removed
