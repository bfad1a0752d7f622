"""Kafka messages turned into the change records of a batch, judged like JSON Lines records.

A message becomes (at most) one record in two steps. :func:`map_messages` runs in plain Python
on the executors (through ``DataFrame.mapInArrow``): it unwraps the envelope, fills key
columns from the message key, and says whether the record upserts or deletes, and where it
sits in the upstream database's log. It never judges the record's columns: the record goes on
as one JSON object text, and :func:`kafka_batch_records` judges it with the very expression
that judges a JSON Lines line (``records.judge_lines``), so a record gets the same verdict and
the same reason whether it arrived in a file or a topic. A message that cannot be mapped at
all is a bad record with a reason, never an exception: one bad message must not stop the
executors, and the fail/quarantine rules decide what happens to it.

Envelopes:

- ``json``: the value is the record. Key columns it lacks come from the message key (a JSON
  object's fields, or for a single key column the key itself). A null value (a Kafka
  tombstone) deletes the message key's record.
- ``debezium``: the value is a Debezium change event, optionally wrapped as
  ``{"schema": ..., "payload": {...}}``. ``c``/``r``/``u`` upsert ``after``, ``d`` deletes
  the key of ``before``; the null-value tombstone that follows a delete is no record. The
  source position (PostgreSQL ``source.lsn``, MySQL ``source.file``/``pos``/``row``) orders
  the changes of a key; without one, the Kafka offset does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from functools import partial
from json.encoder import encode_basestring, encode_basestring_ascii  # type: ignore[attr-defined]
from typing import TYPE_CHECKING, Any

from airflow_upsert_provider.engine.config import ShardConfig
from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.engine.table.schema_evolution import ObservedField
from airflow_upsert_provider.engine.write.kafka_field_types import (
    OBSERVED_FIELDS_TYPE,
    FieldObserver,
    UnsupportedFieldType,
    connect_type,
    json_value_type,
    observed_fields,
)
from airflow_upsert_provider.engine.write.records import (
    QUOTE_CHARS,
    BatchRecords,
    judge_lines,
    refuse_non_json_constant,
    refused_field_reason,
    sql_name,
)
from airflow_upsert_provider.engine.table.runs import user_schema

if TYPE_CHECKING:
    import pyarrow
    from pyspark.sql import DataFrame, SparkSession

    from airflow_upsert_provider.engine.sources.kafka import KafkaSource

ENVELOPES = ("json", "debezium")
# The fields a slice batch's records carry that the shard's schema does not name: how many
# records carry each, the first message (by partition, offset) that does, and the type of
# their values (kafka_field_types.FieldObserver). Set on the first row of each slice batch,
# null on the others (map_messages).
UNKNOWN_FIELDS_TYPE = OBSERVED_FIELDS_TYPE
# Sets of record fields map_messages remembers per slice batch, judged against the schema.
MAX_FIELD_SHAPES = 1024
# What map_messages yields for each message that is a record (Spark DDL).
MAPPED_SCHEMA = (
    "_file STRING, _partition STRING, _offset BIGINT, _raw STRING, _delete BOOLEAN NOT NULL, "
    "_srcpos STRUCT<lsn: BIGINT, file: STRING, pos: BIGINT, row: BIGINT>, _map_reason STRING, "
    f"_unknown {UNKNOWN_FIELDS_TYPE}"
)
FILE_PREFIX = "kafka:"
UPSERT_OPS = ("c", "r", "u")
DELETE_OP = "d"
_INTEGER = re.compile(r"-?[0-9]+")
_INT64 = (-(2**63), 2**63 - 1)


def message_file(topic: str, partition: int, offset: int) -> str:
    """The ``_file`` of a message: names topic, partition and offset in every report."""
    return f"{FILE_PREFIX}{topic}/{partition}/{offset}"


def message_position(file: str) -> tuple[str, int, int] | None:
    """(topic, partition, offset) of a ``_file`` that :func:`message_file` made; None for a
    segment file's path."""
    if not file.startswith(FILE_PREFIX):
        return None
    topic, partition, offset = file[len(FILE_PREFIX):].rsplit("/", 2)
    return topic, int(partition), int(offset)


# --- JSON that keeps what it read -------------------------------------------------------------
# A record is re-serialised only when it must be (Debezium's after/before, a record given key
# columns). It is then written back as read: numbers keep their text (1.10 stays 1.10, 1e400
# stays 1e400 for the validator to reject), objects keep their members in order, duplicates
# included, so the validator judges what was sent, not what Python made of it.


class _Number:
    """A JSON number as its text."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


class _Object(dict):
    """A JSON object: a dict for look-ups (the last duplicate wins, as in Spark) that keeps
    its members as read for writing back."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        super().__init__(pairs)
        self.pairs = pairs


def _loads(text: str) -> Any:
    """Strict-enough JSON: NaN and Infinity refused, numbers and members kept as read. What
    Python still accepts and the validator does not (it is stricter), the validator rejects."""
    return json.loads(
        text, parse_int=_Number, parse_float=_Number, parse_constant=refuse_non_json_constant, object_pairs_hook=_Object
    )


def _parse(text: str) -> tuple[Any, str | None]:
    """(value, None), or (None, why it is not JSON)."""
    try:
        return _loads(text), None
    except ValueError as exc:  # JSONDecodeError is a ValueError
        return None, str(exc)
    except RecursionError:
        return None, "nested too deeply"


def _dump_string(text: str, ascii: bool = False) -> str:
    return encode_basestring_ascii(text) if ascii else encode_basestring(text)


def _dump(value: Any, ascii: bool = False) -> str:
    """``value`` as JSON text; ``ascii`` escapes every non-ASCII character (see :func:`_utf8`)."""
    if isinstance(value, _Number):
        return value.text
    if isinstance(value, str):
        return _dump_string(value, ascii)
    if isinstance(value, _Object):
        return "{" + ",".join(f"{_dump_string(k, ascii)}:{_dump(v, ascii)}" for k, v in value.pairs) + "}"
    if isinstance(value, dict):
        return "{" + ",".join(f"{_dump_string(k, ascii)}:{_dump(v, ascii)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_dump(v, ascii) for v in value) + "]"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _utf8(dump: Callable[[bool], str]) -> str:
    """``dump(False)``, unless it cannot be UTF-8 (a lone surrogate such as ``\\ud800`` read
    from an escape): then ``dump(True)``, every non-ASCII character escaped again."""
    text = dump(False)
    return text if _is_utf8(text) else dump(True)


def _kind(value: Any) -> str:
    """What a JSON value that is not an object is, for a reason text."""
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return "a number"


def _is_wrapped(value: Any) -> bool:
    """Kafka Connect's JsonConverter with schemas: ``{"schema": ..., "payload": ...}``."""
    return isinstance(value, _Object) and set(value) == {"schema", "payload"}


def _int64(value: Any) -> int | None:
    if isinstance(value, _Number) and _INTEGER.fullmatch(value.text):
        number = int(value.text)
        if _INT64[0] <= number <= _INT64[1]:
            return number
    return None


# --- the message key ----------------------------------------------------------------------


class _MessageKey:
    """What a message key offers for key columns: an object's fields (Kafka Connect's
    schema/payload wrapper unwrapped), or for a single key column one value: the JSON scalar
    the key parses as, else its text as a string. Worked out only when a record lacks a key
    column, so a record that holds its keys never pays for parsing the key."""

    def __init__(self, text: str | None, keys: Sequence[str], string_keys: frozenset[str]) -> None:
        self.text = text
        self.keys = keys
        self.string_keys = string_keys
        self._fields: dict[str, str] | None = None

    @property
    def fields(self) -> dict[str, str]:
        """Key column -> its value as JSON text."""
        if self._fields is None:
            self._fields = self._resolve()
        return self._fields

    def _resolve(self) -> dict[str, str]:
        text = self.text
        if text is None:
            return {}
        parsed, error = _parse(text)
        wrapped = error is None and _is_wrapped(parsed)
        if wrapped:
            parsed = parsed["payload"]
        if error is None and isinstance(parsed, _Object):
            return {k: _utf8(partial(_dump, parsed[k])) for k in self.keys if k in parsed}
        if len(self.keys) != 1 or (wrapped and parsed is None):
            return {}
        (key,) = self.keys
        scalar = error is None and not isinstance(parsed, list)
        if scalar and (isinstance(parsed, str) or key not in self.string_keys):
            return {key: _utf8(partial(_dump, parsed))}
        if wrapped:
            # A STRING key column: a number or boolean payload is its text.
            return {key: _dump_string(_dump(parsed))} if scalar else {}  # a number or boolean: ASCII
        # Not JSON, an array, or a STRING key column whose key is not a JSON string: key
        # 42 for a STRING column is the string "42", not a wrongly typed number.
        return {key: _utf8(partial(_dump_string, text))}


def _missing_keys(record: dict, keys: Sequence[str], key: _MessageKey, where: str | None) -> tuple[list[str], str | None]:
    """The members to add to ``record`` for key columns it lacks (as JSON member texts), or
    why a key column can be found nowhere (``where``: what the record came from, None for a
    tombstone, which has only the message key)."""
    added = []
    for name in keys:
        if name in record:
            continue
        if name not in key.fields:
            if where is None:
                return [], f"key column {name!r} is not in the message key"
            return [], f"key column {name!r} is neither in the {where} nor in the message key"
        added.append(f"{_utf8(partial(_dump_string, name))}:{key.fields[name]}")
    return added, None


# --- one message --------------------------------------------------------------------------

# (raw, delete, source position, map reason, the record's top-level fields by name (the value
# object's, or Debezium's ``after``'s), the Kafka Connect schema of the change event when the
# message carries one); None: the message is no record.
_Mapped = tuple[str, bool, "dict[str, Any] | None", "str | None", "Mapping[str, Any]", Any]
_NO_FIELDS: Mapping[str, Any] = {}


def _map_json(value: str | None, key: _MessageKey, keys: Sequence[str]) -> _Mapped:
    if value is None:
        # A tombstone deletes the record the message key names.
        added, reason = _missing_keys({}, keys, key, None)
        if reason is not None:
            return "", False, None, f"tombstone (null value) without a usable message key: {reason}", _NO_FIELDS, None
        return "{" + ",".join(added) + "}", True, None, None, _NO_FIELDS, None
    try:
        # Only the top level is looked at; the text itself goes on unchanged.
        record = json.loads(value, parse_constant=refuse_non_json_constant)
    except ValueError as exc:
        return value, False, None, f"value is not JSON ({exc})", _NO_FIELDS, None
    except RecursionError:
        return value, False, None, "value is not JSON (nested too deeply)", _NO_FIELDS, None
    if not isinstance(record, dict):
        return value, False, None, f"value is {_kind(record)}, not a JSON object", _NO_FIELDS, None
    added, reason = _missing_keys(record, keys, key, "value")
    if reason is not None:
        return value, False, None, reason, _NO_FIELDS, None
    if not added:
        return value, False, None, None, record, None
    # Splice the key members in after the opening brace: the rest stays byte for byte.
    brace = value.index("{")
    separator = "," if record else ""
    return value[: brace + 1] + ",".join(added) + separator + value[brace + 1 :], False, None, None, record, None


def _source_position(source: Any) -> dict[str, Any] | None:
    """PostgreSQL's ``lsn``, or MySQL's binlog ``file`` and ``pos`` (and ``row`` within the
    event); None when the event has neither (the Kafka offset orders it then)."""
    if not isinstance(source, _Object):
        return None
    lsn = _int64(source.get("lsn"))
    if lsn is not None:
        return {"lsn": lsn, "file": None, "pos": None, "row": None}
    file, pos = source.get("file"), _int64(source.get("pos"))
    if isinstance(file, str) and file and _is_utf8(file) and pos is not None:
        return {"lsn": None, "file": file, "pos": pos, "row": _int64(source.get("row"))}
    return None


def _map_debezium(value: str | None, key: _MessageKey, keys: Sequence[str]) -> _Mapped | None:
    if value is None:
        return None  # the tombstone after a delete, for log compaction: the delete was the record
    event, error = _parse(value)
    if error is not None:
        return value, False, None, f"debezium: value is not JSON ({error})", _NO_FIELDS, None
    connect_schema = None
    if _is_wrapped(event):
        event, connect_schema = event["payload"], event["schema"]
    if not isinstance(event, _Object):
        return value, False, None, f"debezium: the change event is {_kind(event)}, not an object", _NO_FIELDS, None
    op = event.get("op")
    if op in UPSERT_OPS:
        image, delete = "after", False
    elif op == DELETE_OP:
        image, delete = "before", True
    elif "op" not in event:
        return value, False, None, "debezium: the change event has no 'op'", _NO_FIELDS, None
    else:
        shown = repr(op) if isinstance(op, str) else _utf8(partial(_dump, op))
        if len(shown) > QUOTE_CHARS:
            shown = shown[:QUOTE_CHARS] + "..."
        return value, False, None, f"debezium: unknown op {shown}", _NO_FIELDS, None
    record = event.get(image)
    if not isinstance(record, _Object):
        return value, False, None, f"debezium: op {op!r} without a{'n' if image == 'after' else ''} {image!r} object", _NO_FIELDS, None
    added, reason = _missing_keys(record, keys, key, f"{image!r} object")
    if reason is not None:
        return value, False, None, reason, _NO_FIELDS, None
    body = _utf8(lambda ascii: ",".join(f"{_dump_string(k, ascii)}:{_dump(v, ascii)}" for k, v in record.pairs))
    separator = "," if added and record.pairs else ""
    # A delete's ``before`` gives only the key: its other fields reach no column.
    fields = _NO_FIELDS if delete else record
    return ("{" + ",".join(added) + separator + body + "}", delete, _source_position(event.get("source")), None, fields,
            connect_schema)


# --- batches ------------------------------------------------------------------------------


def _mapped_arrow_schema() -> "pyarrow.Schema":
    import pyarrow as pa

    return pa.schema(
        [
            pa.field("_file", pa.string()),
            pa.field("_partition", pa.string()),
            pa.field("_offset", pa.int64()),
            pa.field("_raw", pa.string()),
            pa.field("_delete", pa.bool_(), nullable=False),
            pa.field(
                "_srcpos",
                pa.struct(
                    [
                        pa.field("lsn", pa.int64()),
                        pa.field("file", pa.string()),
                        pa.field("pos", pa.int64()),
                        pa.field("row", pa.int64()),
                    ]
                ),
            ),
            pa.field("_map_reason", pa.string()),
            pa.field(
                "_unknown",
                pa.list_(
                    pa.struct(
                        [
                            pa.field("name", pa.string()),
                            pa.field("records", pa.int64()),
                            pa.field("partition", pa.int32()),
                            pa.field("offset", pa.int64()),
                            pa.field("type", pa.string()),
                            pa.field("type_partition", pa.int32()),
                            pa.field("type_offset", pa.int64()),
                            pa.field("other_type", pa.string()),
                            pa.field("other_partition", pa.int32()),
                            pa.field("other_offset", pa.int64()),
                            pa.field("problem", pa.string()),
                        ]
                    )
                ),
            ),
        ]
    )


def map_messages(
    batch: "pyarrow.RecordBatch",
    *,
    topic: str,
    keys: tuple[str, ...],
    envelope: str,
    string_keys: Sequence[str] = (),
    known: Collection[str] | None = None,
    refused: Collection[str] = (),
) -> "pyarrow.RecordBatch":
    """One row per message of ``batch`` (columns of ``kafka.SLICE_SCHEMA``) that is a record,
    with the columns of :data:`MAPPED_SCHEMA`. Pure Python, for the executors. Never raises
    for a bad message: it gets ``_map_reason``. ``string_keys`` are the key columns typed
    STRING: a non-object message key is their value as text (key ``42`` is ``"42"``).
    ``known``: the schema's column names; the top-level fields of the records that it does not
    name are observed as they are parsed, with the types of their values
    (:class:`~kafka_field_types.FieldObserver`; ``_unknown`` on the first row; None: not
    observed). ``refused``: fields the schema does not take (schema evolution policy
    ``none``): a record carrying one is a bad record naming it."""
    import pyarrow as pa

    if envelope not in ENVELOPES:
        raise ConfigurationError(f"unknown kafka envelope {envelope!r}; expected one of {ENVELOPES}", field="envelope")
    strings = frozenset(string_keys)
    mapper = _map_json if envelope == "json" else _map_debezium
    schema = _mapped_arrow_schema()
    columns: dict[str, list[Any]] = {name: [] for name in schema.names if name != "_unknown"}
    named = None if known is None else frozenset(known)
    shapes: dict[tuple[str, ...], tuple[str, ...]] = {}  # a record's fields -> those not named
    observer = FieldObserver()
    refused_names = frozenset(refused)
    data = batch.to_pydict()
    problems = data.get("problem") or [None] * batch.num_rows
    for partition, offset, key_text, value, problem in zip(
        data["partition"], data["offset"], data["key"], data["value"], problems
    ):
        try:
            if problem is not None:
                # Undecodable bytes (read_range said why): a bad record, judged by the batch's rule.
                mapped: _Mapped | None = "", False, None, problem, _NO_FIELDS, None
            else:
                mapped = mapper(value, _MessageKey(key_text, keys, strings), keys)
        except Exception as exc:  # a rule missed: the message is still only a bad record
            mapped = value or "", False, None, f"message cannot be mapped ({type(exc).__name__}: {str(exc)[:QUOTE_CHARS]})", _NO_FIELDS, None
        if mapped is None:
            continue
        raw, delete, position, reason, fields, connect_schema = mapped
        if named is not None:
            # Most records of a topic share one set of fields: judge each set once.
            shape = tuple(fields)
            names = shapes.get(shape)
            if names is None:
                names = tuple({name: None for name in shape if name not in named})
                if len(shapes) < MAX_FIELD_SHAPES:
                    shapes[shape] = names
            if names:
                _observe(observer, names, fields, connect_schema, partition, offset)
                if reason is None:
                    reason = _refused_reason(names, refused_names)
        columns["_file"].append(message_file(topic, partition, offset))
        columns["_partition"].append(str(partition))
        columns["_offset"].append(offset)
        columns["_raw"].append(raw)
        columns["_delete"].append(delete)
        columns["_srcpos"].append(position)
        columns["_map_reason"].append(reason)
    columns["_unknown"] = [None] * len(columns["_file"])
    if observer.fields:
        columns["_unknown"][0] = observer.entries()
    return pa.RecordBatch.from_arrays([pa.array(columns[f.name], f.type) for f in schema], schema=schema)


def _after_field_schemas(connect_schema: Any) -> Mapping[str, Any]:
    """The Kafka Connect schemas of the fields of a change event's ``after``, by name; empty
    when the event's schema does not describe them."""
    if not isinstance(connect_schema, Mapping) or not isinstance(connect_schema.get("fields"), list):
        return _NO_FIELDS
    for envelope_field in connect_schema["fields"]:
        if isinstance(envelope_field, Mapping) and envelope_field.get("field") == "after":
            fields = envelope_field.get("fields")
            if isinstance(fields, list):
                return {f["field"]: f for f in fields if isinstance(f, Mapping) and isinstance(f.get("field"), str)}
    return _NO_FIELDS


def _observe(observer: FieldObserver, names: Iterable[str], fields: Mapping[str, Any], connect_schema: Any,
             partition: int, offset: int) -> None:
    """Observe the fields ``names`` of a record: typed by the change event's schema where it
    describes them, else by their values."""
    described = _after_field_schemas(connect_schema) if connect_schema is not None else _NO_FIELDS
    for name in names:
        try:
            spark_type = connect_type(described[name]) if name in described else json_value_type(fields[name])
        except UnsupportedFieldType as exc:
            observer.observe(name, partition, offset, None, problem=str(exc))
        else:
            observer.observe(name, partition, offset, spark_type)


def _refused_reason(names: Iterable[str], refused: frozenset[str]) -> str | None:
    for name in names:
        if name in refused:
            return refused_field_reason(name)
    return None


def kafka_observed_fields(shard_id: str, topic: str, entries: Iterable[Mapping[str, Any]]) -> list[ObservedField]:
    """The fields the schema does not name of a batch's records, with their types, from the
    ``_unknown`` entries of its slice batches (``where``: the first message carrying one, as
    ``_file`` names it). Raises BatchSchemaRefused when messages disagree on a field's type."""
    return observed_fields(shard_id, entries, position=partial(message_file, topic))


def kafka_field_counts(topic: str, counted: Iterable[Mapping[str, Any]]) -> list[tuple[str, int, str]]:
    """(field, records carrying it, first message as ``_file`` names it) from the ``_unknown``
    entries of a batch's slice batches: records summed per field, the first message the one
    with the lowest (partition, offset)."""
    merged: dict[str, tuple[int, int, int]] = {}
    for entry in counted:
        name, records, position = entry["name"], int(entry["records"]), (int(entry["partition"]), int(entry["offset"]))
        before = merged.get(name)
        merged[name] = (records, *position) if before is None else (before[0] + records, *min(before[1:], position))
    return [(name, records, message_file(topic, partition, offset))
            for name, (records, partition, offset) in sorted(merged.items())]


def _map_all(
    batches: Iterator["pyarrow.RecordBatch"], topic: str, keys: tuple[str, ...], envelope: str, string_keys: tuple[str, ...],
    known: tuple[str, ...], refused: tuple[str, ...],
) -> Iterator["pyarrow.RecordBatch"]:
    for batch in batches:
        yield map_messages(batch, topic=topic, keys=keys, envelope=envelope, string_keys=string_keys, known=known,
                           refused=refused)


def _string_keys(config: ShardConfig) -> tuple[str, ...]:
    from pyspark.sql.types import StringType

    schema = user_schema(config)
    return tuple(k for k in config.keys if isinstance(schema[k].dataType, StringType))


def kafka_batch_records(
    spark: "SparkSession", config: ShardConfig, messages: "DataFrame", *, topic: str, envelope: str,
    refused: Sequence[str] = (),
) -> BatchRecords:
    """The records of a batch read from Kafka (``messages``: columns of ``kafka.SLICE_SCHEMA``),
    each judged as a JSON Lines record is (``records.judge_lines``). ``records`` columns:
    ``_file`` (``kafka:<topic>/<partition>/<offset>``), ``_partition``, ``_offset``, ``_line``
    (0), ``_raw``, the user columns, ``_reason`` (why the message could not be mapped, else
    the validator's reason), ``_delete``, ``_srcpos`` (null without a source position) and
    ``_unknown`` (the fields the schema does not name, observed per slice batch as the messages
    are parsed: :func:`map_messages`). ``refused``: fields whose records are bad records
    (schema evolution policy ``none``)."""
    del spark  # the messages' session does the work; kept for the shape every source has
    if envelope not in ENVELOPES:
        raise ConfigurationError(f"unknown kafka envelope {envelope!r}; expected one of {ENVELOPES}", field="envelope")
    mapper = partial(_map_all, topic=topic, keys=tuple(config.keys), envelope=envelope, string_keys=_string_keys(config),
                     known=tuple(config.column_names()), refused=tuple(refused))
    mapped = messages.mapInArrow(mapper, MAPPED_SCHEMA)
    judged = judge_lines(
        mapped, config, passthrough=["_file", "_partition", "_offset", "_delete", "_srcpos", "_map_reason", "_unknown"]
    )
    records = judged.selectExpr(
        "_file",
        "_partition",
        "_offset",
        "CAST(0 AS BIGINT) AS _line",
        "_raw",
        *[sql_name(f.name) for f in user_schema(config).fields],
        "coalesce(_map_reason, _reason) AS _reason",
        "_delete",
        "_srcpos",
        "_unknown",
    )
    return BatchRecords(records, lines=None, change_events=True)


def infer_kafka_schema(
    spark: "SparkSession",
    source: "KafkaSource",
    *,
    envelope: str,
    sample_per_partition: int = 200,
    keys: Sequence[str] = (),
) -> str:
    """The schema JSON (as a shard stores it) of the records in the first
    ``sample_per_partition`` messages of each partition, read on the driver; columns in the
    order of the first record. ``keys``: key columns to take from message keys when the
    values lack them (without it, such a column is not seen). Raises ConfigurationError
    (field ``schema``) when those messages hold no record."""
    from pyspark.sql.types import StructType

    from airflow_upsert_provider.engine.sources.kafka import read_range

    raws: list[str] = []
    first_reason: str | None = None
    for partition, (low, high) in sorted(source.watermarks().items()):
        end = min(low + sample_per_partition, high)
        for batch in read_range(source.config, source.topic, partition, low, end, stall_timeout=source.stall_timeout):
            mapped = map_messages(batch, topic=source.topic, keys=tuple(keys), envelope=envelope).to_pydict()
            for raw, reason in zip(mapped["_raw"], mapped["_map_reason"]):
                if reason is None:
                    raws.append(raw)
                elif first_reason is None:
                    first_reason = reason
    order: list[str] = []
    for raw in raws:
        try:
            record = json.loads(raw)
        except ValueError:
            continue
        if isinstance(record, dict):
            order += [name for name in record if name not in order]
    # A DataFrame of strings, not an RDD: Spark Connect sessions have no SparkContext.
    inferred = (
        spark.read.option("mode", "PERMISSIVE").json(spark.createDataFrame([(raw,) for raw in raws], "value string")).schema
        if raws else StructType()
    )
    fields = {f.name: f for f in inferred.fields if f.name != "_corrupt_record"}
    if not fields:
        hint = f" (first bad message: {first_reason})" if first_reason else ""
        raise ConfigurationError(
            f"kafka topic {source.topic!r} holds no {envelope} records in the first {sample_per_partition} messages of "
            f"any partition to infer a schema from{hint}; pass --schema",
            field="schema",
        )
    order = [name for name in order if name in fields] + [name for name in fields if name not in order]
    return StructType([fields[name] for name in order]).json()
