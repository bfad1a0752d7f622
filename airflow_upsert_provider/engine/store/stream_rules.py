"""Stream lifecycle and recovery order as pure decisions (invariants 12, 14 and 16).

A shard's stream has one authoritative state in consensus (``engine/store/streams.py`` keeps it):
a status, a version bumped by every change, the recovery epoch and the epoch whose seek
completed. Every function here takes that state and says what one transition does to it,
or why it is refused; the store applies the answer by one compare-and-set on (status,
version), so no decision is ever taken on a cached read. Nothing here touches a store.

    READY --stop--> STOPPING --finalize--> STOPPED --resume--> READY
    READY|STOPPED --recover begin (new epoch)--> RECOVERING
    RECOVERING --seek (same epoch)--> RECOVERING, seeked_epoch = epoch
    RECOVERING --recover resume (seeked_epoch == epoch)--> READY
    restore of a checkpoint --> RECOVERING (new epoch)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Any

from airflow_upsert_provider.engine.common.time_text import format_timestamp


class Status(str, enum.Enum):
    READY = "READY"
    STOPPING = "STOPPING"
    STOPPED = "STOPPED"
    RECOVERING = "RECOVERING"


# How long a stop waits for the batch in hand to commit before it finalizes.
DEFAULT_DRAIN_SECONDS = 60.0

# A batch in hand with no sign of a writer for this long (since its binding was minted, or
# since the newest file of its staging directories was written) is taken as left by a killed
# writer: a stop does not wait for it. A writer that is in fact still working is fenced at its
# commit, as at the end of any drain: nothing is lost.
DRAIN_IDLE_SECONDS = 120.0

# A writer may commit while the stream is in one of these (a stop lets the batch in hand finish).
COMMITTABLE = frozenset({Status.READY, Status.STOPPING})


@dataclass(frozen=True)
class StreamState:
    """One shard's stream, as read from the store at ``version``."""

    shard_id: str
    status: Status
    version: int
    epoch: int
    seeked_epoch: int | None = None
    # Where the seek of ``seeked_epoch`` positioned the source: {partition: first offset}.
    seek_position: dict[str, int] | None = None
    changed_by: str = ""
    changed_at: float = 0.0
    reason: str = ""

    def describe(self) -> str:
        """The status with who set it, when and why, for messages."""
        text = f"{self.status.value} (epoch {self.epoch})"
        if self.changed_at:
            text += f", set by {self.changed_by or 'unknown'} at {format_timestamp(self.changed_at)}"
        if self.reason:
            text += f": {self.reason}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "shard": self.shard_id,
            "status": self.status.value,
            "version": self.version,
            "epoch": self.epoch,
            "seeked_epoch": self.seeked_epoch,
            "seek_position": self.seek_position,
            "changed_by": self.changed_by,
            "changed_at": self.changed_at,
            "reason": self.reason,
        }


def initial_state(shard_id: str) -> StreamState:
    """The stream of a shard that has never changed it: READY in epoch 0."""
    return StreamState(shard_id, Status.READY, 0, 0)


@dataclass(frozen=True)
class Decision:
    """What a transition does: ``new`` is the state to write (None: nothing to write),
    ``refusal`` why it is refused (None: allowed), ``action`` its name for the history."""

    action: str
    current: StreamState
    new: StreamState | None = None
    refusal: str | None = None

    @property
    def changes(self) -> bool:
        return self.new is not None


def next_epoch(epoch: int, now: float) -> int:
    """A new recovery epoch: the time it begins in milliseconds, and always above the last.

    Time-based so that an epoch is never reused even when the store that counted the old
    ones is lost: a writer still running against the lost store's epoch can never match
    the epoch a restore starts."""
    return max(epoch + 1, int(now * 1000))


def _change(current: StreamState, action: str, actor: str, now: float, reason: str, **fields: Any) -> Decision:
    new = replace(current, version=current.version + 1, changed_by=actor, changed_at=now, reason=reason, **fields)
    return Decision(action, current, new)


def _refuse(current: StreamState, action: str, why: str) -> Decision:
    return Decision(action, current, refusal=f"{action} of shard {current.shard_id!r} refused: {why}; "
                                              f"the stream is {current.describe()}")


def _no_change(current: StreamState, action: str) -> Decision:
    return Decision(action, current)


def decide_stop(current: StreamState, actor: str, now: float, reason: str = "") -> Decision:
    """READY -> STOPPING. Stopping a stream that is stopping or stopped changes nothing."""
    if current.status is Status.READY:
        return _change(current, "stop", actor, now, reason, status=Status.STOPPING)
    if current.status in (Status.STOPPING, Status.STOPPED):
        return _no_change(current, "stop")
    return _refuse(current, "stop", "a recovery is open: finish it (recover seek, recover resume) first")


def decide_finalize(current: StreamState | None, read: StreamState, actor: str, now: float) -> Decision:
    """STOPPING -> STOPPED, only if the row is still STOPPING at the version the finalizer
    read. Anything else (a resume, another finalizer, a recovery came first) changes nothing:
    a stale finalizer never overwrites a newer state. ``current`` None: the shard is gone."""
    if current is None:
        return _refuse(read, "finalize", "the shard no longer exists")
    if current.status is not Status.STOPPING or current.version != read.version:
        return _no_change(current, "finalize")
    return _change(current, "finalize", actor, now, read.reason, status=Status.STOPPED)


def decide_resume(current: StreamState, actor: str, now: float, reason: str = "") -> Decision:
    """STOPPED -> READY. Resuming a READY stream changes nothing."""
    if current.status is Status.STOPPED:
        return _change(current, "resume", actor, now, reason, status=Status.READY)
    if current.status is Status.READY:
        return _no_change(current, "resume")
    if current.status is Status.STOPPING:
        return _refuse(current, "resume", "the stop is still finishing: wait for STOPPED, then resume")
    return _refuse(current, "resume", "a recovery is open: use recover resume after recover seek")


def decide_begin_recovery(current: StreamState, actor: str, now: float, reason: str = "") -> Decision:
    """READY|STOPPED -> RECOVERING with a new epoch: from here no writer of an earlier epoch
    commits, and nothing writes until the seek of this epoch and the resume have run."""
    if current.status in (Status.READY, Status.STOPPED):
        return _change(current, "recover begin", actor, now, reason, status=Status.RECOVERING,
                       epoch=next_epoch(current.epoch, now), seeked_epoch=None, seek_position=None)
    if current.status is Status.STOPPING:
        return _refuse(current, "recover begin", "a stop is finishing: wait for STOPPED first")
    return _refuse(current, "recover begin",
                   f"recovery epoch {current.epoch} is already open: seek and resume it")


def decide_seek(current: StreamState, epoch: int | None, position: dict[str, int], actor: str, now: float) -> Decision:
    """Record that the source was positioned (and verified) for the shard's upper in the
    open recovery epoch. ``epoch`` is the epoch the caller began (None: the open one)."""
    if current.status is not Status.RECOVERING:
        return _refuse(current, "recover seek", "no recovery is open: run recover begin first")
    if epoch is not None and epoch != current.epoch:
        return _refuse(current, "recover seek",
                       f"it was asked for epoch {epoch}, but the open recovery is epoch {current.epoch}")
    return _change(current, "recover seek", actor, now, current.reason,
                   seeked_epoch=current.epoch, seek_position=dict(position))


def decide_resume_after_recovery(current: StreamState, epoch: int | None, actor: str, now: float) -> Decision:
    """RECOVERING -> READY, only once the seek of this very epoch completed."""
    if current.status is not Status.RECOVERING:
        return _refuse(current, "recover resume", "no recovery is open")
    if epoch is not None and epoch != current.epoch:
        return _refuse(current, "recover resume",
                       f"it was asked for epoch {epoch}, but the open recovery is epoch {current.epoch}")
    if current.seeked_epoch != current.epoch:
        seeked = "no seek" if current.seeked_epoch is None else f"only the seek of epoch {current.seeked_epoch}"
        return _refuse(current, "recover resume",
                       f"recovery epoch {current.epoch} has {seeked}: run recover seek first")
    return _change(current, "recover resume", actor, now, current.reason, status=Status.READY)


def decide_restore(current: StreamState | None, shard_id: str, actor: str, now: float, reason: str) -> StreamState:
    """The stream a restored shard starts with: RECOVERING in a new epoch, above any epoch
    the target id had, so that nothing writes before seek and resume."""
    before = current or initial_state(shard_id)
    return replace(before, status=Status.RECOVERING, version=before.version + 1,
                   epoch=next_epoch(before.epoch, now), seeked_epoch=None, seek_position=None,
                   changed_by=actor, changed_at=now, reason=reason)


def fence(current: StreamState, writer_epoch: int | None) -> str | None:
    """Why a commit by a writer that started under ``writer_epoch`` must be refused now, or
    None. A stop lets the batch in hand commit (STOPPING); STOPPED and RECOVERING do not, and
    neither does a new epoch begun after the writer started."""
    if current.status not in COMMITTABLE:
        return f"the stream is {current.describe()}"
    if writer_epoch is not None and writer_epoch != current.epoch:
        return (f"a recovery began after this writer started (writer epoch {writer_epoch}, "
                f"stream {current.describe()})")
    return None


def fenced_by(current: StreamState, writer_epoch: int | None) -> str | None:
    """Which transition fences a commit by a writer that started under ``writer_epoch``:
    "recovery" (the stream is RECOVERING, or a recovery began since: another epoch), "stop"
    (the stream is STOPPED), or None (the commit may go ahead)."""
    if current.status is Status.RECOVERING or (writer_epoch is not None and writer_epoch != current.epoch):
        return "recovery"
    if current.status not in COMMITTABLE:
        return "stop"
    return None


def refuse_start(current: StreamState) -> str | None:
    """Why a run may not start now, or None: only a READY stream starts new batches."""
    if current.status is Status.READY:
        return None
    return f"shard {current.shard_id!r} is not READY: the stream is {current.describe()}"


def stop_superseded(read: StreamState, current: StreamState) -> str | None:
    """Why a stop that wrote STOPPING at ``read.version`` no longer stands, or None: the stream
    is still that STOPPING (the stop's to finish) or is STOPPED (what was asked for, whoever
    finalized it). Anything else (resumed to READY, a recovery began) supersedes the stop:
    writers may run, so nothing that needs a stopped stream may go ahead."""
    if current.status is Status.STOPPED:
        return None
    if current.status is Status.STOPPING and current.version == read.version:
        return None
    return (f"the stop of shard {read.shard_id!r} (version {read.version}) was superseded: the stream is "
            f"{current.describe()}; writers may run")


def writer_may_be_working(last_sign: float, now: float, idle_seconds: float = DRAIN_IDLE_SECONDS) -> bool:
    """Whether a batch in hand may still have a writer: its last sign of one (``last_sign``:
    the binding's mint, or the newest file of its staging directories) is younger than
    ``idle_seconds``."""
    return now - last_sign < idle_seconds
