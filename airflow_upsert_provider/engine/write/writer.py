"""The writer: one execution of an upsert (one CLI run, one Airflow task try).

It holds staged batches and classifies each against the authoritative upper (invariant 4):
ts < upper is dropped (a peer persisted it), ts == upper is appended, ts > upper is held. A
lagging writer reaches the upper without starting Spark. Appends are compare-and-append with
an idempotency token; an unknown outcome is retried with the same token and never deletes the
staged files.
"""

from __future__ import annotations

import errno
import logging
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import tenacity

from airflow_upsert_provider.engine.common.retry import OUTCOME_UNKNOWN_APPEND, RESTAGE
from airflow_upsert_provider.engine.store.records import AppendOutcome, BatchRecord
from airflow_upsert_provider.engine.errors import (
    BlobWriteFailed,
    CommitOutcomeUnknown,
    CommitRefused,
    ConfigurationError,
    ConsensusOutcomeUnknown,
    ConsensusUnavailable,
    IntegrityError,
    PlanningOutdated,
    SparkUnavailable,
    StagingLost,
    StreamFenced,
    UpsertError,
    exception_chain,
)
from airflow_upsert_provider.engine.table.shard import (
    Disposition,
    Shard,
    ShardStatus,
    check_bad_record_mode,
    classify,
    missing_binding_error,
)
from airflow_upsert_provider.engine.spark.session import connect_address, is_connect_session
from airflow_upsert_provider.engine.spark.server import server_gone

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from airflow_upsert_provider.engine.store.records import Binding

log = logging.getLogger(__name__)

COMMITTED = "committed"
ALREADY_COMMITTED = "already_committed"
ALREADY_PERSISTED = "already_persisted"
NOTHING_TO_DO = "nothing_to_do"

# Restages of a batch whose commit was refused because GC claimed its staged files.
MAX_RESTAGES = RESTAGE.retries

# Filesystem failures of a blob write that no retry fixes by itself, as the OS (and, through
# Hadoop, the JVM) words them.
BLOB_WRITE_FAILURES = {
    errno.ENOSPC: "No space left on device",
    errno.EDQUOT: "Disk quota exceeded",
    errno.EROFS: "Read-only file system",
}


def blob_write_failure(exc: BaseException) -> str | None:
    """The filesystem reason (e.g. "No space left on device") behind a failed staging write,
    found in the Python exception chain or in the text of a Spark (JVM) error; else None."""
    for current in exception_chain(exc):
        if isinstance(current, OSError) and current.errno in BLOB_WRITE_FAILURES:
            return BLOB_WRITE_FAILURES[current.errno]
        text = str(current)
        for reason in BLOB_WRITE_FAILURES.values():
            if reason in text:
                return reason
    return None


# How a filesystem (the OS, Hadoop, Spark's output committer) says that a file or directory
# it was working on is gone.
MISSING_FILE_MARKERS = (
    "No such file or directory",
    "FileNotFoundException",
    "does not exist",
    "cannot access",
    "Mkdirs failed",
)


def staging_lost(exc: BaseException, staging_dirs: tuple[str, ...], *, claimed: bool) -> bool:
    """Whether a failed staging attempt failed because its staging directory was deleted
    under it: GC claimed the directory, or the error (Python's, or the JVM's in its text)
    says that a path inside it is missing. Any other failure is reported as it is."""
    if claimed:
        return True
    for current in exception_chain(exc):
        text = str(current)
        if isinstance(current, OSError) and current.filename:
            text += f" {current.filename}"
        # A staging directory's name is unique to its attempt (a nonce): naming it is enough.
        if any(marker in text for marker in MISSING_FILE_MARKERS) and any(
            d.rstrip("/") in text for d in staging_dirs
        ):
            return True
    return False


# Retries of an append whose outcome is unknown, with the same token (module names, read at
# call time, so that a test can shorten the wait).
APPEND_RETRIES = OUTCOME_UNKNOWN_APPEND.retries
APPEND_RETRY_DELAY_SECONDS = OUTCOME_UNKNOWN_APPEND.base_seconds
APPEND_RETRY_MAX_DELAY_SECONDS = OUTCOME_UNKNOWN_APPEND.max_wait_seconds


@dataclass
class StagedBatch:
    ts: int
    token: str
    run: dict[str, Any]
    rejects: dict[str, Any] | None
    rows_in: int
    rows_out: int
    rejected: int
    # Source files set aside when the batch was bound (quarantine mode), with reasons.
    quarantined_files: list[dict[str, str]]
    stage_seconds: float
    stage_timings: dict[str, float] = field(default_factory=dict)
    # Fields the records carry that the shard's schema does not name: {name: {records, file}}.
    unknown_fields: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class BatchResult:
    ts: int
    outcome: str
    rows_in: int = 0
    rows_out: int = 0
    rejected: int = 0
    # Fields the records carry that the shard's schema does not name (ignored): name -> records.
    unknown_fields: dict[str, int] = field(default_factory=dict)
    quarantined_files: int = 0
    seconds: float = 0.0
    upper: int = 0
    lag_offsets: dict[str, int] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    # What is pending after the step, in the source's unit (ShardStatus.lag); None: not measured.
    lag: int | None = None
    lag_unit: str | None = None
    # Age of the oldest record not committed after the step (ShardStatus.lag_seconds_at).
    lag_seconds: float | None = None
    # Bytes of the Parquet files this step's commit named (0 when a peer's batch won).
    bytes_written: int = 0

    @property
    def progressed(self) -> bool:
        return self.outcome != NOTHING_TO_DO

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["seconds"] = round(self.seconds, 3)
        data["timings"] = {k: round(v, 3) for k, v in self.timings.items()}
        return data


@dataclass
class RunReport:
    results: list[BatchResult]
    upper: int
    converged: int  # held batches dropped because a peer persisted them
    # Set when a stop or a recovery ended the run before the source was caught up.
    stopped_because: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "stopped_because": self.stopped_because,
            "batches": [r.to_dict() for r in self.results],
            "upper": self.upper,
            "converged": self.converged,
            "committed": sum(1 for r in self.results if r.outcome == COMMITTED),
        }


class Writer:
    """Runs micro-batches of one shard.

    :param shard: the shard to write.
    :param writer_id: identity of this execution; recorded with every batch it commits.
    :param spark_factory: builds the SparkSession on first need (a skip never starts Spark).
    :param on_bad_record: ``fail`` (default) or ``quarantine``.
    :param max_files_per_batch: files per batch for the bindings this writer mints (default:
        the shard's); bindings minted by peers are used as they are.
    """

    def __init__(
        self,
        shard: Shard,
        writer_id: str,
        *,
        spark_factory: Callable[[], "SparkSession"],
        on_bad_record: str = "fail",
        max_files_per_batch: int | None = None,
    ) -> None:
        if not writer_id:
            raise ConfigurationError("a writer needs a non-empty writer id", field="writer_id")
        self.shard = shard
        self.writer_id = writer_id
        self.on_bad_record = check_bad_record_mode(on_bad_record)
        if max_files_per_batch is not None and max_files_per_batch < 1:
            raise ConfigurationError("max files per batch must be >= 1", field="max_files_per_batch")
        self.max_files_per_batch = max_files_per_batch
        self._spark_factory = spark_factory
        self.held: dict[int, StagedBatch] = {}
        # Tokens of held batches an append of which may have landed (the store failed while
        # committing it): their files are never deleted by this writer (invariant 7).
        self._outcome_unknown: set[str] = set()
        # This writer's own frontier: never below the upper it last read (invariant 4).
        self.progress = 0
        self.converged = 0
        # The stream epoch this writer started under (read when its first step starts): every
        # commit carries it, and is fenced if a recovery began since.
        self.epoch: int | None = None
        # Why the last run stopped before the source was caught up (a stop or a recovery).
        self.stopped_because: str | None = None
        # Seams for continuous mode and upstream offsets (engine/write/continuous.py, group_offsets.py):
        # a Kafka batch's slice fetched ahead, asked for with (epoch, binding) when staging;
        # a call after each batch is staged, before its append; calls after each step that
        # moved the upper, with the writer's epoch (failures there are logged, never raised).
        self.prefetched: Callable[[int, "Binding"], "DataFrame | None"] | None = None
        self.on_staged: Callable[[StagedBatch], None] | None = None
        self.after_commit: list[Callable[[BatchResult, int], None]] = []
        # A Kafka shard's consumer group, moved after each commit (engine/frontier/upstream.py).
        self.upstream = None

    # -- the one rule ------------------------------------------------------------------------

    def reconcile(self, upper: int) -> None:
        """Drop every held batch below ``upper`` and bring progress up to it."""
        for ts in sorted(self.held):
            if classify(ts, upper) is Disposition.DROP:
                staged = self.held.pop(ts)
                self._discard_lost(staged)
                self._outcome_unknown.discard(staged.token)
                self.converged += 1
        self.progress = max(self.progress, upper)

    def _discard_lost(self, staged: StagedBatch) -> None:
        """A held batch at ts < upper: delete its files unless they are the committed ones."""
        winner = self.shard.consensus.get_batch(self.shard.shard_id, staged.ts)
        if winner is not None and winner.token != staged.token:
            # Invariant 7: a peer's token committed this ts, so ours provably lost.
            self._delete_staged(staged)

    def _release_held(self) -> None:
        """Give up every held batch (a new epoch began). Files are deleted only where that is
        provably safe: a batch never appended, or one a peer's token beat (the token check of
        :meth:`_discard_lost`). A batch whose append may have landed keeps its files: if it did
        land they are the committed ones; if not, GC removes them after its grace period."""
        for staged in list(self.held.values()):
            if staged.token in self._outcome_unknown:
                self._discard_lost(staged)
            else:
                self._delete_staged(staged)
        self.held.clear()
        self._outcome_unknown.clear()

    def _delete_staged(self, staged: StagedBatch) -> None:
        blob = self.shard.blob
        blob.delete_tree(blob.path(staged.run["path"]))
        if staged.rejects:
            blob.delete_tree(blob.path(staged.rejects["path"]))

    # -- staging and appending ---------------------------------------------------------------

    def stage(self, ts: int) -> StagedBatch:
        """Stage batch ``ts`` (its binding must exist) and hold it.

        An attempt whose staging directory was deleted under it (GC, run with a grace period
        shorter than the attempt, removed it while Spark wrote) is restaged under a new path,
        at most ``MAX_RESTAGES`` times; then :class:`StagingLost` (retryable)."""
        binding = self.shard.binding(ts)
        if binding is None:
            raise missing_binding_error(self.shard.shard_id, ts, ts, self.shard.state().upper)
        messages = None
        for restage in range(MAX_RESTAGES + 1):
            started = time.monotonic()
            nonce = uuid.uuid4().hex
            run_dir = self.shard.run_dir(ts, self.writer_id, nonce[:12])
            rejects_dir = self.shard.rejects_dir(ts, self.writer_id, nonce[:12])
            spark = None
            try:
                spark = self._spark_factory()
                if messages is None and self.prefetched is not None and self.shard.is_kafka and self.epoch is not None:
                    messages = self.prefetched(self.epoch, binding)
                output = self._stage_batch(spark, binding, run_dir, rejects_dir, messages)
                break
            except UpsertError:
                raise
            except Exception as exc:
                self._raise_mapped_staging_error(exc, spark, ts, run_dir, rejects_dir)
                # Only a lost attempt gets here: nothing names its files (no append was
                # tried), so what is left of them goes before the next attempt.
                for directory in (run_dir, rejects_dir):
                    self.shard.blob.delete_tree(directory)
                if restage == MAX_RESTAGES:
                    raise StagingLost(
                        f"the staging directory {run_dir} of batch {ts} of shard {self.shard.shard_id!r} "
                        f"was deleted while the batch was written, {MAX_RESTAGES + 1} times in a row (is GC "
                        "running with a grace period shorter than a batch takes?); nothing was committed "
                        "and a retry is safe",
                        shard=self.shard.shard_id, ts=ts, path=run_dir,
                    ) from exc
                log.warning("shard %s: the staging directory %s of batch %s was deleted while the batch "
                            "was written (%s); restaging batch %s", self.shard.shard_id, run_dir, ts,
                            type(exc).__name__, ts)
        staged = StagedBatch(
            ts=ts,
            token=nonce,
            run=output.run,
            rejects=output.rejects,
            rows_in=output.rows_in,
            rows_out=output.rows_out,
            rejected=output.rejected,
            quarantined_files=binding.quarantined,
            stage_seconds=time.monotonic() - started,
            stage_timings=dict(output.timings),
            unknown_fields={f.name: {"records": f.records, "file": f.file} for f in output.unknown_fields},
        )
        self.held[ts] = staged
        return staged

    def _stage_batch(self, spark: "SparkSession", binding: "Binding", run_dir: str, rejects_dir: str,
                     messages: "DataFrame | None") -> Any:
        from airflow_upsert_provider.engine.write.upsert import stage_batch

        return stage_batch(spark, self.shard, binding, run_dir=run_dir, rejects_dir=rejects_dir,
                           on_bad_record=self.on_bad_record, messages=messages)

    def _raise_mapped_staging_error(
        self, exc: Exception, spark: "SparkSession | None", ts: int, run_dir: str, rejects_dir: str
    ) -> None:
        """Raise the error a failed staging attempt stands for; return only when the attempt
        was lost to a deletion of its staging directory (restage it)."""
        from airflow_upsert_provider.engine.spark.executor_errors import carried_error

        carried = carried_error(exc)  # a Kafka read on an executor failed: its own class, exit code
        if carried is not None:
            raise carried from exc
        if spark is not None and is_connect_session(spark) and server_gone(exc):
            # The attempt's files are unreferenced, like a killed task's: GC removes them
            # (the server may still be writing them if only the connection broke).
            address = connect_address(spark)
            raise SparkUnavailable(
                f"the Spark Connect server at {address} stopped answering while batch {ts} of "
                f"shard {self.shard.shard_id!r} was staged: nothing was committed; run again when "
                "the server answers (upsertctl spark-server status)",
                address=address, ts=ts,
            ) from None  # the client's error may name the server's token
        staging_dirs = (run_dir, rejects_dir)
        if staging_lost(exc, staging_dirs, claimed=self._claimed(staging_dirs)):
            return
        cause = blob_write_failure(exc)
        if cause is None:
            raise exc
        # Nothing names this attempt's files yet (no append was tried): remove them, so
        # that a full disk is not left fuller by a half-written batch.
        for directory in staging_dirs:
            self.shard.blob.delete_tree(directory)
        raise BlobWriteFailed(
            f"writing batch {ts} of shard {self.shard.shard_id!r} under blob root "
            f"{self.shard.blob.root} failed: {cause}; nothing was committed and the files of "
            "this attempt were removed: free space or fix the mount, then run again",
            shard=self.shard.shard_id,
            ts=ts,
            cause=cause,
        ) from exc

    def _claimed(self, staging_dirs: tuple[str, ...]) -> bool:
        """Whether GC claimed one of an attempt's staging directories for deletion; a store
        that cannot say counts as no (the error is then reported as it is)."""
        from airflow_upsert_provider.engine.store.gc_claims import claims

        try:
            claimed = set(claims(self.shard.consensus, self.shard.shard_id))
        except UpsertError:
            return False
        return any(self.shard.blob.relative(d) in claimed for d in staging_dirs)

    def append(self, staged: StagedBatch) -> str:
        """compare_and_append(ts -> ts+1) of a held batch; the outcome as a result word."""
        record = BatchRecord(
            ts=staged.ts,
            writer_id=self.writer_id,
            token=staged.token,
            run=staged.run,
            stats={
                "rows_in": staged.rows_in,
                "rows_out": staged.rows_out,
                "rejected": staged.rejected,
                "rejects": staged.rejects,
                "quarantined_files": staged.quarantined_files,
                **({"unknown_fields": staged.unknown_fields} if staged.unknown_fields else {}),
            },
        )
        # The store says which failures changed nothing (ConsensusUnavailable) and which may
        # have landed (ConsensusOutcomeUnknown). Either way the same token is safe to retry:
        # the store recognises it as ours if an earlier attempt did land.
        def attempt():
            try:
                return self.shard.compare_and_append(staged.ts, staged.ts + 1, record, epoch=self.epoch)
            except ConsensusOutcomeUnknown:
                self._outcome_unknown.add(staged.token)
                raise

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(ConsensusUnavailable),
            stop=tenacity.stop_after_attempt(APPEND_RETRIES + 1),
            wait=tenacity.wait_exponential(multiplier=APPEND_RETRY_DELAY_SECONDS, max=APPEND_RETRY_MAX_DELAY_SECONDS),
            before_sleep=lambda state: log.warning(
                "append of ts %s failed (%s); retrying with the same token (attempt %s)",
                staged.ts, type(state.outcome.exception()).__name__, state.attempt_number + 1,
            ),
            reraise=True,
        )
        try:
            result = retrying(attempt)
        except ConsensusUnavailable as exc:
            if staged.token not in self._outcome_unknown:
                # Every attempt failed before its commit: nothing landed. The files stay held
                # (nothing names them; GC removes them if no retry of this writer commits them).
                raise ConsensusUnavailable(
                    f"commit of batch {staged.ts} of shard {self.shard.shard_id!r} failed "
                    f"{APPEND_RETRIES + 1} times before committing ({exc.message}); nothing was committed "
                    "and a retry is safe",
                    shard=self.shard.shard_id, ts=staged.ts, **{k: v for k, v in exc.details.items()
                                                                  if k not in ("shard", "ts")},
                ) from exc
            raise CommitOutcomeUnknown(
                f"commit of batch {staged.ts} of shard {self.shard.shard_id!r} has an unknown outcome "
                f"after {APPEND_RETRIES + 1} attempts ({exc.message}); its files are kept and a retry is safe",
                shard=self.shard.shard_id,
                ts=staged.ts,
                token=staged.token,
            ) from exc
        return self._settle(staged, result.outcome, result.upper)

    def _settle(self, staged: StagedBatch, outcome: AppendOutcome, upper: int) -> str:
        if outcome is AppendOutcome.UPPER_BEHIND:
            # Held until the upper reaches it (ts > upper: invariant 4's third case).
            self.progress = max(self.progress, upper)
            return "held"
        self.held.pop(staged.ts, None)
        self._outcome_unknown.discard(staged.token)
        if outcome is AppendOutcome.UPPER_MOVED:
            self._delete_staged(staged)
            self.converged += 1
        elif outcome is AppendOutcome.TRUNCATED:
            # Persisted, but whose token won is no longer recorded: the files may be the
            # committed ones (a checkpoint may list them), so they stay for GC to judge.
            self.converged += 1
        self.progress = max(self.progress, upper)
        return {
            AppendOutcome.COMMITTED: COMMITTED,
            AppendOutcome.ALREADY_COMMITTED: ALREADY_COMMITTED,
            AppendOutcome.UPPER_MOVED: ALREADY_PERSISTED,
            AppendOutcome.TRUNCATED: ALREADY_PERSISTED,
        }[outcome]

    # -- the loop ----------------------------------------------------------------------------

    def start(self) -> None:
        """Check the stream lets a run start (READY: else StreamNotReady) and take its epoch."""
        from airflow_upsert_provider.engine.store.streams import require_ready

        epoch = require_ready(self.shard.consensus, self.shard.shard_id).epoch
        if self.epoch is not None and epoch != self.epoch:
            # Batches staged under an earlier epoch may not be committed in this one.
            self._release_held()
        self.epoch = epoch
        if self.shard.is_kafka:
            self._follow_upstream(epoch)

    def _follow_upstream(self, epoch: int) -> None:
        """Start (or restart in a new epoch) the consumer group's commits; a failure there
        is logged and retried with the next commit, never a reason not to run."""
        from airflow_upsert_provider.engine.frontier.upstream import follow_upper

        try:
            if self.upstream is None:
                self.upstream = follow_upper(self.shard)
                self.after_commit.append(self.upstream)
            self.upstream.start(epoch)
        except Exception as exc:  # noqa: BLE001 - the group follows the shard, never gates it
            log.warning("shard %s: consumer group commits not started (%s: %s); retried after the next commit",
                        self.shard.shard_id, type(exc).__name__, (str(exc).splitlines() or [""])[0][:300])

    def may_continue(self) -> bool:
        """Whether another batch may start: the stream is still READY in this writer's epoch.
        A stop or a recovery lets the batch in hand finish and starts no other."""
        from airflow_upsert_provider.engine.store.stream_rules import refuse_start
        from airflow_upsert_provider.engine.store.streams import read_stream

        state = read_stream(self.shard.consensus, self.shard.shard_id)
        if refuse_start(state) is None and state.epoch == self.epoch:
            return True
        self.stopped_because = f"the stream is {state.describe()}"
        return False

    def step(self) -> BatchResult:
        """Advance the shard by one batch if the source holds one. A step that raises is
        recorded as a frontier observation before the error goes on."""
        try:
            return self._step()
        except Exception as exc:
            self.record_failed_step(exc)
            raise

    def _step(self) -> BatchResult:
        if self.epoch is None:
            self.start()
        started = time.monotonic()
        upper = self.shard.state().upper
        self.reconcile(upper)
        staged = self.held.get(upper)
        if staged is None:
            try:
                binding = self.shard.mint_binding(
                    upper,
                    minted_by=self.writer_id,
                    on_bad_record=self.on_bad_record,
                    max_files=self.max_files_per_batch,
                )
                if binding is None:
                    return BatchResult(upper, NOTHING_TO_DO, upper=upper, seconds=time.monotonic() - started)
                staged = self.stage(upper)
            except PlanningOutdated:
                # Paused across a peer's commits and a truncation of the history: what this
                # step was to do is persisted (ts < upper), which is convergence, not failure.
                now_upper = self.shard.state().upper
                if classify(upper, now_upper) is not Disposition.DROP:
                    raise
                self.reconcile(now_upper)
                self.converged += 1
                return BatchResult(upper, ALREADY_PERSISTED, upper=self.progress, seconds=time.monotonic() - started)
        if self.on_staged is not None:
            self.on_staged(staged)
        commit_started = time.monotonic()
        for restage in range(MAX_RESTAGES + 1):
            try:
                outcome = self.append(staged)
                break
            except StreamFenced:
                # Refused inside the transaction whose compare-and-set matched: this ts is
                # not committed by anyone, and ours never will be. Its files can go now.
                self.held.pop(staged.ts, None)
                self._delete_staged(staged)
                raise
            except CommitRefused as refused:
                # GC claimed our staged files (we paused past its grace period): they are
                # GC's to delete now. Nothing was committed; stage again under a new path.
                self.held.pop(staged.ts, None)
                if restage == MAX_RESTAGES:
                    raise
                log.warning("%s; restaging batch %s", refused.message, staged.ts)
                staged = self.stage(staged.ts)
        commit_seconds = time.monotonic() - commit_started
        if outcome == "held":
            raise IntegrityError(
                f"upper of shard {self.shard.shard_id!r} is below batch {staged.ts}, which was "
                "bound at the upper: the upper moved backwards",
                shard=self.shard.shard_id,
                ts=staged.ts,
            )
        mine = outcome in (COMMITTED, ALREADY_COMMITTED)
        return BatchResult(
            ts=staged.ts,
            outcome=outcome,
            rows_in=staged.rows_in if mine else 0,
            rows_out=staged.rows_out if mine else 0,
            rejected=staged.rejected if mine else 0,
            unknown_fields={name: f["records"] for name, f in staged.unknown_fields.items()} if mine else {},
            quarantined_files=len(staged.quarantined_files) if mine else 0,
            bytes_written=sum(int(f.get("bytes") or 0) for f in staged.run.get("files", ())) if mine else 0,
            seconds=time.monotonic() - started,
            upper=self.progress,
            timings={"stage": staged.stage_seconds, **staged.stage_timings, "commit": commit_seconds},
        )

    def notify_committed(self, result: BatchResult) -> None:
        """Run the after-commit calls for a step that moved the upper."""
        if result.outcome not in (COMMITTED, ALREADY_COMMITTED, ALREADY_PERSISTED) or self.epoch is None:
            return
        for call in self.after_commit:
            try:
                call(result, self.epoch)
            except Exception as exc:  # noqa: BLE001 - the batch is committed whatever follows
                log.warning("shard %s: after-commit step %s for batch %s failed (%s: %s); the batch is "
                            "committed", self.shard.shard_id, getattr(call, "__qualname__", call), result.ts,
                            type(exc).__name__, (str(exc).splitlines() or [""])[0][:300])

    def settle(
        self,
        result: BatchResult,
        *,
        on_result: Callable[[BatchResult], None] | None = None,
        with_lag: bool = True,
        observe: bool = True,
    ) -> None:
        """What follows every step of a run (this loop's and continuous mode's): the
        after-commit calls, the lag after it, the frontier observation, ``on_result`` last."""
        self.notify_committed(result)
        status = self.shard.status() if with_lag else None
        if status is not None:
            result.lag_offsets = status.lag_offsets
            result.lag, result.lag_unit = status.lag, status.lag_unit
            result.lag_seconds = status.lag_seconds_at(time.time())
        if observe:
            self.record_observation(result, status)
        if on_result is not None:
            on_result(result)

    @property
    def spark_factory(self) -> Callable[[], "SparkSession"]:
        return self._spark_factory

    def record_observation(self, result: BatchResult, status: ShardStatus | None = None) -> None:
        """Record what the shard looks like after a step (invariant 15: a writer that keeps
        running while committing nothing leaves a trail). A failure is logged, never raised:
        the batch's outcome does not depend on it."""
        try:
            from airflow_upsert_provider.engine.frontier import observations

            obs = observations.observe(self.shard, observer=f"writer:{self.writer_id}",
                                       writer_outcome=result.outcome, status=status)
            observations.record_observation(self.shard.consensus, obs)
        except Exception as exc:  # noqa: BLE001 - an observation is never worth failing a batch
            log.warning("shard %s: frontier observation after batch %s not recorded (%s: %s); "
                        "the batch is unaffected", self.shard.shard_id, result.ts, type(exc).__name__,
                        (str(exc).splitlines() or [""])[0][:300])

    def record_failed_step(self, exc: BaseException) -> None:
        """Record an observation for a step that raised (outcome "failed:<error class>"): a
        writer failing on every run leaves a trail that says so, not the silence of no writer."""
        from airflow_upsert_provider.engine.frontier.model import failed_outcome

        upper = self.progress
        try:
            upper = self.shard.state().upper
        except Exception:  # noqa: BLE001 - the store may be what failed; observe() says so below
            pass
        self.record_observation(BatchResult(upper, failed_outcome(exc), upper=upper))

    def run(
        self,
        *,
        max_batches: int | None = 1,
        until_caught_up: bool = False,
        on_result: Callable[[BatchResult], None] | None = None,
        with_lag: bool = True,
    ) -> RunReport:
        """Run batches: ``max_batches`` of them, or until the source is caught up."""
        if max_batches is not None and max_batches < 1:
            raise ConfigurationError("max batches must be >= 1", field="max_batches")
        results: list[BatchResult] = []
        self.stopped_because = None
        self.start()
        while True:
            if results and not self.may_continue():
                log.info("shard %s: %s; no further batch started", self.shard.shard_id, self.stopped_because)
                break
            result = self.step()
            self.settle(result, on_result=on_result, with_lag=with_lag)
            results.append(result)
            if not result.progressed:
                break
            if not until_caught_up and max_batches is not None and len(results) >= max_batches:
                break
        return RunReport(results, self.progress, self.converged, self.stopped_because)
