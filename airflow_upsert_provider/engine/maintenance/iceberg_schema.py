"""The Iceberg schema of a shard's table: Spark's types mapped to Iceberg's, and why an
existing table's schema cannot take the shard's. All pure."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from airflow_upsert_provider.engine.config import ShardConfig
from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.engine.table.arrow_reader import output_columns

if TYPE_CHECKING:
    from pyiceberg.schema import Schema
    from pyiceberg.types import IcebergType

_DECIMAL = re.compile(r"decimal\((\d+),\s*(\d+)\)")
_STRING_LIKE = re.compile(r"(?:var)?char\(\d+\)")
_PRIMITIVES = {
    "boolean": "BooleanType",
    "byte": "IntegerType",
    "short": "IntegerType",
    "integer": "IntegerType",
    "long": "LongType",
    "float": "FloatType",
    "double": "DoubleType",
    "string": "StringType",
    "binary": "BinaryType",
    "date": "DateType",
    # Spark's TIMESTAMP is an instant (Arrow: timestamp[us, tz=UTC]); TIMESTAMP_NTZ is not.
    "timestamp": "TimestamptzType",
    "timestamp_ntz": "TimestampType",
}


def iceberg_type(spark_type: Any, column: str, counter: Iterator[int]) -> "IcebergType":
    """The Iceberg type of a column of Spark type ``spark_type`` (its JSON form, as the
    shard's schema stores it); nested fields take their ids from ``counter`` (placeholders,
    unique in the schema: the catalog assigns fresh ones when it creates the table). Every
    field is optional: the engine does not enforce NOT NULL. A type Iceberg has none for is a
    :class:`ConfigurationError` naming the column."""
    from pyiceberg import types as t

    def convert(node: Any, path: str) -> "IcebergType":
        if isinstance(node, str):
            name = _PRIMITIVES.get(node)
            if name is not None:
                return getattr(t, name)()
            decimal = _DECIMAL.fullmatch(node)
            if decimal:
                return t.DecimalType(int(decimal.group(1)), int(decimal.group(2)))
            if _STRING_LIKE.fullmatch(node):
                return t.StringType()
        elif isinstance(node, dict) and node.get("type") == "array":
            return t.ListType(next(counter), convert(node["elementType"], f"{path}.element"), element_required=False)
        elif isinstance(node, dict) and node.get("type") == "map":
            return t.MapType(
                next(counter), convert(node["keyType"], f"{path}.key"),
                next(counter), convert(node["valueType"], f"{path}.value"), value_required=False,
            )
        elif isinstance(node, dict) and node.get("type") == "struct":
            return t.StructType(*[
                t.NestedField(next(counter), f["name"], convert(f["type"], f"{path}.{f['name']}"), required=False)
                for f in node["fields"]
            ])
        shown = node if isinstance(node, str) else node.get("type") if isinstance(node, dict) else repr(node)
        raise ConfigurationError(
            f"column {path!r} has type {shown}, which Iceberg has no type for: it cannot be published",
            field="schema",
            column=path,
        )

    return convert(spark_type, column)


def iceberg_schema(config: ShardConfig) -> "Schema":
    """The Iceberg schema of the shard's table: the columns a read returns (keys first, the
    delete marker left out), each optional. Pure."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import NestedField

    types = {f["name"]: f["type"] for f in config.schema_fields()}
    columns = output_columns(config, None)
    nested_ids = itertools.count(len(columns) + 1)
    return Schema(*[
        NestedField(position, name, iceberg_type(types[name], name, nested_ids), required=False)
        for position, name in enumerate(columns, start=1)
    ])


def schema_mismatch(expected: "Schema", actual: "Schema", table: str) -> str | None:
    """Why an existing table whose schema is ``actual`` cannot take the shard's table
    (``expected``): the first field missing, extra or of another type, by name, named with
    both types; None when they agree (field ids and optionality aside). Pure."""
    wanted = {f.name: f for f in expected.fields}
    have = {f.name: f for f in actual.fields}
    for name, field in wanted.items():
        if name not in have:
            return f"Iceberg table {table} has no column {name!r} (shard column of type {field.field_type})"
        if not _same_type(field.field_type, have[name].field_type):
            return (f"Iceberg table {table}: column {name!r} is {have[name].field_type}, the shard's is "
                    f"{field.field_type}")
    extra = [name for name in have if name not in wanted]
    if extra:
        return (f"Iceberg table {table} has column {extra[0]!r}, which the shard's table does not have "
                f"(the shard's columns: {', '.join(wanted)})")
    return None


def _same_type(a: "IcebergType", b: "IcebergType") -> bool:
    """Equal types, nested field ids and optionality aside."""
    from pyiceberg import types as t

    if isinstance(a, t.StructType) and isinstance(b, t.StructType):
        return [f.name for f in a.fields] == [f.name for f in b.fields] and all(
            _same_type(x.field_type, y.field_type) for x, y in zip(a.fields, b.fields)
        )
    if isinstance(a, t.ListType) and isinstance(b, t.ListType):
        return _same_type(a.element_type, b.element_type)
    if isinstance(a, t.MapType) and isinstance(b, t.MapType):
        return _same_type(a.key_type, b.key_type) and _same_type(a.value_type, b.value_type)
    return a == b
