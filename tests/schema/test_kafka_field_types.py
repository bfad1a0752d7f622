"""The types of the new fields of Kafka messages (engine/write/kafka_field_types.py), observed as
``map_messages`` parses them and merged per batch on the driver: pure, no Kafka, no Spark."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from airflow_upsert_provider.engine.errors import BatchSchemaRefused
from airflow_upsert_provider.engine.table.schema_evolution import ObservedField
from airflow_upsert_provider.engine.write.kafka_field_types import (
    CONNECT_PRIMITIVES,
    CONNECT_REFUSED,
    FieldObserver,
    UnsupportedFieldType,
    array_type,
    connect_type,
    json_value_type,
    merge_types,
    observed_fields,
    struct_type,
)
from airflow_upsert_provider.engine.write.kafka_records import kafka_observed_fields, map_messages, message_file
from airflow_upsert_provider.engine.write.records import refused_field_reason
from tests.kafka.test_kafka_records import slice_batch

TOPIC = "t"
PRIMITIVES = {"int8": "byte", "int16": "short", "int32": "integer", "int64": "long", "float32": "float",
              "float64": "double", "boolean": "boolean", "string": "string", "bytes": "binary"}
# Logical types sent as epoch numbers keep their physical type; ZonedTimestamp is ISO text.
LOGICAL = [
    ("int32", "org.apache.kafka.connect.data.Date", "integer"),
    ("int32", "io.debezium.time.Date", "integer"),
    ("int64", "org.apache.kafka.connect.data.Timestamp", "long"),
    ("int64", "io.debezium.time.Timestamp", "long"),
    ("int64", "io.debezium.time.MicroTimestamp", "long"),
    ("int64", "io.debezium.time.NanoTimestamp", "long"),
    ("int32", "org.apache.kafka.connect.data.Time", "integer"),
    ("int64", "io.debezium.time.MicroTime", "long"),
    ("string", "io.debezium.time.ZonedTimestamp", "timestamp"),
    ("string", "io.debezium.data.Json", "string"),
    ("string", "io.debezium.data.Uuid", "string"),
]


def _position(partition: int, offset: int) -> str:
    return message_file(TOPIC, partition, offset)


def test_every_connect_primitive_maps_alone_and_nested_with_its_optionality():
    assert dict(CONNECT_PRIMITIVES) == PRIMITIVES
    for (kind, spark), optional in itertools.product(PRIMITIVES.items(), (True, False)):
        field = {"type": kind, "optional": optional}
        assert connect_type(field) == spark
        assert connect_type({"type": "struct", "fields": [{**field, "field": "x"}]}) == {
            "type": "struct", "fields": [{"name": "x", "type": spark, "nullable": optional, "metadata": {}}]}
        assert connect_type({"type": "array", "items": field}) == array_type(spark, optional)
        assert connect_type({"type": "map", "keys": {"type": "string"}, "values": field}) == {
            "type": "map", "keyType": "string", "valueType": spark, "valueContainsNull": optional}
        if kind != "string":
            with pytest.raises(UnsupportedFieldType, match="keys are not strings"):
                connect_type({"type": "map", "keys": field, "values": field})
    for kind, logical, spark in LOGICAL:
        assert connect_type({"type": kind, "name": logical, "optional": True}) == spark, logical
    for logical in CONNECT_REFUSED:
        with pytest.raises(UnsupportedFieldType, match="decimal.handling.mode"):
            connect_type({"type": "bytes", "name": logical, "parameters": {"scale": "2"}})
    for bad in ({"type": "int128"}, {"type": "struct"}, "int32", {"type": "struct", "fields": [{"type": "int8"}]}):
        with pytest.raises(UnsupportedFieldType):
            connect_type(bad)


# JSON values and the type Spark's JSON inference gives them.
VALUES = [
    (True, "boolean"), (False, "boolean"), (0, "long"), (-7, "long"), (2**62, "long"), (1.5, "double"),
    (1e300, "double"), ("", "string"), ("x", "string"),
    ({"b": 1, "a": "x"}, struct_type([("a", "string", True), ("b", "long", True)])),
    ({"a": None}, struct_type([("a", "string", True)])),
    ([1, 2], array_type("long")), ([1, 2.5, None], array_type("double")), ([], array_type("string")),
    ([{"a": 1}, {"b": True}], array_type(struct_type([("a", "long", True), ("b", "boolean", True)]))),
]


def test_json_values_are_typed_as_spark_infers_them():
    assert json_value_type(None) is None
    for value, spark in VALUES:
        assert json_value_type(value) == spark, value
        assert json_value_type(json.loads(json.dumps(value))) == spark, value
    with pytest.raises(UnsupportedFieldType, match="both long and string"):
        json_value_type([1, "x"])


DISAGREE = object()


def _merge(a, b):
    """merge_types with a disagreement kept apart from null (both are None there)."""
    if a is DISAGREE or b is DISAGREE:
        return DISAGREE
    merged = merge_types(a, b)
    return DISAGREE if merged is None and (a, b) != (None, None) else merged


def test_merge_is_commutative_associative_and_null_is_its_identity():
    types = [None, *{json.dumps(t, sort_keys=True): t for _, t in VALUES}.values(), "integer", "binary"]
    for a in types:
        assert merge_types(a, None) == merge_types(None, a) == a
        assert merge_types(a, a) == a
        for b in types:
            assert _merge(a, b) == _merge(b, a), (a, b)
            for c in types:
                assert _merge(_merge(a, b), c) == _merge(a, _merge(b, c)), (a, b, c)
    assert merge_types("long", "double") == "double"
    assert merge_types("integer", "long") is None  # inference gives long; a declared int32 and int64 disagree
    assert merge_types("string", "long") is None


SCALARS = [("long", 1), ("double", 2.5), ("string", "s"), ("boolean", True), (None, None), ("array", [1])]


def _model(observations: list[tuple[int, int, object]]) -> tuple[object, str, str | None]:
    """(merged type, first typed position, first disagreeing position) folding every message's
    type in (partition, offset) order."""
    merged, first, bad = None, "", None
    for partition, offset, value in sorted(observations, key=lambda o: o[:2]):
        seen = json_value_type(value)
        if seen is None:
            continue
        combined = merge_types(merged, seen)
        if combined is None:
            return merged, first, _position(partition, offset)
        first = first or _position(partition, offset)
        merged = combined
    return merged, first, None


def test_a_batch_cut_into_slices_in_any_order_merges_or_names_both_disagreeing_messages():
    """Seeded sweep: messages of a few partitions carry a new field with values of random
    scalar types; cut into slice batches at random points, observed per slice and merged in a
    shuffled order: the merged type and first message equal a fold over all messages, and a
    disagreement names the first typed message and the first one that disagrees with it."""
    refusals = merges = 0
    for seed in range(400):
        rng = random.Random(seed)
        kinds = rng.sample(SCALARS, rng.randint(1, 3))
        slices, observations = [], []
        for partition in rng.sample(range(6), rng.randint(1, 3)):
            offset, messages = rng.randrange(10**9), []
            for _ in range(rng.randint(1, 12)):
                messages.append((partition, offset, rng.choice(kinds)[1]))
                offset += rng.randint(1, 3)
            observations += messages
            cuts = sorted(rng.sample(range(1, len(messages)), rng.randint(0, min(2, len(messages) - 1))))
            slices += [messages[a:b] for a, b in zip([0, *cuts], [*cuts, len(messages)])]
        rng.shuffle(slices)
        entries = []
        for messages in slices:
            observer = FieldObserver()
            for partition, offset, value in messages:
                observer.observe("f", partition, offset, json_value_type(value))
            entries += observer.entries()
        merged, first_typed, bad = _model(observations)
        first = _position(*min(o[:2] for o in observations))
        if bad is None:
            merges += 1
            assert observed_fields("s", entries, position=_position) == [
                ObservedField("f", "string" if merged is None else merged, first)], seed
            continue
        refusals += 1
        with pytest.raises(BatchSchemaRefused) as refused:
            observed_fields("s", entries, position=_position)
        assert refused.value.details["files"] == [first_typed, bad], seed
        assert f"in {first_typed}, " in str(refused.value) and f"in {bad};" in str(refused.value), seed
    assert refusals > 50 and merges > 50, (refusals, merges)


def test_a_type_no_column_holds_is_refused_naming_its_message():
    observer = FieldObserver()
    observer.observe("price", 0, 9, "long")
    observer.observe("price", 0, 4, None, problem="a decimal sent as base64 bytes")
    with pytest.raises(BatchSchemaRefused, match=r"new field 'price' in kafka:t/0/4 has a type no column holds: a decimal"):
        observed_fields("s", observer.entries(), position=_position)


def _debezium(after: dict, after_schema: list | None) -> str:
    event = {"op": "u", "before": None, "after": after, "source": {"lsn": 1}}
    if after_schema is None:
        return json.dumps(event)
    schema = {"type": "struct", "fields": [{"type": "struct", "optional": True, "field": "after", "fields": after_schema}]}
    return json.dumps({"schema": schema, "payload": event})


def test_map_messages_types_new_fields_by_the_event_schema_else_by_the_value():
    known = ("id", "name")
    described = [{"type": "int32", "optional": False, "field": "id"},
                 {"type": "int16", "optional": True, "field": "rank"},
                 {"type": "int32", "optional": True, "field": "born", "name": "io.debezium.time.Date"}]
    messages = [
        (0, 1, None, _debezium({"id": 1, "rank": 3, "born": 19000, "note": "x"}, described)),
        (0, 2, None, _debezium({"id": 2, "rank": None, "tags": [1, 2]}, None)),
        (1, 0, None, _debezium({"id": 3, "name": "n"}, described)),
    ]
    rows = map_messages(slice_batch(messages), topic=TOPIC, keys=("id",), envelope="debezium", known=known).to_pydict()
    fields = kafka_observed_fields("s", TOPIC, rows["_unknown"][0])
    # rank: int16 by the schema at 0/1, and null (no type) at 0/2; note is described by no schema.
    assert fields == [
        ObservedField("born", "integer", _position(0, 1)),
        ObservedField("note", "string", _position(0, 1)),
        ObservedField("rank", "short", _position(0, 1)),
        ObservedField("tags", array_type("long"), _position(0, 2)),
    ]
    assert rows["_map_reason"] == [None, None, None]
    # A schemaless number and a described int16 disagree: both messages named.
    messages.append((1, 5, None, _debezium({"id": 4, "rank": 2}, None)))
    rows = map_messages(slice_batch(messages), topic=TOPIC, keys=("id",), envelope="debezium", known=known).to_pydict()
    with pytest.raises(BatchSchemaRefused, match=r"'rank': short in kafka:t/0/1, long in kafka:t/1/5"):
        kafka_observed_fields("s", TOPIC, rows["_unknown"][0])


def test_map_messages_makes_a_record_carrying_a_refused_field_a_bad_record_naming_it():
    for envelope, value in (("json", '{"id": 1, "email": "x"}'), ("debezium", _debezium({"id": 1, "email": "x"}, None))):
        rows = map_messages(slice_batch([(0, 1, None, value), (0, 2, None, value.replace('"email": "x"', '"name": "y"'))]),
                            topic=TOPIC, keys=("id",), envelope=envelope, known=("id", "name"),
                            refused=("email",)).to_pydict()
        assert rows["_map_reason"][0] == refused_field_reason("email")
        assert "'email'" in rows["_map_reason"][0]
        assert rows["_map_reason"][1] is None
