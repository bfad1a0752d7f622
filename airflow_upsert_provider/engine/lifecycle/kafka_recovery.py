"""The Kafka side of a recovery's seek: the consumer group set to the shard's frontier.

After a restore or a rewind the shard's upper may be below what the group committed; lag
tools would then show records as processed that the shard will read again, and the group's
offsets would lie about the frontier. The seek commits the offsets bound at the shard's
upper as the group's offsets, reads them back and checks them, and refuses first — nothing
changed — when the topic no longer holds what the shard still has to read.

Partitions of the topic that the positions do not name were never bound: the shard's first
range of such a partition starts at its low watermark (the first offset the topic still
holds, see ``sources/kafka_planning.start_offsets``), so the group is set there too; lag tools
then count everything the topic holds as pending, which it is.
"""

from __future__ import annotations

from typing import Any, Mapping

from airflow_upsert_provider.engine.errors import (
    ConfigurationError,
    IntegrityError,
    KafkaSliceUnavailable,
    KafkaUnavailable,
    SourceSegmentsMissing,
)
from airflow_upsert_provider.engine.lifecycle.group_offsets import (
    commit_offsets,
    group_consumer,
    read_committed,
    topic_partitions,
)
from airflow_upsert_provider.engine.sources.kafka import KafkaSource

# How many offending partitions an error's details list.
MAX_LISTED = 20


def _check_positions(positions: Mapping[str, int]) -> dict[str, int]:
    if not isinstance(positions, Mapping):
        raise ConfigurationError("seek positions must be a mapping {partition: offset}", field="positions")
    checked: dict[str, int] = {}
    for partition, offset in positions.items():
        name = str(partition)
        if not name.isdigit():
            raise ConfigurationError(f"seek position: partition {partition!r} is not a Kafka partition number",
                                     field="positions")
        if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
            raise ConfigurationError(f"seek position of partition {name}: {offset!r} is not an offset >= 0",
                                     field="positions")
        checked[name] = offset
    return checked


def seek_group(source: KafkaSource, group_id: str, positions: Mapping[str, int]) -> dict[str, Any]:
    """Set ``group_id``'s offsets on ``source.topic`` to ``positions`` (the shard's bound
    offsets at its upper; partitions not named go to their low watermark), then read them back
    and verify.

    Refused before anything is committed: with SourceSegmentsMissing when a position is below
    its partition's low watermark (retention deleted records the shard never processed), with
    KafkaSliceUnavailable when a position is above the high watermark or names a partition the
    topic does not have (the topic is not the one the shard read). A read-back that differs
    raises IntegrityError naming partition, expected and found offsets."""
    wanted = _check_positions(positions)
    marks = {str(p): (low, high) for p, (low, high) in source.watermarks().items()}
    topic = source.topic

    unknown = sorted((p for p in wanted if p not in marks), key=int)
    if unknown:
        raise KafkaSliceUnavailable(
            f"kafka topic {topic!r} has no partition {unknown[0]} (partitions: {sorted(marks, key=int)}), yet the shard "
            f"bound offsets up to {wanted[unknown[0]]} in it: the topic was recreated or is not the one the shard "
            "read; nothing was changed",
            topic=topic, partition=int(unknown[0]), partitions=[int(p) for p in unknown],
        )

    lost = [(p, wanted[p], marks[p][0]) for p in sorted(wanted, key=int) if wanted[p] < marks[p][0]]
    if lost:
        p, position, low = lost[0]
        raise SourceSegmentsMissing(
            f"seek of kafka group {group_id!r} refused: topic {topic!r} partition {p}: the shard's position {position} "
            f"is below the low watermark {low}: retention deleted offsets {position}..{low - 1} before they were "
            "processed"
            + (f" ({len(lost) - 1} more partition(s) likewise)" if len(lost) > 1 else "")
            + ". Resuming would skip their records: restore a checkpoint taken after those offsets were processed "
            "(its offsets at or above the low watermark) and seek again, or accept the loss on purpose by building "
            "a new shard from what the topic still holds; nothing was changed",
            topic=topic, group=group_id,
            missing=[{"topic": topic, "partition": int(q), "offset": pos, "low_watermark": lo}
                     for q, pos, lo in lost[:MAX_LISTED]],
        )

    ahead = [(p, wanted[p], marks[p][1]) for p in sorted(wanted, key=int) if wanted[p] > marks[p][1]]
    if ahead:
        p, position, high = ahead[0]
        raise KafkaSliceUnavailable(
            f"seek of kafka group {group_id!r} refused: topic {topic!r} partition {p}: the shard's position {position} "
            f"is above the high watermark {high}: the shard bound offsets the topic does not hold (was it truncated "
            "or recreated?); nothing was changed",
            topic=topic, group=group_id, partition=int(p), offset=position, high_watermark=high,
            partitions=[{"partition": int(q), "offset": pos, "high_watermark": hi} for q, pos, hi in ahead[:MAX_LISTED]],
        )

    target = {p: wanted.get(p, low) for p, (low, _) in marks.items()}
    target = dict(sorted(target.items(), key=lambda item: int(item[0])))
    consumer = group_consumer(source, group_id)
    try:
        from confluent_kafka import KafkaException

        try:
            commit_offsets(consumer, topic_partitions(topic, target))
        except KafkaException as exc:
            raise KafkaUnavailable(
                f"seek of kafka group {group_id!r} on topic {topic!r}: committing {target} failed: "
                f"{source.config.scrub(str(exc))} (a group with active members refuses commits from outside: "
                "stop its consumers and seek again)",
                topic=topic, group=group_id,
            ) from None
        found = read_committed(consumer, source, group_id, list(target))
    finally:
        consumer.close()
    differing = [(p, o, found.get(p)) for p, o in target.items() if found.get(p) != o]
    if differing:
        p, expected, got = differing[0]
        raise IntegrityError(
            f"seek of kafka group {group_id!r} on topic {topic!r}: partition {p} reads back committed offset "
            f"{'none' if got is None else got}, expected {expected}"
            + (f" ({len(differing) - 1} more partition(s) differ)" if len(differing) > 1 else "")
            + ": another member of the group may be committing; stop it and seek again",
            topic=topic, group=group_id,
            differing=[{"partition": int(q), "expected": e, "found": g} for q, e, g in differing[:MAX_LISTED]],
        )
    return {
        "group": group_id,
        "topic": topic,
        "positions": target,
        "unbound": sorted((p for p in target if p not in wanted), key=int),
        "verified": True,
        "low_watermarks": {p: low for p, (low, _) in sorted(marks.items(), key=lambda i: int(i[0]))},
        "high_watermarks": {p: high for p, (_, high) in sorted(marks.items(), key=lambda i: int(i[0]))},
    }
