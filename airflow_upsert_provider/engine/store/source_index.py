"""What planning a batch knows about a source partition, kept in consensus between batches.

Per (shard, partition), one row: the names in the partition's directory whose verdict is
settled (bound by a binding, set aside in quarantine, ignored), as of binding ``through_ts``.
Planning subtracts them from the listing, so only new names are parsed and looked up, and the
row is read in one query instead of every binding ever minted. It is rewritten only now and
then (see ``binding_planner.remember_settled``); in between, the few bindings minted since
are read to catch up.

The row is an accelerator, never the authority: it only ever holds names some binding (or the
quarantine table) settled, and a name it lacks is looked up exactly (the binding whose range
covers its offset, or the quarantine table). It is rewritten after each batch with the names
still present, so it follows the files the source retains, not the shard's history. A row
that does not match the binding it claims (a shard id reused by a restore) is rebuilt from
the bindings.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Iterable

import sqlalchemy as sa

from airflow_upsert_provider.engine.store.consensus import Consensus, insert_ignore
from airflow_upsert_provider.engine.store.records import _binding_from_row, Binding
from airflow_upsert_provider.engine.store.tables import bindings_table, quarantined_files_table, settled_names_table
from airflow_upsert_provider.engine.errors import PlanningOutdated
from airflow_upsert_provider.engine.sources.directory import Segment
from airflow_upsert_provider.engine.sources.planning import bound_names, put_back_reason
from airflow_upsert_provider.engine.store.history import oldest_binding, truncation_horizon


def binding_digest(binding: Binding | None) -> str:
    return "" if binding is None else hashlib.sha256(binding.to_json().encode()).hexdigest()


def _encode(names: Iterable[str]) -> str:
    return "/".join(names)


def _decode(text: str) -> set[str]:
    return set(text.split("/")) if text else set()


class SourceIndex:
    """The settled names of one shard's source partitions, and exact look-ups behind them."""

    def __init__(self, consensus: Consensus, shard_id: str, source_root: str, extension: str) -> None:
        self.consensus = consensus
        self.shard_id = shard_id
        self.source_root = source_root
        self.extension = extension
        # The oldest binding kept, read once by the first look-up that needs it.
        self._oldest: Binding | None = None

    # -- the accelerator row ----------------------------------------------------------------

    def settled(self, partition: str, upto: Binding | None) -> tuple[set[str], int]:
        """Names of ``partition`` settled through binding ``upto`` (None: before any), and
        how many bindings the stored row lagged behind ``upto`` (caught up from them).

        The row and the bindings it is checked against and caught up from are read in one
        snapshot: GC rewrites rows and truncates the bindings below them (store/history.py)
        in between two reads. A row ahead of ``upto`` (a peer minted later bindings and saved
        it while this planner held ``upto``) gives its names less those the later bindings
        settled. Raises :class:`PlanningOutdated` when the bindings needed are truncated:
        names cannot be settled from a history that is gone, and a file must never be
        called late for it."""
        upto_ts = -1 if upto is None else upto.ts
        table = settled_names_table

        def bindings_in(conn, first_ts: int, last_ts: int) -> list[Binding]:
            rows = conn.execute(
                sa.select(bindings_table)
                .where(bindings_table.c.shard_id == self.shard_id, bindings_table.c.ts >= first_ts,
                       bindings_table.c.ts <= last_ts)
                .order_by(bindings_table.c.ts)
            ).all()
            return [_binding_from_row(r) for r in rows]

        def read(conn):
            row = conn.execute(
                sa.select(table.c.through_ts, table.c.binding_digest, table.c.names).where(
                    table.c.shard_id == self.shard_id, table.c.partition == partition
                )
            ).first()
            if row is not None and row.through_ts > upto_ts:
                later = bindings_in(conn, upto_ts + 1, row.through_ts)
                if later and binding_digest(later[-1]) == row.binding_digest:
                    return row, later, []
                row = None  # not this shard's row (a reused shard id): rebuilt from bindings
            if row is not None and row.through_ts >= 0 and row.through_ts < upto_ts:
                anchor = bindings_in(conn, row.through_ts, row.through_ts)
                if not anchor or binding_digest(anchor[0]) != row.binding_digest:
                    row = None
            elif row is not None and row.through_ts == upto_ts and binding_digest(upto) != row.binding_digest:
                row = None
            through = -1 if row is None else row.through_ts
            return row, [], (bindings_in(conn, through + 1, upto_ts) if through < upto_ts else [])

        row, later, catch_up = self.consensus.read_in_snapshot(read)
        if later:
            if [b.ts for b in later] != list(range(upto_ts + 1, row.through_ts + 1)):
                raise self._outdated(upto_ts)
            names = _decode(row.names)
            for binding in later:
                names -= self.settled_by(partition, binding)
            return names, 0
        through = -1 if row is None else row.through_ts
        # Without a row (a partition new since GC anchored the rows) the bindings kept are all
        # there is; from a row, every binding after its anchor is kept unless truncated since.
        if row is not None and [b.ts for b in catch_up] != list(range(through + 1, upto_ts + 1)):
            raise self._outdated(upto_ts)
        names = set() if row is None else _decode(row.names)
        for binding in catch_up:
            names |= self.settled_by(partition, binding)
        return names, upto_ts - through

    def _outdated(self, upto_ts: int) -> PlanningOutdated:
        return PlanningOutdated(
            f"shard {self.shard_id!r}: binding {upto_ts + 1} cannot be planned from binding {upto_ts}: the "
            "bindings planning catches up from were truncated meanwhile (the planner took longer than GC's "
            "grace period). Nothing was bound; run again",
            shard=self.shard_id, ts=upto_ts + 1,
        )

    def settled_by(self, partition: str, binding: Binding) -> set[str]:
        """Names of ``partition`` that ``binding`` bound or set aside."""
        names = bound_names(binding.ranges.get(partition, {}), self.extension)
        directory = os.path.join(self.source_root, partition)
        names |= {
            os.path.basename(q["file"]) for q in binding.quarantined if os.path.dirname(q["file"]) == directory
        }
        return names

    def save(self, partition: str, through: Binding | None, names: set[str]) -> None:
        """Record ``names`` as settled through ``through``, unless a peer recorded a later
        binding already (the row only moves forward)."""
        table = settled_names_table
        through_ts = -1 if through is None else through.ts
        values = {"through_ts": through_ts, "binding_digest": binding_digest(through), "names": _encode(names)}

        def txn(conn):
            current = conn.execute(
                sa.select(table.c.through_ts).where(table.c.shard_id == self.shard_id, table.c.partition == partition)
            ).scalar_one_or_none()
            if current is None:
                insert_ignore(conn, table, shard_id=self.shard_id, partition=partition, **values)
            elif current <= through_ts:
                conn.execute(
                    sa.update(table)
                    .where(table.c.shard_id == self.shard_id, table.c.partition == partition,
                           table.c.through_ts == current)
                    .values(**values)
                )

        self.consensus.run_in_transaction(txn)

    # -- exact look-ups, for new names only -----------------------------------------------------

    def late_arrival_reason(self, segment: Segment, frontier: int, last: Binding) -> str | None:
        """Why ``segment`` of a partition, offset below ``frontier`` (binding ``last``'s
        ``to``), is a late arrival; None for a bound segment put back, or one below the
        truncation horizon (:func:`sources.planning.put_back_reason` decides). Reads the
        oldest binding kept once per index, then O(log) bindings above it; raises
        :class:`PlanningOutdated` when one of those was truncated meanwhile (never "unbound"
        for a binding that is gone)."""
        if self._oldest is None:
            self._oldest = oldest_binding(self.consensus, self.shard_id)
        oldest = self._oldest
        if oldest is None or oldest.ts > last.ts:
            raise self._outdated(last.ts)
        partition = segment.partition
        found: dict[int, Binding] = {last.ts: last, oldest.ts: oldest}

        def range_at(ts: int) -> dict[str, Any] | None:
            if ts not in found:
                binding = self.consensus.get_binding(self.shard_id, ts)
                if binding is None:
                    raise self._outdated(last.ts)
                found[ts] = binding
            return found[ts].ranges.get(partition)

        horizon = truncation_horizon(oldest).get(partition, 0)
        return put_back_reason(segment, frontier, horizon, oldest.ts, last.ts, range_at, self.extension)

    def quarantined_among(self, paths: list[str]) -> set[str]:
        """Which of ``paths`` are set aside in quarantine."""
        if not paths:
            return set()
        table = quarantined_files_table
        found: set[str] = set()
        for start in range(0, len(paths), 500):
            chunk = paths[start : start + 500]
            rows = self.consensus.read_in_snapshot(
                lambda conn: conn.execute(
                    sa.select(table.c.file).where(table.c.shard_id == self.shard_id, table.c.file.in_(chunk))
                ).all()
            )
            found |= {r.file for r in rows}
        return found
