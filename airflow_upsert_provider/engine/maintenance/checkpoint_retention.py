"""Checkpoint retention: which checkpoints a shard keeps (``retained_ids``, pure), and dropping
the others from the catalog before deleting their directories (``apply_retention``).

Retention never drops the newest checkpoint whose files verify (``newest_verifying_id``): a
newer checkpoint may list a file damaged after an earlier checkpoint hashed it (an incremental
checkpoint only checks its size), and dropping the last good one would leave nothing to
restore from. Only a checkpoint whose every file was read just now is taken as verifying
without reading it again."""

from __future__ import annotations

import time
from typing import Callable, Collection

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


def newest_verifying_id(
    entries: list[CheckpointEntry], verifies: Callable[[str], bool], verified: Collection[str] = frozenset()
) -> str | None:
    """The id of the newest of ``entries`` whose files verify, trying newest first and stopping
    at the first: an id in ``verified`` (every file read just now) verifies without asking,
    any other is asked of ``verifies``. None if none does. Pure but for ``verifies``."""
    for entry in sorted(entries, key=lambda e: (e.upper, e.created_at), reverse=True):
        if entry.id in verified or verifies(entry.id):
            return entry.id
    return None


def newest_verifying(
    blob: Blob, shard_id: str, verified: set[str] = frozenset(), consensus: Consensus | None = None
) -> str | None:
    """``newest_verifying_id`` over the checkpoints the catalog lists now, each checked by a
    full verify (every file read: one damaged after it was hashed must not pass)."""

    def verifies(checkpoint_id: str) -> bool:
        try:
            verify_checkpoint(blob, shard_id, checkpoint_id, consensus, full=True)
        except (CheckpointCorrupt, ConfigurationError):  # damaged, or dropped meanwhile
            return False
        return True

    return newest_verifying_id(Catalog.load(blob, shard_id, consensus).entries, verifies, verified)


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
