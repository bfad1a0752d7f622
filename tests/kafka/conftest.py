"""A librdkafka mock cluster for the Kafka tests, and a producer of change records.

The mock cluster lives inside the client object that creates it and dies with it, so one
spawned process owns it for the whole test session: it creates the cluster, reports the
bootstrap address through a pipe and keeps the object alive until told to stop (or until
the pipe closes because the test process went away). Spark's executor processes and the
tests reach it on loopback like any broker.
"""

from __future__ import annotations

import json
import multiprocessing
import uuid
from dataclasses import dataclass
from typing import Any, Iterable

import pytest

MOCK_PARTITIONS = 4  # the mock cluster creates every topic with this many partitions


def own_mock_cluster(conn: Any) -> None:
    """Body of the owner process: the cluster exists as long as ``producer`` does."""
    from confluent_kafka import Producer

    producer = Producer({"test.mock.num.brokers": 1})
    brokers = producer.list_topics(timeout=10).brokers.values()
    conn.send(",".join(f"{b.host}:{b.port}" for b in brokers))
    try:
        conn.recv()  # a stop message, or EOFError when the test process is gone
    except EOFError:
        pass
    del producer


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterable[str]:
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    owner = context.Process(target=own_mock_cluster, args=(theirs,), name="kafka-mock-cluster", daemon=True)
    owner.start()
    theirs.close()
    try:
        if not ours.poll(60):
            raise RuntimeError("the mock Kafka cluster did not report its address within 60s")
        bootstrap = ours.recv()
        yield bootstrap
    finally:
        try:
            ours.send("stop")
        except (BrokenPipeError, OSError):
            pass
        owner.join(10)
        if owner.is_alive():
            owner.terminate()
            owner.join(5)
        ours.close()


@pytest.fixture
def kafka_topic() -> str:
    """A topic no other test writes: the mock cluster creates it on first use."""
    return f"changes-{uuid.uuid4().hex[:10]}"


@dataclass(frozen=True)
class Produced:
    partition: int
    offset: int
    key: str | None
    value: str | None


def produce_changes(bootstrap: str, topic: str, records: Iterable[tuple[int, str | None, dict[str, Any] | None]]) -> list[Produced]:
    """Produce ``(partition, key, change)`` records, the change as JSON (None is a tombstone),
    and return what the cluster acknowledged, with the offsets it assigned (in the order of
    the acknowledgements). Fails unless every record was acknowledged."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    acknowledged: list[Produced] = []
    failures: list[str] = []

    def delivered(error: Any, message: Any) -> None:
        if error is not None:
            failures.append(str(error))
            return
        key = message.key()
        value = message.value()
        acknowledged.append(
            Produced(message.partition(), message.offset(), None if key is None else key.decode(), None if value is None else value.decode())
        )

    count = 0
    for partition, key, change in records:
        value = None if change is None else json.dumps(change, sort_keys=True)
        producer.produce(topic, key=key, value=value, partition=partition, on_delivery=delivered)
        count += 1
        producer.poll(0)
    remaining = producer.flush(30)
    assert remaining == 0 and not failures and len(acknowledged) == count, (remaining, failures, len(acknowledged), count)
    return acknowledged
