"""The checkpoint catalog in consensus: one header row per shard and one row per listed checkpoint.

The consensus store holds the authoritative catalog of a shard once it has a header row
(``upsert_checkpoint_catalogs``). Every change is one short transaction under the shard's
catalog lock (``catalog_lock``): it reads these rows, applies a pure change and writes them
back with the next version, and does no blob I/O. The blob keeps immutable copies, one per
version (engine/maintenance/checkpoint.py writes them after the transaction), so that a
checkpoint can be restored from the blob alone into an empty store.

A shard without a header row has its catalog on the blob only (written by a release before
this table, or restored into a store that has not changed it yet): the first change imports it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from airflow_upsert_provider.engine.store.consensus import Consensus
from airflow_upsert_provider.engine.store.tables import metadata

catalogs_table = sa.Table(
    "upsert_checkpoint_catalogs",
    metadata,
    sa.Column("shard_id", sa.String(128), primary_key=True),
    # Bumped by every change that changed the entries: the number of its blob copy.
    sa.Column("version", sa.BigInteger, nullable=False),
    sa.Column("changed_at", sa.Float, nullable=False),
)

catalog_entries_table = sa.Table(
    "upsert_checkpoint_entries",
    metadata,
    sa.Column("shard_id", sa.String(128), primary_key=True),
    sa.Column("checkpoint_id", sa.String(128), primary_key=True),
    sa.Column("upper", sa.BigInteger, nullable=False),
    sa.Column("since", sa.BigInteger, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("files", sa.BigInteger, nullable=False),
    sa.Column("bytes", sa.BigInteger, nullable=False),
    sa.Column("manifest_sha256", sa.String(64), nullable=False),
)

# The fields of an entry, as the catalog's JSON names them (``id`` is the checkpoint id).
ENTRY_FIELDS = ("id", "upper", "since", "created_at", "files", "bytes", "manifest_sha256")


@dataclass(frozen=True)
class StoredCatalog:
    """A shard's catalog as the store holds it: its version and entries (dicts of
    :data:`ENTRY_FIELDS`), oldest first."""

    version: int
    entries: list[dict[str, Any]]


def entry_order(entry: dict[str, Any]) -> tuple:
    """The one order of a catalog's entries, in the store and in its copies."""
    return (entry["upper"], entry["created_at"], entry["id"])


def read_catalog_in(conn: sa.Connection, shard_id: str) -> StoredCatalog | None:
    """The stored catalog of ``shard_id`` in the caller's transaction; None if the store does
    not hold it (yet)."""
    version = conn.execute(
        sa.select(catalogs_table.c.version).where(catalogs_table.c.shard_id == shard_id)
    ).scalar_one_or_none()
    if version is None:
        return None
    t = catalog_entries_table
    rows = conn.execute(
        sa.select(t.c.checkpoint_id, t.c.upper, t.c.since, t.c.created_at, t.c.files, t.c.bytes, t.c.manifest_sha256)
        .where(t.c.shard_id == shard_id)
    )
    entries = [dict(zip(ENTRY_FIELDS, row)) for row in rows]
    return StoredCatalog(int(version), sorted(entries, key=entry_order))


def read_catalog(consensus: Consensus, shard_id: str) -> StoredCatalog | None:
    """The stored catalog of ``shard_id`` (one read-only snapshot); None if the store does not
    hold it."""
    return consensus.read_in_snapshot(lambda conn: read_catalog_in(conn, shard_id))


def listed_ids_in(conn: sa.Connection, shard_id: str) -> set[str] | None:
    """The checkpoint ids the stored catalog lists, in the caller's transaction; None if the
    store does not hold the catalog."""
    stored = read_catalog_in(conn, shard_id)
    return None if stored is None else {e["id"] for e in stored.entries}


def write_catalog_in(
    conn: sa.Connection,
    shard_id: str,
    before: StoredCatalog | None,
    entries: list[dict[str, Any]],
    version: int,
) -> None:
    """Replace the stored catalog (``before``: what the caller read in this transaction) with
    ``entries`` at ``version``, in the caller's transaction (under the catalog lock)."""
    now = time.time()
    if before is None:
        conn.execute(sa.insert(catalogs_table).values(shard_id=shard_id, version=version, changed_at=now))
    else:
        conn.execute(
            sa.update(catalogs_table).where(catalogs_table.c.shard_id == shard_id).values(version=version, changed_at=now)
        )
    old = {e["id"]: e for e in (before.entries if before else [])}
    new = {e["id"]: e for e in entries}
    gone = [i for i in old if i not in new or old[i] != new[i]]
    t = catalog_entries_table
    if gone:
        conn.execute(sa.delete(t).where(t.c.shard_id == shard_id, t.c.checkpoint_id.in_(gone)))
    fresh = [
        {"shard_id": shard_id, "checkpoint_id": e["id"], **{k: e[k] for k in ENTRY_FIELDS if k != "id"}}
        for i, e in new.items()
        if i not in old or old[i] != e
    ]
    if fresh:
        conn.execute(sa.insert(t), fresh)
