"""The Kafka side of a recovery's seek (engine/lifecycle/kafka_recovery.seek_group) against the mock
cluster: the group's offsets set to the shard's positions and read back, refused with nothing
changed when retention deleted unprocessed offsets or a position is past the high watermark,
and no secret in any message."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import TopicPartition

from airflow_upsert_provider.engine.errors import (
    ConfigurationError,
    IntegrityError,
    KafkaSliceUnavailable,
    SourceSegmentsMissing,
)
from airflow_upsert_provider.engine.lifecycle.group_offsets import group_consumer
from airflow_upsert_provider.engine.lifecycle.kafka_recovery import seek_group
from airflow_upsert_provider.engine.sources.kafka import KafkaConfig, KafkaSource
from tests.kafka.conftest import MOCK_PARTITIONS, produce_changes

SECRET = "s33k-Pa55-31b7"


def config(bootstrap: str) -> KafkaConfig:
    return KafkaConfig.from_dict({"bootstrap.servers": bootstrap, "sasl.username": "u", "sasl.password": SECRET})


class RetainedSource(KafkaSource):
    """The topic as if retention had deleted each partition's offsets below ``lows`` (the
    mock cluster keeps every record)."""

    def __init__(self, topic: str, config: KafkaConfig, lows: dict[int, int]) -> None:
        super().__init__(topic, config)
        self.lows = lows

    def watermarks(self) -> dict[int, tuple[int, int]]:
        return {p: (max(low, self.lows.get(p, 0)), high) for p, (low, high) in super().watermarks().items()}


def committed(source: KafkaSource, group: str) -> dict[int, int]:
    consumer = group_consumer(source, group)
    try:
        return {tp.partition: tp.offset for tp in consumer.committed(
            [TopicPartition(source.topic, p) for p in range(MOCK_PARTITIONS)], timeout=10)}
    finally:
        consumer.close()


def produce(bootstrap: str, topic: str, counts: dict[int, int]) -> None:
    produce_changes(bootstrap, topic, [(p, f"k{p}-{n}", {"id": n}) for p, count in counts.items() for n in range(count)])


NOTHING = {p: -1001 for p in range(MOCK_PARTITIONS)}


def test_seek_commits_the_positions_and_reads_them_back(kafka_bootstrap: str, kafka_topic: str) -> None:
    produce(kafka_bootstrap, kafka_topic, {0: 12, 1: 7, 2: 3})
    group = f"upsert-{uuid.uuid4().hex[:8]}"
    with RetainedSource(kafka_topic, config(kafka_bootstrap), {3: 0}) as source:
        # The group ran ahead of a shard that was then restored to an earlier checkpoint.
        ahead = group_consumer(source, group)
        ahead.commit(offsets=[TopicPartition(kafka_topic, p, o) for p, o in {0: 12, 1: 7, 2: 3}.items()],
                     asynchronous=False)
        ahead.close()

        result = seek_group(source, group, {"0": 4, "1": 7, "2": 0})
        # Partition 3 was never bound: the group goes to its low watermark (0 here).
        assert result == {
            "group": group, "topic": kafka_topic, "positions": {"0": 4, "1": 7, "2": 0, "3": 0},
            "unbound": ["3"], "verified": True,
            "low_watermarks": {"0": 0, "1": 0, "2": 0, "3": 0},
            "high_watermarks": {"0": 12, "1": 7, "2": 3, "3": 0},
        }
        assert committed(source, group) == {0: 4, 1: 7, 2: 0, 3: 0}

    # An unbound partition whose head retention deleted starts at its low watermark.
    with RetainedSource(kafka_topic, config(kafka_bootstrap), {2: 2}) as source:
        assert seek_group(source, group, {"0": 12})["positions"] == {"0": 12, "1": 0, "2": 2, "3": 0}
        assert committed(source, group) == {0: 12, 1: 0, 2: 2, 3: 0}


def test_seek_refuses_positions_the_topic_no_longer_or_not_yet_holds(kafka_bootstrap: str, kafka_topic: str) -> None:
    produce(kafka_bootstrap, kafka_topic, {0: 10, 1: 10})
    group = f"upsert-{uuid.uuid4().hex[:8]}"
    with RetainedSource(kafka_topic, config(kafka_bootstrap), {0: 6, 1: 8}) as source:
        with pytest.raises(SourceSegmentsMissing) as below:
            seek_group(source, group, {"0": 4, "1": 3})
        message = below.value.message
        assert all(part in message for part in (
            kafka_topic, "partition 0", "position 4", "low watermark 6", "retention deleted offsets 4..5",
            "before they were processed", "1 more partition", "restore a checkpoint", "accept the loss"))
        assert below.value.details["missing"] == [
            {"topic": kafka_topic, "partition": 0, "offset": 4, "low_watermark": 6},
            {"topic": kafka_topic, "partition": 1, "offset": 3, "low_watermark": 8},
        ]
        assert below.value.exit_code == 4

        with pytest.raises(KafkaSliceUnavailable) as above:
            seek_group(source, group, {"0": 8, "1": 11})
        assert all(part in above.value.message for part in (
            kafka_topic, "partition 1", "position 11", "above the high watermark 10"))
        assert above.value.details["high_watermark"] == 10

        with pytest.raises(KafkaSliceUnavailable) as missing:
            seek_group(source, group, {"0": 8, "7": 1})
        assert "has no partition 7" in missing.value.message

        with pytest.raises(ConfigurationError) as bad:
            seek_group(source, group, {"0": -1})
        assert bad.value.details["field"] == "positions"

        # Every refusal changed nothing, and no message names the password.
        assert committed(source, group) == NOTHING
        for caught in (below, above, missing, bad):
            assert SECRET not in str(caught.value) and SECRET not in repr(caught.value.to_dict())

        # At the low watermark exactly is fine: nothing unprocessed was deleted.
        assert seek_group(source, group, {"0": 6, "1": 10})["verified"] is True
        assert committed(source, group) == {0: 6, 1: 10, 2: 0, 3: 0}


def test_a_read_back_that_differs_is_an_error_naming_partition_and_offsets(
        kafka_bootstrap: str, kafka_topic: str, monkeypatch: pytest.MonkeyPatch) -> None:
    produce(kafka_bootstrap, kafka_topic, {0: 5})
    group = f"upsert-{uuid.uuid4().hex[:8]}"
    from airflow_upsert_provider.engine.lifecycle import kafka_recovery

    def another_member_commits(consumer, offsets):  # a member of the group commits in between
        offsets = [TopicPartition(tp.topic, tp.partition, 1 if tp.partition == 0 else tp.offset) for tp in offsets]
        consumer.commit(offsets=offsets, asynchronous=False)

    monkeypatch.setattr(kafka_recovery, "commit_offsets", another_member_commits)
    with KafkaSource(kafka_topic, config(kafka_bootstrap)) as source:
        with pytest.raises(IntegrityError) as caught:
            seek_group(source, group, {"0": 5})
    assert "partition 0 reads back committed offset 1, expected 5" in caught.value.message
    assert caught.value.details["differing"] == [{"partition": 0, "expected": 5, "found": 1}]
