"""A shard's --schema parsed without Spark where the DDL is plain (engine/spark/ddl.py), with
Spark's own parser as the authority: both give the same schema for everything the fast
parser accepts, and what it declines goes to Spark (its result or its error)."""

from __future__ import annotations

import pytest

from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.engine.spark.ddl import parse_column_list
from airflow_upsert_provider.engine.write.upsert import parse_schema
from airflow_upsert_provider.sample_data import SAMPLE_SCHEMA_DDL

ACCEPTED = [
    SAMPLE_SCHEMA_DDL,
    "id BIGINT",
    "a TINYINT, b BYTE, c SMALLINT, d SHORT, e INT, f INTEGER, g BIGINT, h LONG, i FLOAT, j REAL, k DOUBLE, "
    "l DATE, m TIMESTAMP_LTZ, n TIMESTAMP_NTZ, o STRING, p BINARY, q BOOLEAN",
    "price DECIMAL, p2 DECIMAL(12), p3 DEC(12, 2), p4 NUMERIC(38,38)",
    "tags ARRAY<STRING>, m MAP<STRING, ARRAY<INT>>, s STRUCT<a: INT, b STRING NOT NULL COMMENT 'inner', c: STRUCT<>>",
    "m MAP<ARRAY<INT>, STRUCT<x: DOUBLE>>, nested ARRAY<ARRAY<BIGINT>>",
    "id BIGINT NOT NULL COMMENT 'the key', `odd name` STRING, `with``tick` INT",
    'c STRING COMMENT "double quoted", d INT COMMENT \'\'',
    "a: INT, b: STRING",
    "date DATE, timestamp BIGINT, order INT, array STRING, comment STRING, `not` INT",
    "Id bigint, NAME string, Amount Double",
    "id BIGINT, id BIGINT, name STRING",
    "\n  id BIGINT,\n  name STRING\n",
]

# Left to Spark: a bare TIMESTAMP follows the session's spark.sql.timestampType; CHAR and
# VARCHAR carry length metadata; intervals, collations, escapes and errors are Spark's to say.
DECLINED = [
    "ts TIMESTAMP",
    "name VARCHAR(10)",
    "code CHAR(3)",
    "span INTERVAL DAY TO SECOND",
    "c STRING COLLATE UTF8_LCASE",
    r"c STRING COMMENT 'it\'s'",
    "d DECIMAL(39, 0)",
    "d DECIMAL(5, 6)",
    "garbage",
    "",
    "   ",
    "id BIGINT,",
    "id BIGINT NOT",
    "s STRUCT<a INT",
    "id BIGINT; DROP TABLE x",
]


@pytest.mark.parametrize("ddl", ACCEPTED)
def test_an_accepted_column_list_is_the_schema_spark_parses(ddl, spark):
    from pyspark.sql.types import DataType

    parsed = parse_column_list(ddl)
    assert parsed is not None
    assert parsed.json() == DataType.fromDDL(ddl).json()


@pytest.mark.parametrize("ddl", DECLINED)
def test_what_the_fast_parser_declines_is_left_to_spark(ddl):
    assert parse_column_list(ddl) is None


def test_a_plain_schema_starts_no_spark():
    def no_spark():
        raise AssertionError("Spark was started for a plain column list")

    assert parse_schema("id BIGINT NOT NULL, tags ARRAY<STRING>", no_spark) == (
        '{"fields":[{"metadata":{},"name":"id","nullable":false,"type":"long"},'
        '{"metadata":{},"name":"tags","nullable":true,"type":{"containsNull":true,"elementType":"string",'
        '"type":"array"}}],"type":"struct"}'
    )


def test_a_declined_schema_goes_to_spark_for_its_schema_or_its_error(spark):
    started = []

    def factory():
        started.append(1)
        return spark

    ts = parse_schema("id BIGINT, ts TIMESTAMP", factory)
    assert '"name":"ts","nullable":true,"type":"timestamp"' in ts and started == [1]
    with pytest.raises(ConfigurationError, match=r"invalid --schema 'garbage': .*") as raised:
        parse_schema("garbage", factory)
    assert raised.value.details.get("field") == "schema" and started == [1, 1]
    with pytest.raises(ConfigurationError, match=r"--schema 'INT' is not a list of columns"):
        parse_schema("INT", factory)
