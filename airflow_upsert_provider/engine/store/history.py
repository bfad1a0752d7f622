"""Bounded batch history: the rows of ``upsert_batches`` and ``upsert_bindings`` below since
are rolled up into a summary and truncated.

What a shard needs of its history, and so what truncation keeps (as Materialize persist keeps
its state since its last rollup and truncates what is below it):

- every batch and binding at ts >= since - 1: reads as of ts >= since merge the batches from
  since on; binding(upper - 1) is where the next binding starts (contiguity), what a seek
  after a restore seeks and what acks and group offsets follow; batch(upper - 1) is the
  "last committed" the monitor and status show, and upper - 1 >= since - 1;
- every row younger than the grace period (GC's): a writer whose commit's outcome was
  unknown learns whether its own token landed (idempotent retry, invariant 6), and may then
  delete its files at once if a peer's token won (invariant 7). A writer slower than the
  grace period restages anyway (GC claims its files);
- every binding from the one a source index row (store/source_index.py) is anchored at:
  planning checks the row against it and catches up from the bindings after it;
- an audit summary of every range truncated (``upsert_batch_rollups``: batches, rows in and
  out, rejected, first and last ``committed_at``): one row per shard, each truncation folded
  into it (a new row only where a range does not continue the last one).

A writer retrying an append of a ts whose row is gone still learns that its batch is
persisted (ts < upper says so); which token won is no longer known, so it keeps its files
and GC judges them (``AppendOutcome.TRUNCATED``).

Truncation runs in bounded chunks, each its own short transaction that re-reads since,
rolls the chunk up and deletes it; no blob I/O happens inside (it touches no blob at all).
``plan_truncation`` decides the chunks (pure); ``truncate_history`` runs them.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import sqlalchemy as sa

from airflow_upsert_provider.engine.store.consensus import Consensus
from airflow_upsert_provider.engine.store.records import (
    _binding_from_row,
    Binding,
    history_from,
    Rollup,
    rollup_from_row,
)
from airflow_upsert_provider.engine.store.tables import (
    batch_rollups_table,
    batches_table,
    bindings_table,
    settled_names_table,
    shards_table,
)

# Rows deleted per transaction: a short transaction that never holds the store for long.
DEFAULT_CHUNK = 1000

def keep_from(since: int, held_from: int | None) -> int:
    """The lowest ts whose batch and binding rows stay: since - 1 (see the module
    docstring), or ``held_from`` if that is lower."""
    bound = history_from(since)
    return bound if held_from is None else min(bound, max(held_from, 0))


def plan_truncation(oldest: int | None, since: int, held_from: int | None, chunk: int) -> list[tuple[int, int]]:
    """Pure: the ranges [lo, hi) of ts to roll up and delete, at most ``chunk`` ts each.

    :param oldest: the lowest ts that still has a batch or binding row (None: none).
    :param since: the shard's since.
    :param held_from: the lowest ts below since - 1 that must stay for another reason (None:
        none): the first batch committed inside the grace period, the binding a source index
        row is anchored at; it and everything above it stay.
    """
    if chunk < 1:
        raise ValueError("a truncation chunk holds at least one ts")
    if oldest is None:
        return []
    stop = keep_from(since, held_from)
    return [(lo, min(lo + chunk, stop)) for lo in range(oldest, stop, chunk)]


@dataclass
class TruncationReport:
    """What a truncation removed."""

    kept_from: int = 0
    batches: int = 0
    bindings: int = 0
    chunks: int = 0
    ranges: list[tuple[int, int]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"kept_from": self.kept_from, "batches": self.batches, "bindings": self.bindings,
                "chunks": self.chunks}


def _oldest(conn, shard_id: str) -> int | None:
    """The lowest ts with a batch or binding row (each a primary-key look-up)."""
    found = [
        conn.execute(sa.select(sa.func.min(t.c.ts)).where(t.c.shard_id == shard_id)).scalar()
        for t in (batches_table, bindings_table)
    ]
    found = [ts for ts in found if ts is not None]
    return min(found) if found else None


def _young_from(conn, shard_id: str, oldest: int, below: int, cutoff: float) -> int | None:
    """The lowest ts in [oldest, below) whose batch was committed at or after ``cutoff``."""
    return conn.execute(
        sa.select(sa.func.min(batches_table.c.ts)).where(
            batches_table.c.shard_id == shard_id,
            batches_table.c.ts >= oldest,
            batches_table.c.ts < below,
            batches_table.c.committed_at >= cutoff,
        )
    ).scalar()


def truncate_history(
    consensus: Consensus,
    shard_id: str,
    *,
    committed_before: float,
    source_partitions: Iterable[str] | None,
    chunk: int = DEFAULT_CHUNK,
    dry_run: bool = False,
    on_chunk: Callable[[int, int], None] | None = None,
) -> TruncationReport:
    """Roll up and delete the batch and binding rows of ``shard_id`` below since - 1 that
    were committed before ``committed_before`` (GC passes now - grace), ``chunk`` ts per
    transaction. ``on_chunk(lo, hi)`` is called after each chunk committed (tests count them).

    :param source_partitions: the partitions of a directory source that planning surveys
        (None for a source without a source index, Kafka): the bindings from the lowest
        binding their index rows are anchored at stay, and all of them if one has no row
        (planning would rebuild it from binding 0). GC anchors them first
        (``binding_planner.anchor_source_index``).
    """
    partitions = None if source_partitions is None else set(source_partitions)

    def plan(conn):
        since = conn.execute(
            sa.select(shards_table.c.since).where(shards_table.c.shard_id == shard_id)
        ).scalar_one_or_none()
        if since is None:
            return 0, []
        oldest = _oldest(conn, shard_id)
        if oldest is None:
            return since, []
        young = _young_from(conn, shard_id, oldest, history_from(since), committed_before)
        # A source index row checks its names against the binding it is anchored at, and
        # catches up from the bindings after it: those stay (rows are rewritten every few
        # dozen batches, so this holds truncation back by as much).
        anchored = None
        if partitions:
            rows = dict(conn.execute(
                sa.select(settled_names_table.c.partition, settled_names_table.c.through_ts).where(
                    settled_names_table.c.shard_id == shard_id
                )
            ).all())
            anchored = min(rows.get(p, -1) for p in partitions)
        held = min((ts for ts in (young, anchored) if ts is not None), default=None)
        return keep_from(since, held), plan_truncation(oldest, since, held, chunk)

    kept_from, ranges = consensus.read_in_snapshot(plan)
    report = TruncationReport(kept_from=kept_from, ranges=ranges)
    if dry_run:
        return report
    # The chunks of one truncation roll up into one row (they share its stamp).
    stamp = time.time()
    for lo, hi in ranges:
        batches, bindings = consensus.run_in_transaction(
            lambda conn, lo=lo, hi=hi: _truncate_chunk(conn, shard_id, lo, hi, stamp)
        )
        report.batches += batches
        report.bindings += bindings
        report.chunks += 1
        if on_chunk is not None:
            on_chunk(lo, hi)
    return report


def _truncate_chunk(conn, shard_id: str, lo: int, hi: int, stamp: float) -> tuple[int, int]:
    """One transaction: roll [lo, hi) up (into the row that ends at lo, else a new row) and
    delete its batch and binding rows."""
    since = conn.execute(
        sa.select(shards_table.c.since).where(shards_table.c.shard_id == shard_id)
    ).scalar_one_or_none()
    if since is None or hi > history_from(since):
        # Since only advances, so this cannot happen unless the shard was dropped and
        # recreated (a restore) meanwhile: touch nothing.
        return 0, 0
    where_batches = (batches_table.c.shard_id == shard_id, batches_table.c.ts >= lo, batches_table.c.ts < hi)
    rows = conn.execute(
        sa.select(batches_table.c.stats, batches_table.c.committed_at).where(*where_batches)
    ).all()
    if rows:
        rollup = _summarize(lo, hi, rows, stamp)
        # Into the row the range continues, whichever truncation wrote it: one row per shard
        # (a checkpoint carries the rollups, so a row per truncation made every checkpoint
        # cost more as the history grew).
        previous = conn.execute(
            sa.select(batch_rollups_table).where(
                batch_rollups_table.c.shard_id == shard_id,
                batch_rollups_table.c.to_ts == lo,
            )
        ).first()
        if previous is None:
            conn.execute(sa.insert(batch_rollups_table).values(shard_id=shard_id, **rollup.to_dict()))
        else:
            merged = _merge(rollup_from_row(previous), rollup)
            conn.execute(
                sa.update(batch_rollups_table)
                .where(batch_rollups_table.c.shard_id == shard_id, batch_rollups_table.c.from_ts == previous.from_ts)
                .values(**merged.to_dict())
            )
    batches = conn.execute(sa.delete(batches_table).where(*where_batches)).rowcount
    bindings = conn.execute(
        sa.delete(bindings_table).where(
            bindings_table.c.shard_id == shard_id, bindings_table.c.ts >= lo, bindings_table.c.ts < hi
        )
    ).rowcount
    return batches, bindings


def _summarize(lo: int, hi: int, rows, stamp: float) -> Rollup:
    stats = [json.loads(r.stats) for r in rows]
    times = [r.committed_at for r in rows]
    return Rollup(
        from_ts=lo,
        to_ts=hi,
        batches=len(rows),
        rows_in=sum(int(s.get("rows_in") or 0) for s in stats),
        rows_out=sum(int(s.get("rows_out") or 0) for s in stats),
        rejected=sum(int(s.get("rejected") or 0) for s in stats),
        first_committed_at=min(times),
        last_committed_at=max(times),
        rolled_up_at=stamp,
    )


def _merge(a: Rollup, b: Rollup) -> Rollup:
    """Two adjacent rollups (a ends where b starts) as one."""
    firsts = [t for t in (a.first_committed_at, b.first_committed_at) if t is not None]
    lasts = [t for t in (a.last_committed_at, b.last_committed_at) if t is not None]
    return Rollup(
        from_ts=a.from_ts,
        to_ts=b.to_ts,
        batches=a.batches + b.batches,
        rows_in=a.rows_in + b.rows_in,
        rows_out=a.rows_out + b.rows_out,
        rejected=a.rejected + b.rejected,
        first_committed_at=min(firsts) if firsts else None,
        last_committed_at=max(lasts) if lasts else None,
        rolled_up_at=b.rolled_up_at,
    )


def oldest_binding(consensus: Consensus, shard_id: str) -> Binding | None:
    """The oldest binding truncation kept (None: the shard has none), read in one snapshot.
    Bindings are contiguous and truncated from the bottom, so its ``from`` per partition is
    the summary of every truncated range: each offset below it was covered by a truncated
    binding (:func:`truncation_horizon`). It survives a checkpoint and a restore, which carry
    the bindings kept."""

    def read(conn):
        ts = conn.execute(
            sa.select(sa.func.min(bindings_table.c.ts)).where(bindings_table.c.shard_id == shard_id)
        ).scalar()
        if ts is None:
            return None
        return conn.execute(
            sa.select(bindings_table).where(bindings_table.c.shard_id == shard_id, bindings_table.c.ts == ts)
        ).first()

    row = consensus.read_in_snapshot(read)
    return None if row is None else _binding_from_row(row)


def truncation_horizon(oldest: Binding | None) -> dict[str, int]:
    """Pure: ``{partition: offset}`` below which every offset was covered by a truncated
    binding, from the oldest binding kept (a partition it does not name was in no binding
    before it: a partition, once bound, is in every later binding)."""
    if oldest is None:
        return {}
    return {partition: int(rng["from"]) for partition, rng in oldest.ranges.items()}


def rollups(consensus: Consensus, shard_id: str) -> list[Rollup]:
    """The audit summaries of a shard's truncated ranges, oldest first."""
    rows = consensus.run_in_transaction(
        lambda conn: conn.execute(
            sa.select(batch_rollups_table)
            .where(batch_rollups_table.c.shard_id == shard_id)
            .order_by(batch_rollups_table.c.from_ts)
        ).all()
    )
    return [rollup_from_row(r) for r in rows]
