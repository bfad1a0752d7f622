"""A Kafka shard's consumer-group offsets: the contiguous committed frontier, told to Kafka.

The shard's compare-and-append is the only commit that decides what was processed; the
consumer group's committed offsets are how Kafka and its lag tools learn it. After batch ts
commits, the writer acknowledges binding(ts)'s ranges here; the decisions are those of
``engine/lifecycle/acks.py`` (only the end of a contiguous acknowledged range is ever committed, and
acknowledgements from an earlier recovery epoch never count), this module only talks to the
broker and keeps time.

A group commit that fails never blocks the shard: it is logged (the reason scrubbed of the
client config's secrets) and retried on the next acknowledgement. A group left behind the
shard's frontier for longer than ``gap_alert_seconds`` is an alert — an ERROR line, the
``upstream`` field of frontier observations — rather than a silent block. Since when the group
is behind survives a restart: it is derived from consensus, the commit time of the first batch
that moved the shard past the group's offset (:func:`group_behind_since`).

Partitions are the strings bindings use (``"0"``, ``"1"``, ...); offsets are Kafka offsets,
the next offset to read, as a group offset means it.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence

from airflow_upsert_provider.engine.lifecycle import acks
from airflow_upsert_provider.engine.errors import ConfigurationError, KafkaUnavailable
from airflow_upsert_provider.engine.sources.kafka import KafkaSource
from airflow_upsert_provider.engine.sources.kafka_planning import start_offsets

if TYPE_CHECKING:
    from confluent_kafka import Consumer, TopicPartition

    from airflow_upsert_provider.engine.store.consensus import Consensus
    from airflow_upsert_provider.engine.store.records import Binding, ShardRecord

log = logging.getLogger(__name__)

DEFAULT_GAP_ALERT_SECONDS = 300.0
# librdkafka's "no offset committed" sentinel (OFFSET_INVALID).
NO_OFFSET = -1001

CommitFn = Callable[[list["TopicPartition"]], None]


class KafkaShardLike(Protocol):
    """What this module needs of a Kafka shard (engine/table/shard.py's Shard)."""

    shard_id: str
    consensus: "Consensus"
    source: KafkaSource

    @property
    def group_id(self) -> str: ...

    def state(self) -> "ShardRecord": ...

    def binding(self, ts: int) -> "Binding | None": ...

    def bound_offsets(self, upper: int) -> dict[str, int]: ...


# -- talking to the group -----------------------------------------------------------------------


def group_consumer(source: KafkaSource, group_id: str) -> "Consumer":
    """A consumer of ``group_id`` that never subscribes, never auto-commits: it only commits
    and reads the group's offsets by partition."""
    from confluent_kafka import Consumer, KafkaException

    if not isinstance(group_id, str) or not group_id.strip():
        raise ConfigurationError("kafka consumer group id must be a non-empty string", field="group_id")
    properties = {**source.config.consumer_properties(), "group.id": group_id}
    try:
        return Consumer(properties)
    except (KafkaException, ValueError, TypeError) as exc:
        raise ConfigurationError(
            f"kafka client config refused: {source.config.scrub(str(exc))}", field="kafka_config"
        ) from None


def topic_partitions(topic: str, offsets: Mapping[str, int]) -> list["TopicPartition"]:
    from confluent_kafka import TopicPartition

    return [TopicPartition(topic, int(p), int(o)) for p, o in sorted(offsets.items(), key=lambda i: int(i[0]))]


def read_committed(consumer: "Consumer", source: KafkaSource, group_id: str, partitions: Sequence[str]) -> dict[str, int]:
    """The group's committed offset of each of ``partitions`` that has one (a partition the
    group never committed is absent). Raises KafkaUnavailable, scrubbed, when the broker does
    not answer."""
    from confluent_kafka import KafkaException, TopicPartition

    if not partitions:
        return {}
    asked = [TopicPartition(source.topic, int(p)) for p in partitions]
    try:
        answered = consumer.committed(asked, timeout=source.timeout)
    except KafkaException as exc:
        raise KafkaUnavailable(
            f"kafka group {group_id!r} topic {source.topic!r}: reading committed offsets failed: "
            f"{source.config.scrub(str(exc))}",
            topic=source.topic, group=group_id,
        ) from None
    offsets: dict[str, int] = {}
    for tp in answered:
        if tp.error is not None:
            raise KafkaUnavailable(
                f"kafka group {group_id!r} topic {source.topic!r} partition {tp.partition}: reading the committed "
                f"offset failed: {source.config.scrub(str(tp.error))}",
                topic=source.topic, group=group_id, partition=tp.partition,
            )
        if tp.offset >= 0:
            offsets[str(tp.partition)] = int(tp.offset)
    return offsets


def commit_offsets(consumer: "Consumer", offsets: list["TopicPartition"]) -> None:
    """Commit ``offsets`` synchronously; a partition the broker refused raises, like the call."""
    from confluent_kafka import KafkaException

    result = consumer.commit(offsets=offsets, asynchronous=False)
    refused = [tp for tp in result or () if tp.error is not None]
    if refused:
        raise KafkaException(refused[0].error)


def behind_offsets(group: Mapping[str, int], acknowledged: Mapping[str, int]) -> dict[str, int]:
    """``{partition: offsets the group is behind}`` for each acknowledged partition ahead of
    the group (a partition the group never committed counts from 0)."""
    return {p: a - group.get(p, 0) for p, a in sorted(acknowledged.items()) if a > group.get(p, 0)}


def ahead_offsets(group: Mapping[str, int], positions: Mapping[str, int]) -> dict[str, int]:
    """``{partition: offsets the group is ahead}`` for each partition whose group offset is
    beyond ``positions``, where the shard reads on from. The writers only ever commit offsets
    the shard bound at its upper, so a group ahead was moved by something else: a writer still
    committing against another store (an old one after a restore), a tool, another pipeline
    sharing the group id. Lag tools then count records as processed that the shard has not
    read. Partitions ``positions`` does not name are not judged."""
    return {p: g - positions[p] for p, g in sorted(group.items()) if p in positions and g > positions[p]}


def shard_positions(shard: KafkaShardLike, upper: int, marks: Mapping[str, tuple[int, int]]) -> dict[str, int]:
    """Where ``shard`` reads each partition on from at ``upper``: binding(upper - 1)'s ``to``,
    the low watermark for a partition no binding names (as the next binding would start,
    ``kafka_planning.start_offsets``)."""
    binding = shard.binding(upper - 1) if upper > 0 else None
    return start_offsets(binding.ranges if binding is not None else {}, marks)


# -- since when: derived from consensus ---------------------------------------------------------


def first_ts_past(low: int, high: int, past: Callable[[int], bool]) -> int:
    """Pure: the lowest ts in [low, high] where ``past`` holds, given that it holds at
    ``high`` and, once true, stays true for every later ts (a binary search)."""
    while low < high:
        middle = (low + high) // 2
        if past(middle):
            high = middle
        else:
            low = middle + 1
    return low


def group_behind_since(shard: KafkaShardLike, group_offsets: Mapping[str, int]) -> float | None:
    """When the shard went past the group: the ``committed_at`` of the first batch whose
    binding's ``to`` is beyond the group's offset in some partition. None when the group is
    not behind the shard's upper.

    Bindings' ``to`` never decrease with ts, so "some partition beyond the group" is false up
    to one ts and true from it on: a binary search reads O(log upper) bindings, and the
    answer does not depend on the process that saw the gap open (it survives restarts).

    The search starts at the oldest binding truncation kept (store/history.py): when the shard
    was already past the group there, the gap opened within the truncated history and its
    date is floored at that batch's commit (the group has been behind at least since then),
    never taken for "not behind"."""
    from airflow_upsert_provider.engine.store.history import oldest_binding

    upper = shard.state().upper

    def past_group(ts: int) -> bool:
        binding = shard.binding(ts)
        if binding is None:
            return False
        return any(to > group_offsets.get(p, 0) for p, to in binding.to_offsets().items())

    if upper == 0 or not past_group(upper - 1):
        return None
    oldest = oldest_binding(shard.consensus, shard.shard_id)
    first = first_ts_past(0 if oldest is None else min(oldest.ts, upper - 1), upper - 1, past_group)
    batch = shard.consensus.get_batch(shard.shard_id, first)
    if batch is None:
        # A truncation since the oldest binding was read took its row: the first row kept
        # (a later date, still a floor).
        batch = next(iter(shard.consensus.batches(shard.shard_id, from_ts=first, below=upper)), None)
    return None if batch is None else float(batch.committed_at)


def group_status(
    shard: KafkaShardLike,
    *,
    gap_alert_seconds: float = DEFAULT_GAP_ALERT_SECONDS,
    now: float | None = None,
) -> dict[str, Any]:
    """One look at the group against the shard: its committed offsets, the offsets bound at
    the upper (what it should hold), how far behind and since when (from consensus), how far
    ahead of where the shard reads on (:func:`ahead_offsets`: an alert at once), and whether
    that is an alert. For observations and the CLI; raises KafkaUnavailable when the group
    cannot be read."""
    now = time.time() if now is None else float(now)
    source = shard.source
    group_id = shard.group_id
    upper = shard.state().upper
    acknowledged = shard.bound_offsets(upper)
    marks = {str(p): held for p, held in source.watermarks().items()}
    consumer = group_consumer(source, group_id)
    try:
        group = read_committed(consumer, source, group_id, sorted(set(acknowledged) | set(marks), key=int))
    finally:
        consumer.close()
    ahead = ahead_offsets(group, shard_positions(shard, upper, marks))
    if ahead:
        # A writer of this shard may have committed a batch and told the group between the
        # two reads: the group is ahead only of an upper read after the group was.
        upper = shard.state().upper
        acknowledged = shard.bound_offsets(upper)
        ahead = ahead_offsets(group, shard_positions(shard, upper, marks))
    behind = behind_offsets(group, acknowledged)
    since = group_behind_since(shard, group) if behind else None
    seconds = None if since is None else max(0.0, now - since)
    return {
        "group": group_id,
        "topic": source.topic,
        "committed": group,
        "acknowledged": dict(sorted(acknowledged.items())),
        "behind": behind,
        "gap_since": since,
        "gap_seconds": seconds,
        "gap_alert_seconds": gap_alert_seconds,
        # Never normal, so never waited on: lag tools count these records as processed now.
        "ahead": ahead,
        "alert": (seconds is not None and seconds > gap_alert_seconds) or bool(ahead),
    }


# -- the committer a writer keeps ---------------------------------------------------------------


@dataclass(frozen=True)
class GroupCommit:
    """What one acknowledgement (or start) did: the offsets committed to the group (empty:
    none needed, or the commit failed), the failure's scrubbed reason, the partitions whose
    acknowledgement changed nothing and why, and whether the gap alert is on."""

    committed: dict[str, int] = field(default_factory=dict)
    failed: str | None = None
    ignored: dict[str, str] = field(default_factory=dict)
    alert: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"committed": dict(self.committed), "failed": self.failed, "ignored": dict(self.ignored),
                "alert": self.alert}


class GroupCommitter:
    """Commits a Kafka shard's consumer-group offsets as its frontier moves, under one
    writer's recovery epoch.

    ``commit`` replaces the broker call (tests make group commits fail with it); by default
    one consumer of ``group_id`` created from ``source.config`` commits synchronously.
    ``shard`` lets :meth:`start` date a gap it finds from consensus instead of from now."""

    def __init__(
        self,
        source: KafkaSource,
        group_id: str,
        shard_id: str,
        *,
        gap_alert_seconds: float = DEFAULT_GAP_ALERT_SECONDS,
        clock: Callable[[], float] = time.time,
        commit: CommitFn | None = None,
        shard: KafkaShardLike | None = None,
    ) -> None:
        if isinstance(gap_alert_seconds, bool) or not isinstance(gap_alert_seconds, (int, float)) \
                or gap_alert_seconds < 0:
            raise ConfigurationError(
                f"gap_alert_seconds must be a number of seconds >= 0, got {gap_alert_seconds!r}",
                field="gap_alert_seconds",
            )
        if not isinstance(group_id, str) or not group_id.strip():
            raise ConfigurationError("kafka consumer group id must be a non-empty string", field="group_id")
        self.source = source
        self.group_id = group_id
        self.shard_id = shard_id
        self.gap_alert_seconds = float(gap_alert_seconds)
        self.clock = clock
        self.shard = shard
        self._commit = commit
        self._consumer: Consumer | None = None
        self._lock = threading.Lock()
        self._acks: acks.AckState | None = None
        self._group: dict[str, int] = {}  # what the group is known to hold
        self._behind_since: float | None = None
        self._alert_logged_at: float | None = None
        self._last_failure: str | None = None
        # The group was found ahead of the shard's frontier at start (confirmed against
        # consensus): reported until the shard's acknowledged offsets reach the group's.
        self._ahead_found = False

    @classmethod
    def for_shard(cls, shard: KafkaShardLike, **kwargs: Any) -> "GroupCommitter":
        """The committer of ``shard``'s group (``shard.group_id``), dating gaps from its consensus."""
        return cls(shard.source, shard.group_id, shard.shard_id, shard=shard, **kwargs)

    # -- broker calls -------------------------------------------------------------------------

    def _group_consumer(self) -> "Consumer":
        if self._consumer is None:
            self._consumer = group_consumer(self.source, self.group_id)
        return self._consumer

    def _send(self, offsets: list["TopicPartition"]) -> None:
        if self._commit is not None:
            self._commit(offsets)
        else:
            commit_offsets(self._group_consumer(), offsets)

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def __enter__(self) -> "GroupCommitter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the frontier -------------------------------------------------------------------------

    @property
    def epoch(self) -> int | None:
        return None if self._acks is None else self._acks.epoch

    def start(self, epoch: int, positions: Mapping[str, int]) -> GroupCommit:
        """Track ``positions`` (the shard's bound offsets at its upper) as acknowledged in the
        writer's ``epoch``, read what the group holds, and commit the positions if the group
        is behind them. A group found behind that stays behind (its commit failed) is dated
        from consensus when the committer knows the shard, else from now."""
        with self._lock:
            if self._acks is not None and epoch < self._acks.epoch:
                raise ValueError(f"cannot start epoch {epoch}: epoch {self._acks.epoch} is tracked already")
            self._acks = acks.track(epoch, {str(p): int(o) for p, o in positions.items()})
            self._behind_since = None
            try:
                self._group = read_committed(self._group_consumer(), self.source, self.group_id,
                                             sorted(self._acks.names()))
            except KafkaUnavailable as exc:
                # Unknown: treat as holding nothing, so the commit below is attempted.
                log.warning("shard %s: %s; committing the shard's offsets to the group anyway", self.shard_id, exc)
                self._group = {}
            self._ahead_found = self._group_ahead_of_shard()
            result = self._flush({})
            if self._behind() and self.shard is not None:
                try:
                    since = group_behind_since(self.shard, self._group)
                except Exception as exc:  # dating the gap is best effort; now is a safe fallback
                    log.warning("shard %s: could not date the group's gap from consensus: %s", self.shard_id, exc)
                    since = None
                if since is not None:
                    self._behind_since = since
            return self._checked(result)

    def acknowledge(self, epoch: int, binding_ranges: Mapping[str, Mapping[str, Any]]) -> GroupCommit:
        """Record that a committed batch of ``epoch`` read ``binding_ranges`` ({partition:
        {"from", "to", ...}}), then commit the contiguous end to the group if it moved past
        what the group holds (this retries an earlier failed commit too). Never raises for a
        failed group commit: the result says why, a WARNING line too.

        A partition no earlier binding named starts at its first range's ``from``: batches
        commit one at a time in ts order, so its first acknowledgement is its first range."""
        with self._lock:
            if self._acks is None:
                raise ValueError("acknowledge before start: the committer tracks no epoch yet")
            now = self.clock()
            ignored: dict[str, str] = {}
            state = self._acks
            for partition, rng in sorted(binding_ranges.items()):
                partition = str(partition)
                start, end = int(rng["from"]), int(rng["to"])
                if partition not in state.names():
                    if epoch < state.epoch:
                        ignored[partition] = acks.Ignored.EARLIER_EPOCH.value
                        continue
                    state = acks.add_partition(state, partition, start)
                done = acks.acknowledge(state, partition, start, end, epoch, now=now)
                state = done.state
                if done.ignored is not None:
                    ignored[partition] = done.ignored.value
            self._acks = state
            return self._checked(self._flush(ignored))

    def flush(self) -> GroupCommit:
        """Commit what is acknowledged and not yet held by the group (a retry without a new
        acknowledgement)."""
        with self._lock:
            if self._acks is None:
                return GroupCommit()
            return self._checked(self._flush({}))

    def _pending(self) -> dict[str, int]:
        assert self._acks is not None
        ends = acks.committed_offsets(self._acks)
        return {p: o for p, o in ends.items() if o > self._group.get(p, -1)}

    def _flush(self, ignored: dict[str, str]) -> GroupCommit:
        pending = self._pending()
        if not pending:
            return GroupCommit(ignored=ignored)
        try:
            self._send(topic_partitions(self.source.topic, pending))
        except Exception as exc:  # a failed group commit never blocks the shard
            reason = self.source.config.scrub(str(exc) or type(exc).__name__)
            self._last_failure = reason
            log.warning(
                "shard %s: committing offsets %s of topic %r to kafka group %r failed (retried on the next "
                "commit): %s", self.shard_id, pending, self.source.topic, self.group_id, reason,
            )
            return GroupCommit(ignored=ignored, failed=reason)
        self._group.update(pending)
        self._last_failure = None
        return GroupCommit(committed=pending, ignored=ignored)

    def _group_ahead_of_shard(self) -> bool:
        """Whether the group just read is ahead of the tracked positions and still ahead of
        the shard's bound offsets read from consensus now: a peer writer of this store may
        have committed and told the group since the positions were read, which is no alert.
        Without the shard nothing can be confirmed, so nothing is reported."""
        assert self._acks is not None
        if self.shard is None or not ahead_offsets(self._group, acks.committed_offsets(self._acks)):
            return False
        try:
            bound_now = self.shard.bound_offsets(self.shard.state().upper)
        except Exception as exc:  # the check never fails a writer
            log.warning("shard %s: could not check the kafka group against consensus: %s", self.shard_id, exc)
            return False
        return bool(ahead_offsets(self._group, bound_now))

    def _ahead(self) -> dict[str, int]:
        if not self._ahead_found or self._acks is None:
            return {}
        return ahead_offsets(self._group, acks.committed_offsets(self._acks))

    def _behind(self) -> dict[str, int]:
        assert self._acks is not None
        return behind_offsets(self._group, acks.committed_offsets(self._acks))

    def _checked(self, result: GroupCommit) -> GroupCommit:
        """Date a gap that opened, clear one that closed, and log the alert while it lasts
        (once per ``gap_alert_seconds``, so a long outage is not one line per batch)."""
        now = self.clock()
        behind = self._behind()
        if behind and self._behind_since is None:
            self._behind_since = now
        if not behind and self._behind_since is not None:
            if self._alert_logged_at is not None:
                log.warning("shard %s: kafka group %r caught up with the shard's frontier on topic %r; alert cleared",
                            self.shard_id, self.group_id, self.source.topic)
            self._behind_since = None
            self._alert_logged_at = None
        if self._ahead_found and not self._ahead():
            self._ahead_found = False  # the shard's acknowledged frontier reached the group
        status = self._status(now)
        if status["alert"] and (self._alert_logged_at is None
                                or now - self._alert_logged_at >= self.gap_alert_seconds):
            self._alert_logged_at = now
            log.error("shard %s: %s", self.shard_id, describe_alert(status))
        return GroupCommit(result.committed, result.failed, result.ignored, status["alert"])

    def _status(self, now: float) -> dict[str, Any]:
        acknowledged = acks.committed_offsets(self._acks) if self._acks is not None else {}
        behind = behind_offsets(self._group, acknowledged)
        ahead = self._ahead()
        since = self._behind_since if behind else None
        seconds = None if since is None else max(0.0, now - since)
        ack_gaps = acks.gaps(self._acks) if self._acks is not None else []
        stuck_acks = [g for g in ack_gaps if g.age(now) > self.gap_alert_seconds]
        return {
            "group": self.group_id,
            "topic": self.source.topic,
            "epoch": self.epoch,
            "committed": dict(sorted(self._group.items())),
            "acknowledged": dict(sorted(acknowledged.items())),
            "behind": behind,
            "gap_since": since,
            "gap_seconds": seconds,
            "gap_alert_seconds": self.gap_alert_seconds,
            # Acknowledged offsets above a missing one: the contiguous end cannot move.
            "ack_gaps": [g.to_dict() for g in ack_gaps],
            "last_failure": self._last_failure,
            "ahead": ahead,
            "alert": (seconds is not None and seconds > self.gap_alert_seconds) or bool(stuck_acks) or bool(ahead),
        }

    def status(self) -> dict[str, Any]:
        """The group against the acknowledged frontier now: ``group``, ``committed`` (what the
        group holds), ``acknowledged``, ``behind`` {partition: offsets}, ``gap_since``,
        ``gap_seconds``, ``alert``, plus ``ack_gaps`` and ``last_failure``."""
        with self._lock:
            return self._status(self.clock())


def describe_alert(status: Mapping[str, Any]) -> str:
    """The alert line: which group, topic and partitions, at which offsets, for how long."""
    parts = []
    behind = status.get("behind") or {}
    if behind:
        acknowledged = status.get("acknowledged") or {}
        committed = status.get("committed") or {}
        offsets = ", ".join(
            f"partition {p} at {committed.get(p, 'none')} (shard at {acknowledged.get(p)}, {n} behind)"
            for p, n in behind.items()
        )
        seconds = status.get("gap_seconds")
        parts.append(
            f"kafka group {status.get('group')!r} is behind the shard's frontier on topic {status.get('topic')!r} "
            f"for {seconds if seconds is None else round(seconds)}s (alert after {status.get('gap_alert_seconds')}s): "
            f"{offsets}; lag tools show this group further behind than the shard is"
            + (f"; last commit failure: {status['last_failure']}" if status.get("last_failure") else "")
        )
    ahead = status.get("ahead") or {}
    if ahead:
        committed = status.get("committed") or {}
        offsets = ", ".join(
            f"partition {p} at {committed.get(p)} (shard at {committed.get(p, 0) - n}, {n} ahead)" for p, n in ahead.items()
        )
        parts.append(
            f"kafka group {status.get('group')!r} is ahead of the shard's frontier on topic {status.get('topic')!r}: "
            f"{offsets}; lag tools count {sum(ahead.values())} records as processed that the shard has not read. "
            "Something else commits to this group (a writer still running against another store, e.g. the one a "
            "restore replaced): stop it, then 'upsertctl recover seek' sets the group back to the shard's frontier"
        )
    for gap in status.get("ack_gaps") or ():
        parts.append(
            f"acknowledgements of topic {status.get('topic')!r} partition {gap['partition']} have a gap: "
            f"committed {gap['committed']}, acknowledged from {gap['first_acknowledged']}, "
            f"{gap['missing']} offsets never acknowledged; the group offset cannot move past it"
        )
    return "; ".join(parts)
