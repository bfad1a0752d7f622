"""Kafka errors keep their class from the executor that raised them to the driver's caller:
a broker that does not answer is retryable (exit 2), a range the partition does not hold is
an integrity error (exit 4), never a plain Spark error (exit 1)."""

from __future__ import annotations

import base64
import json

import pytest

from airflow_upsert_provider.engine.store.records import Binding
from airflow_upsert_provider.engine.errors import (
    ConfigurationError,
    KafkaSliceUnavailable,
    KafkaUnavailable,
    UpsertError,
)
from airflow_upsert_provider.engine.sources import kafka
from airflow_upsert_provider.engine.sources.kafka import (
    ExecutorError,
    KafkaConfig,
    KafkaSource,
    carried_error,
    check_ranges,
    read_range,
)
from airflow_upsert_provider.engine.write.writer import Writer
from tests.kafka.conftest import produce_changes
from tests.kafka.test_kafka_shard import kafka_shard

SECRET = "exec-Pa55-77c1"
# Nothing listens on port 1 of loopback: a broker that never answers.
NO_BROKER = "127.0.0.1:1"


@pytest.fixture
def sqlite_consensus(sqlite_url):
    from airflow_upsert_provider.engine.store.registry import open_consensus

    store = open_consensus(sqlite_url)
    yield store
    store.dispose()


def test_a_carried_error_is_rebuilt_in_its_class_with_its_details() -> None:
    original = KafkaSliceUnavailable("kafka topic 't' partition 2: no message at offset 7\nsecond line",
                                     topic="t", partition=2, offset=7, end=9)
    carrier = ExecutorError(original)
    # What the driver sees: the executor's text inside a Spark error, its traceback around it.
    spark_error = RuntimeError(f"Job aborted due to stage failure: Traceback (most recent call last):\n"
                               f"  File \"kafka.py\", line 1, in read\n{kafka.__name__}.ExecutorError: {carrier}\n"
                               "\tat org.apache.spark.api.python.BasePythonRunner")
    rebuilt = carried_error(spark_error)
    assert type(rebuilt) is KafkaSliceUnavailable
    assert rebuilt.message == original.message and rebuilt.details == original.details
    assert rebuilt.exit_code == 4
    # Found through a cause chain too; nothing is made up where no error was carried.
    try:
        raise ValueError("wrapped") from spark_error
    except ValueError as wrapped:
        assert type(carried_error(wrapped)) is KafkaSliceUnavailable
    assert carried_error(RuntimeError("Job aborted: java.lang.OutOfMemoryError")) is None
    # A mark naming something that is not an engine error is not rebuilt.
    forged = base64.urlsafe_b64encode(json.dumps({"error": "Any", "message": "x", "details": {}}).encode()).decode()
    assert carried_error(RuntimeError(f"[upsert-error:{forged}]")) is None
    # A mark cut short (a truncated message) is skipped, never half decoded.
    assert carried_error(RuntimeError(str(ExecutorError(UpsertError("x")))[:-9] + "]")) is None


def test_a_stall_of_an_unreachable_broker_is_retryable_not_an_integrity_error() -> None:
    """No message within stall_timeout and the broker does not answer: the messages may well
    exist, so this is the cluster's outage (retryable), never "the range reaches past what
    the partition holds"."""
    config = KafkaConfig.from_dict({"bootstrap.servers": NO_BROKER, "sasl.password": SECRET})
    with pytest.raises(KafkaUnavailable) as caught:
        list(read_range(config, "orders", 0, 0, 5, stall_timeout=1.0, poll_timeout=0.2))
    assert caught.value.retryable is True and caught.value.exit_code == 2
    assert caught.value.details == {"topic": "orders", "partition": 0, "offset": 0, "end": 5}
    assert "kafka topic 'orders' partition 0: no message at offset 0 within 1s" in caught.value.message
    assert "the broker is slow or unreachable" in caught.value.message
    assert SECRET not in caught.value.message


def test_errors_raised_on_executors_reach_the_writer_in_their_class(
        spark, sqlite_consensus, blob, kafka_bootstrap, kafka_topic, monkeypatch) -> None:
    produce_changes(kafka_bootstrap, kafka_topic, [(0, str(i), {"id": i, "name": "n", "amount": 1.0}) for i in range(6)])
    shard = kafka_shard(sqlite_consensus, blob, kafka_bootstrap, kafka_topic, max_records=100)
    shard.source.stall_timeout = 1.0

    # 1. The executors cannot reach the brokers (the driver can): KafkaUnavailable, retryable.
    building = kafka._slice_data_source
    unreachable = KafkaConfig.from_dict({"bootstrap.servers": NO_BROKER, "sasl.password": SECRET})
    monkeypatch.setattr(kafka, "_slice_data_source", lambda config, topic, stall: building(unreachable, topic, stall))
    with pytest.raises(KafkaUnavailable) as caught:
        Writer(shard, "w1", spark_factory=lambda: spark).run(max_batches=1)
    assert caught.value.retryable is True and caught.value.exit_code == 2
    assert caught.value.details["topic"] == kafka_topic and caught.value.details["partition"] == 0
    assert SECRET not in caught.value.message
    assert shard.state().upper == 0
    monkeypatch.setattr(kafka, "_slice_data_source", building)

    # 2. The partition no longer holds the bound range when the executor reads it (the topic
    # was truncated after the driver checked it): KafkaSliceUnavailable, exit 4, naming the offset.
    assert Writer(shard, "w2", spark_factory=lambda: spark).run(max_batches=1).upper == 1
    bound = shard.bound_offsets(1)
    assert bound["0"] == 6
    ranges = {p: {"from": o, "to": o + 3 if p == "0" else o, "count": 3 if p == "0" else 0} for p, o in bound.items()}
    sqlite_consensus.mint_binding(shard.shard_id, Binding(1, ranges), "test")
    monkeypatch.setattr(KafkaSource, "check_slice", lambda self, ranges: check_ranges(ranges))
    with pytest.raises(KafkaSliceUnavailable) as caught:
        Writer(shard, "w3", spark_factory=lambda: spark).run(max_batches=1)
    assert caught.value.exit_code == 4 and caught.value.retryable is False
    assert caught.value.details == {"topic": kafka_topic, "partition": 0, "offset": 6, "end": 9}
    assert "no message at offset 6" in caught.value.message and "offsets 0..5" in caught.value.message
    assert shard.state().upper == 1


def test_a_carried_configuration_error_keeps_its_field() -> None:
    rebuilt = carried_error(RuntimeError(str(ExecutorError(
        ConfigurationError("kafka client config refused: bad value", field="kafka_config")))))
    assert type(rebuilt) is ConfigurationError and rebuilt.details == {"field": "kafka_config"}
