"""Fields the shard's schema does not name: the rule that counts them (a Kafka batch ignores them
and says so, docs/input.md), and the count of a directory batch's fields on the driver against
Spark's (a directory batch applies the shard's schema evolution policy to them:
tests/schema/test_schema_apply_spark.py)."""

from __future__ import annotations

import json
import logging
import random

import pytest

from airflow_upsert_provider.engine.blob.files import open_blob
from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.engine.table.shard import Shard
from airflow_upsert_provider.engine.write.records import UnknownField, unknown_fields, unknown_fields_text
from airflow_upsert_provider.engine.write.writer import Writer
from tests.helpers import sample_config

SCHEMA = json.dumps({"type": "struct", "fields": [
    {"name": "id", "type": "long", "nullable": True, "metadata": {}},
    {"name": "v", "type": "string", "nullable": True, "metadata": {}},
]})


# -- the rule ------------------------------------------------------------------------------------


def test_unknown_fields_are_those_the_schema_does_not_name_summed_with_their_first_file():
    """Seeded sweep: every known set, every mix of counts (names known and not, zero counts,
    one field reported by several files)."""
    names = ["id", "v", "email", "Email", "phone", "meta", "", "a b"]
    rng = random.Random(34)
    for _ in range(2000):
        known = rng.sample(names, rng.randint(0, len(names)))
        counts = [(rng.choice(names), rng.randint(0, 5), f"/landing/p{rng.randint(0, 3)}/{rng.randint(0, 9)}.jsonl")
                  for _ in range(rng.randint(0, 12))]
        got = unknown_fields(known, counts)
        expected: dict[str, tuple[int, str]] = {}
        for name, records, file in counts:
            if name not in known and records > 0:
                total, first = expected.get(name, (0, file))
                expected[name] = (total + records, min(first, file))
        assert got == [UnknownField(n, r, f) for n, (r, f) in sorted(expected.items())], (known, counts)


def test_the_log_text_names_each_field_its_records_and_first_file():
    assert unknown_fields_text([UnknownField("email", 2, "/l/p0/0.jsonl"), UnknownField("phone", 1, "/l/p1/0.jsonl")]) \
        == "'email' (2 records, first in /l/p0/0.jsonl); 'phone' (1 record, first in /l/p1/0.jsonl)"


# -- a batch on Spark ----------------------------------------------------------------------------


def _shard(tmp_path, **overrides):
    consensus = open_consensus(f"sqlite:///{tmp_path / 'consensus.db'}")
    blob = open_blob(str(tmp_path / "blob"))
    blob.ensure_root()
    config = sample_config(str(tmp_path / "landing"), schema=SCHEMA, order_by=None, delete_marker=None, **overrides)
    return consensus, Shard.create(consensus, blob, "drift", config)


def _land(tmp_path, partition: str, name: str, lines: list[dict]) -> str:
    path = tmp_path / "landing" / partition / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "the shard's schema does not name" in r.getMessage()]


def test_a_batch_of_known_fields_says_nothing(spark, tmp_path, caplog):
    _land(tmp_path, "p0", "0.jsonl", [{"id": 1, "v": "a"}, {"id": 2, "v": None}])
    consensus, shard = _shard(tmp_path)
    try:
        with caplog.at_level(logging.WARNING):
            result = Writer(shard, "w", spark_factory=lambda: spark).step()
        assert (result.outcome, result.rows_in, result.unknown_fields) == ("committed", 2, {})
        assert _warnings(caplog) == []
        assert "unknown_fields" not in shard.consensus.get_batch("drift", 0).stats
    finally:
        consensus.dispose()


# -- the count on the driver against Spark's -----------------------------------------------------

# Lines of every shape the record rules know (docs/input.md): flat and nested objects, arrays,
# scalars, blank lines, CRLF and lone CR endings, a byte order mark, invalid UTF-8, two objects
# on a line, NaN, unicode escapes in keys, a key the schema names with other case.
LINE_SHAPES = [
    b'{"id": 1, "v": "a"}',
    b'{"id": 2, "v": "b", "email": "x@y"}',
    b'{"id": 3, "meta": {"deep": {"x": 1}}, "tags": [1, 2]}',
    b'[1, 2, 3]',
    b'"just a string"',
    b'42',
    b'   ',
    b'{"id": 4, "V": "case"}',
    b'{"id": 5, "caf\\u00e9": 1}',
    b'\xef\xbb\xbf{"id": 6, "bom": 1}',
    b'{"id": 7, "bad": "\xff"}',
    b'{"id": 8} {"id": 9, "two": 1}',
    b'{"id": 10, "n": NaN}',
    b'{"id": 11, "v": "x", "email": null}',
    b'{"id": 12, "x": 1',
]


@pytest.mark.parametrize("seed", range(8))
def test_the_drivers_count_of_unknown_fields_equals_sparks(spark, tmp_path, seed):
    """The driver counts a batch it scans anyway; Spark counts a bigger one. Both give one answer
    for every line shape (seeded mixes of shapes and line endings over several files)."""
    from airflow_upsert_provider.engine.sources import Segment
    from airflow_upsert_provider.engine.write import records as R

    rng = random.Random(seed)
    segments = []
    for index in range(3):
        path = tmp_path / "landing" / f"p{index % 2}" / f"{index}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        ending = rng.choice([b"\n", b"\r\n", b"\r"])
        path.write_bytes(ending.join(rng.choice(LINE_SHAPES) for _ in range(rng.randint(1, 12))) + ending)
        segments.append(Segment(index, f"p{index % 2}", str(path)))
    config = sample_config(str(tmp_path / "landing"), schema=SCHEMA, order_by=None, delete_marker=None)
    on_driver = sorted(R.jsonl_field_counts_on_driver(config, segments))
    on_spark = sorted((f, n, R.local_path(first)) for f, n, first in R._jsonl_field_counts_spark(spark, config, segments))
    assert on_driver == on_spark
