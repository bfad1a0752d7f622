"""Kafka messages mapped to change records (JSON and Debezium envelopes) and judged exactly as
JSON Lines records are: pure tests of map_messages for every rule, Spark tests of
kafka_batch_records on slice-shaped DataFrames (no broker), and schema inference against the
mock cluster."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from airflow_upsert_provider.engine.config import ShardConfig
from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.engine.write.records import jsonl_records
from airflow_upsert_provider.engine.sources import Segment
from airflow_upsert_provider.engine.sources.kafka import SLICE_SCHEMA, KafkaConfig, KafkaSource
from airflow_upsert_provider.engine.write.kafka_records import (
    MAPPED_SCHEMA,
    infer_kafka_schema,
    kafka_batch_records,
    map_messages,
    message_file,
    message_position,
)
from tests.kafka.conftest import produce_changes

TOPIC = "orders"
SLICE_ARROW = pa.schema(
    [
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("key", pa.string()),
        ("value", pa.string()),
        ("timestamp", pa.timestamp("us", tz="UTC")),
    ]
)


def test_a_message_position_is_read_back_from_the_file_name_it_was_given():
    # Topic names may hold dots, dashes and underscores; the position is the last two parts.
    assert message_position(message_file("db.public-orders_v2", 3, 1234)) == ("db.public-orders_v2", 3, 1234)
    assert message_position("/landing/0/17.jsonl") is None


def slice_batch(messages):
    """Messages ``(partition, offset, key, value)`` as a slice batch."""
    columns = list(zip(*messages)) if messages else [(), (), (), ()]
    arrays = [pa.array(list(column), field.type) for column, field in zip(columns, SLICE_ARROW)]
    return pa.RecordBatch.from_arrays(arrays + [pa.array([None] * len(messages), SLICE_ARROW.field("timestamp").type)], schema=SLICE_ARROW)


def mapped(messages, *, keys=("id",), envelope="json", **kwargs):
    return map_messages(slice_batch(messages), topic=TOPIC, keys=keys, envelope=envelope, **kwargs).to_pylist()


def one(value, key=None, **kwargs):
    rows = mapped([(0, 5, key, value)], **kwargs)
    assert len(rows) == 1, rows
    return rows[0]


def event(op, *, before=None, after=None, source=None, wrap=False):
    payload = {"op": op, "before": before, "after": after, "source": source, "ts_ms": 1}
    if wrap:
        return json.dumps({"schema": {"type": "struct", "optional": False}, "payload": payload})
    return json.dumps(payload)


# --- map_messages: the JSON envelope ----------------------------------------------------------


def test_json_value_with_its_keys_is_kept_byte_for_byte_with_the_position_columns():
    value = '{"id": 7,  "amount": 1.10, "name":"x\\u00e9"}'
    rows = mapped([(3, 41, "7", value)])
    assert rows == [
        {
            "_file": "kafka:orders/3/41",
            "_partition": "3",
            "_offset": 41,
            "_raw": value,
            "_delete": False,
            "_srcpos": None,
            "_map_reason": None,
            "_unknown": None,
        }
    ]


def test_json_output_has_the_declared_schema_even_when_empty():
    batch = map_messages(slice_batch([]), topic=TOPIC, keys=("id",), envelope="json")
    assert batch.num_rows == 0
    assert batch.schema.names == ["_file", "_partition", "_offset", "_raw", "_delete", "_srcpos", "_map_reason", "_unknown"]
    assert all(name in MAPPED_SCHEMA for name in batch.schema.names)
    assert not batch.schema.field("_delete").nullable


@pytest.mark.parametrize(
    "key, raw",
    [
        ("42", '{"id":42,"name": "a"}'),  # a JSON scalar key is that value
        ('"k-1"', '{"id":"k-1","name": "a"}'),
        ("k-1", '{"id":"k-1","name": "a"}'),  # not JSON: the key text as a string
        ('{"id": 9, "other": 1}', '{"id":9,"name": "a"}'),  # an object key: its fields
        ('{"schema": {"type": "struct"}, "payload": {"id": 9}}', '{"id":9,"name": "a"}'),
        ("[1, 2]", '{"id":"[1, 2]","name": "a"}'),  # an array is no scalar: its text
    ],
)
def test_json_key_column_missing_from_the_value_comes_from_the_message_key(key, raw):
    row = one('{"name": "a"}', key=key)
    assert (row["_raw"], row["_map_reason"], row["_delete"]) == (raw, None, False)


def test_json_key_added_to_an_empty_object_and_only_missing_columns_are_added():
    assert one("{ }", key="5")["_raw"] == '{"id":5 }'
    row = one('{"a": 1, "b": 2}', key='{"a": 10, "b": 20, "c": 30}', keys=("a", "b", "c"))
    assert row["_raw"] == '{"c":30,"a": 1, "b": 2}'


def test_json_value_keys_win_over_the_message_key():
    assert one('{"id": 1}', key="2")["_raw"] == '{"id": 1}'


def test_string_key_columns_take_a_numeric_key_as_text():
    assert one('{"n": 1}', key="42", string_keys=("id",))["_raw"] == '{"id":"42","n": 1}'
    assert one('{"n": 1}', key='"a"', string_keys=("id",))["_raw"] == '{"id":"a","n": 1}'


def test_json_key_column_nowhere_is_a_bad_record_keeping_the_value():
    value = '{"name": "a"}'
    for key in (None, '{"other": 1}'):
        row = one(value, key=key)
        assert row["_raw"] == value
        assert row["_map_reason"] == "key column 'id' is neither in the value nor in the message key"
    # A composite key cannot come from a scalar message key.
    row = one('{"a": 1}', key="7", keys=("a", "b"))
    assert row["_map_reason"] == "key column 'b' is neither in the value nor in the message key"


def test_json_tombstone_deletes_the_message_keys_record():
    assert one(None, key="7")["_raw"] == '{"id":7}'
    row = one(None, key='{"a": 1, "b": "x", "c": 3}', keys=("a", "b"))
    assert (row["_raw"], row["_delete"], row["_map_reason"]) == ('{"a":1,"b":"x"}', True, None)


def test_json_tombstone_without_a_usable_key_is_a_bad_record():
    for key, keys in ((None, ("id",)), ('{"a": 1}', ("a", "b")), ("7", ("a", "b"))):
        row = one(None, key=key, keys=keys)
        assert (row["_raw"], row["_delete"]) == ("", False)
        assert row["_map_reason"].startswith("tombstone (null value) without a usable message key: key column ")
        assert row["_map_reason"].endswith("is not in the message key")


@pytest.mark.parametrize(
    "value, reason",
    [
        ('{"id": 1', "value is not JSON ("),
        ("", "value is not JSON ("),
        ('{"id": NaN}', "value is not JSON (NaN is not a JSON value)"),
        ('{"id": 1} {"id": 2}', "value is not JSON (Extra data"),
        ("[1, 2]", "value is an array, not a JSON object"),
        ("3", "value is a number, not a JSON object"),
        ('"text"', "value is a string, not a JSON object"),
        ("null", "value is null, not a JSON object"),
    ],
)
def test_json_unmappable_values_keep_their_text_and_say_why(value, reason):
    row = one(value, key="1")
    assert row["_raw"] == value
    assert row["_delete"] is False
    assert row["_map_reason"].startswith(reason), row["_map_reason"]


# --- map_messages: the Debezium envelope ------------------------------------------------------


@pytest.mark.parametrize("op", ["c", "r", "u"])
@pytest.mark.parametrize("wrap", [False, True])
def test_debezium_create_read_update_upsert_after(op, wrap):
    value = event(op, before={"id": 1, "n": 0}, after={"id": 1, "n": 2, "price": 1.10}, wrap=wrap)
    value = value.replace("1.1,", "1.10,").replace("1.1}", "1.10}")  # a number keeps its text
    row = one(value, key='{"id": 1}', envelope="debezium")
    assert row == {
        "_file": "kafka:orders/0/5",
        "_partition": "0",
        "_offset": 5,
        "_raw": '{"id":1,"n":2,"price":1.10}',
        "_delete": False,
        "_srcpos": None,
        "_map_reason": None,
        "_unknown": None,
    }


@pytest.mark.parametrize("wrap", [False, True])
def test_debezium_delete_deletes_the_key_of_before(wrap):
    row = one(event("d", before={"id": 3, "n": None}, wrap=wrap), key='{"id": 3}', envelope="debezium")
    assert (row["_raw"], row["_delete"], row["_map_reason"]) == ('{"id":3,"n":null}', True, None)


def test_debezium_tombstone_after_a_delete_is_no_record():
    rows = mapped(
        [(0, 1, '{"id": 3}', event("d", before={"id": 3})), (0, 2, '{"id": 3}', None), (0, 3, "{}", event("c", after={"id": 4}))],
        envelope="debezium",
    )
    assert [(r["_offset"], r["_delete"]) for r in rows] == [(1, True), (3, False)]


def test_debezium_key_columns_come_from_the_message_key_wrapped_or_not():
    row = one(event("d", before={"n": 1}), key='{"schema": {"type": "struct"}, "payload": {"id": 8}}', envelope="debezium")
    assert (row["_raw"], row["_delete"]) == ('{"id":8,"n":1}', True)
    row = one(event("u", after={"n": 1}), key='{"id": 9}', envelope="debezium")
    assert row["_raw"] == '{"id":9,"n":1}'
    row = one(event("u", after={"n": 1}), key=None, envelope="debezium")
    assert row["_map_reason"] == "key column 'id' is neither in the 'after' object nor in the message key"


def test_debezium_positions_postgresql_lsn_and_mysql_binlog():
    pg = one(event("u", after={"id": 1}, source={"connector": "postgresql", "lsn": 24023128, "txId": 5}), envelope="debezium")
    assert pg["_srcpos"] == {"lsn": 24023128, "file": None, "pos": None, "row": None}
    my = one(
        event("c", after={"id": 1}, source={"connector": "mysql", "file": "mysql-bin.000003", "pos": 154, "row": 2}),
        envelope="debezium",
    )
    assert my["_srcpos"] == {"lsn": None, "file": "mysql-bin.000003", "pos": 154, "row": 2}
    no_row = one(event("d", before={"id": 1}, source={"file": "mysql-bin.000004", "pos": 4}), envelope="debezium")
    assert no_row["_srcpos"] == {"lsn": None, "file": "mysql-bin.000004", "pos": 4, "row": None}
    for source in (None, {"connector": "sqlserver", "change_lsn": "00000027:00000758:0003"}, {"lsn": "0/16B3748"}, {"lsn": 2**64}):
        assert one(event("u", after={"id": 1}, source=source), envelope="debezium")["_srcpos"] is None, source


@pytest.mark.parametrize(
    "value, reason",
    [
        (event("t"), "debezium: unknown op 't'"),
        (event("m"), "debezium: unknown op 'm'"),
        (json.dumps({"after": {"id": 1}}), "debezium: the change event has no 'op'"),
        (event("d", after={"id": 1}), "debezium: op 'd' without a 'before' object"),
        (event("c", before={"id": 1}), "debezium: op 'c' without an 'after' object"),
        (event("u", after=[1]), "debezium: op 'u' without an 'after' object"),
        ("{not json", "debezium: value is not JSON ("),
        ("[1]", "debezium: the change event is an array, not an object"),
        (json.dumps({"schema": {}, "payload": None}), "debezium: the change event is null, not an object"),
    ],
)
def test_debezium_unmappable_events_keep_their_text_and_say_why(value, reason):
    row = one(value, key='{"id": 1}', envelope="debezium")
    assert (row["_raw"], row["_delete"], row["_srcpos"]) == (value, False, None)
    assert row["_map_reason"].startswith(reason), row["_map_reason"]


def test_debezium_records_are_written_back_as_read():
    # Duplicates, member order, number texts and escapes reach the validator as sent.
    # A lone surrogate cannot be UTF-8: the record is written with non-ASCII escaped.
    value = '{"op":"c","after":{"b":1e400,"a":-0.50,"a":2,"s":"\\ud800","t":"\\u00e9\\n"}}'
    row = one(value, key='{"id": 1}', envelope="debezium")
    assert row["_raw"] == '{"id":1,"b":1e400,"a":-0.50,"a":2,"s":"\\ud800","t":"\\u00e9\\n"}'
    value = '{"op":"c","after":{"id":1,"t":"\\u00e9\\n"}}'
    assert one(value, envelope="debezium")["_raw"] == '{"id":1,"t":"é\\n"}'


def test_unencodable_or_odd_fields_never_raise():
    # A binlog file name no UTF-8 can hold is no position; a non-string op is quoted.
    row = one('{"op":"c","after":{"id":1},"source":{"file":"\\udc80","pos":1}}', envelope="debezium")
    assert (row["_srcpos"], row["_map_reason"]) == (None, None)
    row = one('{"op":{"x":"\\ud800"}}', envelope="debezium")
    assert row["_map_reason"] == 'debezium: unknown op {"x":"\\ud800"}'


def test_a_rule_that_fails_makes_a_bad_record_not_an_exception(monkeypatch):
    from airflow_upsert_provider.engine.write import kafka_records

    def broken(value, key, keys):
        raise RuntimeError("boom")

    monkeypatch.setattr(kafka_records, "_map_json", broken)
    rows = mapped([(0, 1, "1", '{"id": 1}'), (0, 2, "2", None)])
    assert [(r["_offset"], r["_raw"], r["_map_reason"]) for r in rows] == [
        (1, '{"id": 1}', "message cannot be mapped (RuntimeError: boom)"),
        (2, "", "message cannot be mapped (RuntimeError: boom)"),
    ]


def test_unknown_envelope_is_refused():
    with pytest.raises(ConfigurationError):
        mapped([(0, 1, None, "{}")], envelope="avro")


# --- kafka_batch_records on Spark -------------------------------------------------------------

SCHEMA = json.dumps(
    {
        "type": "struct",
        "fields": [
            {"name": "id", "type": "long", "nullable": True, "metadata": {}},
            {"name": "name", "type": "string", "nullable": True, "metadata": {}},
            {"name": "amount", "type": "double", "nullable": True, "metadata": {}},
        ],
    }
)


def shard_config(envelope="json"):
    return ShardConfig(source=f"kafka:{TOPIC}", keys=("id",), schema=SCHEMA, extra={"kafka": {"envelope": envelope}})


def records_of(spark, messages, envelope="json"):
    df = spark.createDataFrame([(p, o, k, v, None, None) for p, o, k, v in messages], SLICE_SCHEMA)
    batch = kafka_batch_records(spark, shard_config(envelope), df, topic=TOPIC, envelope=envelope)
    return batch, {r["_offset"]: r.asDict(recursive=True) for r in batch.records.collect()}


def test_batch_records_have_typed_columns_in_order(spark):
    batch, rows = records_of(
        spark,
        [
            (0, 0, "1", '{"id": 1, "name": "a", "amount": 2.5}'),
            (1, 7, "2", '{"name": "b"}'),  # the key from the message key
            (1, 8, "2", None),  # a tombstone
        ],
    )
    assert batch.records.columns == [
        "_file", "_partition", "_offset", "_line", "_raw", "id", "name", "amount", "_reason", "_delete", "_srcpos", "_unknown",
    ]
    assert batch.lines is None
    assert rows[0] == {
        "_file": "kafka:orders/0/0", "_partition": "0", "_offset": 0, "_line": 0,
        "_raw": '{"id": 1, "name": "a", "amount": 2.5}', "id": 1, "name": "a", "amount": 2.5,
        "_reason": None, "_delete": False, "_srcpos": None, "_unknown": None,
    }
    assert (rows[7]["id"], rows[7]["name"], rows[7]["_delete"], rows[7]["_reason"]) == (2, "b", False, None)
    assert (rows[8]["id"], rows[8]["name"], rows[8]["_delete"], rows[8]["_reason"]) == (2, None, True, None)
    assert batch.rejected().count() == 0


def jsonl_reason(spark, tmp_path, line):
    path = tmp_path / "0" / "1.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(line + "\n")
    batch = jsonl_records(spark, shard_config(), [Segment(1, "0", str(path))])
    return batch.records.collect()[0]["_reason"]


@pytest.mark.parametrize(
    "value, reason",
    [
        ('{"id": 5, "amount": "lots"}', "field 'amount': expected double, got lots"),
        ('{"id": "five"}', "field 'id': expected bigint, got five"),
        ('{"id": 5, "name": 12}', "field 'name': expected string, got 12"),
        ('{"id": null}', "null key column 'id'"),
        ('{"id": 5, "amount": 1e400}', "field 'amount': number out of range for double"),
    ],
)
def test_a_wrongly_typed_value_gets_the_reason_a_jsonl_line_gets(spark, tmp_path, value, reason):
    batch, rows = records_of(spark, [(2, 3, "5", value)])
    assert rows[3]["_reason"] == reason
    assert jsonl_reason(spark, tmp_path, value) == reason
    rejected = [r.asDict() for r in batch.rejected().collect()]
    assert rejected == [
        {"_file": "kafka:orders/2/3", "_partition": "2", "_offset": 3, "_line": 0, "_reason": reason, "_raw": value}
    ]


def test_a_mapping_reason_wins_and_good_neighbours_are_unaffected(spark):
    _, rows = records_of(spark, [(0, 1, None, '{"name": "x"}'), (0, 2, None, "not json"), (0, 3, "3", '{"amount": 1}')])
    assert rows[1]["_reason"] == "key column 'id' is neither in the value nor in the message key"
    assert rows[2]["_reason"].startswith("value is not JSON (")
    assert (rows[3]["id"], rows[3]["amount"], rows[3]["_reason"]) == (3, 1.0, None)


def test_string_key_column_from_a_numeric_message_key(spark):
    schema = json.loads(SCHEMA)
    schema["fields"][0]["type"] = "string"
    config = ShardConfig(source=f"kafka:{TOPIC}", keys=("id",), schema=json.dumps(schema))
    df = spark.createDataFrame([(0, 0, "42", '{"name": "a"}', None, None)], SLICE_SCHEMA)
    row = kafka_batch_records(spark, config, df, topic=TOPIC, envelope="json").records.collect()[0]
    assert (row["id"], row["_reason"]) == ("42", None)


def test_debezium_batch_records_by_partition(spark):
    df = spark.createDataFrame(
        [
            (0, 0, '{"id": 1}', event("c", after={"id": 1, "name": "a", "amount": 1.5}, source={"lsn": 100}), None, None),
            (0, 1, '{"id": 1}', event("d", before={"id": 1, "name": None, "amount": None}, source={"lsn": 90}), None, None),
            (0, 2, '{"id": 1}', None, None, None),
            (1, 0, '{"id": 2}', event("u", after={"id": 2, "amount": "x"}, source={"file": "bin.1", "pos": 7, "row": 0}), None, None),
            (1, 1, '{"id": 2}', event("t"), None, None),
        ],
        SLICE_SCHEMA,
    )
    batch = kafka_batch_records(spark, shard_config("debezium"), df, topic=TOPIC, envelope="debezium")
    rows = {r["_file"]: r.asDict(recursive=True) for r in batch.records.collect()}
    assert sorted(rows) == ["kafka:orders/0/0", "kafka:orders/0/1", "kafka:orders/1/0", "kafka:orders/1/1"]
    created, deleted = rows["kafka:orders/0/0"], rows["kafka:orders/0/1"]
    assert (created["id"], created["name"], created["amount"], created["_delete"], created["_reason"]) == (1, "a", 1.5, False, None)
    assert created["_srcpos"] == {"lsn": 100, "file": None, "pos": None, "row": None}
    assert (deleted["id"], deleted["_delete"], deleted["_reason"]) == (1, True, None)
    assert deleted["_srcpos"]["lsn"] == 90
    mistyped = rows["kafka:orders/1/0"]
    assert mistyped["_reason"] == "field 'amount': expected double, got x"
    assert mistyped["_srcpos"] == {"lsn": None, "file": "bin.1", "pos": 7, "row": 0}
    assert rows["kafka:orders/1/1"]["_reason"] == "debezium: unknown op 't'"
    assert {r["_file"] for r in batch.rejected().collect()} == {"kafka:orders/1/0", "kafka:orders/1/1"}


# --- infer_kafka_schema against the mock cluster ----------------------------------------------


def test_infer_kafka_schema_from_the_first_messages_of_each_partition(spark, kafka_bootstrap, kafka_topic):
    source = KafkaSource(kafka_topic, KafkaConfig.from_dict({"bootstrap.servers": kafka_bootstrap}))
    with source:
        # Only messages that are no record: a truncate and a tombstone.
        produce_changes(kafka_bootstrap, kafka_topic, [(3, '{"id": 9}', {"op": "t"}), (3, '{"id": 9}', None)])
        with pytest.raises(ConfigurationError) as caught:
            infer_kafka_schema(spark, source, envelope="debezium")
        assert caught.value.details["field"] == "schema"
        assert "debezium: unknown op 't'" in caught.value.message
        produce_changes(
            kafka_bootstrap,
            kafka_topic,
            [
                (0, '{"id": 1}', {"op": "c", "after": {"zeta": "a", "amount": 1.5}, "before": None}),
                (1, '{"id": 2}', {"op": "u", "after": {"zeta": "b", "amount": 2.0, "tags": [1]}, "before": None}),
                (2, '{"id": 3}', {"op": "t"}),
                # Beyond the sample of partition 0: never read.
                (0, '{"id": 4}', {"op": "c", "after": {"zeta": "c", "late": True}, "before": None}),
            ],
        )
        schema = json.loads(infer_kafka_schema(spark, source, envelope="debezium", sample_per_partition=1, keys=("id",)))
    # produce_changes sorts members: the first record's order is id (from the key), amount, zeta.
    assert [(f["name"], f["type"]) for f in schema["fields"]] == [
        ("id", "long"), ("amount", "double"), ("zeta", "string"), ("tags", {"type": "array", "elementType": "long", "containsNull": True}),
    ]
