"""The stream state of every shard in consensus, changed only by compare-and-set.

One row per shard (``upsert_streams``) holds the authoritative state; ``upsert_stream_history``
holds every change (who, when, from, to, why, version). A transition reads the row, asks the
pure rules of ``engine/store/stream_rules.py`` what to do, and writes the answer by one conditional
UPDATE on (status, version): if the row changed in between, the UPDATE matches nothing and
the transition decides again on a fresh read. A finalizer never decides again: it acts on
the version it read, so a stale one changes nothing (invariant 14).

Two hooks run inside other transactions of consensus (store/registry.py lists them):
``fence_commit`` in every append (invariant 16: a stopped stream, or a recovery begun after
the writer started, refuses the commit) and ``start_recovering`` in every restore (a restored shard is RECOVERING in a new
epoch). On PostgreSQL the fence reads the row FOR SHARE, so a transition waits for a commit
that read the old state and the commit waits for a transition in progress: every commit is
ordered entirely before or entirely after every transition. SQLite serializes all writes.

A shard that never changed its stream has no row and is READY in epoch 0.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Callable

import sqlalchemy as sa

from airflow_upsert_provider.engine.common.retry import CAS_CONTENTION
from airflow_upsert_provider.engine.store.consensus import Consensus, insert_ignore, shard_exists
from airflow_upsert_provider.engine.store.records import CommitAttempt, RestoreEvent
from airflow_upsert_provider.engine.store.tables import metadata
from airflow_upsert_provider.engine.errors import (
    ShardNotFound,
    StopSuperseded,
    StreamFenced,
    StreamNotReady,
    TransitionRefused,
)
from airflow_upsert_provider.engine.store.stream_rules import (
    DEFAULT_DRAIN_SECONDS,
    stop_superseded,
    writer_may_be_working,
    Decision,
    Status,
    StreamState,
    decide_begin_recovery,
    decide_finalize,
    decide_restore,
    decide_resume,
    decide_resume_after_recovery,
    decide_seek,
    decide_stop,
    fence,
    fenced_by,
    initial_state,
    refuse_start,
)

streams_table = sa.Table(
    "upsert_streams",
    metadata,
    sa.Column("shard_id", sa.String(128), primary_key=True),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("version", sa.BigInteger, nullable=False),
    sa.Column("epoch", sa.BigInteger, nullable=False),
    sa.Column("seeked_epoch", sa.BigInteger, nullable=True),
    sa.Column("seek_position", sa.Text, nullable=True),
    sa.Column("changed_by", sa.String(512), nullable=False),
    sa.Column("changed_at", sa.Float, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
)

stream_history_table = sa.Table(
    "upsert_stream_history",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("shard_id", sa.String(128), nullable=False, index=True),
    sa.Column("version", sa.BigInteger, nullable=False),
    sa.Column("action", sa.String(32), nullable=False),
    sa.Column("from_status", sa.String(16), nullable=True),
    sa.Column("to_status", sa.String(16), nullable=False),
    sa.Column("epoch", sa.BigInteger, nullable=False),
    sa.Column("actor", sa.String(512), nullable=False),
    sa.Column("at", sa.Float, nullable=False),
    sa.Column("reason", sa.Text, nullable=False),
)

# Fresh reads and decisions a transition makes when concurrent changes keep beating its
# compare-and-set, before it reports the lost race.
MAX_ATTEMPTS = CAS_CONTENTION.max_attempts

# Called between a transition's read and its compare-and-set: tests use it to land a
# concurrent change exactly there.
between_read_and_write: Callable[[str, StreamState], None] | None = None


@dataclass(frozen=True)
class TransitionResult:
    """What a transition did: ``changed`` False when the stream already was where it asked
    to go (or a finalizer found it moved on), ``state`` the stream afterwards."""

    action: str
    changed: bool
    state: StreamState
    before: StreamState

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action, "changed": self.changed, "from": self.before.status.value,
                **self.state.to_dict()}


def _state_from_row(row) -> StreamState:
    return StreamState(
        shard_id=row.shard_id,
        status=Status(row.status),
        version=int(row.version),
        epoch=int(row.epoch),
        seeked_epoch=None if row.seeked_epoch is None else int(row.seeked_epoch),
        seek_position=None if row.seek_position is None else json.loads(row.seek_position),
        changed_by=row.changed_by,
        changed_at=float(row.changed_at),
        reason=row.reason,
    )


def _values(state: StreamState) -> dict[str, Any]:
    return {
        "status": state.status.value,
        "version": state.version,
        "epoch": state.epoch,
        "seeked_epoch": state.seeked_epoch,
        "seek_position": None if state.seek_position is None else json.dumps(state.seek_position, sort_keys=True),
        "changed_by": state.changed_by,
        "changed_at": state.changed_at,
        "reason": state.reason,
    }


def _read_row(conn, shard_id: str, *, for_share: bool = False) -> StreamState | None:
    query = sa.select(streams_table).where(streams_table.c.shard_id == shard_id)
    if for_share:
        query = query.with_for_update(read=True)
    row = conn.execute(query).first()
    return None if row is None else _state_from_row(row)


def _read(conn, shard_id: str) -> StreamState | None:
    """The stream of an existing shard (READY in epoch 0 if it never changed); None if the
    shard does not exist."""
    if not shard_exists(conn, shard_id):
        return None
    return _read_row(conn, shard_id) or initial_state(shard_id)


def _record_history(conn, action: str, before: StreamState | None, after: StreamState) -> None:
    conn.execute(sa.insert(stream_history_table).values(
        shard_id=after.shard_id,
        version=after.version,
        action=action,
        from_status=None if before is None else before.status.value,
        to_status=after.status.value,
        epoch=after.epoch,
        actor=after.changed_by,
        at=after.changed_at,
        reason=after.reason,
    ))


def _not_found(shard_id: str) -> ShardNotFound:
    return ShardNotFound(f"no shard {shard_id!r} in the consensus store: nothing to change", shard=shard_id)


def read_stream(consensus: Consensus, shard_id: str) -> StreamState:
    """The authoritative stream state of ``shard_id``."""
    state = consensus.read_in_snapshot(lambda conn: _read(conn, shard_id))
    if state is None:
        raise _not_found(shard_id)
    return state


def stream_history(consensus: Consensus, shard_id: str, limit: int | None = None) -> list[dict[str, Any]]:
    """Every change of the stream, oldest first (the last ``limit`` of them)."""
    def txn(conn):
        if not shard_exists(conn, shard_id):
            raise _not_found(shard_id)
        query = (sa.select(stream_history_table)
                 .where(stream_history_table.c.shard_id == shard_id)
                 .order_by(stream_history_table.c.id.desc()))
        if limit is not None:
            query = query.limit(limit)
        return [dict(r._mapping) for r in conn.execute(query)][::-1]

    rows = consensus.read_in_snapshot(txn)
    for row in rows:
        row.pop("id", None)
        row["shard"] = row.pop("shard_id")
        row["from"] = row.pop("from_status")
        row["to"] = row.pop("to_status")
    return rows


def _compare_and_set(consensus: Consensus, decision: Decision) -> bool:
    """Write ``decision.new`` iff the row is still at (status, version) of ``decision.current``.
    True if it was written; False if the row moved (nothing written)."""
    current, new = decision.current, decision.new
    assert new is not None

    def txn(conn):
        if not shard_exists(conn, current.shard_id):
            raise _not_found(current.shard_id)
        if current.version == 0:
            # The first change of a stream creates its row, as it was (READY, epoch 0).
            insert_ignore(conn, streams_table, shard_id=current.shard_id, **_values(current))
        updated = conn.execute(
            sa.update(streams_table)
            .where(
                streams_table.c.shard_id == current.shard_id,
                streams_table.c.status == current.status.value,
                streams_table.c.version == current.version,
            )
            .values(**_values(new))
        ).rowcount
        if updated != 1:
            return False
        _record_history(conn, decision.action, current, new)
        return True

    return consensus.run_in_transaction(txn)


def transition(consensus: Consensus, shard_id: str, decide: Callable[[StreamState], Decision]) -> TransitionResult:
    """Read the stream, decide, compare-and-set; on a lost compare-and-set decide again on a
    fresh read. Raises TransitionRefused when the rules refuse."""
    for _ in range(MAX_ATTEMPTS):
        current = read_stream(consensus, shard_id)
        decision = decide(current)
        if decision.refusal is not None:
            raise TransitionRefused(decision.refusal, **current.to_dict())
        if not decision.changes:
            return TransitionResult(decision.action, False, current, current)
        if between_read_and_write is not None:
            between_read_and_write(decision.action, current)
        if _compare_and_set(consensus, decision):
            return TransitionResult(decision.action, True, decision.new, current)
    raise TransitionRefused(
        f"{decision.action} of shard {shard_id!r} lost {MAX_ATTEMPTS} compare-and-sets in a row to "
        "concurrent changes; nothing was changed: run it again",
        **read_stream(consensus, shard_id).to_dict(),
    )


def stop(consensus: Consensus, shard_id: str, actor: str, reason: str = "") -> TransitionResult:
    """READY -> STOPPING: writers finish the batch in hand and start no other."""
    return transition(consensus, shard_id, lambda s: decide_stop(s, actor, time.time(), reason))


def finalize_stop(consensus: Consensus, read: StreamState, actor: str) -> TransitionResult:
    """STOPPING -> STOPPED iff the row is still STOPPING at ``read.version`` (the version this
    finalizer read). A stale finalizer changes nothing: it never decides again."""
    current = consensus.read_in_snapshot(lambda conn: _read(conn, read.shard_id))
    decision = decide_finalize(current, read, actor, time.time())
    if decision.refusal is not None:
        raise TransitionRefused(decision.refusal, **read.to_dict())
    if decision.changes:
        if between_read_and_write is not None:
            between_read_and_write(decision.action, decision.current)
        if _compare_and_set(consensus, decision):
            return TransitionResult(decision.action, True, decision.new, decision.current)
    after = read_stream(consensus, read.shard_id)
    return TransitionResult("finalize", False, after, read)


def resume(consensus: Consensus, shard_id: str, actor: str, reason: str = "") -> TransitionResult:
    """STOPPED -> READY."""
    return transition(consensus, shard_id, lambda s: decide_resume(s, actor, time.time(), reason))


def begin_recovery(consensus: Consensus, shard_id: str, actor: str, reason: str = "") -> TransitionResult:
    """READY|STOPPED -> RECOVERING in a new epoch."""
    return transition(consensus, shard_id, lambda s: decide_begin_recovery(s, actor, time.time(), reason))


def record_seek(
    consensus: Consensus, shard_id: str, epoch: int | None, position: dict[str, int], actor: str
) -> TransitionResult:
    """Record the completed seek of recovery ``epoch`` (None: the open one) at ``position``."""
    return transition(consensus, shard_id, lambda s: decide_seek(s, epoch, position, actor, time.time()))


def resume_after_recovery(consensus: Consensus, shard_id: str, epoch: int | None, actor: str) -> TransitionResult:
    """RECOVERING -> READY, iff the seek of the open epoch completed."""
    return transition(consensus, shard_id, lambda s: decide_resume_after_recovery(s, epoch, actor, time.time()))


def require_ready(consensus: Consensus, shard_id: str) -> StreamState:
    """The stream, if a run may start; else StreamNotReady naming who set what, when."""
    state = read_stream(consensus, shard_id)
    why = refuse_start(state)
    if why is not None:
        raise StreamNotReady(f"{why}; a run starts no batch until it is READY (docs/recovery.md)",
                             **state.to_dict())
    return state


# -- hooks inside other transactions -----------------------------------------------------------


def fence_commit(conn, attempt: CommitAttempt) -> None:
    """Commit hook: refuse an append when the stream no longer lets its writer commit."""
    if attempt.kind != "append":
        return None
    state = _read_row(conn, attempt.shard_id, for_share=True)
    if state is None:
        # Create the row as it is, so that a transition racing this commit waits for it.
        insert_ignore(conn, streams_table, shard_id=attempt.shard_id, **_values(initial_state(attempt.shard_id)))
        state = _read_row(conn, attempt.shard_id, for_share=True) or initial_state(attempt.shard_id)
    why = fence(state, attempt.epoch)
    if why is not None:
        raise StreamFenced(
            f"commit of batch {attempt.ts} of shard {attempt.shard_id!r} by writer {attempt.writer_id!r} "
            f"fenced: {why}; nothing was committed",
            ts=attempt.ts,
            writer_epoch=attempt.epoch,
            fenced_by=fenced_by(state, attempt.epoch),
            **state.to_dict(),
        )
    return None


def start_recovering(conn, event: RestoreEvent) -> None:
    """Restore hook: the restored shard's stream is RECOVERING in a new epoch."""
    before = _read_row(conn, event.shard_id)
    after = decide_restore(before, event.shard_id, event.actor or "restore", time.time(),
                           event.reason or f"restored at upper {event.upper}")
    conn.execute(sa.delete(streams_table).where(streams_table.c.shard_id == event.shard_id))
    conn.execute(sa.insert(streams_table).values(shard_id=event.shard_id, **_values(after)))
    _record_history(conn, "restore", before, after)




# -- a stop, drained and finalized -------------------------------------------------------------

DRAIN_POLL_SECONDS = 1.0


def batch_in_hand(consensus: Consensus, shard_id: str) -> bool:
    """Whether a writer may be working on a batch: the batch at the upper is bound."""
    return bound_at_upper(consensus, shard_id) is not None


def bound_at_upper(consensus: Consensus, shard_id: str) -> tuple[int, float] | None:
    """(ts, when its binding was minted) of the batch at the upper, if it is bound."""
    from airflow_upsert_provider.engine.store.tables import bindings_table, shards_table

    def txn(conn):
        upper = conn.execute(
            sa.select(shards_table.c.upper).where(shards_table.c.shard_id == shard_id)
        ).scalar_one_or_none()
        if upper is None:
            raise _not_found(shard_id)
        minted_at = conn.execute(
            sa.select(bindings_table.c.minted_at).where(
                bindings_table.c.shard_id == shard_id, bindings_table.c.ts == upper
            )
        ).scalar_one_or_none()
        return None if minted_at is None else (int(upper), float(minted_at))

    return consensus.read_in_snapshot(txn)


def staging_written_at(blob: Any, shard_id: str) -> Callable[[int], float | None]:
    """For a stop's drain: when the newest file of batch ts's staging directories (runs and
    rejects of every attempt, laid out as ``Shard.run_dir`` does) was written; None if none."""

    def newest(ts: int) -> float | None:
        group = f"ts={ts:012d}"
        try:
            times = [f.mtime for kind in ("runs", "rejects") for f in blob.walk_files(blob.path(shard_id, kind, group))]
        except OSError:
            return None  # an unreadable blob takes this sign away; the binding's age still counts
        return max(times, default=None)

    return newest


def stop_and_finalize(
    consensus: Consensus,
    shard_id: str,
    actor: str,
    reason: str = "",
    *,
    drain_seconds: float = DEFAULT_DRAIN_SECONDS,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    on_wait: Callable[[float], None] | None = None,
    staging_written_at: Callable[[int], float | None] | None = None,
    wall_clock: Callable[[], float] = time.time,
) -> TransitionResult:
    """Stop the stream, let the batch in hand commit (at most ``drain_seconds``), then
    finalize STOPPING -> STOPPED at the version the stop wrote. A writer still working when
    the drain ends is fenced at its commit: nothing is lost, its batch runs after the resume.

    The drain ends early when no writer shows a sign of work on the batch in hand for
    ``DRAIN_IDLE_SECONDS`` (a killed writer's binding; ``staging_written_at(ts)``: when the
    newest file of that batch's staging directories was written), and at once when the stop
    is superseded. A superseded stop (someone finalized it and resumed the stream, or began a
    recovery) raises :class:`StopSuperseded`: the stream is not STOPPED."""
    stopped = stop(consensus, shard_id, actor, reason)
    if stopped.state.status is not Status.STOPPING:
        return stopped
    deadline = clock() + drain_seconds
    while clock() < deadline:
        if stop_superseded(stopped.state, read_stream(consensus, shard_id)) is not None:
            break
        in_hand = bound_at_upper(consensus, shard_id)
        if in_hand is None:
            break
        ts, minted_at = in_hand
        written_at = staging_written_at(ts) if staging_written_at is not None else None
        if not writer_may_be_working(max(minted_at, written_at or 0.0), wall_clock()):
            break
        if on_wait is not None:
            on_wait(max(0.0, deadline - clock()))
        sleep(min(DRAIN_POLL_SECONDS, max(0.0, deadline - clock())))
    finalized = finalize_stop(consensus, stopped.state, actor)
    why = stop_superseded(stopped.state, finalized.state)
    if why is not None:
        raise StopSuperseded(f"{why}: nothing that needs a stopped stream may go ahead; stop it again",
                             **finalized.state.to_dict())
    return TransitionResult("stop", True, finalized.state, stopped.before)
