"""One verdict per record, whatever its neighbours (docs/input.md).

Every record shape is staged alone and beside a bad line in another file, in both bad-record
modes: the committed rows, the rejected count and the reasons must not depend on the
neighbour. A batch whose lines are all clean is staged by Spark's JSON reader; a batch with a
bad or unusual line by the exact path; so "alone" and "beside" also compare the two paths.
"""

from __future__ import annotations

import glob
import json
import os

import pytest

from airflow_upsert_provider.engine import records as R
from airflow_upsert_provider.engine.consensus import open_consensus
from airflow_upsert_provider.engine.errors import BadInputError
from airflow_upsert_provider.engine.shard import Shard
from airflow_upsert_provider.engine.sources import Segment
from airflow_upsert_provider.engine.upsert import _segment_columns
from airflow_upsert_provider.engine.writer import Writer
from tests.helpers import sample_config

SCHEMA = json.dumps(
    {
        "type": "struct",
        "fields": [
            {"name": "id", "type": "long", "nullable": True, "metadata": {}},
            {"name": "v", "type": "string", "nullable": True, "metadata": {}},
            {"name": "d", "type": "double", "nullable": True, "metadata": {}},
            {"name": "b", "type": "boolean", "nullable": True, "metadata": {}},
        ],
    }
)


def field_type(name, got):
    kind = {"v": "string", "d": "double", "b": "boolean"}[name]
    return f"field {name!r}: expected {kind}, got {got}"


# shape -> (segment bytes, accepted rows {id: (v, d, b)}, rejected [(line, reason)])
SHAPES = {
    "lf": (b'{"id":1,"v":"a"}\n{"id":2,"v":"b"}\n', {1: ("a", None, None), 2: ("b", None, None)}, []),
    "no_final_newline": (b'{"id":1,"v":"a"}\n{"id":2}', {1: ("a", None, None), 2: (None, None, None)}, []),
    "crlf": (b'{"id":1,"v":"a"}\r\n\r\n{"id":2,"v":"b"}\r\n', {1: ("a", None, None), 2: ("b", None, None)}, []),
    "cr_only": (
        b'{"id":1,"v":"a"}\r{"id":2,"v":"b"}\r{"id":3,"v":"c"}\r',
        {1: ("a", None, None), 2: ("b", None, None), 3: ("c", None, None)},
        [],
    ),
    "cr_only_with_bad_line": (b'{"id":1}\r{"id":2\r{"id":3}\r', {1: (None,) * 3, 3: (None,) * 3}, [(2, R.MALFORMED)]),
    "blank_and_whitespace_lines": (b'\n{"id":1}\n \n\t\n \t \n{"id":2}\n', {1: (None,) * 3, 2: (None,) * 3}, []),
    "form_feed_line": (b'{"id":1}\n\x0c\n', {1: (None,) * 3}, [(2, R.MALFORMED)]),
    "bom_at_file_start": (b'\xef\xbb\xbf{"id":1,"v":"a"}\n{"id":2}\n', {1: ("a", None, None), 2: (None,) * 3}, []),
    "bom_at_line_start": (b'{"id":1}\n\xef\xbb\xbf{"id":2}\n', {1: (None,) * 3}, [(2, R.MALFORMED)]),
    "bom_inside_line": (b'{"id":1}\xef\xbb\xbf\n', {}, [(1, R.TRAILING)]),
    "two_objects_on_a_line": (b'{"id":1,"v":"a"}{"id":2,"v":"b"}\n', {}, [(1, R.TRAILING)]),
    "two_objects_with_comma": (b'{"id":1},{"id":2}\n', {}, [(1, R.TRAILING)]),
    "trailing_word": (b'{"id":1} xyz\n', {}, [(1, R.TRAILING)]),
    "trailing_bracket": (b'{"id":1}]\n', {}, [(1, R.TRAILING)]),
    "trailing_after_nested": (b'{"id":1,"v":"}"}], [5\n', {}, [(1, R.TRAILING)]),
    "array_of_objects": (b'[{"id":1},{"id":2}]\n', {}, [(1, R.MALFORMED)]),
    "scalar_line": (b'5\n', {}, [(1, R.MALFORMED)]),
    "invalid_utf8_in_string": (b'{"id":1,"v":"caf\xe9"}\n{"id":2,"v":"ok"}\n', {2: ("ok", None, None)}, [(1, R.INVALID_UTF8)]),
    "invalid_utf8_in_unknown_field": (b'{"id":1,"x":"\xff"}\n', {}, [(1, R.INVALID_UTF8)]),
    "replacement_char_is_valid": (b'{"id":1,"v":"\xef\xbf\xbd"}\n', {1: ("\ufffd", None, None)}, []),
    "nan": (b'{"id":1,"d":NaN}\n', {}, [(1, R.MALFORMED)]),
    "infinity": (b'{"id":1,"d":-Infinity}\n', {}, [(1, R.MALFORMED)]),
    "nan_as_string": (b'{"id":1,"d":"NaN"}\n', {}, [(1, field_type("d", "NaN"))]),
    "number_beyond_double": (b'{"id":1,"d":1e400}\n', {}, [(1, "field 'd': number out of range for double")]),
    "integer_into_double": (b'{"id":1,"d":5}\n', {1: (None, 5.0, None)}, []),
    "single_quotes": (b"{'id':1}\n", {}, [(1, R.MALFORMED)]),
    "object_into_string": (b'{"id":1,"v":{"a":1}}\n', {}, [(1, field_type("v", '{"a":1}'))]),
    "array_into_string": (b'{"id":1,"v":[1,2]}\n', {}, [(1, field_type("v", "[1,2]"))]),
    "number_into_string": (b'{"id":1,"v":5}\n', {}, [(1, field_type("v", "5"))]),
    "boolean_into_string": (b'{"id":1,"v":true}\n', {}, [(1, field_type("v", "true"))]),
    "null_into_string": (b'{"id":1,"v":null}\n', {1: (None,) * 3}, []),
    "string_into_boolean": (b'{"id":1,"b":"true"}\n', {}, [(1, field_type("b", "true"))]),
    "braces_inside_a_string": (b'{"id":1,"v":"}{"}\n', {1: ("}{", None, None)}, []),
    "duplicate_name_last_wins": (b'{"id":1,"v":"a","v":"b"}\n', {1: ("b", None, None)}, []),
}

NEIGHBOUR = b'{"id":100,\n'  # a bad line in another file: malformed


@pytest.fixture
def sqlite_consensus(tmp_path):
    store = open_consensus(f"sqlite:///{tmp_path / 'consensus.db'}")
    yield store
    store.dispose()


def landing_with(tmp_path, content: bytes, neighbour: bool) -> str:
    landing = tmp_path / "landing"
    (landing / "p0").mkdir(parents=True)
    (landing / "p0" / "0.jsonl").write_bytes(content)
    if neighbour:
        (landing / "p1").mkdir()
        (landing / "p1" / "0.jsonl").write_bytes(NEIGHBOUR)
    return str(landing)


def shape_shard(consensus, blob, tmp_path, content: bytes, neighbour: bool) -> tuple[Shard, str]:
    landing = landing_with(tmp_path, content, neighbour)
    config = sample_config(landing, schema=SCHEMA, order_by=None, delete_marker=None, max_files_per_batch=8)
    return Shard.create(consensus, blob, "shapes", config), landing


def expected_rejects(landing: str, rejected: list, neighbour: bool) -> list[dict]:
    listed = [{"file": os.path.join(landing, "p0", "0.jsonl"), "line": line, "reason": reason} for line, reason in rejected]
    if neighbour:
        listed.append({"file": os.path.join(landing, "p1", "0.jsonl"), "line": 1, "reason": R.MALFORMED})
    return listed


def table(shard, spark) -> dict:
    return {r["id"]: (r["v"], r["d"], r["b"]) for r in shard.read(spark).collect()}


@pytest.mark.parametrize("neighbour", [False, True], ids=["alone", "beside_bad_line"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_shape_in_quarantine_mode(shape, neighbour, spark, sqlite_consensus, blob, tmp_path):
    content, rows, rejected = SHAPES[shape]
    shard, landing = shape_shard(sqlite_consensus, blob, tmp_path, content, neighbour)
    result = Writer(shard, "w", spark_factory=lambda: spark, on_bad_record="quarantine").step()
    want = expected_rejects(landing, rejected, neighbour)
    assert (result.outcome, result.rejected, result.rows_in) == ("committed", len(want), len(rows) + len(want))
    assert table(shard, spark) == rows
    written = []
    stats = shard.batches()[0].stats
    if want:
        for path in glob.glob(os.path.join(blob.path(stats["rejects"]["path"]), "*.json")):
            with open(path) as handle:
                written += [json.loads(line) for line in handle]
    assert sorted((w["file"], w["line"], w["reason"]) for w in written) == sorted(
        (w["file"], w["line"], w["reason"]) for w in want
    )


@pytest.mark.parametrize("neighbour", [False, True], ids=["alone", "beside_bad_line"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_shape_in_fail_mode(shape, neighbour, spark, sqlite_consensus, blob, tmp_path):
    content, rows, rejected = SHAPES[shape]
    shard, landing = shape_shard(sqlite_consensus, blob, tmp_path, content, neighbour)
    want = expected_rejects(landing, rejected, neighbour)
    writer = Writer(shard, "w", spark_factory=lambda: spark)
    if not want:
        assert writer.step().outcome == "committed"
        assert table(shard, spark) == rows
        return
    with pytest.raises(BadInputError) as info:
        writer.step()
    assert info.value.details["count"] == len(want)
    assert info.value.details["records"] == want  # ordered by partition, offset, line
    assert shard.state().upper == 0


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_fast_reader_agrees_with_exact_path(shape, spark, tmp_path):
    """When the fast reader is allowed to decide a batch, its verdict and values for every
    record equal the exact path's."""
    content, rows, rejected = SHAPES[shape]
    landing = landing_with(tmp_path, content, neighbour=False)
    config = sample_config(landing, schema=SCHEMA, order_by=None, delete_marker=None)
    segments = [Segment("p0", 0, os.path.join(landing, "p0", "0.jsonl"))]
    exact = R.jsonl_records(spark, config, segments, _segment_columns).records
    verdicts = sorted(((r["id"], r["v"], r["d"], r["b"], r["_reason"] is None) for r in exact.collect()), key=repr)
    decides = R.jsonl_fast_path_decides(spark, segments)
    # Clean lines, nested or not, stay on the fast reader; what it cannot read exactly does not.
    if shape in {"lf", "crlf", "cr_only", "bom_at_file_start", "braces_inside_a_string", "object_into_string"}:
        assert decides
    if shape in {"two_objects_on_a_line", "trailing_bracket", "invalid_utf8_in_unknown_field", "bom_at_line_start", "array_of_objects"}:
        assert not decides
    if not decides:
        return
    fast = R.jsonl_records_fast(spark, config, segments, _segment_columns).records
    assert sorted(((r["id"], r["v"], r["d"], r["b"], r["_reason"] is None) for r in fast.collect()), key=repr) == verdicts


# Shapes whose every line the driver's scan decides alone (no Spark job).
DRIVER_DECIDES = {
    "lf", "no_final_newline", "crlf", "cr_only", "blank_and_whitespace_lines", "integer_into_double",
    "replacement_char_is_valid", "null_into_string", "duplicate_name_last_wins",
    # Every line one flat object: the driver passes them to the JSON reader, which rejects
    # the record (and the exact path then says why).
    "nan", "infinity", "nan_as_string", "number_beyond_double", "single_quotes", "array_into_string",
    "number_into_string", "boolean_into_string", "string_into_boolean",
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_driver_scan_never_passes_what_the_spark_scan_refuses(shape, spark, tmp_path):
    """A batch the driver's line scan passes is one the Spark scan passes too: the driver
    only ever saves the Spark job, it never changes which path stages a batch."""
    content = SHAPES[shape][0]
    path = tmp_path / "0.jsonl"
    path.write_bytes(content)
    assert R.simple_jsonl(content) == (shape in DRIVER_DECIDES)
    if R.simple_jsonl(content):
        assert R.spark_scan_decides(spark, [str(path)])


def test_a_clean_batch_is_decided_without_a_spark_job(monkeypatch, tmp_path):
    """Lines the driver passes start no Spark scan; past DRIVER_SCAN_BYTES, or with a line it
    cannot judge, the Spark scan decides."""
    clean = tmp_path / "clean.jsonl"
    clean.write_bytes(b'{"id":1,"v":"a"}\r\n\n  {"id":2}\t\n')
    nested = tmp_path / "nested.jsonl"
    nested.write_bytes(b'{"id":3,"v":{"a":1}}\n')
    asked = []
    monkeypatch.setattr(R, "spark_scan_decides", lambda spark, paths: asked.append(paths) or "spark")
    segment = lambda path: Segment(0, "p0", str(path))  # noqa: E731
    assert R.jsonl_fast_path_decides(None, [segment(clean)]) is True
    assert asked == []
    assert R.jsonl_fast_path_decides(None, [segment(clean), segment(nested)]) == "spark"
    assert asked == [[str(clean), str(nested)]]
    monkeypatch.setattr(R, "DRIVER_SCAN_BYTES", clean.stat().st_size - 1)
    assert R.jsonl_fast_path_decides(None, [segment(clean)]) == "spark"


@pytest.mark.parametrize(
    "content",
    [
        b'\xef\xbb\xbf{"id":1}\n',  # a byte order mark: Spark's text source decides
        b'{"id":1}\n{"id":2,"v":"caf\xe9"}\n',  # invalid UTF-8 on any line
        b'{"id":1}\x0c\n',  # a form feed is not a blank for Spark's trim
        b'{"id":1,"v":"}"}\n',  # a '}' before the last character
        b'{"id":1}}\n',
        b'["x"]\n',
        b'{"id":1}\x0b{"id":2}\n',  # a vertical tab does not end a line for Spark
    ],
)
def test_driver_scan_leaves_what_it_cannot_judge_to_spark(content):
    assert R.simple_jsonl(content) is False


def test_line_numbers_across_file_splits(spark, sqlite_consensus, blob, tmp_path):
    """A file read in several blocks still reports the line number of each rejected record."""
    lines = [json.dumps({"id": i, "v": "x" * 40}) if i % 37 else "not json" for i in range(1, 400)]
    content = ("\n".join(lines) + "\n").encode()
    shard, landing = shape_shard(sqlite_consensus, blob, tmp_path, content, neighbour=False)
    previous = spark.conf.get("spark.sql.files.maxPartitionBytes")
    spark.conf.set("spark.sql.files.maxPartitionBytes", "2048")
    try:
        with pytest.raises(BadInputError) as info:
            Writer(shard, "w", spark_factory=lambda: spark).step()
    finally:
        spark.conf.set("spark.sql.files.maxPartitionBytes", previous)
    assert [r["line"] for r in info.value.details["records"]] == [i for i in range(1, 400) if i % 37 == 0]
