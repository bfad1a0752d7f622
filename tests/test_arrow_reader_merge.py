"""The Arrow reader's k-way merge of a bucket's sorted run files
(``arrow_reader.merge_sorted_streams``) against the whole-bucket merge it replaces
(``arrow_reader.merge_bucket`` over every row at once) as the oracle: seeded random runs over
a grid of key shapes, order columns, run counts, sizes, overlaps, tombstones and read batch
sizes, each equal row for row (key order included). Pure: no Spark, no files."""

from __future__ import annotations

import bisect
import random

import pyarrow as pa
import pytest
from pyspark.sql.types import BooleanType, DoubleType, LongType, StringType, StructField, StructType

from airflow_upsert_provider.engine.config import ShardConfig
from airflow_upsert_provider.engine.table.arrow_reader import merge_bucket, merge_sorted_streams
from tests.arrow_runs import arrow_run_schema

# (keys, order column type or None)
SHAPES = [
    (("id",), None),
    (("id",), LongType()),
    (("id",), DoubleType()),
    (("region", "id"), LongType()),
    (("region", "id"), None),
]
READ_BATCHES = [1, 7, 64, 10_000]


def shape_config(keys, order_type) -> ShardConfig:
    fields = [StructField("region", StringType()), StructField("id", LongType()),
              StructField("name", StringType()), StructField("deleted", BooleanType())]
    if order_type is not None:
        fields.append(StructField("version", order_type))
    return ShardConfig(source="dir:/nonexistent", keys=keys, schema=StructType(fields).json(),
                       order_by="version" if order_type is not None else None, delete_marker="deleted", buckets=1)


def random_run(rng: random.Random, config: ShardConfig, ts: int, *, rows: int, key_space: int,
               duplicates: bool) -> list[dict]:
    """One run file's rows, sorted by key: random keys of a key space (runs overlap as much as
    their key spaces do), order values from a small range (ties) with nulls (and NaN for a
    floating one), tombstones; with ``duplicates`` a key may appear more than once."""
    floating = config.order_by is not None and "DoubleType" in str(StructType.fromJson(
        __import__("json").loads(config.schema))["version"].dataType)
    chosen = [rng.randrange(key_space) for _ in range(rows)] if duplicates else rng.sample(range(key_space),
                                                                                        min(rows, key_space))
    out = []
    for k in chosen:
        row = {"region": f"r{k % 3}", "id": k, "name": f"n{k}-{ts}-{rng.randrange(1000)}",
               "_deleted": rng.random() < 0.2, "_ts": ts}
        if config.order_by is not None:
            roll = rng.random()
            row["version"] = (None if roll < 0.1 else float("nan") if floating and roll < 0.2
                              else (float if floating else int)(rng.randrange(4)))
        out.append(row)
    return sorted(out, key=lambda r: tuple(r[k] for k in config.keys))


def streams_of(runs: list[list[dict]], schema: pa.Schema, read_batch: int):
    return [iter(pa.Table.from_pylist(rows, schema=schema).to_batches(max_chunksize=read_batch)) for rows in runs]


def canonical(table: pa.Table) -> str:
    return repr(table.to_pylist())  # NaN compares equal as text


def test_the_streamed_merge_equals_the_whole_bucket_merge_over_random_runs():
    cases = 0
    for shape_index, (keys, order_type) in enumerate(SHAPES):
        config = shape_config(keys, order_type)
        schema = arrow_run_schema(config)
        output = [*keys, "name", *(["version"] if order_type is not None else [])]
        for run_count in (1, 2, 3, 6):
            for key_space in (5, 40, 400):
                for read_batch in READ_BATCHES:
                    rng = random.Random(f"{shape_index}-{run_count}-{key_space}-{read_batch}")
                    for _ in range(2):
                        runs = [random_run(rng, config, ts, rows=rng.choice([0, 1, 5, 60, 150]),
                                           key_space=key_space, duplicates=rng.random() < 0.3)
                                for ts in rng.sample(range(10), run_count)]
                        everything = pa.Table.from_pylist([r for run in runs for r in run], schema=schema)
                        expected = merge_bucket(everything, config, output)
                        pieces = list(merge_sorted_streams(streams_of(runs, schema, read_batch), config, output))
                        got = pa.concat_tables(pieces) if pieces else expected.slice(0, 0)
                        assert canonical(got) == canonical(expected), (keys, order_type, run_count, key_space,
                                                                       read_batch)
                        cases += 1
    assert cases == len(SHAPES) * 4 * 3 * len(READ_BATCHES) * 2


def test_what_the_merge_holds_is_a_batch_per_run_not_the_bucket():
    """Rows read from the run files and not yet merged never exceed a read batch per file
    (plus the rows of one key a batch ends inside), however large the bucket."""
    config = shape_config(("id",), LongType())
    schema = arrow_run_schema(config)
    rng = random.Random(5)
    runs = [random_run(rng, config, ts, rows=5_000, key_space=20_000, duplicates=False) for ts in range(4)]
    read_batch = 50
    pulled = [0]

    def counted(rows):
        for batch in pa.Table.from_pylist(rows, schema=schema).to_batches(max_chunksize=read_batch):
            pulled[0] += batch.num_rows
            yield batch

    ids_in = sorted(r["id"] for run in runs for r in run)
    merged_through = 0
    most_held = 0
    for piece in merge_sorted_streams([counted(run) for run in runs], config, ["id", "name"]):
        if piece.num_rows:
            last = piece.column("id")[-1].as_py()
            merged_through = bisect.bisect_right(ids_in, last)
        most_held = max(most_held, pulled[0] - merged_through)
    assert pulled[0] == len(ids_in) == 20_000
    assert most_held <= len(runs) * read_batch, most_held


@pytest.mark.parametrize("descending_at", [1, 60])
def test_a_run_file_whose_keys_go_down_is_refused(descending_at):
    from airflow_upsert_provider.engine.table.arrow_reader import _NotSorted

    config = shape_config(("id",), None)
    schema = arrow_run_schema(config)
    rows = [{"region": "r", "id": i, "name": "n", "_deleted": False, "_ts": 0} for i in range(100)]
    rows[descending_at], rows[descending_at - 1] = rows[descending_at - 1], rows[descending_at]
    sorted_run = [{**r, "_ts": 1} for r in sorted(rows, key=lambda r: r["id"])]
    with pytest.raises(_NotSorted) as raised:
        list(merge_sorted_streams(streams_of([sorted_run, rows], schema, 16), config, ["id"]))
    assert raised.value.stream == 1
