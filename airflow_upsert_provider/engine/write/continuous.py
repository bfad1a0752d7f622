"""Continuous mode: batches back to back in one Spark session, the next slice fetched ahead.

``run_continuous`` runs a :class:`Writer` until a duration ends or a stop or a recovery is
requested (seen between batches, as ``Writer.run`` sees it), polling an idle source. While
batch ``ts`` commits, :class:`SlicePrefetcher` reads the slice of binding(ts+1) on the
executors, so the next stage does not wait for Kafka.

Prefetched data is keyed by (recovery epoch, binding) (``acks.prefetch_key``, invariant 13).
A slice is handed to a stage only when its key matches the writer's epoch and the batch's
binding; any other entry is dropped for the reason its key gives (an earlier epoch, an
earlier batch, other ranges), one entry at a time. Nothing is ever cleared wholesale: a
blanket clear run after a seek could race with a fetch started after it and drop offsets
that nothing would read again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from airflow_upsert_provider.engine.lifecycle import acks
from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.engine.write.writer import NOTHING_TO_DO, BatchResult, RunReport, StagedBatch, Writer

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from airflow_upsert_provider.engine.store.records import Binding
    from airflow_upsert_provider.engine.table.shard import Shard
    from airflow_upsert_provider.engine.sources.kafka import KafkaSource

log = logging.getLogger(__name__)

Submit = Callable[[Callable[[], None]], Any]

# Why a prefetched slice was dropped instead of consumed.
DROP_EPOCH = "epoch"  # fetched before a seek: its offsets are read again in the new epoch
DROP_OTHER_RANGES = "other-ranges"  # fetched for the same ts with other ranges than its binding holds
DROP_BELOW_UPPER = "below-upper"  # its batch is committed (or was taken and staged)
DROP_CAPACITY = "capacity"  # more entries than the prefetcher keeps
DROP_CLOSED = "closed"  # the prefetcher was closed

# Slices kept at most: the one being fetched and the one a stage is about to take.
DEFAULT_MAX_ENTRIES = 2
# Keys of consumed and dropped slices remembered (the latest), so a long run stays bounded.
HISTORY = 1000


@dataclass
class _Entry:
    key: acks.PrefetchKey
    ranges: dict[int, tuple[int, int]]
    done: threading.Event = field(default_factory=threading.Event)
    started: bool = False
    cancelled: bool = False
    frame: "DataFrame | None" = None
    error: str | None = None


@dataclass(frozen=True)
class Dropped:
    """A prefetched slice dropped unconsumed, and why (one of the ``DROP_*`` words)."""

    key: acks.PrefetchKey
    reason: str
    message: str


class SlicePrefetcher:
    """Fetches Kafka slices ahead of their stage, keyed by (epoch, binding).

    :param shard: the Kafka shard whose slices are fetched.
    :param spark_factory: the writer's session factory (the fetch runs on its session).
    :param submit: runs a fetch job; by default on one background thread. A test passes a
        scheduler it drives step by step.
    :param max_entries: slices kept at most; the lowest batch beyond it is dropped.
    """

    def __init__(
        self,
        shard: "Shard",
        spark_factory: Callable[[], "SparkSession"],
        *,
        submit: Submit | None = None,
        max_entries: int = DEFAULT_MAX_ENTRIES,
    ) -> None:
        if not shard.is_kafka:
            raise ConfigurationError(f"shard {shard.shard_id!r} does not read Kafka: nothing to prefetch",
                                     field="prefetch")
        if max_entries < 1:
            raise ConfigurationError("a prefetcher keeps at least one slice", field="max_entries")
        self.shard = shard
        self._spark_factory = spark_factory
        self.max_entries = max_entries
        self._executor: ThreadPoolExecutor | None = None
        self._submit = submit if submit is not None else self._submit_in_background
        self._lock = threading.Lock()
        self._entries: dict[acks.PrefetchKey, _Entry] = {}
        # Slices handed to a stage: released once their batch is below the upper.
        self._taken: dict[acks.PrefetchKey, _Entry] = {}
        self._source: "KafkaSource | None" = None
        # What happened to each slice, for the run's report and for tests.
        self.consumed: deque[acks.PrefetchKey] = deque(maxlen=HISTORY)
        self.dropped: deque[Dropped] = deque(maxlen=HISTORY)

    # -- fetching ----------------------------------------------------------------------------

    def _submit_in_background(self, job: Callable[[], None]) -> None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"prefetch-{self.shard.shard_id}")
        self._executor.submit(job)

    def _reader(self) -> "KafkaSource":
        """A source of its own: the driver-side metadata calls of a fetch run beside the
        writer's, which must not share a consumer across threads."""
        from airflow_upsert_provider.engine.sources.kafka import KafkaSource

        if self._source is None:
            source = self.shard.source
            self._source = KafkaSource(source.topic, source.config, timeout=source.timeout,
                                       stall_timeout=source.stall_timeout)
        return self._source

    def fetch(self, epoch: int, binding: "Binding") -> bool:
        """Schedule reading ``binding``'s slice for ``epoch``. False when nothing was
        scheduled: the key is held already, or the binding reads nothing."""
        key = acks.prefetch_key(epoch, binding)
        ranges = {int(p): (int(r["from"]), int(r["to"])) for p, r in binding.ranges.items() if r["to"] > r["from"]}
        if not ranges:
            return False
        upper = self.shard.state().upper
        with self._lock:
            if key in self._entries or key in self._taken:
                return False
            self._release_below(upper)
            entry = _Entry(key, ranges)
            self._entries[key] = entry
            while len(self._entries) > self.max_entries:
                oldest = min(self._entries.values(), key=lambda e: (e.key.ts, e.key.epoch))
                self._drop(oldest, DROP_CAPACITY, f"more than {self.max_entries} slices held")
        log.info("shard %s: prefetching batch %s (epoch %s) of topic %r", self.shard.shard_id, binding.ts, epoch,
                 self.shard.source.topic)
        self._submit(lambda: self._run(entry))
        return True

    def _run(self, entry: _Entry) -> None:
        from pyspark import StorageLevel

        with self._lock:
            if entry.cancelled:
                entry.done.set()
                return
            entry.started = True
        frame = None
        error = None
        try:
            spark = self._spark_factory()
            # Materialized on the executors now, so the stage reads these blocks and never
            # Kafka again; kept on disk too so that memory pressure does not re-read it.
            frame = self._reader().read_slice(spark, entry.ranges).persist(StorageLevel.MEMORY_AND_DISK)
            frame.count()
        except Exception as exc:  # noqa: BLE001 - a failed fetch only means the stage reads the slice itself
            error = self.shard.source.config.scrub(f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0][:300]}")
            if frame is not None:
                _unpersist(frame)
                frame = None
        with self._lock:
            entry.error = error
            if entry.cancelled and frame is not None:
                # Dropped while it ran: nobody takes it.
                _unpersist(frame)
                frame = None
            entry.frame = frame
            entry.done.set()
        if error is not None:
            log.warning("shard %s: prefetch of batch %s (epoch %s) failed (%s); its stage reads the slice itself",
                        self.shard.shard_id, entry.key.ts, entry.key.epoch, error)

    # -- taking ------------------------------------------------------------------------------

    def take(self, epoch: int, binding: "Binding") -> "DataFrame | None":
        """The slice prefetched for ``binding`` in ``epoch``, or None (the stage reads it).

        Entries whose key does not match are dropped for their reason; entries of later
        batches in the same epoch are kept. A matching fetch still running is waited for; one
        not started yet is cancelled (the stage will not wait for a queue)."""
        upper = self.shard.state().upper
        wait_for: _Entry | None = None
        with self._lock:
            self._release_below(min(upper, binding.ts))
            for entry in sorted(self._entries.values(), key=lambda e: (e.key.ts, e.key.epoch)):
                verdict = acks.usable(entry.key, epoch, binding)
                if verdict.usable:
                    wait_for = entry
                elif verdict.reason is acks.Unusable.EPOCH_CHANGED and entry.key.epoch < epoch:
                    self._drop(entry, DROP_EPOCH, verdict.message)
                elif verdict.reason is acks.Unusable.OTHER_RANGES:
                    self._drop(entry, DROP_OTHER_RANGES, verdict.message)
                elif verdict.reason is acks.Unusable.OTHER_BATCH and entry.key.ts < binding.ts:
                    self._drop(entry, DROP_BELOW_UPPER,
                               f"{verdict.message}: batch {entry.key.ts} is staged or committed already")
            if wait_for is not None and not wait_for.started and not wait_for.done.is_set():
                self._entries.pop(wait_for.key, None)
                wait_for.cancelled = True
                log.info("shard %s: prefetch of batch %s had not started; the stage reads the slice itself",
                         self.shard.shard_id, binding.ts)
                return None
        if wait_for is None:
            return None
        wait_for.done.wait()
        with self._lock:
            self._entries.pop(wait_for.key, None)
            if wait_for.frame is None:
                log.info("shard %s: no prefetched slice for batch %s (%s); the stage reads it",
                         self.shard.shard_id, binding.ts, wait_for.error or "dropped")
                return None
            self._taken[wait_for.key] = wait_for
            self.consumed.append(wait_for.key)
        log.info("shard %s: batch %s stages its prefetched slice (epoch %s)", self.shard.shard_id, binding.ts, epoch)
        return wait_for.frame

    # -- dropping ----------------------------------------------------------------------------

    def _drop(self, entry: _Entry, reason: str, message: str) -> None:
        """Drop one entry for ``reason`` (lock held). A running fetch is marked and frees its
        slice itself when it ends."""
        self._entries.pop(entry.key, None)
        entry.cancelled = True
        if entry.frame is not None:
            _unpersist(entry.frame)
            entry.frame = None
        self.dropped.append(Dropped(entry.key, reason, message))
        log.info("shard %s: prefetched slice of batch %s (epoch %s) dropped (%s): %s",
                 self.shard.shard_id, entry.key.ts, entry.key.epoch, reason, message)

    def _release_below(self, upper: int) -> None:
        """Free the taken slices and drop the entries of batches below ``upper`` (lock held)."""
        for key in [k for k in self._taken if k.ts < upper]:
            entry = self._taken.pop(key)
            if entry.frame is not None:
                _unpersist(entry.frame)
                entry.frame = None
        for entry in [e for e in self._entries.values() if e.key.ts < upper]:
            self._drop(entry, DROP_BELOW_UPPER, f"batch {entry.key.ts} is below the upper {upper}")

    def held(self) -> list[acks.PrefetchKey]:
        """The keys of the slices held (fetched or being fetched), lowest batch first."""
        with self._lock:
            return sorted(self._entries, key=lambda k: (k.ts, k.epoch))

    def close(self) -> None:
        """Wait for a running fetch, free every slice, close the reader's consumer."""
        with self._lock:
            for entry in list(self._entries.values()):
                self._drop(entry, DROP_CLOSED, "the prefetcher was closed")
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None
        with self._lock:
            self._release_below(2**63 - 1)
        if self._source is not None:
            self._source.close()
            self._source = None


def _unpersist(frame: "DataFrame") -> None:
    try:
        frame.unpersist()
    except Exception as exc:  # noqa: BLE001 - a session already stopped holds nothing any more
        log.debug("unpersisting a prefetched slice failed: %s", exc)


# -- the loop --------------------------------------------------------------------------------


def _next_slice_fetcher(writer: Writer, prefetcher: SlicePrefetcher) -> Callable[[StagedBatch], None]:
    """The writer's ``on_staged``: mint binding(ts+1) and fetch its slice while ts commits.
    Never raises: a failure here costs the next stage its head start, never this batch."""

    def on_staged(staged: StagedBatch) -> None:
        if writer.epoch is None:
            return
        try:
            binding = writer.shard.mint_binding(staged.ts + 1, minted_by=writer.writer_id,
                                                on_bad_record=writer.on_bad_record,
                                                max_files=writer.max_files_per_batch)
            if binding is not None:
                prefetcher.fetch(writer.epoch, binding)
        except Exception as exc:  # noqa: BLE001 - the next step binds and reads for itself
            log.warning("shard %s: prefetch of batch %s not started (%s: %s); it is read when its turn comes",
                        writer.shard.shard_id, staged.ts + 1, type(exc).__name__,
                        (str(exc).splitlines() or [""])[0][:300])

    return on_staged


def run_continuous(
    writer: Writer,
    *,
    duration_seconds: float,
    on_result: Callable[[BatchResult], None] | None = None,
    prefetch: bool = True,
    prefetcher: SlicePrefetcher | None = None,
    idle_wait_seconds: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> RunReport:
    """Run batches back to back until ``duration_seconds`` pass or a stop or a recovery is
    requested (``RunReport.stopped_because`` then says which). A source with nothing new is
    polled every ``idle_wait_seconds``; a run of idle polls is reported as one result.

    :param writer: the writer (its Spark factory is the run's one session).
    :param duration_seconds: how long to keep running; no batch starts after it.
    :param on_result: called with every reported result.
    :param prefetch: fetch the next Kafka slice while a batch commits (ignored for a
        directory shard).
    :param prefetcher: the prefetcher to use (default: one for this run, closed at its end);
        a caller that passes one keeps it across runs and closes it.
    :param idle_wait_seconds: wait between polls of an idle source.
    :param clock: monotonic seconds (tests pass their own).
    :param sleep: waits (tests pass their own).
    """
    if isinstance(duration_seconds, bool) or not isinstance(duration_seconds, (int, float)) or duration_seconds <= 0:
        raise ConfigurationError(f"continuous duration must be a number of seconds > 0, got {duration_seconds!r}",
                                 field="duration")
    if isinstance(idle_wait_seconds, bool) or not isinstance(idle_wait_seconds, (int, float)) or idle_wait_seconds < 0:
        raise ConfigurationError(f"idle wait must be a number of seconds >= 0, got {idle_wait_seconds!r}",
                                 field="idle_wait_seconds")
    deadline = clock() + float(duration_seconds)
    owned = None
    if prefetcher is None and prefetch and writer.shard.is_kafka:
        owned = prefetcher = SlicePrefetcher(writer.shard, writer.spark_factory)
    seams = (writer.prefetched, writer.on_staged)
    if prefetcher is not None:
        writer.prefetched = prefetcher.take
        writer.on_staged = _next_slice_fetcher(writer, prefetcher)
    results: list[BatchResult] = []
    writer.stopped_because = None
    try:
        writer.start()
        idle = False
        while True:
            if results and not writer.may_continue():
                log.info("shard %s: %s; no further batch started", writer.shard.shard_id, writer.stopped_because)
                break
            result = writer.step()
            quiet = idle and result.outcome == NOTHING_TO_DO
            # One result (and one observation) per run of idle polls, not one per poll.
            writer.settle(result, on_result=None if quiet else on_result, observe=not quiet)
            if not quiet:
                results.append(result)
            idle = result.outcome == NOTHING_TO_DO
            remaining = deadline - clock()
            if remaining <= 0:
                break
            if idle:
                sleep(min(float(idle_wait_seconds), remaining))
                if clock() >= deadline:
                    break
    finally:
        writer.prefetched, writer.on_staged = seams
        if owned is not None:
            owned.close()
    return RunReport(results, writer.progress, writer.converged, writer.stopped_because)
