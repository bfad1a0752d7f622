"""Which Parquet (Arrow) column types a shard column of each Spark type may be read from.

Decided from the file's footer when a batch is bound, so a mismatch is bad input naming the
file and column, never a Spark error in the middle of a batch. A pair is accepted only if
Spark reads it and every value survives unchanged: integers into integers at least as wide,
integers up to 32 bits and floats into DOUBLE, decimals into decimals with at least as many
integer and fraction digits, timestamps by time zone (UTC-adjusted into TIMESTAMP, local into
TIMESTAMP_NTZ) in milli- or microseconds. Nested columns are checked structurally.
"""

from __future__ import annotations

import re
from typing import Any, Callable

import pyarrow as pa
import pyarrow.types as pat

# Spark integer type -> its width in bits; signed Arrow ints of at most that width fit, and
# unsigned ones of at most width-1 bits.
_INT_BITS = {"byte": 8, "short": 16, "integer": 32, "long": 64}
_DECIMAL = re.compile(r"decimal\((\d+),\s*(-?\d+)\)")


def _int_fits(arrow_type: pa.DataType, bits: int) -> bool:
    if pat.is_signed_integer(arrow_type):
        return arrow_type.bit_width <= bits
    if pat.is_unsigned_integer(arrow_type):
        return arrow_type.bit_width < bits
    return False


def type_problem(spark_type: Any, arrow_type: pa.DataType) -> str | None:
    """Why a column of ``arrow_type`` cannot be read into ``spark_type`` (the schema JSON
    form: a name such as ``"long"``, or a dict for nested types), or None."""
    if pat.is_dictionary(arrow_type):
        arrow_type = arrow_type.value_type
    expected = _spark_type_name(spark_type)
    mismatch = f"expected {expected}, got {arrow_type}"
    if isinstance(spark_type, dict):
        return _nested_problem(spark_type, arrow_type, mismatch)
    if spark_type in _INT_BITS:
        return None if _int_fits(arrow_type, _INT_BITS[spark_type]) else mismatch
    if spark_type == "double":
        ok = pat.is_float32(arrow_type) or pat.is_float64(arrow_type) or _int_fits(arrow_type, 32)
        return None if ok else mismatch
    if spark_type == "float":
        return None if pat.is_float32(arrow_type) else mismatch
    if spark_type == "string":
        return None if pat.is_string(arrow_type) or pat.is_large_string(arrow_type) else mismatch
    if spark_type == "binary":
        ok = any(check(arrow_type) for check in (pat.is_binary, pat.is_large_binary, pat.is_fixed_size_binary, pat.is_string, pat.is_large_string))
        return None if ok else mismatch
    if spark_type == "boolean":
        return None if pat.is_boolean(arrow_type) else mismatch
    if spark_type == "date":
        return None if pat.is_date32(arrow_type) or pat.is_date64(arrow_type) else mismatch
    if spark_type in ("timestamp", "timestamp_ntz"):
        if not pat.is_timestamp(arrow_type) or arrow_type.unit not in ("ms", "us"):
            return mismatch
        if (arrow_type.tz is not None) != (spark_type == "timestamp"):
            zone = "UTC-adjusted" if arrow_type.tz is not None else "local (no time zone)"
            other = "timestamp" if arrow_type.tz is not None else "timestamp_ntz"
            return f"{mismatch} ({zone} timestamps go into a {other} column)"
        return None
    decimal = _DECIMAL.fullmatch(spark_type) if isinstance(spark_type, str) else None
    if decimal:
        precision, scale = int(decimal.group(1)), int(decimal.group(2))
        if not pat.is_decimal(arrow_type):
            return mismatch
        if arrow_type.scale > scale or arrow_type.precision - arrow_type.scale > precision - scale:
            return f"{mismatch} (values would not fit)"
        return None
    return f"column type {expected} is not supported in Parquet segments"


def _spark_type_name(spark_type: Any) -> str:
    if isinstance(spark_type, dict):
        return str(spark_type.get("type"))
    return str(spark_type)


def _nested_problem(spark_type: dict[str, Any], arrow_type: pa.DataType, mismatch: str) -> str | None:
    kind = spark_type.get("type")
    if kind == "array":
        if not (pat.is_list(arrow_type) or pat.is_large_list(arrow_type)):
            return mismatch
        inner = type_problem(spark_type["elementType"], arrow_type.value_type)
        return None if inner is None else f"array element: {inner}"
    if kind == "map":
        if not pat.is_map(arrow_type):
            return mismatch
        key = type_problem(spark_type["keyType"], arrow_type.key_type)
        if key is not None:
            return f"map key: {key}"
        value = type_problem(spark_type["valueType"], arrow_type.item_type)
        return None if value is None else f"map value: {value}"
    if kind == "struct":
        if not pat.is_struct(arrow_type):
            return mismatch
        present = {arrow_type.field(i).name: arrow_type.field(i).type for i in range(arrow_type.num_fields)}
        for spec in spark_type["fields"]:
            # A missing struct field reads as null, as a missing top-level column does.
            if spec["name"] in present:
                inner = type_problem(spec["type"], present[spec["name"]])
                if inner is not None:
                    return f"struct field '{spec['name']}': {inner}"
        return None
    return f"column type {kind} is not supported in Parquet segments"


def _wider_types(spark_type: Any) -> list[str]:
    """The types a column of ``spark_type`` may widen to, narrowest first (the widenings of
    engine/table/schema_evolution.py ``widens``, within what Spark's Parquet reader reads)."""
    if spark_type in _INT_BITS:
        return [t for t, bits in _INT_BITS.items() if bits > _INT_BITS[spark_type]]
    if spark_type == "float":
        return ["double"]
    decimal = _DECIMAL.fullmatch(spark_type) if isinstance(spark_type, str) else None
    if decimal:
        precision, scale = int(decimal.group(1)), int(decimal.group(2))
        return [f"decimal({p},{scale})" for p in range(precision + 1, MAX_DECIMAL_PRECISION + 1)]
    return []


MAX_DECIMAL_PRECISION = 38  # Spark's DecimalType


def widened_type(spark_type: Any, arrow_type: pa.DataType) -> str | None:
    """The narrowest type a column of ``spark_type`` widens to so that it reads a Parquet
    column of ``arrow_type`` with every value unchanged (int64 into an integer column: long;
    double into a float column: double; decimal(12,2) into a decimal(10,2) column:
    decimal(12,2)); None when the column reads it as it is, or no widening does. Pure."""
    if type_problem(spark_type, arrow_type) is None:
        return None
    return next((t for t in _wider_types(spark_type) if type_problem(t, arrow_type) is None), None)


# Why the policy refuses to widen column (name, its type, the wider type), or None: it widens.
WideningRefusal = Callable[[str, Any, str], "str | None"]


def parquet_schema_problem(
    path: str, schema_fields: list[dict[str, Any]], keys: tuple[str, ...], refuse_widening: WideningRefusal | None = None
) -> str | None:
    """A whole-file mismatch between a Parquet segment and the shard schema, or None.
    A file's schema is immutable, so every writer reaches the same verdict. A column the file
    holds in a wider type (:func:`widened_type`) is no mismatch when ``refuse_widening``
    answers None for it (the batch widens the column); otherwise its answer says why."""
    import pyarrow.parquet as pq

    try:
        arrow_schema = pq.read_schema(path)
    except Exception as exc:  # pyarrow raises several types for a corrupt footer
        return f"unreadable Parquet footer: {exc}"
    fields = {f.name: f for f in arrow_schema}
    for spec in schema_fields:
        name = spec["name"]
        if name not in fields:
            if name in keys:
                return f"missing key column '{name}'"
            continue
        problem = type_problem(spec["type"], fields[name].type)
        if problem is None:
            continue
        target = widened_type(spec["type"], fields[name].type)
        if target is None or refuse_widening is None:
            return f"field '{name}': {problem}"
        refusal = refuse_widening(name, spec["type"], target)
        if refusal is not None:
            return f"field '{name}': {problem}, a widening to {target}: {refusal}"
    return None
