"""The records the consensus store reads and writes (shard, binding, batch, compaction, rollup,
snapshot), what its commit and restore hooks see, and the pure rules over them (which runs a
read merges, from which ts history is kept)."""

from __future__ import annotations

import enum
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import sqlalchemy as sa


@dataclass(frozen=True)
class CommitAttempt:
    """What a commit is about to make live, as commit hooks see it."""

    shard_id: str
    # "append": a batch at ``ts``; "compaction": a compacted run below since ``ts``.
    kind: str
    ts: int
    # The run descriptions ({"path", "files": [{"path", ...}], ...}) the commit names.
    runs: tuple[dict[str, Any], ...]
    writer_id: str = ""
    # The stream epoch the writer started under (None: not checked, e.g. a maintenance task).
    epoch: int | None = None


# Hooks run inside the commit transaction of every append and swap, after its compare-and-set
# matched: each returns None or a reason to refuse (the transaction rolls back and
# CommitRefused is raised), or raises an UpsertError of its own (same rollback), and may write
# rows of its own in the same transaction. The store runs those its schema lists
# (store/registry.py), in that order.
CommitHook = Callable[[Any, CommitAttempt], "str | None"]


@dataclass(frozen=True)
class RestoreEvent:
    """A shard being restored from a checkpoint, as restore hooks see it."""

    shard_id: str
    upper: int
    actor: str
    reason: str


# Hooks run inside the transaction that restores a shard (e.g. the stream starts RECOVERING).
RestoreHook = Callable[[Any, RestoreEvent], None]


@dataclass(frozen=True)
class StoreSchema:
    """The tables a store creates and the hooks it runs in its transactions. Composed once, in
    store/registry.py, and given to the store when it is opened."""

    tables: tuple[sa.Table, ...]
    commit_hooks: tuple[CommitHook, ...] = ()
    restore_hooks: tuple[RestoreHook, ...] = ()


class AppendOutcome(str, enum.Enum):
    COMMITTED = "committed"
    # The upper had already moved past expected_upper with this very token: an earlier
    # attempt of ours landed (e.g. the connection dropped after the commit).
    ALREADY_COMMITTED = "already_committed"
    # A peer's batch holds that ts: ours provably lost.
    UPPER_MOVED = "upper_moved"
    # The upper is past that ts, whose batch row was truncated (below since, older than GC's
    # grace period): the batch is persisted, but whose token won is no longer known.
    TRUNCATED = "truncated"
    # The upper is below expected_upper: the batch must be held until the shard gets there.
    UPPER_BEHIND = "upper_behind"


@dataclass(frozen=True)
class ShardRecord:
    shard_id: str
    upper: int
    since: int
    seqno: int
    config: str
    created_at: float


@dataclass(frozen=True)
class Binding:
    ts: int
    # partition -> {"from": int, "to": int, "files": [[seq, name], ...], "count": int}
    ranges: dict[str, dict[str, Any]]
    # [{"file": path, "reason": str}] set aside when this binding was minted (quarantine mode)
    quarantined: list[dict[str, str]] = field(default_factory=list)
    minted_by: str = ""

    def to_offsets(self) -> dict[str, int]:
        return {p: r["to"] for p, r in self.ranges.items()}

    def to_json(self) -> str:
        return json.dumps({"ranges": self.ranges, "quarantined": self.quarantined}, sort_keys=True)


@dataclass(frozen=True)
class BatchRecord:
    ts: int
    writer_id: str
    token: str
    # {"path": staging dir, "files": [{"path", "bytes"}], "rows": int}
    run: dict[str, Any]
    stats: dict[str, Any]
    committed_at: float = 0.0


@dataclass(frozen=True)
class AppendResult:
    outcome: AppendOutcome
    # The authoritative upper after the attempt, read from the store, never from a cache.
    upper: int
    # On UPPER_MOVED: the writer and token of the batch that holds expected_upper.
    winner_writer_id: str | None = None
    winner_token: str | None = None


@dataclass(frozen=True)
class CompactionRecord:
    # The run covers every ts < since; reads as of ts >= since add the batches from since on.
    since: int
    run: dict[str, Any]
    compacted_at: float = 0.0


@dataclass(frozen=True)
class Rollup:
    """The audit summary of a truncated range of batches [from_ts, to_ts)."""

    from_ts: int
    to_ts: int
    batches: int
    rows_in: int
    rows_out: int
    rejected: int
    first_committed_at: float | None
    last_committed_at: float | None
    rolled_up_at: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def rollup_from_row(row) -> Rollup:
    return Rollup(**{k: v for k, v in row._mapping.items() if k != "shard_id"})


@dataclass(frozen=True)
class ShardSnapshot:
    """What consensus holds about one shard that its state at the upper needs, read in one
    transaction: what a checkpoint records and what a restore writes back. Batches and
    bindings from since - 1 on (``history_from``): what reads, the next binding, a seek and
    the last commit need; older rows are history (store/history.py), summed up in
    ``rollups``."""

    record: ShardRecord
    compaction: CompactionRecord | None
    batches: list[BatchRecord]
    bindings: list[Binding]
    # [{"file", "reason", "ts"}]: source files set aside, with the batch that set them aside
    quarantined: list[dict[str, Any]]
    rollups: list[Rollup] = field(default_factory=list)
    # The source index rows ({"partition", "through_ts", "binding_digest", "names"}); the
    # bindings start at the lowest one's anchor when that is below since - 1.
    source_index: list[dict[str, Any]] = field(default_factory=list)
    # The versions of the table's schema after version 1 ({"version", "schema", "change",
    # "created_by", "created_at"}): the runs name them.
    table_schemas: list[dict[str, Any]] = field(default_factory=list)

    def live_runs(self, as_of: int | None = None) -> list[dict[str, Any]]:
        """The runs a read as of ``as_of`` (default: the upper) merges."""
        return live_runs(self.compaction, self.batches, self.record.upper if as_of is None else as_of)


@dataclass(frozen=True)
class LiveView:
    """What a read as of ``as_of`` needs, read in one transaction: the shard's state, its
    compacted run and the batches from the compaction's since up to ``as_of``."""

    record: ShardRecord
    compaction: CompactionRecord | None
    batches: list[BatchRecord]
    as_of: int

    @property
    def runs(self) -> list[dict[str, Any]]:
        return live_runs(self.compaction, self.batches, self.as_of)


def live_runs(
    compaction: CompactionRecord | None, batches: list[BatchRecord], as_of: int
) -> list[dict[str, Any]]:
    """The runs a read as of ``as_of`` merges: the compacted run (every ts below its since)
    and the committed batches from its since up to ``as_of``. The one rule that reads,
    compaction, checkpoints and GC share; the caller checks since <= as_of <= upper."""
    base = compaction.since if compaction else 0
    runs = [compaction.run] if compaction else []
    return runs + [b.run for b in batches if base <= b.ts < as_of]


def history_from(since: int) -> int:
    """The lowest ts whose batch and binding rows a shard always keeps (store/history.py)."""
    return max(since - 1, 0)


def _binding_from_row(row) -> Binding:
    data = json.loads(row.ranges)
    return Binding(
        ts=row.ts,
        ranges=data["ranges"],
        quarantined=data.get("quarantined", []),
        minted_by=row.minted_by,
    )


def _batch_from_row(row) -> BatchRecord:
    return BatchRecord(
        ts=row.ts,
        writer_id=row.writer_id,
        token=row.token,
        run=json.loads(row.run),
        stats=json.loads(row.stats),
        committed_at=row.committed_at,
    )


def _compaction_from_row(row) -> CompactionRecord:
    return CompactionRecord(since=row.since, run=json.loads(row.run), compacted_at=row.compacted_at)
