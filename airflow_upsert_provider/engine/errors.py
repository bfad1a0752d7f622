"""Errors of the engine, each with the exit code `upsertctl` documents for it (docs/errors.md).

Two questions decide how a caller reacts to an error:

- **Did anything happen?** A *determinate* error means nothing was changed (exit 2, 3, 4);
  an *indeterminate* one (:class:`OutcomeUnknown`, exit 5) means a write may or may not have
  landed.
- **Is a retry safe and may it help?** ``retryable`` says so. It is true for an unknown
  outcome (the retry recognises its own idempotency token) and for a store that could not be
  reached (nothing was changed, the store may come back); false where only a human can fix
  the cause (bad usage, bad data, a violated invariant, a full disk).
"""

from __future__ import annotations

from typing import Any, Iterator


class UpsertError(Exception):
    """Base class. ``exit_code`` is what `upsertctl` exits with; ``retryable`` whether
    running the same step again is safe and may succeed."""

    exit_code = 1
    retryable: bool = False

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_dict(self) -> dict[str, Any]:
        return {"error": type(self).__name__, "message": self.message, "retryable": self.retryable, **self.details}


class ConfigurationError(UpsertError):
    """Bad usage or configuration: unknown shard, bad option, unusable blob root or consensus
    URL. Nothing was changed (exit 2)."""

    exit_code = 2


class ShardNotFound(ConfigurationError):
    pass


class ShardExists(ConfigurationError):
    pass


class SchemaVersionMismatch(ConfigurationError):
    """The consensus store's schema is not the one this code is built for: an older schema
    (or a store from before schema versions) that ``upsertctl db upgrade`` brings to the
    code's, or a newer one that only a newer provider knows. Checked when a store is opened;
    nothing was changed (exit 2). ``details`` name the store's and the code's revisions."""


class ConsensusUnavailable(UpsertError):
    """The consensus store could not be reached, or failed before anything was committed:
    nothing was changed (exit 2). Retryable: the store may come back."""

    exit_code = 2
    retryable = True


class BlobUnavailable(UpsertError):
    """The object store of the blob root failed a request transiently (a 5xx answer,
    throttling, a connection cut or timed out) on every attempt the filesystem layer made.
    Nothing was committed by the step that failed (exit 2). Retryable: the store may answer
    the next run. ``details`` name the operation, bucket, key and endpoint."""

    exit_code = 2
    retryable = True


class BlobWriteFailed(UpsertError):
    """Writing data files to the blob root failed for a reason of the filesystem (no space
    left, read-only, quota). Nothing was committed and the files of the attempt were removed
    (exit 2). Not retryable: someone has to free space or fix the mount first."""

    exit_code = 2


class BadInputError(UpsertError):
    """Bad source data. Nothing was committed (exit 3).

    ``details["records"]`` lists the offending records: file, line (or row), field, reason.
    """

    exit_code = 3


class IntegrityError(UpsertError):
    """A shard invariant would be violated or is found violated (exit 4)."""

    exit_code = 4


class OutcomeUnknown(UpsertError):
    """A write may or may not have landed (the connection was lost while it committed or
    while its outcome was being read back). Exit 5; a retry is safe."""

    exit_code = 5
    retryable = True


class CommitOutcomeUnknown(OutcomeUnknown):
    """The commit of a batch may or may not have landed. Staged files are kept; retrying
    with the same token reports ``already_committed`` if it did land (exit 5)."""


class ConsensusOutcomeUnknown(OutcomeUnknown, ConsensusUnavailable):
    """The consensus store failed while a transaction that writes was committing: it may
    or may not have landed (exit 5). Every write in consensus is idempotent or
    compare-and-set, so running the step again is safe. Also a :class:`ConsensusUnavailable`
    (the store failed), so code that resolves a store failure itself still catches it."""


class CommitRefused(UpsertError):
    """A commit was refused inside its transaction by a commit hook (e.g. GC claimed a run
    it names): nothing was committed (exit 2). ``details["reason"]`` says why. Retryable:
    the writer restages under a new path, a compaction writes a new output."""

    exit_code = 2
    retryable = True


class PlanningOutdated(UpsertError):
    """A directory shard's next binding could not be planned: the bindings planning catches up
    from were truncated by GC while it planned (a planner slower than GC's grace period).
    Nothing was bound (exit 2). Retryable: the next try plans from the current upper."""

    exit_code = 2
    retryable = True


class ReadOutdated(UpsertError):
    """A read lost files it had planned to read: compaction replaced those runs and GC
    (grace 0, or a read longer than the grace period) deleted them between the read's
    choice of runs and the reading. Nothing is wrong with the shard (exit 2); ``details``
    name the first file. Retryable: a new read reads the runs live now."""

    exit_code = 2
    retryable = True


class StagingLost(UpsertError):
    """A batch's staging directory was deleted while Spark wrote into it (GC with a grace
    period shorter than a batch takes), on every restage the writer tried. Nothing was
    committed (exit 2); ``details["path"]`` names the last staging directory. Retryable: the
    next run stages under a new path."""

    exit_code = 2
    retryable = True


class StreamNotWritable(UpsertError):
    """The shard's stream does not let this writer write (exit 6): it is not READY when a
    run starts, or a commit was fenced because the stream stopped or a recovery began after
    the writer started. Nothing was committed. Not retryable: the stream's state has to be
    changed on purpose first (docs/recovery.md). ``details`` name the status, its epoch,
    and who set it, when and why."""

    exit_code = 6


class StreamNotReady(StreamNotWritable):
    """A run refused to start: the stream is STOPPING, STOPPED or RECOVERING (exit 6)."""


class StreamFenced(StreamNotWritable):
    """A commit refused inside its transaction: the stream was stopped, or a recovery began
    (a new epoch) after this writer started (exit 6). The batch's staged files are dropped."""


class TransitionRefused(UpsertError):
    """A stream transition was refused: the stream is not in a state it may leave that way
    (resume without the seek of the same recovery epoch, seek of another epoch, stop during a
    recovery, ...), or its compare-and-set lost to a concurrent change. Nothing was changed
    (exit 7); ``details`` hold the stream's current state."""

    exit_code = 7


class SourceSegmentsMissing(IntegrityError):
    """A recovery's seek found source segments at or after the seek point gone (deleted by
    retention before the shard processed them): resuming would skip their records. Nothing
    was changed (exit 4); ``details["missing"]`` lists them, first missing first."""


class KafkaUnavailable(UpsertError):
    """A broker did not answer in time or refused a request. Nothing was changed (exit 2).
    Retryable: the cluster may come back."""

    exit_code = 2
    retryable = True


class KafkaSliceUnavailable(IntegrityError):
    """A bound range reaches outside the offsets the partition holds: above the high
    watermark (the slice names messages that do not exist) or below the low watermark
    (retention deleted messages the shard has not processed). Exit 4."""


class SparkUnavailable(UpsertError):
    """The Spark Connect server a connect-mode run uses did not answer (not started, stopped,
    wrong address), or a local server could not be started. Nothing was changed (exit 2).
    Retryable: the server may be (re)started. ``details["address"]`` names it."""

    exit_code = 2
    retryable = True


class StopSuperseded(TransitionRefused):
    """A stop that wrote STOPPING was overtaken before it finished: someone finalized it and
    resumed the stream (or began a recovery). The stream is not STOPPED: writers may run, so a
    step gated on the stop must not go ahead (exit 7). ``details`` hold the stream's state."""


class SchemaChangeRefused(ConfigurationError):
    """A change of a shard's table schema that is not allowed: a column dropped or renamed, a
    type narrowed or changed, NULL made NOT NULL, a key or the order column changed, a name
    already taken, or a change the shard's evolution policy does not permit. Nothing was
    changed (exit 2). ``details`` name the column, its old and new type and the policy."""


class BatchSchemaRefused(BadInputError):
    """A batch's records carry a field whose type the shard's schema cannot take under its
    evolution policy (a type change, a widening the policy does not allow, any change of a key
    or the order column), or its files disagree on a new column's type. Nothing committed
    (exit 3). ``details`` name the column, the old and new types, the file(s) and the policy."""


class SchemaVersionConflict(UpsertError):
    """A schema change lost its compare-and-set: the shard's schema moved to another version
    since the change was planned (someone else changed it). Nothing was changed (exit 2).
    Retryable: planned again on the new version, the change may be unnecessary or allowed."""

    exit_code = 2
    retryable = True


def first_line(exc: BaseException) -> str:
    """The first non-empty line of ``exc``'s message, cut to 300 characters ("" if none): what
    an error of ours quotes of a library's or driver's error."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return (lines[0] if lines else "")[:300]


def exception_chain(exc: BaseException | None) -> Iterator[BaseException]:
    """``exc``, then what it was raised from or while handling (``__cause__``, else
    ``__context__``), each once."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__
