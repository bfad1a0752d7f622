"""Planning a Kafka binding: pure decisions over offsets, and the shard that mints them."""

from __future__ import annotations

import pytest

from airflow_upsert_provider.engine.common.time_text import parse_duration
from airflow_upsert_provider.engine.config import ShardConfig
from airflow_upsert_provider.engine.errors import ConfigurationError, KafkaSliceUnavailable
from airflow_upsert_provider.engine.table.shard import Shard
from airflow_upsert_provider.engine.sources.kafka import KafkaConfig, KafkaSource
from airflow_upsert_provider.engine.sources.kafka_options import KafkaShardOptions, load_kafka_config
from airflow_upsert_provider.engine.sources.kafka_planning import (
    lost_offsets,
    partition_order,
    plan_ranges,
    share_budget,
    start_offsets,
)
from tests.kafka.conftest import produce_changes
from tests.helpers import batch

SCHEMA = '{"type":"struct","fields":[{"name":"id","type":"long","nullable":true,"metadata":{}},{"name":"v","type":"string","nullable":true,"metadata":{}}]}'


# -- pure -------------------------------------------------------------------------------------


def test_share_budget_gives_every_backlog_a_share_and_passes_leftovers_on():
    assert share_budget({"0": 10, "1": 1000, "2": 0, "3": 500}, 100) == {"0": 10, "1": 45, "2": 0, "3": 45}


def test_share_budget_never_exceeds_budget_or_backlog():
    backlog = {str(p): n for p, n in enumerate([7, 3, 0, 11, 1])}
    for budget in range(1, 30):
        taken = share_budget(backlog, budget)
        assert sum(taken.values()) == min(budget, sum(backlog.values()))
        assert all(0 <= taken[p] <= backlog[p] for p in backlog)


def test_share_budget_remainder_goes_to_lowest_partitions_deterministically():
    assert share_budget({"10": 5, "2": 5, "1": 5}, 4) == {"1": 2, "2": 1, "10": 1}


def test_share_budget_refuses_an_empty_budget():
    with pytest.raises(ValueError):
        share_budget({"0": 1}, 0)


def test_starts_continue_from_the_previous_binding_and_new_partitions_start_at_low():
    previous = {"0": {"from": 0, "to": 40}, "1": {"from": 3, "to": 3}}
    marks = {"0": (0, 50), "1": (0, 9), "2": (5, 8)}
    assert start_offsets(previous, marks) == {"0": 40, "1": 3, "2": 5}


def test_plan_binds_contiguously_from_previous_within_the_budget():
    previous = {"0": {"from": 0, "to": 40}, "1": {"from": 0, "to": 3}}
    ranges = plan_ranges(previous, {"0": (0, 50), "1": (0, 9)}, max_records=8)
    assert ranges == {"0": {"from": 40, "to": 44, "count": 4}, "1": {"from": 3, "to": 7, "count": 4}}


def test_plan_is_none_when_nothing_new():
    assert plan_ranges({"0": {"from": 0, "to": 5}}, {"0": (0, 5), "1": (2, 2)}, 10) is None


def test_plan_keeps_a_partition_the_topic_no_longer_lists_at_its_frontier():
    ranges = plan_ranges({"0": {"from": 0, "to": 5}, "7": {"from": 0, "to": 2}}, {"0": (0, 6)}, 10)
    assert ranges == {"0": {"from": 5, "to": 6, "count": 1}, "7": {"from": 2, "to": 2, "count": 0}}


def test_lost_offsets_names_partitions_whose_next_offset_retention_deleted():
    lost = lost_offsets({"0": 10, "1": 4}, {"0": (12, 20), "1": (4, 9)})
    assert [(x.partition, x.start, x.low_watermark) for x in lost] == [("0", 10, 12)]


def test_partitions_sort_as_numbers():
    assert sorted(["10", "2", "1"], key=partition_order) == ["1", "2", "10"]


@pytest.mark.parametrize("text, seconds", [("90", 90), ("90s", 90), ("10m", 600), ("1h30m", 5400), ("1.5h", 5400), (" 2m ", 120)])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "abc", "10x", "-5", "1h-2m", "m"])
def test_parse_duration_refuses_what_is_not_a_positive_duration(text):
    with pytest.raises(ConfigurationError) as raised:
        parse_duration(text, field="--for")
    assert "--for" in raised.value.message


# -- options and client config ------------------------------------------------------------------


def test_kafka_options_are_validated_when_the_shard_config_is_built():
    with pytest.raises(ConfigurationError) as raised:
        ShardConfig(source="kafka:t", keys=("id",), schema=SCHEMA, extra={"kafka": {"envelope": "avro"}})
    assert "avro" in raised.value.message
    with pytest.raises(ConfigurationError):
        ShardConfig(source="kafka:t", keys=("id",), schema=SCHEMA, extra={"kafka": {"max_records_per_batch": 0}})
    with pytest.raises(ConfigurationError) as raised:
        ShardConfig(source="kafka:t", keys=("id",), schema=SCHEMA, extra={"kafka": {"batch": 5}})
    assert "batch" in raised.value.message
    config = ShardConfig(source="kafka:t", keys=("id",), schema=SCHEMA, extra=KafkaShardOptions(envelope="debezium").to_extra())
    assert KafkaShardOptions.from_extra(ShardConfig.from_json(config.to_json()).extra).envelope == "debezium"


def test_client_config_file_errors_name_the_file_and_never_a_value(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"bootstrap.servers": "x", "sasl.password": "hunter2"')
    with pytest.raises(ConfigurationError) as raised:
        load_kafka_config(str(bad))
    assert str(bad) in raised.value.message and "hunter2" not in raised.value.message
    missing = tmp_path / "missing.json"
    missing.write_text('{"sasl.password": "hunter2"}')
    with pytest.raises(ConfigurationError) as raised:
        load_kafka_config(str(missing))
    assert "bootstrap.servers" in raised.value.message and "hunter2" not in raised.value.message
    with pytest.raises(ConfigurationError) as raised:
        load_kafka_config(str(tmp_path / "absent.json"))
    assert "absent.json" in raised.value.message


# -- the shard mints Kafka bindings ---------------------------------------------------------------


def kafka_shard(consensus, blob, bootstrap: str, topic: str, *, max_records: int = 1000, shard_id: str = "k") -> Shard:
    config = ShardConfig(source=f"kafka:{topic}", keys=("id",), schema=SCHEMA,
                         extra=KafkaShardOptions(max_records_per_batch=max_records).to_extra())
    return Shard.create(consensus, blob, shard_id, config,
                        kafka_config=KafkaConfig.from_dict({"bootstrap.servers": bootstrap}))


def test_shard_mints_contiguous_bindings_from_the_watermarks(sqlite_consensus, blob, kafka_bootstrap, kafka_topic):
    produced = produce_changes(kafka_bootstrap, kafka_topic,
                               [(i % 4, str(i), {"id": i, "v": "x"}) for i in range(30)])
    shard = kafka_shard(sqlite_consensus, blob, kafka_bootstrap, kafka_topic, max_records=12)
    per_partition = {str(p): sum(1 for m in produced if m.partition == p) for p in range(4)}
    first = shard.mint_binding(0, minted_by="test")
    assert {p: r["to"] - r["from"] for p, r in first.ranges.items()} == {"0": 3, "1": 3, "2": 3, "3": 3}
    assert all(r["from"] == 0 for r in first.ranges.values())
    # Minted once: a second call returns the stored binding.
    assert shard.mint_binding(0, minted_by="other").ranges == first.ranges
    second = shard.mint_binding(1, minted_by="test")
    assert {p: r["from"] for p, r in second.ranges.items()} == first.to_offsets()
    third = shard.mint_binding(2, minted_by="test")
    assert third.to_offsets() == per_partition
    assert shard.mint_binding(3, minted_by="test") is None
    status = shard.status()
    assert status.high_watermark == per_partition
    assert sum(status.lag_offsets.values()) == 30  # nothing committed yet: upper is 0
    assert (status.lag, status.lag_unit) == (30, "records")
    # Batch 0 committed (12 records bound): the lag is the 18 records after its offsets.
    assert shard.compare_and_append(0, 1, batch(0, token="t0"), epoch=0).upper == 1
    status = shard.status()
    assert (status.lag, status.lag_unit) == (30 - 12, "records")
    assert status.lag == sum(per_partition[p] - to for p, to in first.to_offsets().items())


def test_shard_refuses_to_bind_past_offsets_retention_deleted(sqlite_consensus, blob, kafka_bootstrap, kafka_topic):
    produce_changes(kafka_bootstrap, kafka_topic, [(0, "1", {"id": 1, "v": "a"}), (0, "2", {"id": 2, "v": "b"})])
    shard = kafka_shard(sqlite_consensus, blob, kafka_bootstrap, kafka_topic)
    shard.mint_binding(0, minted_by="test")
    produce_changes(kafka_bootstrap, kafka_topic, [(0, "3", {"id": 3, "v": "c"}) for _ in range(5)])

    class Retained(KafkaSource):
        def watermarks(self):  # the mock cluster has no retention: pretend offsets 2..4 went
            return {p: ((5, high) if p == 0 else (low, high)) for p, (low, high) in super().watermarks().items()}

    shard.source = Retained(kafka_topic, shard.source.config)
    with pytest.raises(KafkaSliceUnavailable) as raised:
        shard.mint_binding(1, minted_by="test")
    assert "partition 0" in raised.value.message and "offsets 2..4" in raised.value.message
    assert shard.binding(1) is None


def test_a_kafka_shard_opened_without_client_config_says_how_to_give_one(sqlite_consensus, blob, kafka_bootstrap, kafka_topic):
    produce_changes(kafka_bootstrap, kafka_topic, [(0, "1", {"id": 1, "v": "a"})])
    kafka_shard(sqlite_consensus, blob, kafka_bootstrap, kafka_topic)
    shard = Shard.open(sqlite_consensus, blob, "k")
    assert shard.state().upper == 0  # consensus alone works
    with pytest.raises(ConfigurationError) as raised:
        shard.mint_binding(0, minted_by="test")
    assert "--kafka-config" in raised.value.message and "kafka_conn_id" in raised.value.message


@pytest.fixture
def sqlite_consensus(sqlite_url):
    from airflow_upsert_provider.engine.store.registry import open_consensus

    store = open_consensus(sqlite_url)
    yield store
    store.dispose()


def test_client_log_lines_go_through_python_logging_with_secrets_masked(caplog):
    from airflow_upsert_provider.engine.sources.kafka import open_consumer

    config = KafkaConfig.from_dict({
        "bootstrap.servers": "127.0.0.1:1", "sasl.password": "s3cr3t-value",
        # An odd setting the client warns about, quoting both values.
        "socket.timeout.ms": 100, "fetch.wait.max.ms": 500,
    })
    with caplog.at_level("DEBUG", logger="airflow_upsert_provider.kafka.client"):
        consumer = open_consumer(config)
        consumer.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "airflow_upsert_provider.kafka.client"]
    assert any("fetch.wait.max.ms" in line for line in lines), lines
    assert not any("s3cr3t-value" in line for line in lines)
