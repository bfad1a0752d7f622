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

from airflow_upsert_provider.engine.store.consensus import (
    Binding,
    Consensus,
    _binding_from_row,
    bindings_table,
    insert_ignore,
    quarantined_files_table,
    settled_names_table,
)
from airflow_upsert_provider.engine.sources.planning import bound_names, range_to

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

    # -- the accelerator row ----------------------------------------------------------------

    def settled(self, partition: str, upto: Binding | None) -> tuple[set[str], int]:
        """Names of ``partition`` settled through binding ``upto`` (None: before any), and
        how many bindings the stored row lagged behind ``upto`` (caught up from them)."""
        upto_ts = -1 if upto is None else upto.ts
        table = settled_names_table
        row = self.consensus._run_snapshot(
            lambda conn: conn.execute(
                sa.select(table.c.through_ts, table.c.binding_digest, table.c.names).where(
                    table.c.shard_id == self.shard_id, table.c.partition == partition
                )
            ).first()
        )
        names: set[str] = set()
        through = -1
        if row is not None and row.through_ts <= upto_ts:
            anchor = upto if row.through_ts == upto_ts else self.consensus.get_binding(self.shard_id, row.through_ts)
            if row.through_ts == -1 or binding_digest(anchor) == row.binding_digest:
                names, through = _decode(row.names), row.through_ts
        if through < upto_ts:
            for binding in self._bindings_between(through + 1, upto_ts):
                names |= self.settled_by(partition, binding)
        return names, upto_ts - through

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

        self.consensus._run(txn)

    # -- exact look-ups, for new names only -----------------------------------------------------

    def covering_range(self, partition: str, offset: int, last: Binding) -> dict[str, Any] | None:
        """The range of ``partition`` in the binding that covers ``offset`` (below the
        frontier of ``last``): a binary search over ts, since each partition's ``to`` never
        decreases from one binding to the next."""
        low, high = 0, last.ts
        found: dict[int, Binding | None] = {last.ts: last}

        def to_at(ts: int) -> int:
            if ts not in found:
                found[ts] = self.consensus.get_binding(self.shard_id, ts)
            binding = found[ts]
            return range_to(binding.ranges.get(partition)) if binding else 0

        while low < high:
            middle = (low + high) // 2
            if to_at(middle) > offset:
                high = middle
            else:
                low = middle + 1
        binding = found.get(low) or self.consensus.get_binding(self.shard_id, low)
        return None if binding is None else binding.ranges.get(partition)

    def quarantined_among(self, paths: list[str]) -> set[str]:
        """Which of ``paths`` are set aside in quarantine."""
        if not paths:
            return set()
        table = quarantined_files_table
        found: set[str] = set()
        for start in range(0, len(paths), 500):
            chunk = paths[start : start + 500]
            rows = self.consensus._run_snapshot(
                lambda conn: conn.execute(
                    sa.select(table.c.file).where(table.c.shard_id == self.shard_id, table.c.file.in_(chunk))
                ).all()
            )
            found |= {r.file for r in rows}
        return found

    def _bindings_between(self, first_ts: int, last_ts: int) -> list[Binding]:
        table = bindings_table
        rows = self.consensus._run_snapshot(
            lambda conn: conn.execute(
                sa.select(table)
                .where(table.c.shard_id == self.shard_id, table.c.ts >= first_ts, table.c.ts <= last_ts)
                .order_by(table.c.ts)
            ).all()
        )
        return [_binding_from_row(r) for r in rows]
