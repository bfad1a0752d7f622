"""Segment files parsed into the records of a batch, one verdict per record.

A JSON Lines record is judged by one expression over its own line, whatever the other lines of
the batch hold: every batch, clean or not, goes through the same parse and the same checks, so
a record's fate never depends on its neighbours and every writer reaches the same verdict.
The rules are in docs/input.md; in short, strict JSON (RFC 8259), one object per line.

Lines are read as Spark's text source splits them (a line ends at LF, CRLF or a lone CR) and
numbered by position; the line numbers a report shows are worked out only when something was
rejected (see :meth:`BatchRecords.rejected`), so a clean batch pays nothing for them.
"""

from __future__ import annotations

import codecs
import dataclasses
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_upsert_provider.engine.config import ShardConfig
from airflow_upsert_provider.engine.errors import BatchSchemaRefused
from airflow_upsert_provider.engine.table.runs import user_schema
from airflow_upsert_provider.engine.table.schema_evolution import NONE, ObservedField, locked_columns
from airflow_upsert_provider.engine.sources import Segment

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# How much of a bad value an error message quotes.
QUOTE_CHARS = 80

# Strict JSON: Spark's JSON parser otherwise accepts NaN/Infinity and single quotes.
JSON_OPTIONS = {
    "mode": "PERMISSIVE",
    "columnNameOfCorruptRecord": "_corrupt",
    "allowNonNumericNumbers": "false",
    "allowSingleQuotes": "false",
    "allowUnquotedFieldNames": "false",
    "allowComments": "false",
    "allowNumericLeadingZeros": "false",
    "allowBackslashEscapingAnyCharacter": "false",
    "allowUnquotedControlChars": "false",
}

# Blank lines (JSON whitespace only) are not records.
NOT_BLANK = "trim(BOTH ' \\t' FROM _raw) != ''"

MALFORMED = "malformed JSON: not a JSON object"
TRAILING = "malformed JSON: text after the object (one JSON object per line)"
INVALID_UTF8 = "not valid UTF-8"

def sql_string(text: str) -> str:
    """``text`` as a Spark SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def sql_name(name: str) -> str:
    """A column name quoted for Spark SQL."""
    return "`" + name.replace("`", "``") + "`"


def segment_columns(file_column: str) -> dict[str, str]:
    """Partition and offset of a segment as SQL expressions over its path
    ``.../<partition>/<seq>.<ext>`` (both validated when the batch was bound). substring_index
    is used because a regular expression per record costs more than parsing the record."""
    return {
        "_partition": f"substring_index(substring_index({file_column}, '/', -2), '/', 1)",
        "_offset": f"CAST(substring_index(substring_index({file_column}, '/', -1), '.', 1) AS BIGINT)",
    }


@dataclass(frozen=True)
class BatchRecords:
    """The records of a batch: ``records`` has one row per record with ``_file``,
    ``_partition``, ``_offset``, ``_line`` (a position that orders records within a file),
    ``_raw``, the typed columns and ``_reason`` (null when the record is accepted)."""

    records: "DataFrame"
    # Every line of the JSON segments, blank ones included, to number the lines of rejects.
    lines: "DataFrame | None" = None
    # The records also carry ``_delete`` (a delete whatever the marker column says),
    # ``_srcpos`` (a source position that orders a key's changes before the offset does) and
    # ``_unknown`` (the fields the schema does not name, counted as messages were parsed):
    # a Kafka batch. Said here rather than read from the schema, which through Spark
    # Connect is one more round trip to the server per batch.
    change_events: bool = False

    def rejected(self) -> "DataFrame":
        """The rejected records with ``_file``, ``_partition``, ``_offset``, ``_line`` (the
        line number in the file, from 1, or the row number in a Parquet file), ``_reason``
        and ``_raw``. Costs one more pass over the segments; only called when something was
        rejected."""
        from pyspark.sql import functions as F

        bad = self.records.where(F.col("_reason").isNotNull())
        if self.lines is None:
            return bad.select("_file", "_partition", "_offset", "_line", "_reason", "_raw")
        return _numbered(self.lines, bad)


def jsonl_records(
    spark: "SparkSession", config: ShardConfig, segments: list[Segment], *, refused: Sequence[str] = ()
) -> BatchRecords:
    """Every non-blank line of the segments as a record, judged on its own (docs/input.md):
    the exact path, with a reason for every rejected record. A record carrying a field of
    ``refused`` (fields the schema does not name, under schema evolution policy ``none``) is
    bad, its reason naming the field."""
    lines = spark.read.text([s.path for s in segments]).selectExpr(
        "_metadata.file_path AS _file",
        "_metadata.file_block_start AS _block",
        # Rows of one file block are numbered consecutively within a task: _pos orders the
        # lines of a file however the files are split or packed into tasks.
        "monotonically_increasing_id() AS _pos",
        "value AS _raw",
    )
    # Spark's text source drops a byte order mark at the start of a file (as its JSON reader
    # does); anywhere else U+FEFF is not JSON whitespace and the line is malformed.
    judged = judge_lines(lines.where(NOT_BLANK), config, passthrough=["_file", "_block", "_pos"],
                         refused=refused)
    records = judged.selectExpr(
        "_file",
        *[f"{expr} AS {name}" for name, expr in segment_columns("_file").items()],
        "_block",
        "_pos",
        "_pos AS _line",
        "_raw",
        *[sql_name(f.name) for f in user_schema(config).fields],
        "_reason",
    )
    return BatchRecords(records, lines)


def judge_lines(
    lines: "DataFrame", config: ShardConfig, *, passthrough: Sequence[str], refused: Sequence[str] = ()
) -> "DataFrame":
    """The verdict on each record of ``lines``, one JSON text per row in ``_raw``: the
    columns ``passthrough`` (carried as they are), ``_raw``, the typed user columns and
    ``_reason`` (null when the record is accepted). One function for every source, so a
    record gets the same verdict and the same reason wherever it came from (docs/input.md).
    A record that carries a top-level field of ``refused`` is bad, its reason naming it."""
    from pyspark.sql import functions as F

    schema = user_schema(config)
    checks = _TypedChecks(config)
    carried = [sql_name(c) for c in passthrough]
    parsed = lines.withColumn("_r", F.from_json("_raw", checks.read_schema, JSON_OPTIONS))
    one_object = _one_object("_raw")
    # A field the schema does not name, under policy none: the record's top-level keys are
    # listed only when the batch carries such a field.
    carries = [f"array_contains(json_object_keys(_raw), {sql_string(name)})" for name in sorted(refused)]
    checked = parsed.selectExpr(
        *carried,
        "_raw",
        "is_valid_utf8(_raw) AS _utf8",
        f"{one_object} AS _one",
        *[f"{checks.value('_r', f.name)} AS {sql_name(f.name)}" for f in schema.fields],
        f"(NOT is_valid_utf8(_raw) OR NOT {one_object} OR {checks.bad('_r')}"
        f"{''.join(f' OR coalesce({c}, false)' for c in carries)}) AS _bad",
    )
    # The reasons are worked out for bad records only: a second parse, as a map of texts.
    options = ", ".join(f"{sql_string(k)}, {sql_string(v)}" for k, v in JSON_OPTIONS.items() if k != "columnNameOfCorruptRecord")
    with_map = checked.selectExpr(
        "*", f"CASE WHEN _bad THEN from_json(_raw, 'MAP<STRING,STRING>', map({options})) END AS _m"
    )
    reasons = [
        f"CASE WHEN NOT _utf8 THEN {sql_string(INVALID_UTF8)} END",
        f"CASE WHEN _m IS NULL THEN {sql_string(MALFORMED)} END",
        f"CASE WHEN NOT _one THEN {sql_string(TRAILING)} END",
    ]
    for key in config.keys:
        reasons.append(f"CASE WHEN NOT map_contains_key(_m, {sql_string(key)}) THEN {sql_string(f'missing key column {key!r}')} END")
        # A JSON null; a value of the wrong type is reported by the field checks below.
        reasons.append(f"CASE WHEN _m[{sql_string(key)}] IS NULL THEN {sql_string(f'null key column {key!r}')} END")
    for spec in schema.fields:
        raw = f"_m[{sql_string(spec.name)}]"
        if spec.name in checks.floats:
            reasons.append(
                f"CASE WHEN NOT (abs({sql_name(spec.name)}) < double('inf')) "
                f"THEN {sql_string(f'field {spec.name!r}: number out of range for {spec.dataType.simpleString()}')} END"
            )
        expected = sql_string(f"field {spec.name!r}: expected {spec.dataType.simpleString()}, got ")
        reasons.append(
            f"CASE WHEN {raw} IS NOT NULL AND {sql_name(spec.name)} IS NULL "
            f"THEN concat({expected}, substring({raw}, 1, {QUOTE_CHARS})) END"
        )
    reasons += [f"CASE WHEN {c} THEN {sql_string(refused_field_reason(name))} END"
                for c, name in zip(carries, sorted(refused))]
    return with_map.selectExpr(
        *carried,
        "_raw",
        *[sql_name(f.name) for f in schema.fields],
        f"CASE WHEN _bad THEN coalesce({', '.join(reasons)}, {sql_string('malformed JSON')}) END AS _reason",
    )


def refused_field_reason(name: str) -> str:
    """Why a record carrying ``name``, a field the schema does not name, is bad under schema
    evolution policy ``none`` (docs/schema.md)."""
    return (f"field {name!r} is not a column of the shard's schema (schema evolution policy none: "
            "add it with `upsertctl schema add-column`, or set a policy that adds columns)")


# Up to this many bytes of segments, the driver scans a batch's lines itself
# (:func:`simple_jsonl`, about 40 ms per 10 MB) instead of starting a Spark job for it; a
# bigger batch is scanned by Spark on the executors.
DRIVER_SCAN_BYTES = 64 * 1024 * 1024


def jsonl_fast_path_decides(spark: "SparkSession", segments: list[Segment]) -> bool:
    """Whether Spark's JSON reader (:func:`jsonl_records_fast`) reads every line of the
    segments exactly as :func:`jsonl_records` does: each line is blank, or valid UTF-8 that
    starts with '{' and holds nothing after its object. The reader cannot see what follows
    the first value of a line, nor invalid UTF-8 (it decodes it to U+FFFD); a batch with any
    such line goes to the exact path.

    A batch of at most :data:`DRIVER_SCAN_BYTES` whose lines are all :func:`simple_jsonl` is
    decided on the driver, without a Spark job; any other batch by one Spark scan of the
    text, which parses only a line whose only '}' is not its last character."""
    paths = [s.path for s in segments]
    if sum(os.path.getsize(p) for p in paths) <= DRIVER_SCAN_BYTES and all(simple_jsonl(_read(p)) for p in paths):
        return True
    return spark_scan_decides(spark, paths)


def spark_scan_decides(spark: "SparkSession", paths: list[str]) -> bool:
    """The Spark scan of :func:`jsonl_fast_path_decides`: every line blank, or valid UTF-8
    starting with '{' with nothing after its object."""
    clean = (
        "is_valid_utf8(value) AND (_t = '' OR (startswith(_t, '{') AND "
        f"{_one_object('_t')}))"
    )
    row = (
        spark.read.text(paths)
        .selectExpr("value", "trim(BOTH ' \\t' FROM value) AS _t")
        .selectExpr(f"bool_and({clean}) AS clean")
        .collect()[0]
    )
    return bool(row["clean"])


def simple_jsonl(data: bytes) -> bool:
    """Whether every line of ``data`` (split as Spark's text source splits: LF, CRLF or a
    lone CR) is blank or, trimmed of spaces and tabs, starts with '{' and holds its only '}'
    as its last character, and ``data`` is valid UTF-8. Every such line is one the Spark
    scan of :func:`jsonl_fast_path_decides` finds clean; False only means "not decided
    here" (a nested object, a byte order mark...), and the Spark scan decides."""
    for line in data.splitlines():  # bytes split on LF, CRLF and CR only
        text = line.strip(b" \t")
        if text and (text[0] != 0x7B or text.find(b"}") != len(text) - 1):
            return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _read(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def jsonl_records_fast(spark: "SparkSession", config: ShardConfig, segments: list[Segment]) -> BatchRecords:
    """The records of a batch for which :func:`jsonl_fast_path_decides`, read by Spark's JSON
    reader (faster than parsing lines as expressions) with the same parser options and the
    same typed checks as :func:`jsonl_records`, so a record gets the same verdict. ``_reason``
    only marks a record as bad; the batch is then staged again by :func:`jsonl_records`,
    which says why and where."""
    schema = user_schema(config)
    checks = _TypedChecks(config)
    reader = spark.read.schema(checks.read_schema)
    for option, setting in JSON_OPTIONS.items():
        reader = reader.option(option, setting)
    return BatchRecords(
        reader.json([s.path for s in segments]).selectExpr(
            "_metadata.file_path AS _file",
            *[f"{expr} AS {name}" for name, expr in segment_columns("_metadata.file_path").items()],
            # A position, not a line number: it grows with the line within a file.
            "monotonically_increasing_id() AS _line",
            "CAST(NULL AS STRING) AS _raw",
            *[f"{checks.value('', f.name)} AS {sql_name(f.name)}" for f in schema.fields],
            f"CASE WHEN {checks.bad('')} THEN 'bad record' END AS _reason",
        )
    )


class _TypedChecks:
    """What both paths check on a parsed record, as SQL over its struct (or its top-level
    columns when ``struct`` is empty): the read schema, the typed value of each column and
    whether the record is bad."""

    def __init__(self, config: ShardConfig) -> None:
        from pyspark.sql.types import DoubleType, FloatType, StringType, StructField, StructType, VariantType

        schema = user_schema(config)
        self.keys = list(config.keys)
        self.fields = [f.name for f in schema.fields]
        # A STRING column is read as a VARIANT so that its JSON type can be checked: Spark's
        # JSON parser would otherwise store an object, array, number or boolean as its text.
        self.strings = {f.name for f in schema.fields if isinstance(f.dataType, StringType)}
        self.floats = {f.name for f in schema.fields if isinstance(f.dataType, (DoubleType, FloatType))}
        self.read_schema = StructType(
            [StructField(f.name, VariantType()) if f.name in self.strings else f for f in schema.fields]
            + [StructField("_corrupt", StringType())]
        )

    def _ref(self, struct: str, name: str) -> str:
        return f"{struct}.{sql_name(name)}" if struct else sql_name(name)

    def value(self, struct: str, name: str) -> str:
        field = self._ref(struct, name)
        if name in self.strings:
            return f"CASE WHEN schema_of_variant({field}) = 'STRING' THEN variant_get({field}, '$', 'string') END"
        return field

    def bad(self, struct: str) -> str:
        ref = self._ref
        checks = [
            f"{struct} IS NULL" if struct else "false",
            f"{ref(struct, '_corrupt')} IS NOT NULL",
            *[f"({self.value(struct, k)}) IS NULL" for k in self.keys],
            # A JSON null is a null; any other JSON value but a string is bad.
            *[
                f"(({self.value(struct, s)}) IS NULL AND {ref(struct, s)} IS NOT NULL AND NOT is_variant_null({ref(struct, s)}))"
                for s in self.strings
            ],
            # NaN and Infinity are not JSON; a number beyond the type's range reads as one.
            *[f"coalesce(NOT (abs({ref(struct, d)}) < double('inf')), false)" for d in self.floats],
        ]
        return "(" + " OR ".join(checks) + ")"


def _one_object(text: str) -> str:
    """SQL: the first JSON value of ``text`` (if it parses) is all there is. Spark's parser
    ignores whatever follows the first value of a line. A line whose only '}' is its last
    character cannot hold more; any other line is scanned once more, wrapped in an array and in
    an object: text after the value breaks one or the other (or makes the array longer)."""
    return (
        f"(instr({text}, '}}') = length(trim(TRAILING ' \\t' FROM {text})) OR coalesce("
        f"json_array_length(concat('[', {text}, ']')) = 1 "
        f"AND json_object_keys(concat('{{\"_\":', {text}, '}}')) IS NOT NULL, false))"
    )


def _numbered(lines: "DataFrame", bad: "DataFrame") -> "DataFrame":
    """``bad`` with ``_line`` the line number in its file: a file's blocks are counted in
    order (each block's lines are consecutive positions), blank lines included."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    blocks = (
        lines.groupBy("_file", "_block")
        .agg(F.min("_pos").alias("_first"), F.count(F.lit(1)).alias("_count"))
        .collect()
    )
    starts = []
    line = {}
    for row in sorted(blocks, key=lambda r: (r["_file"], r["_block"])):
        start = line.get(row["_file"], 1)
        starts.append((row["_file"], row["_block"], row["_first"], start))
        line[row["_file"]] = start + row["_count"]
    schema = StructType(
        [
            StructField("_file", StringType()),
            StructField("_block", LongType()),
            StructField("_first", LongType()),
            StructField("_start", LongType()),
        ]
    )
    table = bad.sparkSession.createDataFrame(starts, schema)
    return bad.join(F.broadcast(table), ["_file", "_block"]).selectExpr(
        "_file", "_partition", "_offset", "_start + _pos - _first AS _line", "_reason", "_raw"
    )


def parquet_records(
    spark: "SparkSession", config: ShardConfig, segments: list[Segment], *, refused: Sequence[ObservedField] = ()
) -> BatchRecords:
    """Parquet segments. Their schemas were checked when the batch was bound (a missing key
    column or an incompatible type is a whole-file problem); here null keys are bad records,
    and so is every row of a file in ``refused`` (a column the schema does not name, under
    schema evolution policy ``none``), its reason naming the column.
    A Parquet file has one reader and no neighbours to depend on: ``_line`` is the row number."""
    from pyspark.sql import functions as F

    schema = user_schema(config)
    df = spark.read.schema(schema).parquet(*[s.path for s in segments])
    df = df.select(
        F.col("_metadata.file_path").alias("_file"),
        (F.col("_metadata.row_index") + 1).alias("_line"),
        F.to_json(F.struct(*[F.col(sql_name(f.name)) for f in schema.fields])).alias("_raw"),
        *[F.col(sql_name(f.name)) for f in schema.fields],
    ).withColumns({name: F.expr(expr) for name, expr in segment_columns("_file").items()})
    reasons = [F.when(F.col(sql_name(k)).isNull(), F.lit(f"null key column '{k}'")) for k in config.keys]
    if refused:
        path = F.url_decode(F.regexp_replace("_file", "^file:(//)?", ""))
        first = {}
        for seen in sorted(refused, key=lambda o: (o.where, o.name)):
            first.setdefault(seen.where, seen.name)
        reasons += [F.when(path == F.lit(where), F.lit(refused_field_reason(name))) for where, name in first.items()]
    records = df.select(
        "_file", "_partition", "_offset", "_line", "_raw",
        *[F.col(sql_name(f.name)) for f in schema.fields],
        F.coalesce(*reasons).alias("_reason"),
    )
    return BatchRecords(records)


# -- fields the shard's schema does not name --------------------------------------------------


@dataclass(frozen=True)
class UnknownField:
    """A field some records of a batch carry and the shard's schema does not name: how many
    records carry it, and the first file (by path) that holds one."""

    name: str
    records: int
    file: str


def unknown_fields(known: Sequence[str], counts: Sequence[tuple[str, int, str]]) -> list[UnknownField]:
    """Of ``counts`` (field, records carrying it, first file), the fields ``known`` (the
    schema's column names) does not name, by name; a field's name is compared exactly, as
    records are validated."""
    named = set(known)
    merged: dict[str, tuple[int, str]] = {}
    for name, records, file in counts:
        if name in named or records <= 0:
            continue
        before = merged.get(name)
        merged[name] = (records, file) if before is None else (before[0] + records, min(before[1], file))
    return [UnknownField(name, records, file) for name, (records, file) in sorted(merged.items())]


def unknown_fields_text(fields: Sequence[UnknownField]) -> str:
    """The fields as one log line says them: "'email' (12 records, first in /landing/p0/7.jsonl)"."""
    return "; ".join(f"{f.name!r} ({f.records} record{'' if f.records == 1 else 's'}, first in {f.file})"
                     for f in fields)


def jsonl_field_counts(
    spark: "SparkSession", config: ShardConfig, segments: list[Segment], *, widen: Mapping[str, str] | None = None
) -> list[tuple[str, int, str]]:
    """(field, records carrying it, file) per file for each top-level field of the segments'
    JSON lines that the schema does not name (a line that is not a JSON object has none), and
    for each column of ``widen`` (name -> its type, one of :data:`FITS`) whose value in a
    record does not fit that type: counted on the driver for a batch it scans anyway
    (:data:`DRIVER_SCAN_BYTES`), by one Spark aggregation over the lines' keys for a bigger
    one. A Spark job costs about 1 s warm for 100k lines, the driver 0.2 s
    (docs/performance.md): most batches are the driver's."""
    if sum(os.path.getsize(s.path) for s in segments) <= DRIVER_SCAN_BYTES:
        return jsonl_field_counts_on_driver(config, segments, widen=widen)
    return [(field, records, local_path(file))
            for field, records, file in _jsonl_field_counts_spark(spark, config, segments, widen=widen)]


# The column types a JSON value may overflow, and whether a parsed value fits each: an integer
# in the type's range, a number within FLOAT's (Spark reads a larger one as infinity, a bad
# record). A value of another JSON type is not a widening: the record is bad as it is.
FLOAT_MAX = 3.4028234663852886e38
_INT_RANGE = {"byte": 8, "short": 16, "integer": 32}
FITS = (*_INT_RANGE, "float")


def value_overflows(column_type: str, value: Any) -> bool:
    """Whether the JSON ``value`` is a number that a column of ``column_type`` (one of
    :data:`FITS`) cannot hold and a wider type could. Pure."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if column_type in _INT_RANGE:
        bits = _INT_RANGE[column_type]
        return isinstance(value, int) and not -(2 ** (bits - 1)) <= value < 2 ** (bits - 1)
    try:
        return abs(float(value)) > FLOAT_MAX and abs(float(value)) != float("inf")
    except OverflowError:  # an integer beyond any double: no float widening holds it
        return False


def jsonl_field_counts_on_driver(
    config: ShardConfig, segments: list[Segment], *, widen: Mapping[str, str] | None = None
) -> list[tuple[str, int, str]]:
    """:func:`jsonl_field_counts` by this process: the lines split as Spark's text source
    splits them, each parsed as JSON; the lines of a segment in one parse when they all are
    JSON (the common case, about 5x faster than a parse per line)."""
    known = set(config.column_names())
    widen = dict(widen or {})
    counts: dict[tuple[str, str], int] = {}
    for segment in sorted(segments, key=lambda s: s.path):
        for record in _json_values(_read(segment.path)):
            if not isinstance(record, dict):
                continue
            names = list(record.keys() - known)
            names += [n for n, t in widen.items() if n in record and value_overflows(t, record[n])]
            for name in names:
                counts[name, segment.path] = counts.get((name, segment.path), 0) + 1
    return [(name, records, path) for (name, path), records in counts.items()]


def _json_values(data: bytes) -> list:
    """The JSON value of every line of ``data`` that holds one, as Spark reads the line's text
    and parses it: bytes that are not UTF-8 read as U+FFFD, no NaN or Infinity, a byte order
    mark only at the start of the file (Spark's text source drops it there); blank and
    unparsable lines hold none. (A record with such bytes or such a mark elsewhere is a bad
    record, docs/input.md: its fields are counted as Spark counts them.)"""
    return _parsed_lines(data)[0]


def _parsed_lines(data: bytes) -> tuple[list, bool]:
    """:func:`_json_values` of ``data``, and whether every line that is not blank parsed."""
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    lines = [line for line in data.splitlines() if line.strip(b" \t")]  # LF, CRLF and CR, as Spark

    def parse(text: bytes) -> Any:
        return json.loads(text.decode("utf-8", errors="replace"), parse_constant=refuse_non_json_constant)

    try:
        return parse(b"[" + b",".join(lines) + b"]"), True
    except ValueError:  # a line that is not JSON: parse them one by one
        values = []
        for line in lines:
            try:
                values.append(parse(line))
            except ValueError:
                continue
        return values, False


_LONG_RANGE = (-(2 ** 63), 2 ** 63 - 1)


def _scalar_type(value: Any) -> str | None:
    """Spark's JSON inference's type of a null, boolean, number or string ``value`` (None for
    null and the empty string); raises ValueError for anything else (an object, an array, an integer beyond bigint,
    which Spark reads as a decimal)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) and _LONG_RANGE[0] <= value <= _LONG_RANGE[1]:
        return "long"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string" if value else None  # Spark's inference reads an empty string as null
    raise ValueError(f"not a scalar Spark's JSON inference types alike: {type(value).__name__}")


def jsonl_scalar_types(values: list, fields: set[str]) -> dict[str, str] | None:
    """The type of each of ``fields`` that Spark's JSON inference (``dropFieldIfAllNull``) gives
    a file whose records are ``values``, when every record is an object and each of their
    values of ``fields`` is a null, boolean, number in bigint's range or string: an integral
    number bigint, any other number double; bigint and double merge as double, any other two
    types as string, as Spark merges them within a file; a field null (or the empty string)
    in every record has no type (absent). None when any record or value is anything else: Spark's inference decides
    those. Pure."""
    types: dict[str, str] = {}
    for record in values:
        if not isinstance(record, dict):
            return None  # Spark reads a line's top-level array as records, a scalar as corrupt
        for name in fields & record.keys():
            try:
                seen = _scalar_type(record[name])
            except ValueError:
                return None
            known = types.get(name)
            if seen is None or known == seen:
                continue
            if known is None:
                types[name] = seen
            else:
                types[name] = "double" if {known, seen} == {"long", "double"} else "string"
    return types


def refuse_non_json_constant(constant: str) -> Any:
    """``json.loads``'s ``parse_constant``: NaN and Infinity are no JSON values (RFC 8259),
    whatever Python's parser accepts."""
    raise ValueError(f"{constant} is not a JSON value")


def _jsonl_field_counts_spark(
    spark: "SparkSession", config: ShardConfig, segments: list[Segment], *, widen: Mapping[str, str] | None = None
) -> list[tuple[str, int, str]]:
    """:func:`jsonl_field_counts` by Spark: (field, records, file as Spark names it)."""
    lines = spark.read.text([s.path for s in segments]).selectExpr("_metadata.file_path AS _file", "value")
    return _field_counts(lines, config, widen)


# The widest type of each column type a JSON value may overflow (:data:`FITS`).
WIDEST = {"byte": "long", "short": "long", "integer": "long", "float": "double"}


def accepted_field_counts(
    spark: "SparkSession", config: ShardConfig, paths: Sequence[str], *, widen: Mapping[str, str]
) -> list[tuple[str, int, str]]:
    """:func:`jsonl_field_counts` over only the records of the files ``paths`` that pass every
    check of the columns the schema has (docs/input.md), each column of ``widen`` taken at its
    widest type (:data:`WIDEST`: a value that overflows it is a widening, no reason): a field,
    or an overflow, carried only by records rejected for another reason (invalid UTF-8,
    malformed JSON, a missing or null key, a value of the wrong type) is not counted, so it
    changes no schema. One Spark job, run only for a batch whose plain count found something."""
    widest = {name: WIDEST[column_type] for name, column_type in widen.items()}
    fields = [{**f, "type": widest.get(f["name"], f["type"])} for f in config.schema_fields()]
    judged_as = dataclasses.replace(config, schema=json.dumps({**json.loads(config.schema), "fields": fields}))
    lines = spark.read.text(list(paths)).selectExpr("_metadata.file_path AS _file", "value AS _raw")
    accepted = (judge_lines(lines.where(NOT_BLANK), judged_as, passthrough=["_file"])
                .where("_reason IS NULL").selectExpr("_file", "_raw AS value"))
    return [(field, records, local_path(file)) for field, records, file in _field_counts(accepted, config, widen)]


def _field_counts(lines: "DataFrame", config: ShardConfig, widen: Mapping[str, str] | None) -> list[tuple[str, int, str]]:
    """(field, records, file) of :func:`jsonl_field_counts` over ``lines`` (``_file``, ``value``)."""
    from pyspark.sql import functions as F

    named = ", ".join(sql_string(name) for name in config.column_names())
    fields = lines.selectExpr("_file", "explode(json_object_keys(value)) AS _field").where(f"NOT _field IN ({named})")
    for name, column_type in sorted((widen or {}).items()):
        # The value's text as JSON has it; a number out of the type's range is a widening.
        text = f"from_json(value, 'MAP<STRING,STRING>')[{sql_string(name)}]"
        if column_type == "float":
            out = f"abs(try_cast({text} AS DOUBLE)) > {FLOAT_MAX!r} AND abs(try_cast({text} AS DOUBLE)) < double('inf')"
        else:
            out = f"{text} RLIKE '^-?[0-9]+$' AND try_cast({text} AS {column_type.upper()}) IS NULL"
        fields = fields.unionByName(lines.where(f"coalesce({out}, false)").selectExpr("_file", f"{sql_string(name)} AS _field"))
    rows = fields.groupBy("_field", "_file").agg(F.count(F.lit(1)).alias("_records")).collect()
    return [(r["_field"], int(r["_records"]), r["_file"]) for r in rows]


def local_path(uri: str) -> str:
    """A path Spark reports (``file:/x`` or ``file:///x``, URL-quoted) as a plain path."""
    from urllib.parse import unquote

    return unquote(re.sub(r"^file:(//)?", "", uri))


# -- the fields a batch carries, as schema evolution observes them (docs/schema.md) -------------


def widenable_columns(config: ShardConfig) -> dict[str, str]:
    """The columns whose JSON values a batch checks for a wider type, under every policy (a
    value that overflows is a widening, which only ``add_and_widen`` makes and the others
    refuse, naming it): those of a type in :data:`FITS`, but a key or the order column (which
    never change type: a value that does not fit stays a bad record)."""
    locked = locked_columns(config.keys, config.order_by)
    return {f["name"]: f["type"] for f in config.schema_fields() if f["type"] in FITS and f["name"] not in locked}


def observed_jsonl_fields(
    spark: "SparkSession", config: ShardConfig, segments: list[Segment], policy: str
) -> list[ObservedField]:
    """The top-level fields of a JSON Lines batch that may change the schema: each field the
    schema does not name, and each column a value overflows (:func:`widenable_columns`), per
    file that carries it in a record that passes the checks of the schema's columns
    (:func:`accepted_field_counts`: a rejected record changes no schema), typed by Spark's
    JSON inference over that file alone (a field null in every record of a file says nothing
    of its type there). Only the files that carry one are checked and inferred; a batch of
    known fields that fit costs the field count alone. Under ``none`` a new field's type is
    not needed (no column is added): it is None."""
    widen = widenable_columns(config)
    counts = jsonl_field_counts(spark, config, segments, widen=widen)
    if counts:  # rare: counted again from the records that pass (a rejected one changes no schema)
        counts = accepted_field_counts(spark, config, sorted({file for _, _, file in counts}), widen=widen)
    by_file: dict[str, set[str]] = {}
    observed = []
    for name, _, file in counts:
        if policy == NONE and name not in widen:
            observed.append(ObservedField(name, None, file))
        else:
            by_file.setdefault(file, set()).add(name)
    # A Spark inference job per file costs about a second warm, however small the file: a
    # batch the driver scans anyway is typed there when its new fields hold scalars.
    on_driver = sum(os.path.getsize(s.path) for s in segments) <= DRIVER_SCAN_BYTES
    for file in sorted(by_file):
        inferred = None
        if on_driver:
            values, every_line_parsed = _parsed_lines(_read(file))
            # A line that does not parse may still hold a record to Spark's inference.
            inferred = jsonl_scalar_types(values, by_file[file]) if every_line_parsed else None
        if inferred is None:
            reader = spark.read.option("dropFieldIfAllNull", "true")
            for option, setting in JSON_OPTIONS.items():
                reader = reader.option(option, setting)
            inferred = {f.name: f.dataType.jsonValue() for f in reader.json(file).schema.fields}
        observed += [ObservedField(name, inferred[name], file) for name in sorted(by_file[file]) if name in inferred]
    return observed


def observed_parquet_fields(config: ShardConfig, segments: list[Segment], policy: str) -> list[ObservedField]:
    """The columns of a Parquet batch's files that the schema does not name, per file, typed
    from the file's footer (no data read), and the columns a file holds in a wider type, typed
    as the column widened (:func:`widened_type`: the binding let them in, under a policy that
    widens). A column type Spark cannot read into a column is :class:`BatchSchemaRefused`
    naming the file. (A file whose column the schema names with another type was refused when
    the batch was bound.)"""
    import pyarrow.parquet as pq
    from pyspark.sql.pandas.types import from_arrow_type

    from airflow_upsert_provider.engine.sources.parquet_types import type_problem, widened_type

    known = {f["name"]: f["type"] for f in config.schema_fields()}
    observed = []
    for segment in sorted(segments, key=lambda s: s.path):
        for field in pq.read_schema(segment.path):
            if field.name in known:
                wider = widened_type(known[field.name], field.type)
                if wider is not None:
                    observed.append(ObservedField(field.name, wider, segment.path))
                continue
            if policy == NONE:
                observed.append(ObservedField(field.name, None, segment.path))
                continue
            try:
                spark_type = from_arrow_type(field.type).jsonValue()
            except (TypeError, NotImplementedError) as exc:
                spark_type, problem = None, str(exc)
            else:
                problem = type_problem(spark_type, field.type)
            if problem is not None:
                raise BatchSchemaRefused(
                    f"{segment.path}: new column {field.name!r} of Parquet type {field.type} cannot become a column "
                    f"({problem}); write it as another type, or add the column with `upsertctl schema add-column`",
                    column=field.name, file=segment.path, new_type=str(field.type), policy=policy,
                )
            observed.append(ObservedField(field.name, spark_type, segment.path))
    return observed
