"""The types of the fields a Kafka message's record carries, as Spark types (Spark's JSON form,
as a shard's schema stores them), for the fields the shard's schema does not name yet.

Pure: no Spark, no Kafka. :mod:`kafka_records` observes each such field while it parses the
messages of a slice batch (:class:`FieldObserver`), and the driver merges the slice batches'
observations into the batch's :class:`ObservedField` list (:func:`observed_fields`), which the
shard's schema evolution policy then judges.

Where a field's type comes from:

- a Debezium change event wrapped with its Kafka Connect ``schema``: the schema of the field
  in ``after`` (:func:`connect_type`);
- otherwise (a bare event, a ``json`` envelope, a field the schema part does not describe):
  the JSON value itself (:func:`json_value_type`), as Spark's JSON inference reads it.

A JSON null has no type: it neither sets nor contradicts one. Two messages whose values of a
new field have types no single column holds are refused, naming both messages.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from airflow_upsert_provider.engine.errors import BatchSchemaRefused
from airflow_upsert_provider.engine.table.schema_evolution import ObservedField, type_name

_INTEGRAL_TEXT = re.compile(r"-?[0-9]+")

# Kafka Connect's primitive schema types -> Spark types.
CONNECT_PRIMITIVES: Mapping[str, str] = {
    "int8": "byte",
    "int16": "short",
    "int32": "integer",
    "int64": "long",
    "float32": "float",
    "float64": "double",
    "boolean": "boolean",
    "string": "string",
    "bytes": "binary",
}
# Logical types whose JSON value Spark reads as a Spark type other than the physical one:
# Debezium's ZonedTimestamp is an ISO-8601 text with its offset.
CONNECT_LOGICAL: Mapping[str, str] = {
    "io.debezium.time.ZonedTimestamp": "timestamp",
}
# Logical types whose JSON value no Spark column reads as the number it is: a decimal sent as
# the base64 of its unscaled bytes (Debezium's decimal.handling.mode=precise).
CONNECT_REFUSED: Mapping[str, str] = {
    "org.apache.kafka.connect.data.Decimal": "a decimal sent as base64 bytes",
    "io.debezium.data.VariableScaleDecimal": "a decimal sent as base64 bytes with its scale",
}
# Epoch-number logical types (org.apache.kafka.connect.data.Date/Time/Timestamp,
# io.debezium.time.Date/Timestamp/MicroTimestamp/NanoTimestamp/...) are not listed: their
# JSON value is a number of days, milliseconds, microseconds or nanoseconds, which Spark's
# JSON reader would read as a null date or as seconds, so the column keeps the number (its
# physical type) as sent.


class UnsupportedFieldType(ValueError):
    """A Kafka Connect schema no column can hold as its JSON values are sent."""


def connect_type(schema: Any) -> Any:
    """The Spark type (JSON form) of the values a Kafka Connect ``schema`` describes. Raises
    :class:`UnsupportedFieldType` saying why when there is none. Pure."""
    if not isinstance(schema, Mapping):
        raise UnsupportedFieldType(f"the field's schema is not an object: {schema!r}")
    logical, kind = schema.get("name"), schema.get("type")
    if logical in CONNECT_REFUSED:
        raise UnsupportedFieldType(
            f"{logical} ({CONNECT_REFUSED[logical]}) reaches no decimal column as sent; set the connector's "
            "decimal.handling.mode to string or double, or add the column yourself"
        )
    if logical in CONNECT_LOGICAL:
        return CONNECT_LOGICAL[logical]
    if kind in CONNECT_PRIMITIVES:
        return CONNECT_PRIMITIVES[kind]
    if kind == "struct":
        fields = schema.get("fields")
        if not isinstance(fields, list):
            raise UnsupportedFieldType("a struct schema without a 'fields' list")
        return struct_type([(f.get("field"), connect_type(f), bool(f.get("optional", False)))
                            for f in fields if isinstance(f, Mapping)])
    if kind == "array":
        items = schema.get("items")
        return array_type(connect_type(items), bool(isinstance(items, Mapping) and items.get("optional", False)))
    if kind == "map":
        keys, values = schema.get("keys"), schema.get("values")
        if connect_type(keys) != "string":
            # The JsonConverter writes such a map as an array of [key, value] pairs.
            raise UnsupportedFieldType("a map whose keys are not strings (sent as an array of pairs)")
        return {"type": "map", "keyType": "string", "valueType": connect_type(values),
                "valueContainsNull": bool(isinstance(values, Mapping) and values.get("optional", False))}
    raise UnsupportedFieldType(f"unknown Kafka Connect schema type {kind!r}")


def struct_type(fields: Iterable[tuple[Any, Any, bool]]) -> dict[str, Any]:
    """A Spark struct type of (name, type, nullable) fields."""
    out = []
    for name, spark_type, nullable in fields:
        if not isinstance(name, str):
            raise UnsupportedFieldType(f"a struct field without a name: {name!r}")
        out.append({"name": name, "type": spark_type, "nullable": nullable, "metadata": {}})
    return {"type": "struct", "fields": out}


def array_type(element: Any, contains_null: bool = True) -> dict[str, Any]:
    return {"type": "array", "elementType": element, "containsNull": contains_null}


def json_value_type(value: Any) -> Any | None:
    """The Spark type a JSON ``value`` is read as, Spark's JSON inference's way: true/false
    boolean, an integral number bigint, any other number double, a string string, an object a
    struct of its members (by name), an array an array of its elements' merged type (string
    when it has none); None for null (no type). A number may be given as its text (any object
    with a ``text`` attribute, as :mod:`kafka_records` keeps numbers). Raises
    :class:`UnsupportedFieldType` for an array whose elements no single type holds. Pure."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    text = getattr(value, "text", None)
    if isinstance(text, str):
        return "long" if _INTEGRAL_TEXT.fullmatch(text) else "double"
    if isinstance(value, Mapping):
        members = {name: json_value_type(member) for name, member in value.items()}
        return struct_type((name, "string" if t is None else t, True) for name, t in sorted(members.items()))
    if isinstance(value, list):
        element: Any | None = None
        for item in value:
            item_type = json_value_type(item)
            merged = merge_types(element, item_type)
            if merged is None and item_type is not None:
                raise UnsupportedFieldType(
                    f"an array holding both {type_name(element)} and {type_name(item_type)} elements")
            element = merged
        return array_type("string" if element is None else element)
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def merge_types(first: Any | None, second: Any | None) -> Any | None:
    """The one type that holds values of both types, as Spark's JSON inference merges them:
    either when the other is None (null), bigint and double as double, two structs as their
    members (merged, in name order), two arrays as their merged elements; otherwise None (they
    disagree). Commutative. Pure."""
    if first is None or second is None:
        return second if first is None else first
    if first == second:
        return first
    if sorted((str(first), str(second))) == ["double", "long"]:
        return "double"
    if isinstance(first, dict) and isinstance(second, dict) and first.get("type") == second.get("type"):
        if first["type"] == "struct":
            types: dict[str, Any] = {}
            for field in [*first["fields"], *second["fields"]]:
                merged = merge_types(types.get(field["name"]), field["type"])
                if merged is None:
                    return None
                types[field["name"]] = merged
            return struct_type((name, t, True) for name, t in sorted(types.items()))
        if first["type"] == "array":
            element = merge_types(first["elementType"], second["elementType"])
            return None if element is None else array_type(element)
    return None


class FieldObserver:
    """The new fields of one slice batch's records: per field the records carrying it, the
    first message (partition, offset) that does, the merged type of its values and the first
    message with a non-null one; a disagreement (the other type and its message) or a type no
    column holds (why, and the message), the first one seen standing."""

    def __init__(self) -> None:
        self.fields: dict[str, dict[str, Any]] = {}

    def observe(self, name: str, partition: int, offset: int, spark_type: Any | None, problem: str | None = None) -> None:
        """A record of message (partition, offset) carries field ``name`` with a value of
        ``spark_type`` (None: null), or with one no column holds (``problem`` says why).
        Messages may come in any order."""
        entry = self.fields.get(name)
        if entry is None:
            entry = self.fields[name] = {
                "name": name, "records": 0, "partition": partition, "offset": offset, "type": None,
                "type_partition": None, "type_offset": None, "other_type": None, "other_partition": None,
                "other_offset": None, "problem": None,
            }
        entry["records"] += 1
        if (partition, offset) < (entry["partition"], entry["offset"]):
            entry["partition"], entry["offset"] = partition, offset
        if entry["problem"] is not None or entry["other_type"] is not None:
            return  # refused already: the first reason stands
        if problem is not None:
            entry["other_partition"], entry["other_offset"], entry["problem"] = partition, offset, problem
            return
        if spark_type is None:
            return
        merged = merge_types(entry["type"], spark_type)
        if merged is None:
            entry["other_type"], entry["other_partition"], entry["other_offset"] = spark_type, partition, offset
            return
        if entry["type"] is None or (partition, offset) < (entry["type_partition"], entry["type_offset"]):
            entry["type_partition"], entry["type_offset"] = partition, offset
        entry["type"] = merged

    def entries(self) -> list[dict[str, Any]]:
        """The observations as rows of :data:`OBSERVED_FIELDS_TYPE` (names in order), types as
        JSON texts."""
        return [
            {**entry, "type": _text(entry["type"]), "other_type": _text(entry["other_type"])}
            for _, entry in sorted(self.fields.items())
        ]


# The rows FieldObserver.entries gives, as Spark DDL (one list per slice batch).
OBSERVED_FIELDS_TYPE = (
    "ARRAY<STRUCT<name: STRING, records: BIGINT, partition: INT, offset: BIGINT, type: STRING, "
    "type_partition: INT, type_offset: BIGINT, other_type: STRING, other_partition: INT, other_offset: BIGINT, "
    "problem: STRING>>"
)


def _text(spark_type: Any | None) -> str | None:
    return None if spark_type is None else json.dumps(spark_type, sort_keys=True)


def observed_fields(
    shard_id: str, entries: Iterable[Mapping[str, Any]], *, position: Callable[[int, int], str]
) -> list[ObservedField]:
    """The new fields of a batch from its slice batches' observation rows
    (:meth:`FieldObserver.entries`): per field its merged type, ``where`` the first message
    (lowest partition, offset) carrying it, as ``position(partition, offset)`` names it. A field only ever null is observed as string, as
    Spark's JSON inference types it. Raises :class:`BatchSchemaRefused` naming the field and
    both messages when messages disagree on its type, or the message whose type no column
    holds. The same rows in any order give the same result. Pure."""
    by_name: dict[str, list[Mapping[str, Any]]] = {}
    for entry in entries:
        by_name.setdefault(entry["name"], []).append(entry)
    out = []
    for name, rows in sorted(by_name.items()):
        details = {"shard": shard_id, "column": name}
        problems = sorted((int(r["other_partition"]), int(r["other_offset"]), r["problem"]) for r in rows if r.get("problem"))
        if problems:
            at = position(*problems[0][:2])
            raise BatchSchemaRefused(
                f"shard {shard_id!r}: new field {name!r} in {at} has a type no column holds: {problems[0][2]}",
                **details, new_type=None, old_type=None, file=at,
            )
        # Each type with the first message that has it: a slice batch's merged type, and the
        # type it disagreed with.
        typed = sorted(
            [(int(r["type_partition"]), int(r["type_offset"]), r["type"]) for r in rows if r.get("type")]
            + [(int(r["other_partition"]), int(r["other_offset"]), r["other_type"]) for r in rows if r.get("other_type")]
        )
        merged: Any | None = None
        merged_where = ""
        for partition, offset, text in typed:
            seen, here = json.loads(text), position(partition, offset)
            combined = merge_types(merged, seen)
            if combined is None:
                raise BatchSchemaRefused(
                    f"shard {shard_id!r}: the batch's messages disagree on the type of new field {name!r}: "
                    f"{type_name(merged)} in {merged_where}, {type_name(seen)} in {here}; send it with one "
                    "type, or add the column with `upsertctl schema add-column` first",
                    **details, old_type=type_name(merged), new_type=type_name(seen), file=here, files=[merged_where, here],
                )
            merged_where = merged_where or here
            merged = combined
        first = min((int(r["partition"]), int(r["offset"])) for r in rows)
        out.append(ObservedField(name, "string" if merged is None else merged, position(*first)))
    return out
