"""The files each retained checkpoint's manifest names, indexed in the consensus store, so
that GC learns what the checkpoints of every shard pin without reading every manifest.

One row per checkpoint: its owner (the shard directory its catalog is in), its id, the
SHA-256 of its manifest and the blob-relative paths the manifest names (JSON). A row is a copy
of an immutable manifest, keyed by its digest: GC uses it only for a catalog entry with the
same digest. GC reads the manifest of a listed checkpoint that has no row (a new checkpoint,
or one written before this table), checking it against the catalog's digest as always (a
corrupt manifest still stops GC), then records the row: each manifest is read once. A catalog
change that drops checkpoints (retention) drops their rows in its transaction; GC drops the
rows of checkpoints its owner's catalog no longer lists. A missing or extra row can therefore
cost a manifest read or a row, never a file: the catalog decides what is retained.

Stores before revision 0004 have no table: ``upsertctl db upgrade`` creates it empty, and the
first GC reads every retained manifest once and fills it (docs/maintenance.md).
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection, Iterable

import sqlalchemy as sa

from airflow_upsert_provider.engine.store.consensus import Consensus, insert_ignore
from airflow_upsert_provider.engine.store.tables import metadata

checkpoint_refs_table = sa.Table(
    "upsert_checkpoint_refs",
    metadata,
    # The shard directory whose catalog lists the checkpoint.
    sa.Column("shard_id", sa.String(128), primary_key=True),
    sa.Column("checkpoint_id", sa.String(128), primary_key=True),
    sa.Column("manifest_sha256", sa.String(64), nullable=False),
    # JSON list of the blob-relative paths the manifest names.
    sa.Column("files", sa.Text, nullable=False),
    sa.Column("indexed_at", sa.Float, nullable=False),
)

# Rows per IN (...) list: far below every store's parameter limit.
CHUNK = 500


def record_references(consensus: Consensus, shard_id: str, checkpoint_id: str, manifest_sha256: str,
                      paths: Iterable[str]) -> None:
    """Index the files the manifest of checkpoint ``checkpoint_id`` of ``shard_id`` (digest
    ``manifest_sha256``) names; a row already there is left as it is (a manifest never changes)."""
    files = json.dumps(sorted(set(paths)))
    consensus.run_in_transaction(lambda conn: insert_ignore(
        conn, checkpoint_refs_table, shard_id=shard_id, checkpoint_id=checkpoint_id,
        manifest_sha256=manifest_sha256, files=files, indexed_at=time.time()))


def references_of(consensus: Consensus, shard_ids: Collection[str]) -> dict[tuple[str, str], tuple[str, list[str]]]:
    """(owner, checkpoint id) -> (manifest digest, paths) for every indexed checkpoint of
    ``shard_ids``: one read, however many manifests it stands for."""
    owners = sorted(set(shard_ids))
    table = checkpoint_refs_table

    def read(conn) -> list:
        rows = []
        for start in range(0, len(owners), CHUNK):
            rows += conn.execute(sa.select(table.c.shard_id, table.c.checkpoint_id, table.c.manifest_sha256,
                                           table.c.files).where(table.c.shard_id.in_(owners[start:start + CHUNK]))).all()
        return rows

    return {(r.shard_id, r.checkpoint_id): (r.manifest_sha256, json.loads(r.files))
            for r in consensus.read_in_snapshot(read)}


def forget_references_in(conn, shard_id: str, checkpoint_ids: Collection[str]) -> None:
    """Drop the rows of checkpoints of ``shard_id``, inside the caller's transaction (a catalog
    change that removed them)."""
    ids = sorted(set(checkpoint_ids))
    for start in range(0, len(ids), CHUNK):
        conn.execute(sa.delete(checkpoint_refs_table).where(
            checkpoint_refs_table.c.shard_id == shard_id,
            checkpoint_refs_table.c.checkpoint_id.in_(ids[start:start + CHUNK])))


def forget_references(consensus: Consensus, keys: Collection[tuple[str, str]]) -> None:
    """Drop the rows of (owner, checkpoint id) ``keys``: checkpoints no catalog lists any more."""
    by_owner: dict[str, list[str]] = {}
    for owner, checkpoint_id in keys:
        by_owner.setdefault(owner, []).append(checkpoint_id)

    def txn(conn) -> None:
        for owner, ids in by_owner.items():
            forget_references_in(conn, owner, ids)

    if by_owner:
        consensus.run_in_transaction(txn)


def indexed_owners(consensus: Consensus) -> set[str]:
    """Every owner (shard directory) that has index rows."""
    return set(consensus.read_in_snapshot(
        lambda conn: conn.execute(sa.select(checkpoint_refs_table.c.shard_id).distinct()).scalars().all()))


def forget_owners(consensus: Consensus, owners: Collection[str]) -> None:
    """Drop every row of ``owners``: directories that no longer hold checkpoints."""
    names = sorted(set(owners))

    def txn(conn) -> None:
        for start in range(0, len(names), CHUNK):
            conn.execute(sa.delete(checkpoint_refs_table).where(
                checkpoint_refs_table.c.shard_id.in_(names[start:start + CHUNK])))

    if names:
        consensus.run_in_transaction(txn)
