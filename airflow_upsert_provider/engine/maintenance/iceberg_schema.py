"""The Iceberg schema of a shard's table: Spark's types mapped to Iceberg's, and the
schema updates that make an existing table's schema the shard's (or why none can). All pure."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_upsert_provider.engine.config import ShardConfig
from airflow_upsert_provider.engine.errors import ConfigurationError, SchemaChangeRefused
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


@dataclass(frozen=True)
class ColumnUpdate:
    """One change of an Iceberg table's schema that makes it the shard's: a column added
    (``old_type`` None; optional, with a new field id) at ``path`` (its parents' names, then
    its own; ``element``/``value`` for a list's element or a map's value), or a column's type
    widened from ``old_type`` to ``new_type`` (same field id)."""

    path: tuple[str, ...]
    old_type: "IcebergType | None"
    new_type: "IcebergType"


# Iceberg's type promotions (its spec's schema evolution): int to long, float to double, a
# decimal's precision up at the same scale. Nothing else changes a column's type in place.
PROMOTIONS = "int to long, float to double, a decimal's precision up at the same scale"


def promotes(old: "IcebergType", new: "IcebergType") -> bool:
    """Whether Iceberg promotes a primitive column of type ``old`` to ``new`` (not equal). Pure."""
    from pyiceberg import types as t

    if isinstance(old, t.IntegerType) and isinstance(new, t.LongType):
        return True
    if isinstance(old, t.FloatType) and isinstance(new, t.DoubleType):
        return True
    return (isinstance(old, t.DecimalType) and isinstance(new, t.DecimalType)
            and new.scale == old.scale and new.precision > old.precision)


def schema_updates(expected: "Schema", actual: "Schema", table: str) -> tuple[ColumnUpdate, ...]:
    """The changes that make the schema ``actual`` of the Iceberg table ``table`` the shard's
    (``expected``), matching columns by name at every level (field ids and optionality aside):
    the shard's columns the table lacks are added, types Iceberg promotes are widened; none
    when they agree. Anything else (a column the shard's table does not have, a type Iceberg
    cannot promote to the shard's) is :class:`SchemaChangeRefused` naming the table, the
    column and both types. Pure."""
    updates: list[ColumnUpdate] = []
    _struct_updates(expected.as_struct(), actual.as_struct(), (), table, updates)
    return tuple(updates)


def _struct_updates(expected: Any, actual: Any, parent: tuple[str, ...], table: str, out: list[ColumnUpdate]) -> None:
    wanted = {f.name: f for f in expected.fields}
    have = {f.name: f for f in actual.fields}
    extra = [name for name in have if name not in wanted]
    if extra:
        column = ".".join((*parent, extra[0]))
        raise SchemaChangeRefused(
            f"Iceberg table {table} has column {column!r}, which the shard's table does not have "
            f"(the shard's columns{' of ' + repr('.'.join(parent)) if parent else ''}: {', '.join(wanted)})",
            table=table, column=column, old_type=str(have[extra[0]].field_type), new_type=None,
        )
    for name, field in wanted.items():
        if name not in have:
            out.append(ColumnUpdate((*parent, name), None, field.field_type))
        else:
            _type_updates(field.field_type, have[name].field_type, (*parent, name), table, out)


def _type_updates(new: "IcebergType", old: "IcebergType", path: tuple[str, ...], table: str,
                  out: list[ColumnUpdate]) -> None:
    from pyiceberg import types as t

    if isinstance(new, t.StructType) and isinstance(old, t.StructType):
        _struct_updates(new, old, path, table, out)
    elif isinstance(new, t.ListType) and isinstance(old, t.ListType):
        _type_updates(new.element_type, old.element_type, (*path, "element"), table, out)
    elif isinstance(new, t.MapType) and isinstance(old, t.MapType) and new.key_type == old.key_type:
        _type_updates(new.value_type, old.value_type, (*path, "value"), table, out)
    elif new == old:
        return
    elif promotes(old, new):
        out.append(ColumnUpdate(path, old, new))
    else:
        column = ".".join(path)
        raise SchemaChangeRefused(
            f"Iceberg table {table}: column {column!r} is {old}, the shard's is {new}, a change Iceberg cannot "
            f"make to a column (it promotes {PROMOTIONS})",
            table=table, column=column, old_type=str(old), new_type=str(new),
        )
