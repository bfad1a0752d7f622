"""Schema evolution applied by Kafka batches, on the librdkafka mock cluster and a real Spark
session: a Debezium topic whose events gain a field, under policies ``add_columns`` (the
default) and ``none``, and messages that disagree on a new field's type."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_upsert_provider.engine.config import ShardConfig
from airflow_upsert_provider.engine.errors import BadInputError, BatchSchemaRefused
from airflow_upsert_provider.engine.sources.kafka import KafkaConfig
from airflow_upsert_provider.engine.sources.kafka_options import KafkaShardOptions
from airflow_upsert_provider.engine.store.table_schemas import run_schema_version
from airflow_upsert_provider.engine.table.schema_apply import set_schema_policy
from airflow_upsert_provider.engine.table.shard import Shard
from airflow_upsert_provider.engine.write.kafka_records import message_file
from airflow_upsert_provider.engine.write.records import refused_field_reason
from airflow_upsert_provider.engine.write.writer import Writer
from tests.helpers import quarantined_records, table
from tests.kafka.conftest import kafka_bootstrap, kafka_topic, produce_changes  # noqa: F401 - fixtures
from tests.kafka.test_kafka_shard import SCHEMA, sqlite_consensus  # noqa: F401 - a fixture

ROW_FIELDS = [{"type": "int64", "optional": False, "field": "id"},
              {"type": "string", "optional": True, "field": "name"},
              {"type": "float64", "optional": True, "field": "amount"}]
RANK = {"type": "int16", "optional": True, "field": "rank"}


def _event(op: str, after: dict, fields: list[dict], lsn: int) -> dict:
    """A Debezium change event as the JsonConverter sends it with schemas on."""
    row = {"type": "struct", "optional": True, "name": "db.public.orders.Value", "fields": fields}
    schema = {"type": "struct", "name": "db.public.orders.Envelope", "fields": [
        {**row, "field": "before"}, {**row, "field": "after"},
        {"type": "struct", "optional": False, "field": "source", "fields": [{"type": "int64", "optional": True, "field": "lsn"}]},
        {"type": "string", "optional": False, "field": "op"}]}
    return {"schema": schema, "payload": {"op": op, "before": None, "after": after, "source": {"lsn": lsn}}}


def _shard(consensus, blob, bootstrap: str, topic: str) -> Shard:
    config = ShardConfig(source=f"kafka:{topic}", keys=("id",), schema=SCHEMA, buckets=2,
                         extra=KafkaShardOptions(max_records_per_batch=1000, envelope="debezium").to_extra())
    return Shard.create(consensus, blob, "orders", config, kafka_config=KafkaConfig.from_dict({"bootstrap.servers": bootstrap}))


def _columns(shard: Shard) -> list[tuple[str, object, bool]]:
    return [(f["name"], f["type"], f["nullable"]) for f in json.loads(shard.refresh_schema().schema)["fields"]]


BASE_COLUMNS = [("id", "long", True), ("name", "string", True), ("amount", "double", True)]


def test_a_debezium_topic_whose_events_gain_an_optional_field_adds_a_nullable_column(
        spark, sqlite_consensus, blob, kafka_bootstrap, kafka_topic):  # noqa: F811 - fixtures
    produce_changes(kafka_bootstrap, kafka_topic, [
        (0, "1", _event("c", {"id": 1, "name": "a", "amount": 1.5}, ROW_FIELDS, 10)),
        (1, "2", _event("c", {"id": 2, "name": "b", "amount": 2.5}, ROW_FIELDS, 11)),
    ])
    shard = _shard(sqlite_consensus, blob, kafka_bootstrap, kafka_topic)
    first = Writer(shard, "w", spark_factory=lambda: spark).step()
    assert (first.outcome, first.rows_in) == ("committed", 2)
    # The table gains a column upstream: later events carry it, typed int16 by their schema
    # (a value's inference would make it bigint).
    produce_changes(kafka_bootstrap, kafka_topic, [
        (0, "3", _event("c", {"id": 3, "name": "c", "amount": 3.5, "rank": 7}, [*ROW_FIELDS, RANK], 12)),
        (1, "2", _event("u", {"id": 2, "name": "b2", "amount": 2.5, "rank": None}, [*ROW_FIELDS, RANK], 13)),
        (1, "4", _event("c", {"id": 4, "name": "d", "amount": 4.5, "rank": -3}, [*ROW_FIELDS, RANK], 14)),
    ])
    second = Writer(shard, "w", spark_factory=lambda: spark).step()
    assert (second.outcome, second.rows_in, second.rejected, second.unknown_fields) == ("committed", 3, 0, {})
    assert _columns(shard) == [*BASE_COLUMNS, ("rank", "short", True)]
    assert [run_schema_version(b.run) for b in shard.batches()] == [1, 2]
    rows = table(shard)
    assert rows == {
        (1,): {"id": 1, "name": "a", "amount": 1.5, "rank": None},  # written before the column existed
        (2,): {"id": 2, "name": "b2", "amount": 2.5, "rank": None},
        (3,): {"id": 3, "name": "c", "amount": 3.5, "rank": 7},
        (4,): {"id": 4, "name": "d", "amount": 4.5, "rank": -3},
    }


def test_policy_none_makes_a_message_carrying_a_new_field_a_bad_record_naming_it(
        spark, sqlite_consensus, blob, kafka_bootstrap, kafka_topic):  # noqa: F811 - fixtures
    produced = produce_changes(kafka_bootstrap, kafka_topic, [
        (0, "1", _event("c", {"id": 1, "name": "a", "amount": 1.5}, ROW_FIELDS, 10)),
        (2, "5", _event("c", {"id": 5, "name": "e", "amount": 5.5, "rank": 1}, [*ROW_FIELDS, RANK], 11)),
    ])
    shard = _shard(sqlite_consensus, blob, kafka_bootstrap, kafka_topic)
    set_schema_policy(shard, "none", "test")
    bad = next(m for m in produced if m.partition == 2)
    reason = refused_field_reason("rank")
    assert "'rank'" in reason
    with pytest.raises(BadInputError) as failed:
        Writer(shard, "w", spark_factory=lambda: spark).step()
    assert f"kafka topic {kafka_topic!r} partition 2 offset {bad.offset}: {reason}" in str(failed.value)
    assert (shard.state().upper, _columns(shard)) == (0, BASE_COLUMNS)
    # Quarantined, the record is set aside with that reason and the others commit.
    result = Writer(shard, "w", spark_factory=lambda: spark, on_bad_record="quarantine").step()
    assert (result.outcome, result.rows_in, result.rejected, result.unknown_fields) == ("committed", 2, 1, {})
    assert _columns(shard) == BASE_COLUMNS
    assert table(shard) == {(1,): {"id": 1, "name": "a", "amount": 1.5}}
    assert [(r["file"], r["reason"]) for r in quarantined_records(shard)] == [
        (message_file(kafka_topic, 2, bad.offset), reason)]


def test_messages_that_disagree_on_a_new_fields_type_are_refused_with_nothing_committed(
        spark, sqlite_consensus, blob, kafka_bootstrap, kafka_topic):  # noqa: F811 - fixtures
    produced = produce_changes(kafka_bootstrap, kafka_topic, [
        (0, "1", _event("c", {"id": 1, "name": "a", "amount": 1.5, "rank": 3}, [*ROW_FIELDS, RANK], 10)),
        (3, "2", _event("c", {"id": 2, "name": "b", "amount": 2.5, "rank": "high"},
                        [*ROW_FIELDS, {**RANK, "type": "string"}], 11)),
    ])
    shard = _shard(sqlite_consensus, blob, kafka_bootstrap, kafka_topic)
    where = {m.partition: message_file(kafka_topic, m.partition, m.offset) for m in produced}
    with pytest.raises(BatchSchemaRefused) as refused:
        Writer(shard, "w", spark_factory=lambda: spark).step()
    assert f"disagree on the type of new field 'rank': short in {where[0]}, string in {where[3]}" in str(refused.value)
    assert refused.value.exit_code == 3
    assert (shard.state().upper, _columns(shard), shard.batches()) == (0, BASE_COLUMNS, [])
    # The run the batch's job wrote while it observed the fields is gone with the refusal.
    assert sorted(p.name for p in Path(blob.path("")).rglob("*") if p.is_file()) == []
