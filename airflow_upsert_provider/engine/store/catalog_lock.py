"""The checkpoint catalog's lock: one row per shard in consensus.

Every change to a shard's checkpoint catalog (store/catalog_rows.py) holds this row for one
short consensus transaction that reads the catalog's rows, applies the change and writes them
back, so two overlapping ``checkpoint create`` runs, or retention during a create, serialize
and none loses the other's entry. GC takes the same row when it claims checkpoint directories
(store/gc_claims.py). No blob I/O runs while it is held: the catalog's blob copies are read
before and written after (engine/maintenance/checkpoint.py). The store releases the lock when
its holder dies (the transaction aborts), so a crashed writer never wedges the catalog.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator

import sqlalchemy as sa

from airflow_upsert_provider.engine.store.consensus import Consensus, insert_ignore
from airflow_upsert_provider.engine.store.tables import metadata
from airflow_upsert_provider.engine.store.urls import _short, redact_url
from airflow_upsert_provider.engine.errors import ConsensusOutcomeUnknown, ConsensusUnavailable

catalog_locks_table = sa.Table(
    "upsert_catalog_locks",
    metadata,
    sa.Column("shard_id", sa.String(128), primary_key=True),
    # Times the lock was held to the end of its body (the catalog's own version is in
    # store/catalog_rows.py).
    sa.Column("version", sa.BigInteger, nullable=False),
    sa.Column("changed_at", sa.Float, nullable=False),
)


@contextmanager
def catalog_lock(consensus: Consensus, shard_id: str) -> Iterator[sa.Connection]:
    """Hold the catalog lock of ``shard_id`` for the body (one consensus transaction, yielded
    for checks of its own: the lock row of PostgreSQL, the write lock of SQLite). An exception
    in the body releases it without counting a change.

    A store failure while taking the lock changed nothing (:class:`ConsensusUnavailable`).
    Once the body ran, the catalog's rows may have changed: a store failure then (the body's
    own checks, counting the change, releasing the lock) is :class:`ConsensusOutcomeUnknown`,
    never "nothing changed"."""
    body_started = False
    try:
        with consensus.engine.begin() as conn:
            insert_ignore(conn, catalog_locks_table, shard_id=shard_id, version=0, changed_at=time.time())
            locked = sa.select(catalog_locks_table.c.version).where(catalog_locks_table.c.shard_id == shard_id)
            if consensus.dialect == "postgresql":
                locked = locked.with_for_update()
            conn.execute(locked).scalar_one()
            body_started = True
            yield conn
            conn.execute(
                sa.update(catalog_locks_table)
                .where(catalog_locks_table.c.shard_id == shard_id)
                .values(version=catalog_locks_table.c.version + 1, changed_at=time.time())
            )
    except (sa.exc.DBAPIError, sa.exc.TimeoutError) as exc:
        # Not chained: a driver's error may echo the URL's password (its first line, masked, is kept).
        where = redact_url(consensus.url)
        reason_line = _short(exc, consensus.url)
        if body_started:
            raise ConsensusOutcomeUnknown(
                f"consensus store {where} failed while the checkpoint catalog of shard {shard_id!r} was "
                f"changed under its lock, so the change may or may not have been made: {reason_line}; "
                "check it with `upsertctl checkpoint list` (running the same step again is safe)",
                shard=shard_id, consensus=where,
            ) from None
        raise ConsensusUnavailable(
            f"consensus store {where} failed while taking the checkpoint catalog lock of shard {shard_id!r}: "
            f"{reason_line}; nothing was changed",
            shard=shard_id, consensus=where,
        ) from None
