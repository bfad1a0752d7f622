"""Recovery in the only safe order: restore, then seek, then resume (invariant 12).

``recover begin`` (or a checkpoint restore) opens a recovery epoch: the stream is RECOVERING
and no writer commits. ``seek`` positions the source where the shard's upper says the next
batch starts, ``binding(upper-1).to`` in every partition, and verifies that every segment the
shard still has to read from there on is present; only then does it record that the seek of
this epoch completed. ``resume`` makes the stream READY again, and refuses unless that seek
ran in the same epoch. The engine enforces the order whoever runs the steps, in whatever order.

Which segments a seek knows must be there: those a binding at or above the upper names
(minted, never committed), and those the partition's retention log records as deleted at or
after the seek point (``engine/maintenance/retention.py``). The decision is ``missing_segments``,
a pure function of them and of the partition listings.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from airflow_upsert_provider.engine.store import streams
from airflow_upsert_provider.engine.errors import SourceSegmentsMissing, TransitionRefused
from airflow_upsert_provider.engine.store.gc_claims import mark_blob_owner
from airflow_upsert_provider.engine.store.stream_rules import Status, decide_seek
from airflow_upsert_provider.engine.table.shard import Shard
from airflow_upsert_provider.engine.sources.planning import range_files
from airflow_upsert_provider.engine.maintenance.retention import read_log


@dataclass(frozen=True)
class ExpectedSegment:
    """A segment a seek needs present, and why it knows about it."""

    partition: str
    offset: int
    name: str
    known_from: str


def missing_segments(
    position: dict[str, int],
    expected: list[ExpectedSegment],
    present: dict[str, set[str]],
) -> list[ExpectedSegment]:
    """The expected segments at or after the seek position that are not present, lowest
    (partition, offset) first. A partition the position does not name starts at offset 0."""
    missing = {
        (s.partition, s.offset, s.name): s
        for s in expected
        if s.offset >= position.get(s.partition, 0) and s.name not in present.get(s.partition, set())
    }
    return [missing[k] for k in sorted(missing)]


@dataclass
class SeekResult:
    shard: str
    epoch: int
    upper: int
    position: dict[str, int]
    # Segments at or after the position that are present (what the next batches read).
    segments_ahead: int
    checked: int
    state: dict[str, Any] = field(default_factory=dict)
    # A Kafka shard's consumer group as the seek set and verified it.
    group: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            **({"group": self.group} if self.group is not None else {}),
            "shard": self.shard,
            "epoch": self.epoch,
            "upper": self.upper,
            "position": self.position,
            "segments_ahead": self.segments_ahead,
            "checked": self.checked,
            "stream": self.state,
        }


def _expected_segments(shard: Shard, upper: int, position: dict[str, int]) -> list[ExpectedSegment]:
    expected: list[ExpectedSegment] = []
    ts = upper
    while (binding := shard.binding(ts)) is not None:
        for partition, rng in binding.ranges.items():
            for offset, name in range_files(rng, shard.source.extension):
                expected.append(ExpectedSegment(partition, offset, name, f"binding of batch {ts}"))
        ts += 1
    for partition in sorted(set(shard.source.partitions()) | set(position)):
        directory = shard.source.partition_dir(partition)
        for deleted in read_log(partition, directory):
            expected.append(ExpectedSegment(partition, deleted.offset, deleted.name,
                                            f"deleted by retention (logged in {directory}/.retention.jsonl)"))
    return expected


def seek(shard: Shard, *, epoch: int | None = None, actor: str) -> SeekResult:
    """Position the source for the shard's upper in the open recovery ``epoch`` (None: the
    open one), verify what the next batches need is present, record the completed seek.
    Refused (nothing changed) outside a recovery, for another epoch, or with segments gone."""
    state = streams.read_stream(shard.consensus, shard.shard_id)
    early = decide_seek(state, epoch, {}, actor, 0.0)
    if early.refusal is not None:
        raise TransitionRefused(early.refusal, **state.to_dict())
    # A restore's blob owner marker, if a crash kept the restore from writing it: before the
    # resume that lets writers in, so that another store's GC keeps off their files.
    mark_blob_owner(shard.consensus, shard.blob, shard.shard_id)
    upper = shard.state().upper
    position = shard.bound_offsets(upper)
    if shard.is_kafka:
        return _seek_kafka(shard, state, epoch, upper, position, actor)
    expected = _expected_segments(shard, upper, position)
    partitions = sorted(set(shard.source.partitions()) | set(position) | {s.partition for s in expected})
    present: dict[str, set[str]] = {}
    ahead = 0
    for partition in partitions:
        directory = shard.source.partition_dir(partition)
        names = set(os.listdir(directory)) if os.path.isdir(directory) else set()
        present[partition] = names
        segments, _ = shard.source.scan(partition) if names else ([], [])
        ahead += sum(1 for s in segments if s.seq >= position.get(partition, 0))
    missing = missing_segments(position, expected, present)
    if missing:
        first = missing[0]
        path = os.path.join(shard.source.partition_dir(first.partition), first.name)
        raise SourceSegmentsMissing(
            f"seek of shard {shard.shard_id!r} (epoch {state.epoch}) failed: segment {path} (offset "
            f"{first.offset} of partition {first.partition!r}, at or after the seek point "
            f"{position.get(first.partition, 0)}) is missing, {first.known_from}"
            + (f"; {len(missing) - 1} more missing" if len(missing) > 1 else "")
            + ". Resuming would skip its records: put the segments back and seek again, or restore "
            "a checkpoint taken before them under a new shard id (docs/recovery.md); nothing was changed",
            shard=shard.shard_id,
            epoch=state.epoch,
            missing=[{"partition": m.partition, "offset": m.offset,
                      "file": os.path.join(shard.source.partition_dir(m.partition), m.name),
                      "known_from": m.known_from} for m in missing[:20]],
        )
    result = streams.record_seek(shard.consensus, shard.shard_id, epoch if epoch is not None else state.epoch,
                                 position, actor)
    return SeekResult(shard.shard_id, result.state.epoch, upper, position, ahead, len(expected),
                      result.state.to_dict())


def _seek_kafka(shard: Shard, state: Any, epoch: int | None, upper: int, position: dict[str, int],
                actor: str) -> SeekResult:
    """A Kafka shard's seek: its consumer group set to the offsets bound at the upper and read
    back (refused, nothing changed, when retention deleted offsets still to be read)."""
    from airflow_upsert_provider.engine.lifecycle.kafka_recovery import seek_group

    group = seek_group(shard.source, shard.group_id, position)
    result = streams.record_seek(shard.consensus, shard.shard_id, epoch if epoch is not None else state.epoch,
                                 position, actor)
    ahead = sum(max(0, high - group["positions"].get(p, high)) for p, high in group["high_watermarks"].items())
    out = SeekResult(shard.shard_id, result.state.epoch, upper, position, ahead, len(group["positions"]),
                     result.state.to_dict())
    out.group = group
    return out


def recovery_status(shard: Shard) -> dict[str, Any]:
    """The stream, the upper, and the next step of an open recovery (None if none is open)."""
    state = streams.read_stream(shard.consensus, shard.shard_id)
    next_step = None
    if state.status is Status.RECOVERING:
        next_step = "resume" if state.seeked_epoch == state.epoch else "seek"
    return {**state.to_dict(), "upper": shard.state().upper, "recovering": state.status is Status.RECOVERING,
            "next_step": next_step}
