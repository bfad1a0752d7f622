"""A Kafka shard end to end: batches from a topic equal the oracle, the consumer group follows
the shard's upper, a recovery's seek moves the group, bad messages are named by topic,
partition and offset."""

from __future__ import annotations

import json
import random

import pytest

from airflow_upsert_provider.engine.lifecycle import recovery
from airflow_upsert_provider.engine.store import streams
from airflow_upsert_provider.engine.config import ShardConfig
from airflow_upsert_provider.engine.errors import BadInputError
from airflow_upsert_provider.engine.lifecycle.group_offsets import group_consumer, read_committed
from airflow_upsert_provider.engine.table.shard import Shard
from airflow_upsert_provider.engine.sources.kafka import KafkaConfig
from airflow_upsert_provider.engine.sources.kafka_options import KafkaShardOptions
from airflow_upsert_provider.engine.write.writer import Writer
from tests.kafka.conftest import produce_changes
from tests.helpers import table

SCHEMA = json.dumps({"type": "struct", "fields": [
    {"name": "id", "type": "long", "nullable": True, "metadata": {}},
    {"name": "name", "type": "string", "nullable": True, "metadata": {}},
    {"name": "amount", "type": "double", "nullable": True, "metadata": {}},
]})


@pytest.fixture
def sqlite_consensus(sqlite_url):
    from airflow_upsert_provider.engine.store.registry import open_consensus

    store = open_consensus(sqlite_url)
    yield store
    store.dispose()


def changes(count: int, keys: int, seed: int) -> list[tuple[int, str, dict | None]]:
    """(partition, key, change) with every key in one partition (as a keyed producer puts
    it) and about one change in eight a tombstone."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        key = rng.randrange(keys)
        change = None if rng.random() < 0.125 else {"id": key, "name": f"n{i}", "amount": round(rng.random() * 100, 2)}
        out.append((key % 4, str(key), change))
    return out


def oracle(produced) -> dict[tuple, dict]:
    """The last message of each key by offset (a key lives in one partition); a tombstone
    deletes it."""
    table: dict[tuple, dict] = {}
    for message in sorted(produced, key=lambda m: (m.partition, m.offset)):
        key = (int(message.key),)
        if message.value is None:
            table.pop(key, None)
        else:
            table[key] = json.loads(message.value)
    return table


def kafka_shard(consensus, blob, bootstrap: str, topic: str, *, max_records: int, shard_id: str = "k",
                group_id: str | None = None) -> Shard:
    config = ShardConfig(source=f"kafka:{topic}", keys=("id",), schema=SCHEMA, buckets=2,
                         extra=KafkaShardOptions(max_records_per_batch=max_records, group_id=group_id).to_extra())
    return Shard.create(consensus, blob, shard_id, config,
                        kafka_config=KafkaConfig.from_dict({"bootstrap.servers": bootstrap}))


def group_offsets(shard: Shard) -> dict[str, int]:
    consumer = group_consumer(shard.source, shard.group_id)
    try:
        return read_committed(consumer, shard.source, shard.group_id, [str(p) for p in shard.source.partitions()])
    finally:
        consumer.close()


def test_batches_equal_the_oracle_and_the_group_follows_the_upper(spark, sqlite_consensus, blob, kafka_bootstrap, kafka_topic):
    produced = produce_changes(kafka_bootstrap, kafka_topic, changes(600, 80, seed=1))
    shard = kafka_shard(sqlite_consensus, blob, kafka_bootstrap, kafka_topic, max_records=250)
    writer = Writer(shard, "w1", spark_factory=lambda: spark)

    report = writer.run(max_batches=1)
    assert report.upper == 1
    # After each commit the group holds exactly the offsets bound at the upper.
    assert group_offsets(shard) == shard.bound_offsets(1)

    report = writer.run(max_batches=None, until_caught_up=True)
    assert report.upper == 3  # 600 offsets, 250 per batch
    marks = shard.source.high_watermarks()
    assert shard.bound_offsets(3) == {str(p): high for p, high in marks.items()}
    assert group_offsets(shard) == shard.bound_offsets(3)
    assert shard.group_id == "upsert-k"
    assert table(shard) == oracle(produced)
    rows_in = sum(b.stats["rows_in"] for b in shard.batches())
    tombstones = sum(1 for m in produced if m.value is None)
    assert rows_in == 600  # a JSON tombstone is a record: it deletes its key
    assert tombstones > 0

    # More messages later: the next run continues from the frontier, nothing skipped or read twice.
    more = produce_changes(kafka_bootstrap, kafka_topic, changes(120, 80, seed=2))
    writer.run(max_batches=None, until_caught_up=True)
    assert table(shard) == oracle(produced + more)
    assert sum(b.stats["rows_in"] for b in shard.batches()) == 720
    assert group_offsets(shard) == shard.bound_offsets(shard.state().upper)


def test_recovery_seek_sets_the_group_to_the_upper(spark, sqlite_consensus, blob, kafka_bootstrap, kafka_topic):
    produce_changes(kafka_bootstrap, kafka_topic, changes(200, 30, seed=3))
    shard = kafka_shard(sqlite_consensus, blob, kafka_bootstrap, kafka_topic, max_records=100, group_id="lag-tools-see-me")
    Writer(shard, "w1", spark_factory=lambda: spark).run(max_batches=None, until_caught_up=True)
    assert group_offsets(shard) == shard.bound_offsets(2)
    # A restore to an earlier upper is simulated by moving the group ahead of what a recovery
    # starts from; the seek must set it back to the shard's bound offsets at the upper.
    opened = streams.begin_recovery(sqlite_consensus, "k", "test", reason="drill")
    sought = recovery.seek(shard, epoch=opened.state.epoch, actor="test")
    assert sought.group is not None and sought.group["verified"] is True
    assert sought.group["positions"] == shard.bound_offsets(2)
    assert group_offsets(shard) == shard.bound_offsets(2)


def test_a_bad_message_is_named_by_topic_partition_and_offset(spark, sqlite_consensus, blob, kafka_bootstrap, kafka_topic):
    produce_changes(kafka_bootstrap, kafka_topic, [(1, "1", {"id": 1, "name": "a", "amount": 1.0}),
                                                    (1, "2", {"id": 2, "name": "b", "amount": "lots"})])
    shard = kafka_shard(sqlite_consensus, blob, kafka_bootstrap, kafka_topic, max_records=100)
    with pytest.raises(BadInputError) as raised:
        Writer(shard, "w1", spark_factory=lambda: spark).run(max_batches=1)
    message = raised.value.message
    assert f"kafka topic {kafka_topic!r} partition 1 offset 1" in message and "amount" in message
    assert raised.value.details["records"][0] == {
        "topic": kafka_topic, "partition": 1, "offset": 1, "reason": raised.value.details["records"][0]["reason"]}
    assert shard.state().upper == 0
    # Quarantine: the good record lands, the bad one is set aside with its position.
    report = Writer(shard, "w2", spark_factory=lambda: spark, on_bad_record="quarantine").run(max_batches=1)
    assert report.upper == 1
    assert table(shard) == {(1,): {"id": 1, "name": "a", "amount": 1.0}}
    rejects = shard.batches()[0].stats["rejects"]
    lines = [json.loads(line) for path in blob_files(blob.path(rejects["path"])) for line in open(path)]
    assert [r["file"] for r in lines] == [f"kafka:{kafka_topic}/1/1"]
    assert group_offsets(shard) == shard.bound_offsets(1)


def blob_files(directory: str) -> list[str]:
    import os

    return sorted(os.path.join(directory, n) for n in os.listdir(directory) if n.endswith(".json"))


def test_a_message_that_is_not_utf8_is_a_bad_record_not_a_failed_read(spark, sqlite_consensus, blob, kafka_bootstrap, kafka_topic):
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    producer.produce(kafka_topic, key=b"1", value=b'{"id": 1, "name": "ok", "amount": 1.0}', partition=2)
    producer.produce(kafka_topic, key=b"2", value=b'{"id": 2, "name": "\xff\xfe"}', partition=2)
    assert producer.flush(30) == 0
    shard = kafka_shard(sqlite_consensus, blob, kafka_bootstrap, kafka_topic, max_records=100)
    with pytest.raises(BadInputError) as raised:
        Writer(shard, "w1", spark_factory=lambda: spark).run(max_batches=1)
    assert f"kafka topic {kafka_topic!r} partition 2 offset 1: message value is not valid UTF-8" in raised.value.message
    report = Writer(shard, "w2", spark_factory=lambda: spark, on_bad_record="quarantine").run(max_batches=1)
    assert report.results[0].rejected == 1
    assert table(shard) == {(1,): {"id": 1, "name": "ok", "amount": 1.0}}
