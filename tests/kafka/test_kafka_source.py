"""KafkaSource against librdkafka's mock cluster: partitions, watermarks, and bound slices
read by Spark executors, exactly the offsets bound; client-config errors; secrets kept out of
reprs, errors and Spark plans."""

from __future__ import annotations

import json

import pytest

from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.engine.sources.kafka import (
    KafkaConfig,
    KafkaSliceUnavailable,
    KafkaSource,
    open_consumer,
    read_range,
)
from tests.kafka.conftest import MOCK_PARTITIONS, produce_changes

SECRET = "s3cr3t-Pa55-4f9a"
KEY_SECRET = "k3y-Pa55-77c1"


def config_with_secrets(bootstrap: str) -> KafkaConfig:
    return KafkaConfig.from_dict(
        {"bootstrap.servers": bootstrap, "sasl.username": "reader", "sasl.password": SECRET, "ssl.key.password": KEY_SECRET}
    )


def produce_per_partition(bootstrap: str, topic: str, counts: dict[int, int]):
    records = [
        (partition, f"id-{partition}-{n}", {"id": f"{partition}-{n}", "n": n, "deleted": n % 5 == 4})
        for partition, count in counts.items()
        for n in range(count)
    ]
    return produce_changes(bootstrap, topic, records)


@pytest.mark.parametrize(
    "raw, field, says",
    [
        ({}, "bootstrap.servers", "'bootstrap.servers' is required"),
        ({"bootstrap.servers": "  "}, "bootstrap.servers", "'bootstrap.servers' is required"),
        ({"bootstrap.servers": 9092}, "bootstrap.servers", "'bootstrap.servers' is required"),
        ("bootstrap.servers=x:1", "kafka_config", "must be a JSON object"),
        ({"bootstrap.servers": "x:1", "sasl.password": ["nested", SECRET]}, "sasl.password", "must be a string, number or boolean"),
    ],
)
def test_config_errors_name_the_field(raw, field, says):
    with pytest.raises(ConfigurationError) as caught:
        KafkaConfig.from_dict(raw)
    assert caught.value.details["field"] == field
    assert says in caught.value.message
    assert SECRET not in str(caught.value)


def test_secrets_never_shown_by_config_source_or_client_errors():
    raw = {
        "bootstrap.servers": "127.0.0.1:1",
        "sasl.username": "reader",
        "sasl.password": SECRET,
        "ssl.key.password": KEY_SECRET,
        "sasl.oauthbearer.client.secret": "oauth-" + SECRET,
        "group.id": "g1",
    }
    config = KafkaConfig.from_dict(raw)
    assert config.properties == raw  # kept as given for the client
    assert config.redacted() == {
        "bootstrap.servers": "127.0.0.1:1",
        "sasl.username": "reader",
        "sasl.password": "***",
        "ssl.key.password": "***",
        "sasl.oauthbearer.client.secret": "***",
        "group.id": "g1",
    }
    shown = [repr(config), str(config), f"{config}", repr(KafkaSource("t", config))]
    for text in shown:
        assert SECRET not in text and KEY_SECRET not in text
        assert "127.0.0.1:1" in text
    assert config.scrub(f"bad value {SECRET!r} and oauth-{SECRET}") == "bad value '***' and ***"
    # The client library quotes values in its own errors: what leaves the module is scrubbed.
    bad = KafkaConfig.from_dict({**raw, "security.protocol": SECRET})
    with pytest.raises(ConfigurationError) as caught:
        open_consumer(bad)
    assert SECRET not in str(caught.value) and "kafka client config refused" in caught.value.message


def test_partitions_and_watermarks(kafka_bootstrap, kafka_topic):
    counts = {0: 5, 1: 0, 2: 3, 3: 7}
    produced = produce_per_partition(kafka_bootstrap, kafka_topic, counts)
    assert sorted((p.partition, p.offset) for p in produced) == sorted((p, n) for p, c in counts.items() for n in range(c))
    with KafkaSource(kafka_topic, config_with_secrets(kafka_bootstrap)) as source:
        assert source.partitions() == list(range(MOCK_PARTITIONS))
        assert source.high_watermarks() == counts
        assert source.low_watermarks() == {0: 0, 1: 0, 2: 0, 3: 0}
        assert source.watermarks() == {p: (0, c) for p, c in counts.items()}
        # Ranges are checked against what the partitions hold, naming topic, partition, offset.
        assert source.check_slice({3: (2, 7), 1: (0, 0)}) == {1: (0, 0), 3: (2, 7)}
        with pytest.raises(KafkaSliceUnavailable) as caught:
            source.check_slice({0: (0, 5), 2: (1, 4)})
        assert caught.value.message == (
            f"kafka topic {kafka_topic!r} partition 2: range [1, 4) reaches past the high watermark 3: offset 3 has no message yet"
        )
        assert caught.value.details == {"topic": kafka_topic, "partition": 2, "offset": 3, "high_watermark": 3}
        with pytest.raises(ConfigurationError, match="has no partition 4"):
            source.check_slice({4: (0, 1)})
        with pytest.raises(ConfigurationError, match=r"range \[5, 2\) ends before it starts"):
            source.check_slice({0: (5, 2)})


def test_executor_read_past_the_high_watermark_fails_naming_the_offset(kafka_bootstrap, kafka_topic):
    """What an executor does when the slice outruns the partition (the driver's check passed,
    then the topic changed): it fails instead of waiting forever or returning fewer rows."""
    produce_per_partition(kafka_bootstrap, kafka_topic, {1: 4})
    config = config_with_secrets(kafka_bootstrap)
    # The range starts inside the partition and ends past it: the reader stalls at offset 4.
    # The stall clock also runs while the consumer connects: 1 s was too short on a slow machine.
    rows = []
    with pytest.raises(KafkaSliceUnavailable) as caught:
        for batch in read_range(config, kafka_topic, 1, 2, 6, stall_timeout=5.0, poll_timeout=0.2):
            rows += batch.column("offset").to_pylist()
    assert rows == [2, 3]
    assert caught.value.details == {"topic": kafka_topic, "partition": 1, "offset": 4, "end": 6}
    assert f"kafka topic {kafka_topic!r} partition 1: no message at offset 4" in caught.value.message
    # The range starts past the partition's end: the broker says out of range, at once.
    with pytest.raises(KafkaSliceUnavailable) as caught:
        list(read_range(config, kafka_topic, 1, 9, 10, stall_timeout=5.0, poll_timeout=0.2))
    assert caught.value.details["partition"] == 1 and caught.value.details["offset"] == 9
    assert f"kafka topic {kafka_topic!r} partition 1: reading offset 9" in caught.value.message
    assert SECRET not in caught.value.message


def test_read_slice_on_executors_reads_exactly_the_bound_offsets(spark, kafka_bootstrap, kafka_topic):
    counts = {0: 12, 1: 9, 2: 6, 3: 10}
    produced = produce_per_partition(kafka_bootstrap, kafka_topic, counts)
    produce_changes(kafka_bootstrap, kafka_topic, [(2, "id-2-gone", None)])  # a tombstone at offset 6
    ranges = {0: (3, 11), 1: (0, 9), 2: (4, 7), 3: (5, 5)}
    expected = sorted(
        [(p.partition, p.offset, p.key, p.value) for p in produced if ranges[p.partition][0] <= p.offset < ranges[p.partition][1]]
        + [(2, 6, "id-2-gone", None)]
    )
    config = config_with_secrets(kafka_bootstrap)
    with KafkaSource(kafka_topic, config) as source:
        df = source.read_slice(spark, ranges)
        # One Spark input partition per non-empty range: the empty one costs no task.
        assert df.rdd.getNumPartitions() == 3
        rows = df.collect()
        assert [f.name for f in df.schema.fields] == ["partition", "offset", "key", "value", "timestamp", "problem"]
        assert sorted((r.partition, r.offset, r.key, r.value) for r in rows) == expected
        assert len(rows) == len(expected) == 8 + 9 + 3
        assert all(r.timestamp is not None for r in rows)
        assert json.loads(next(r.value for r in rows if (r.partition, r.offset) == (0, 3))) == {"deleted": False, "id": "0-3", "n": 3}

        # Nothing reaches Spark's description of the query: plans, explain output, options.
        # (PythonSQLUtils.explainString is what DataFrame.explain(mode) prints.)
        explain = spark._jvm.org.apache.spark.sql.api.python.PythonSQLUtils.explainString
        plans = [df._jdf.queryExecution().toString()] + [
            explain(df._jdf.queryExecution(), mode) for mode in ("extended", "formatted", "cost", "codegen")
        ]
        assert any("upsert_kafka_slice_" in plan for plan in plans)  # the plans are the ones of this read
        for plan in plans:
            assert SECRET not in plan and KEY_SECRET not in plan

        # All ranges empty: an empty DataFrame with the slice's columns, no broker reads.
        empty = source.read_slice(spark, {p: (0, 0) for p in range(MOCK_PARTITIONS)})
        assert empty.collect() == [] and empty.columns == df.columns

        # A range past the high watermark is refused before any task runs.
        with pytest.raises(KafkaSliceUnavailable, match=rf"kafka topic '{kafka_topic}' partition 3: range \[5, 11\)"):
            source.read_slice(spark, {0: (0, 1), 3: (5, 11)})
