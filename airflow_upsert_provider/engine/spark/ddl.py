"""A column list in Spark's DDL (``id BIGINT, name STRING``) parsed without a JVM.

``upsertctl init --schema`` and the hook's ``create_shard`` only need the schema's JSON, and
starting Spark for it cost a JVM start (seconds) on every init. This parser takes the plain
part of the grammar: named columns of the primitive types, DECIMAL, ARRAY, MAP and STRUCT,
``NOT NULL`` and ``COMMENT``. Anything else (CHAR/VARCHAR, INTERVAL, collations, a bare
TIMESTAMP whose meaning depends on the session's ``spark.sql.timestampType``, an escape in a
comment, a syntax error) returns None, and the caller asks Spark, whose parser stays the
authority: tests check that both give the same schema for what this one accepts.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql.types import DataType, StructField, StructType

# name (upper case) -> pyspark type class name; aliases as Spark's parser has them.
PRIMITIVE_TYPES = {
    "BOOLEAN": "BooleanType",
    "TINYINT": "ByteType", "BYTE": "ByteType",
    "SMALLINT": "ShortType", "SHORT": "ShortType",
    "INT": "IntegerType", "INTEGER": "IntegerType",
    "BIGINT": "LongType", "LONG": "LongType",
    "FLOAT": "FloatType", "REAL": "FloatType",
    "DOUBLE": "DoubleType",
    "DATE": "DateType",
    "TIMESTAMP_LTZ": "TimestampType",
    "TIMESTAMP_NTZ": "TimestampNTZType",
    "STRING": "StringType",
    "BINARY": "BinaryType",
}
DECIMAL_NAMES = {"DECIMAL", "DEC", "NUMERIC"}
MAX_DECIMAL_PRECISION = 38

TOKEN = re.compile(
    r"\s*(?:(?P<word>[A-Za-z_][A-Za-z0-9_]*)|(?P<number>[0-9]+)|`(?P<quoted>(?:[^`]|``)+)`"
    r"|'(?P<single>[^'\\]*)'|\"(?P<double>[^\"\\]*)\"|(?P<punct>[<>(),:]))"
)


class _Declined(Exception):
    """Not in the subset this parser takes: Spark decides."""


class _Tokens:
    def __init__(self, text: str) -> None:
        self.items: list[tuple[str, str]] = []
        position = 0
        while position < len(text):
            if text[position:].strip() == "":
                break
            match = TOKEN.match(text, position)
            if match is None:
                raise _Declined
            kind = match.lastgroup
            value = match.group(kind)
            if kind == "quoted":
                value = value.replace("``", "`")
            self.items.append((kind, value))
            position = match.end()
        self.index = 0

    def peek(self) -> tuple[str, str] | None:
        return self.items[self.index] if self.index < len(self.items) else None

    def take(self) -> tuple[str, str]:
        token = self.peek()
        if token is None:
            raise _Declined
        self.index += 1
        return token

    def take_punct(self, value: str) -> None:
        if self.take() != ("punct", value):
            raise _Declined

    def at_punct(self, value: str) -> bool:
        return self.peek() == ("punct", value)

    def at_word(self, value: str) -> bool:
        token = self.peek()
        return token is not None and token[0] == "word" and token[1].upper() == value


def parse_column_list(ddl: str) -> "StructType | None":
    """``ddl`` as Spark's ``DataType.fromDDL`` would read it, or None where this parser leaves
    it to Spark (see the module's docstring)."""
    from pyspark.sql.types import StructType

    try:
        tokens = _Tokens(ddl)
        if tokens.peek() is None:
            raise _Declined
        fields = [_field(tokens)]
        while tokens.at_punct(","):
            tokens.take()
            fields.append(_field(tokens))
        if tokens.peek() is not None:
            raise _Declined
    except _Declined:
        return None
    return StructType(fields)


def _field(tokens: _Tokens) -> "StructField":
    from pyspark.sql.types import StructField

    kind, name = tokens.take()
    if kind not in ("word", "quoted"):
        raise _Declined
    if tokens.at_punct(":"):
        tokens.take()
    data_type = _type(tokens)
    nullable = True
    if tokens.at_word("NOT"):
        tokens.take()
        if not tokens.at_word("NULL"):
            raise _Declined
        tokens.take()
        nullable = False
    metadata = {}
    if tokens.at_word("COMMENT"):
        tokens.take()
        kind, text = tokens.take()
        if kind not in ("single", "double"):
            raise _Declined
        metadata["comment"] = text
    return StructField(name, data_type, nullable, metadata)


def _type(tokens: _Tokens) -> "DataType":
    from pyspark.sql import types

    kind, word = tokens.take()
    if kind != "word":
        raise _Declined
    name = word.upper()
    if name in PRIMITIVE_TYPES:
        return getattr(types, PRIMITIVE_TYPES[name])()
    if name in DECIMAL_NAMES:
        precision, scale = 10, 0
        if tokens.at_punct("("):
            tokens.take()
            precision = _number(tokens)
            if tokens.at_punct(","):
                tokens.take()
                scale = _number(tokens)
            tokens.take_punct(")")
        if not (0 < precision <= MAX_DECIMAL_PRECISION and scale <= precision):
            raise _Declined  # Spark's own error says why
        return types.DecimalType(precision, scale)
    if name == "ARRAY":
        tokens.take_punct("<")
        element = _type(tokens)
        tokens.take_punct(">")
        return types.ArrayType(element, True)
    if name == "MAP":
        tokens.take_punct("<")
        key = _type(tokens)
        tokens.take_punct(",")
        value = _type(tokens)
        tokens.take_punct(">")
        return types.MapType(key, value, True)
    if name == "STRUCT":
        tokens.take_punct("<")
        fields = []
        if not tokens.at_punct(">"):
            fields.append(_field(tokens))
            while tokens.at_punct(","):
                tokens.take()
                fields.append(_field(tokens))
        tokens.take_punct(">")
        return types.StructType(fields)
    raise _Declined


def _number(tokens: _Tokens) -> int:
    kind, value = tokens.take()
    if kind != "number":
        raise _Declined
    return int(value)
