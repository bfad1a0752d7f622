"""What a reader of run files holds follows its batch, not the files' row groups (issue 35 item 6).

Spark writes row groups of up to 128 MB: at 50M rows in 8 buckets, millions of rows each. The
Arrow reader (and the executors' reader) must not decode a whole row group to hand out its first
batch: each batch ``run_io.read_files`` yields owns buffers of its own rows only, whatever the
row group holds. Measured on the buffers the batches reference (no timing, no process memory)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from airflow_upsert_provider.engine.table import run_io

SCHEMA = pa.schema([("id", pa.int64()), ("name", pa.string()), ("amount", pa.float64()), ("_ts", pa.int64())])


def write_one_row_group(path, rows: int) -> None:
    ids = pa.array(np.arange(rows, dtype=np.int64))
    table = pa.table([ids, pc.binary_join_element_wise("name-", pc.cast(ids, pa.string()), ""),
                      pc.multiply(pc.cast(ids, pa.float64()), 0.5), pa.array(np.zeros(rows, dtype=np.int64))],
                     schema=SCHEMA)
    pq.write_table(table, path, row_group_size=rows, write_page_checksum=True)
    assert pq.read_metadata(path).num_row_groups == 1


def held_per_batch(root, name: str, **options) -> list[tuple[int, int]]:
    """(rows, bytes of every buffer it references) per batch read_files yields."""
    return [(batch.num_rows, batch.get_total_buffer_size())
            for batch in run_io.read_files(str(root), [name], SCHEMA, **options)]


def test_each_batch_holds_buffers_of_its_own_rows_whatever_the_row_group_holds(tmp_path):
    # Row groups of 1x and 3x the default batch: what one batch references stays the same.
    largest = {}
    for factor in (1, 3):
        rows = factor * run_io.READ_BATCH_ROWS
        write_one_row_group(tmp_path / f"g{factor}.parquet", rows)
        held = held_per_batch(tmp_path, f"g{factor}.parquet")
        assert sum(n for n, _ in held) == rows
        assert max(n for n, _ in held) <= run_io.READ_BATCH_ROWS
        # A batch sliced out of a decoded row group references the whole group's buffers.
        per_row = [size / n for n, size in held]
        assert max(per_row) < 2 * min(per_row), (factor, held)
        largest[factor] = max(size for _, size in held)
    assert largest[3] < 1.25 * largest[1], largest


def test_batch_rows_bounds_the_rows_and_the_bytes_of_every_batch(tmp_path):
    rows = 20_000
    write_one_row_group(tmp_path / "f.parquet", rows)
    whole = sum(size for _, size in held_per_batch(tmp_path, "f.parquet", batch_rows=rows))
    for batch_rows in (7, 999, 4_096, rows - 1):
        held = held_per_batch(tmp_path, "f.parquet", batch_rows=batch_rows)
        assert [n for n, _ in held] == [batch_rows] * (rows // batch_rows) + ([rows % batch_rows] if rows % batch_rows else [])
        # Every batch's buffers cover its own rows (and at most a page of slack), never the group.
        assert max(size for _, size in held) <= whole * batch_rows / rows + 64 * 1024, (batch_rows, held[:3])
