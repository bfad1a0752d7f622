"""Restoring a shard from a checkpoint's snapshot into the consensus store."""

from __future__ import annotations

import json
import time

import sqlalchemy as sa

from airflow_upsert_provider.engine.errors import ShardExists
from airflow_upsert_provider.engine.store.consensus import Consensus, insert_ignore
from airflow_upsert_provider.engine.store.records import RestoreEvent, ShardRecord, ShardSnapshot
from airflow_upsert_provider.engine.store.tables import (
    batch_rollups_table,
    batches_table,
    bindings_table,
    compactions_table,
    quarantined_files_table,
    settled_names_table,
    shards_table,
    table_schemas_table,
)


def restore_shard(
    consensus: Consensus, shard_id: str, snapshot: ShardSnapshot, *, actor: str = "", reason: str = ""
) -> ShardRecord:
    """Write ``snapshot`` as shard ``shard_id`` in one transaction, with the restore hooks.
    Refused if the shard exists: a restore never moves an existing upper backwards
    (restore under a new id). ``actor`` and ``reason`` are recorded by the hooks."""
    record = snapshot.record

    def txn(conn):
        existing = conn.execute(
            sa.select(shards_table.c.upper).where(shards_table.c.shard_id == shard_id)
        ).scalar_one_or_none()
        if existing is not None or not insert_ignore(
            conn,
            shards_table,
            shard_id=shard_id,
            upper=record.upper,
            since=record.since,
            seqno=record.seqno,
            config=record.config,
            created_at=time.time(),
        ):
            raise ShardExists(
                f"cannot restore into shard {shard_id!r}: it exists"
                + (f" with upper {existing}" if existing is not None else "")
                + f" (the checkpoint's upper is {record.upper}); a restore never moves an "
                "existing upper backwards: restore into an empty consensus or under a new shard id",
                shard=shard_id,
                upper=existing,
            )
        # Stale rows of a shard id used before (dropped shard) must not mix in.
        for table in (bindings_table, batches_table, quarantined_files_table, compactions_table,
                      batch_rollups_table, settled_names_table, table_schemas_table):
            conn.execute(sa.delete(table).where(table.c.shard_id == shard_id))
        if snapshot.bindings:
            conn.execute(
                sa.insert(bindings_table),
                [
                    {"shard_id": shard_id, "ts": b.ts, "ranges": b.to_json(), "minted_by": b.minted_by,
                     "minted_at": time.time()}
                    for b in snapshot.bindings
                ],
            )
        if snapshot.batches:
            conn.execute(
                sa.insert(batches_table),
                [
                    {"shard_id": shard_id, "ts": b.ts, "writer_id": b.writer_id, "token": b.token,
                     "run": json.dumps(b.run, sort_keys=True), "stats": json.dumps(b.stats, sort_keys=True),
                     "committed_at": b.committed_at}
                    for b in snapshot.batches
                ],
            )
        if snapshot.quarantined:
            conn.execute(
                sa.insert(quarantined_files_table),
                [{"shard_id": shard_id, **q} for q in snapshot.quarantined],
            )
        if snapshot.source_index:
            conn.execute(
                sa.insert(settled_names_table),
                [{"shard_id": shard_id, **r} for r in snapshot.source_index],
            )
        if snapshot.rollups:
            conn.execute(
                sa.insert(batch_rollups_table),
                [{"shard_id": shard_id, **r.to_dict()} for r in snapshot.rollups],
            )
        if snapshot.table_schemas:
            conn.execute(sa.insert(table_schemas_table), [{"shard_id": shard_id, **v} for v in snapshot.table_schemas])
        if snapshot.compaction is not None:
            conn.execute(
                sa.insert(compactions_table).values(
                    shard_id=shard_id,
                    since=snapshot.compaction.since,
                    run=json.dumps(snapshot.compaction.run, sort_keys=True),
                    compacted_at=snapshot.compaction.compacted_at,
                )
            )
        for hook in consensus.restore_hooks:
            hook(conn, RestoreEvent(shard_id, record.upper, actor, reason))
        return ShardRecord(**conn.execute(
            sa.select(shards_table).where(shards_table.c.shard_id == shard_id)
        ).one()._mapping)

    return consensus.run_in_transaction(txn)
