"""Transactional producers: every consumer the engine opens reads committed messages only, so
that the high watermark a binding uses is the last stable offset, and a committed
transaction's messages (with the commit markers between them) are bound and read exactly.

librdkafka's mock cluster serves transactional producers but neither reports the last stable
offset nor lists aborted transactions in its fetch answers, so what a real broker does with
an open or aborted transaction under read_committed is not reproduced here; what the engine
controls is: the isolation level it asks for, and reading ranges that end on markers."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_upsert_provider.engine.lifecycle.group_offsets import group_consumer
from airflow_upsert_provider.engine.sources.kafka import KafkaConfig, KafkaSource, read_range
from airflow_upsert_provider.engine.write.writer import Writer
from tests.kafka.test_kafka_shard import kafka_shard
from tests.helpers import table


@pytest.fixture
def sqlite_consensus(sqlite_url):
    from airflow_upsert_provider.engine.store.registry import open_consensus

    store = open_consensus(sqlite_url)
    yield store
    store.dispose()


def test_every_consumer_reads_committed_messages_whatever_the_config_says(monkeypatch) -> None:
    import confluent_kafka

    created: list[dict[str, Any]] = []

    class Recorder:
        def __init__(self, properties: dict[str, Any]) -> None:
            created.append(dict(properties))

        def close(self) -> None:
            pass

    monkeypatch.setattr(confluent_kafka, "Consumer", Recorder)
    config = KafkaConfig.from_dict({"bootstrap.servers": "broker:9092", "isolation.level": "read_uncommitted"})
    source = KafkaSource("orders", config)
    source.consumer()  # the watermarks' consumer: its high watermark is what bindings end at
    group_consumer(source, "upsert-orders")
    assert [c["isolation.level"] for c in created] == ["read_committed", "read_committed"]
    assert config.properties["isolation.level"] == "read_uncommitted"  # the given config is left as given


def produce_transaction(bootstrap: str, topic: str, records: list[tuple[int, str, dict]], *, commit: bool) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx-{topic}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for partition, key, change in records:
        producer.produce(topic, key=key, value=json.dumps(change), partition=partition)
    producer.flush(30)
    if commit:
        producer.commit_transaction(30)
    else:
        producer.abort_transaction(30)


def test_committed_transactions_are_bound_and_read_across_their_markers(
        spark, sqlite_consensus, blob, kafka_bootstrap, kafka_topic) -> None:
    first = [(0, str(i), {"id": i, "name": f"a{i}", "amount": float(i)}) for i in range(4)]
    second = [(0, str(i), {"id": i, "name": f"b{i}", "amount": float(i) + 0.5}) for i in range(2, 6)]
    produce_transaction(kafka_bootstrap, kafka_topic, first, commit=True)
    produce_transaction(kafka_bootstrap, kafka_topic, second, commit=True)
    shard = kafka_shard(sqlite_consensus, blob, kafka_bootstrap, kafka_topic, max_records=5)
    marks = shard.source.high_watermarks()
    # Each transaction ends with a commit marker that takes an offset and is no message.
    assert marks[0] == len(first) + len(second) + 2

    report = Writer(shard, "w1", spark_factory=lambda: spark).run(max_batches=None, until_caught_up=True)
    assert shard.bound_offsets(report.upper) == {str(p): high for p, high in marks.items()}
    expected = {(i,): {"id": i, "name": f"a{i}", "amount": float(i)} for i in range(2)}
    expected.update({(i,): {"id": i, "name": f"b{i}", "amount": float(i) + 0.5} for i in range(2, 6)})
    assert table(shard) == expected
    assert sum(b.stats["rows_in"] for b in shard.batches()) == len(first) + len(second)

    # A range that ends on a marker completes at once: the reader's position passes it.
    offsets = [o for batch in read_range(shard.source.config, kafka_topic, 0, 0, marks[0], stall_timeout=30.0)
               for o in batch.column("offset").to_pylist()]
    assert offsets == [0, 1, 2, 3, 5, 6, 7, 8]
