"""One verdict per record, whatever its neighbours (docs/input.md).

Every record shape is staged alone and beside a bad line in another file, in both bad-record
modes: the committed rows, the rejected count and the reasons must not depend on the
neighbour. A batch whose lines are all clean is staged by Spark's JSON reader; a batch with a
bad or unusual line by the exact path; so "alone" and "beside" also compare the two paths.

A record's verdict is a function of its own line, so the shapes share their Spark batches:
each shape is a segment of its own partition (its key ids made its own), and a few real
batches stage them all, module-scoped. "Alone" batches group the shapes by the path each
takes on its own (fast reader and clean; fast reader, then the exact path; the exact path
only); "beside" batches hold every shape and the bad neighbour. The per-shape tests are then
plain assertions on those batches' committed rows, rejects and errors.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import pytest

from airflow_upsert_provider.engine.write import records as R
from airflow_upsert_provider.engine.blob.files import open_blob
from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.engine.errors import BadInputError
from airflow_upsert_provider.engine.table.shard import MAX_REPORTED, Shard
from airflow_upsert_provider.engine.sources import Segment
from airflow_upsert_provider.engine.write.writer import BatchResult, Writer
from tests.helpers import quarantined_records, sample_config

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
NEIGHBOUR_PARTITION = "s99"  # sorts after every shape's partition
ORDERED = sorted(SHAPES)


def partition_of(shape: str) -> str:
    return f"s{ORDERED.index(shape):02d}"


def key_of(shape: str, id_: int) -> int:
    """The key a shape's record ``id_`` has in a shared batch: shape index and id in its digits."""
    return (100 + ORDERED.index(shape)) * 10 + id_


def shared_content(shape: str) -> bytes:
    """The shape's segment with its key ids made its own (every id in SHAPES is one digit; the
    prefix has no leading zero, which strict JSON refuses)."""
    return SHAPES[shape][0].replace(b'"id":', b'"id":%d' % (100 + ORDERED.index(shape)))


def shape_rows(shape: str) -> dict:
    return {key_of(shape, id_): values for id_, values in SHAPES[shape][1].items()}


def segment_path(landing: str, partition: str) -> str:
    return os.path.join(landing, partition, "0.jsonl")


def expected_rejects(landing: str, shape: str) -> list[dict]:
    path = segment_path(landing, partition_of(shape))
    return [{"file": path, "line": line, "reason": reason} for line, reason in SHAPES[shape][2]]


def neighbour_rejects(landing: str) -> list[dict]:
    return [{"file": segment_path(landing, NEIGHBOUR_PARTITION), "line": 1, "reason": R.MALFORMED}]


@pytest.fixture(scope="module")
def fast_path_decides(spark, tmp_path_factory) -> dict[str, bool]:
    """Whether the fast reader decides each shape on its own (by the driver's scan or the
    Spark scan): the path a shape takes alone."""
    root = tmp_path_factory.mktemp("decides")
    decides = {}
    for shape in ORDERED:
        path = root / f"{partition_of(shape)}.jsonl"
        path.write_bytes(SHAPES[shape][0])
        decides[shape] = bool(R.jsonl_fast_path_decides(spark, [Segment(0, "p0", str(path))]))
    return decides


@dataclass
class ShapeBatch:
    """One real batch of several shapes' segments (and maybe the bad neighbour)."""

    shapes: tuple[str, ...]
    neighbour: bool
    landing: str
    result: BatchResult | None = None
    error: BadInputError | None = None
    table: dict = field(default_factory=dict)
    written: list[dict] = field(default_factory=list)  # rejects quarantined beside the run
    upper: int = 0
    batches: int = 0

    def want(self) -> list[dict]:
        """Every reject of the batch, in the order a failed batch lists them (partition, line)."""
        listed = [r for shape in self.shapes for r in expected_rejects(self.landing, shape)]
        return listed + (neighbour_rejects(self.landing) if self.neighbour else [])

    def rows_of(self, shape: str) -> dict:
        index = ORDERED.index(shape)
        return {k: v for k, v in self.table.items() if k // 10 - 100 == index}

    def rejects_of(self, shape: str, listed: list[dict]) -> list[tuple]:
        path = segment_path(self.landing, partition_of(shape))
        return sorted((r["file"], r["line"], r["reason"]) for r in listed if r["file"] == path)


def run_shape_batch(spark, root, shapes: tuple[str, ...], neighbour: bool, mode: str) -> ShapeBatch:
    landing = root / "landing"
    for shape in shapes:
        (landing / partition_of(shape)).mkdir(parents=True)
        (landing / partition_of(shape) / "0.jsonl").write_bytes(shared_content(shape))
    if neighbour:
        (landing / NEIGHBOUR_PARTITION).mkdir(parents=True)
        (landing / NEIGHBOUR_PARTITION / "0.jsonl").write_bytes(NEIGHBOUR)
    batch = ShapeBatch(tuple(sorted(shapes, key=partition_of)), neighbour, str(landing))
    consensus = open_consensus(f"sqlite:///{root / 'consensus.db'}")
    try:
        blob = open_blob(str(root / "blob"))
        blob.ensure_root()
        config = sample_config(str(landing), schema=SCHEMA, order_by=None, delete_marker=None,
                               max_files_per_batch=len(shapes) + 1)
        shard = Shard.create(consensus, blob, "shapes", config)
        try:
            batch.result = Writer(shard, "w", spark_factory=lambda: spark, on_bad_record=mode).step()
        except BadInputError as error:
            batch.error = error
        batch.table = table(shard, spark)
        batch.upper = shard.state().upper
        batch.batches = len(shard.batches())
        batch.written = quarantined_records(shard)
    finally:
        consensus.dispose()
    return batch


def alone_groups(decides: dict[str, bool]) -> list[tuple[str, ...]]:
    """Shapes grouped by the path each takes alone: the fast reader on clean lines; the fast
    reader that finds a bad record, then the exact path; the exact path only."""
    clean = tuple(s for s in ORDERED if decides[s] and not SHAPES[s][2])
    restaged = tuple(s for s in ORDERED if decides[s] and SHAPES[s][2])
    exact = tuple(s for s in ORDERED if not decides[s])
    return [group for group in (clean, restaged, exact) if group]


def listable_chunks(groups: list[tuple[str, ...]], neighbour: bool) -> list[tuple[str, ...]]:
    """``groups`` split so that a failed batch lists all its rejects (at most MAX_REPORTED)."""
    room = MAX_REPORTED - (1 if neighbour else 0)
    chunks = []
    for group in groups:
        chunk: list[str] = []
        for shape in group:
            if chunk and sum(len(SHAPES[s][2]) for s in chunk) + len(SHAPES[shape][2]) > room:
                chunks.append(tuple(chunk))
                chunk = []
            chunk.append(shape)
        chunks.append(tuple(chunk))
    return chunks


class ShapeBatches:
    def __init__(self, batches: list[ShapeBatch]) -> None:
        self.batches = batches

    def holding(self, shape: str, neighbour: bool) -> ShapeBatch:
        [batch] = [b for b in self.batches if shape in b.shapes and b.neighbour == neighbour]
        return batch


def shape_batches(spark, tmp_path_factory, decides: dict[str, bool], mode: str) -> ShapeBatches:
    alone = alone_groups(decides)
    beside = [tuple(ORDERED)]
    if mode == "fail":
        alone, beside = listable_chunks(alone, neighbour=False), listable_chunks(beside, neighbour=True)
    plan = [(group, False) for group in alone] + [(group, True) for group in beside]
    return ShapeBatches([run_shape_batch(spark, tmp_path_factory.mktemp(f"{mode}-batch"), group, neighbour, mode)
                         for group, neighbour in plan])


@pytest.fixture(scope="module")
def quarantine_batches(spark, tmp_path_factory, fast_path_decides) -> ShapeBatches:
    return shape_batches(spark, tmp_path_factory, fast_path_decides, "quarantine")


@pytest.fixture(scope="module")
def fail_batches(spark, tmp_path_factory, fast_path_decides) -> ShapeBatches:
    return shape_batches(spark, tmp_path_factory, fast_path_decides, "fail")


def table(shard, spark) -> dict:
    return {r["id"]: (r["v"], r["d"], r["b"]) for r in shard.read(spark).collect()}


@pytest.mark.parametrize("neighbour", [False, True], ids=["alone", "beside_bad_line"])
@pytest.mark.parametrize("shape", ORDERED)
def test_shape_in_quarantine_mode(shape, neighbour, quarantine_batches):
    batch = quarantine_batches.holding(shape, neighbour)
    assert batch.error is None and batch.result.outcome == "committed"
    assert batch.rows_of(shape) == shape_rows(shape)
    assert batch.rejects_of(shape, batch.written) == batch.rejects_of(shape, expected_rejects(batch.landing, shape))


def test_quarantine_batches_count_every_record(quarantine_batches):
    """Each shared batch counts exactly the records of its shapes, and quarantines nothing else."""
    assert len(quarantine_batches.batches) == 4  # three paths alone, and every shape beside the neighbour
    for batch in quarantine_batches.batches:
        want = batch.want()
        rows = sum(len(SHAPES[s][1]) for s in batch.shapes)
        result = batch.result
        assert (result.outcome, result.rejected, result.rows_in) == ("committed", len(want), rows + len(want))
        assert len(batch.table) == rows
        assert sorted((w["file"], w["line"], w["reason"]) for w in batch.written) == sorted(
            (w["file"], w["line"], w["reason"]) for w in want
        )


@pytest.mark.parametrize("neighbour", [False, True], ids=["alone", "beside_bad_line"])
@pytest.mark.parametrize("shape", ORDERED)
def test_shape_in_fail_mode(shape, neighbour, fail_batches):
    batch = fail_batches.holding(shape, neighbour)
    # A batch commits in fail mode iff none of its records is bad.
    assert (batch.error is None) == (batch.want() == [])
    if batch.error is None:
        assert batch.result.outcome == "committed"
        assert batch.rows_of(shape) == shape_rows(shape)
        return
    assert batch.rejects_of(shape, batch.error.details["records"]) == batch.rejects_of(
        shape, expected_rejects(batch.landing, shape)
    )
    assert batch.upper == 0 and batch.table == {}


def test_a_failed_shared_batch_lists_every_reject_in_order(fail_batches):
    failed = [b for b in fail_batches.batches if b.error is not None]
    assert failed and all(b.error is None or b.want() for b in fail_batches.batches)
    for batch in failed:
        want = batch.want()
        assert len(want) <= MAX_REPORTED  # the chunks are small enough for the whole list
        assert batch.error.details["count"] == len(want)
        assert batch.error.details["records"] == want  # ordered by partition, offset, line
        assert (batch.upper, batch.batches) == (0, 0)


def verdicts(records) -> dict[str, list]:
    """Each shape's records as (id, v, d, b, accepted), by the partition of its segment."""
    by_partition: dict[str, list] = {}
    for r in records.collect():
        by_partition.setdefault(r["_partition"], []).append((r["id"], r["v"], r["d"], r["b"], r["_reason"] is None))
    return {shape: sorted(by_partition.get(partition_of(shape), []), key=repr) for shape in ORDERED}


@pytest.fixture(scope="module")
def reader_verdicts(spark, tmp_path_factory, fast_path_decides) -> tuple[dict, dict]:
    """Every shape read once by the exact path and, where the fast reader decides it, once by
    the fast reader: each a single read of all those segments."""
    landing = tmp_path_factory.mktemp("readers") / "landing"
    segments = {}
    for shape in ORDERED:
        (landing / partition_of(shape)).mkdir(parents=True)
        path = landing / partition_of(shape) / "0.jsonl"
        path.write_bytes(SHAPES[shape][0])
        segments[shape] = Segment(0, partition_of(shape), str(path))
    config = sample_config(str(landing), schema=SCHEMA, order_by=None, delete_marker=None)
    exact = R.jsonl_records(spark, config, list(segments.values())).records
    decided = [segments[s] for s in ORDERED if fast_path_decides[s]]
    fast = R.jsonl_records_fast(spark, config, decided).records
    return verdicts(exact), verdicts(fast)


@pytest.mark.parametrize("shape", ORDERED)
def test_fast_reader_agrees_with_exact_path(shape, fast_path_decides, reader_verdicts):
    """When the fast reader is allowed to decide a batch, its verdict and values for every
    record equal the exact path's."""
    exact, fast = reader_verdicts
    decides = fast_path_decides[shape]
    # Clean lines, nested or not, stay on the fast reader; what it cannot read exactly does not.
    if shape in {"lf", "crlf", "cr_only", "bom_at_file_start", "braces_inside_a_string", "object_into_string"}:
        assert decides
    if shape in {"two_objects_on_a_line", "trailing_bracket", "invalid_utf8_in_unknown_field", "bom_at_line_start", "array_of_objects"}:
        assert not decides
    assert exact[shape]  # every shape has a record
    if decides:
        assert fast[shape] == exact[shape]


# Shapes whose every line the driver's scan decides alone (no Spark job).
DRIVER_DECIDES = {
    "lf", "no_final_newline", "crlf", "cr_only", "blank_and_whitespace_lines", "integer_into_double",
    "replacement_char_is_valid", "null_into_string", "duplicate_name_last_wins",
    # Every line one flat object: the driver passes them to the JSON reader, which rejects
    # the record (and the exact path then says why).
    "nan", "infinity", "nan_as_string", "number_beyond_double", "single_quotes", "array_into_string",
    "number_into_string", "boolean_into_string", "string_into_boolean",
}


@pytest.mark.parametrize("shape", ORDERED)
def test_driver_scan_decides_the_flat_shapes(shape):
    assert R.simple_jsonl(SHAPES[shape][0]) == (shape in DRIVER_DECIDES)


def test_driver_scan_never_passes_what_the_spark_scan_refuses(spark, tmp_path):
    """A batch the driver's line scan passes is one the Spark scan passes too: the driver
    only ever saves the Spark job, it never changes which path stages a batch. One scan of
    every shape the driver passes (the Spark scan passes a batch iff it passes each line)."""
    paths = []
    for shape in sorted(DRIVER_DECIDES):
        path = tmp_path / f"{partition_of(shape)}.jsonl"
        path.write_bytes(SHAPES[shape][0])
        paths.append(str(path))
    assert R.spark_scan_decides(spark, paths)
    # The scan is not blind: one line it refuses fails the whole scan.
    refused = tmp_path / "refused.jsonl"
    refused.write_bytes(SHAPES["two_objects_on_a_line"][0])
    assert not R.spark_scan_decides(spark, paths + [str(refused)])


@pytest.fixture
def sqlite_consensus(tmp_path):
    store = open_consensus(f"sqlite:///{tmp_path / 'consensus.db'}")
    yield store
    store.dispose()


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
    (tmp_path / "landing" / "p0").mkdir(parents=True)
    (tmp_path / "landing" / "p0" / "0.jsonl").write_bytes(content)
    config = sample_config(str(tmp_path / "landing"), schema=SCHEMA, order_by=None, delete_marker=None)
    shard = Shard.create(sqlite_consensus, blob, "shapes", config)
    previous = spark.conf.get("spark.sql.files.maxPartitionBytes")
    spark.conf.set("spark.sql.files.maxPartitionBytes", "2048")
    try:
        with pytest.raises(BadInputError) as info:
            Writer(shard, "w", spark_factory=lambda: spark).step()
    finally:
        spark.conf.set("spark.sql.files.maxPartitionBytes", previous)
    assert [r["line"] for r in info.value.details["records"]] == [i for i in range(1, 400) if i % 37 == 0]
