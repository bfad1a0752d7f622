"""Fields a Kafka record carries that the shard's schema does not name: counted as the messages
are parsed on the executors (``map_messages``), per slice batch, merged on the driver
(``kafka_field_counts``); the shard's schema evolution policy then judges them (the
default adds them as columns; tests/schema/test_kafka_*.py cover the policies)."""

from __future__ import annotations

import json
import logging
import random

from airflow_upsert_provider.engine.config import ShardConfig
from airflow_upsert_provider.engine.sources.kafka import KafkaConfig
from airflow_upsert_provider.engine.sources.kafka_options import KafkaShardOptions
from airflow_upsert_provider.engine.table.shard import Shard
from airflow_upsert_provider.engine.write.kafka_records import kafka_field_counts, map_messages, message_file
from airflow_upsert_provider.engine.write.writer import Writer
from tests.helpers import table
from tests.kafka.conftest import produce_changes
from tests.kafka.test_kafka_records import slice_batch
from tests.kafka.test_kafka_shard import SCHEMA, sqlite_consensus  # noqa: F401 - a fixture

TOPIC = "orders"
KNOWN = ("id", "name", "amount")
EXTRA = ("email", "phone", "meta", "Name")  # "Name" differs from "name" by case: not named


def _random_record(rng: random.Random, key: int) -> dict:
    record = {"id": key, "name": f"n{key}", "amount": 1.5}
    for name in rng.sample(EXTRA, rng.randint(0, len(EXTRA))):
        record[name] = {"id": 9} if name == "meta" else "x"  # a nested object's keys are not fields
    return record


def _random_message(rng: random.Random, envelope: str, key: int) -> tuple[str, str | None, dict | None]:
    """(message key, value, the record whose fields count or None)."""
    kind = rng.random()
    if kind < 0.1:
        return json.dumps({"id": key}), None, None  # a tombstone
    if kind < 0.15:
        return json.dumps({"id": key}), "not json", None  # a bad message: no record to count
    record = _random_record(rng, key)
    if envelope == "json":
        return json.dumps({"id": key}), json.dumps(record), record
    if kind < 0.3:  # a delete: its before's fields reach no column
        return json.dumps({"id": key}), json.dumps({"op": "d", "before": record, "after": None}), None
    event = {"op": rng.choice("cru"), "before": None, "after": record, "source": {"lsn": key}, "email": "top"}
    if rng.random() < 0.5:
        event = {"schema": {"type": "struct"}, "payload": event}
    return json.dumps({"id": key}), json.dumps(event), record


def test_fields_are_counted_per_slice_batch_and_merged_with_their_first_message():
    """Over seeded topics of both envelopes, cut into slice batches at random points: the
    merged counts equal an independent count, the first message is the lowest (partition,
    offset) carrying the field, and each slice batch carries its counts on one row only."""
    for seed in range(200):
        rng = random.Random(seed)
        envelope = rng.choice(["json", "debezium"])
        expected: dict[str, list] = {}
        slices = []
        for partition in rng.sample(range(12), rng.randint(1, 4)):
            offset = rng.randrange(0, 10**12)
            messages = []
            for _ in range(rng.randint(0, 40)):
                key, value, record = _random_message(rng, envelope, rng.randrange(100))
                messages.append((partition, offset, key, value))
                for name in set(record or ()) - set(KNOWN):
                    counted = expected.setdefault(name, [0, (partition, offset)])
                    counted[0] += 1
                    counted[1] = min(counted[1], (partition, offset))
                offset += rng.randint(1, 3)  # transactions leave gaps
            cuts = sorted(rng.sample(range(len(messages) + 1), rng.randint(0, min(3, len(messages) + 1))))
            for start, end in zip([0, *cuts], [*cuts, len(messages)]):
                slices.append(messages[start:end])
        rng.shuffle(slices)  # the order tasks report in is any order
        entries = []
        for messages in slices:
            rows = map_messages(slice_batch(messages), topic=TOPIC, keys=("id",), envelope=envelope,
                                known=KNOWN).to_pydict()["_unknown"]
            assert all(row is None for row in rows[1:]), (seed, rows)
            entries += rows[0] if rows and rows[0] else []
        assert kafka_field_counts(TOPIC, entries) == [
            (name, records, message_file(TOPIC, *first)) for name, (records, first) in sorted(expected.items())
        ], seed
    # Without ``known`` nothing is counted (the schema inference reads records that way).
    rows = map_messages(slice_batch([(0, 1, None, '{"id": 1, "email": "x"}')]), topic=TOPIC, keys=("id",),
                        envelope="json").to_pydict()
    assert rows["_unknown"] == [None]


def test_kafka_field_counts_sums_and_picks_the_lowest_partition_then_offset():
    entries = [
        {"name": "email", "records": 2, "partition": 10, "offset": 3},
        {"name": "email", "records": 5, "partition": 2, "offset": 900},
        {"name": "email", "records": 1, "partition": 2, "offset": 17},
        {"name": "phone", "records": 1, "partition": 0, "offset": 4},
    ]
    # Partition 2 comes before 10 as a number, not as text.
    assert kafka_field_counts("t", entries) == [("email", 8, "kafka:t/2/17"), ("phone", 1, "kafka:t/0/4")]
    assert kafka_field_counts("t", []) == []


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "the shard's schema does not name" in r.getMessage()]


def _kafka_shard(consensus, blob, bootstrap: str, topic: str, envelope: str) -> Shard:
    config = ShardConfig(source=f"kafka:{topic}", keys=("id",), schema=SCHEMA, buckets=2,
                         extra=KafkaShardOptions(max_records_per_batch=1000, envelope=envelope).to_extra())
    return Shard.create(consensus, blob, "drift", config,
                        kafka_config=KafkaConfig.from_dict({"bootstrap.servers": bootstrap}))


def test_a_json_kafka_batch_adds_the_fields_the_schema_does_not_name_as_columns_typed_by_their_values(
        spark, sqlite_consensus, blob, kafka_bootstrap, kafka_topic, caplog):  # noqa: F811 - the fixture
    produce_changes(kafka_bootstrap, kafka_topic, [
        (1, "1", {"id": 1, "name": "a", "email": "x@y"}),
        (1, "2", {"id": 2, "name": "b", "email": "z@y", "meta": {"id": 9, "inner": 1}}),
        (3, "3", {"id": 3, "name": "c", "email": "w@y"}),
        (3, "4", {"id": 4, "name": "d"}),
        (0, "5", None),  # a tombstone has no fields
    ])
    shard = _kafka_shard(sqlite_consensus, blob, kafka_bootstrap, kafka_topic, "json")
    with caplog.at_level(logging.WARNING):
        result = Writer(shard, "w", spark_factory=lambda: spark).step()
    assert (result.outcome, result.rows_in, result.unknown_fields) == ("committed", 5, {})
    # Under the default policy (add_columns) they became columns, typed as Spark infers JSON.
    meta = {"type": "struct", "fields": [{"name": n, "type": "long", "nullable": True, "metadata": {}}
                                         for n in ("id", "inner")]}
    assert [(f["name"], f["type"]) for f in json.loads(shard.config.schema)["fields"][3:]] == [
        ("email", "string"), ("meta", meta)]
    assert _warnings(caplog) == []
    assert table(shard) == {
        (1,): {"id": 1, "name": "a", "amount": None, "email": "x@y", "meta": None},
        (2,): {"id": 2, "name": "b", "amount": None, "email": "z@y", "meta": {"id": 9, "inner": 1}},
        (3,): {"id": 3, "name": "c", "amount": None, "email": "w@y", "meta": None},
        (4,): {"id": 4, "name": "d", "amount": None, "email": None, "meta": None},
    }


def test_a_debezium_batch_adds_the_fields_of_after_only(spark, sqlite_consensus, blob, kafka_bootstrap,  # noqa: F811
                                                          kafka_topic, caplog):
    def change(op: str, before: dict | None, after: dict | None) -> dict:
        return {"schema": {"type": "struct"}, "payload": {"op": op, "before": before, "after": after,
                                                         "source": {"lsn": 1}, "ts_ms": 1}}

    produce_changes(kafka_bootstrap, kafka_topic, [
        (2, "1", change("c", None, {"id": 1, "name": "a", "email": "x@y"})),
        (2, "1", change("u", {"id": 1, "phone": "1"}, {"id": 1, "name": "b", "email": "x@y"})),
        (0, "7", change("d", {"id": 7, "phone": "2"}, None)),  # before's fields reach no column
        (0, "8", change("r", None, {"id": 8, "name": "c"})),
    ])
    shard = _kafka_shard(sqlite_consensus, blob, kafka_bootstrap, kafka_topic, "debezium")
    with caplog.at_level(logging.WARNING):
        result = Writer(shard, "w", spark_factory=lambda: spark).step()
    assert (result.outcome, result.unknown_fields) == ("committed", {})
    assert [f["name"] for f in json.loads(shard.config.schema)["fields"]] == ["id", "name", "amount", "email"]
    assert _warnings(caplog) == []
    assert table(shard) == {(1,): {"id": 1, "name": "b", "amount": None, "email": "x@y"},
                            (8,): {"id": 8, "name": "c", "amount": None, "email": None}}
