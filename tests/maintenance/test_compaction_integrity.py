"""Compaction never makes damage permanent: a bit flipped in a committed run file, in a value
that still decodes, is refused with the file named, before anything is written or swapped."""

from __future__ import annotations

import io
import os

import pyarrow.parquet as pq
import pytest

from airflow_upsert_provider.engine.errors import IntegrityError
from airflow_upsert_provider.engine.maintenance.compaction import compact
from tests.conftest import sqlite_only
from tests.maintenance.support import written_shard


def flip_a_bit_that_still_decodes(path: str) -> tuple[list, list]:
    """Flip the first bit of the file (in name order of positions) after which it still reads,
    unchecked, as a table of other values; return (rows before, rows after)."""
    data = open(path, "rb").read()
    before = pq.read_table(path).to_pylist()
    footer_start = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    for at in range(4, footer_start):
        flipped = bytearray(data)
        flipped[at] ^= 1
        try:
            after = pq.read_table(io.BytesIO(bytes(flipped))).to_pylist()
        except Exception:
            continue
        if after != before and len(after) == len(before):
            with open(path, "wb") as handle:
                handle.write(bytes(flipped))
            return before, after
    pytest.fail(f"no bit of {path} flips into other values that still decode")


@sqlite_only
def test_compaction_refuses_a_run_file_whose_checksum_does_not_match(spark, consensus, blob, tmp_path):
    shard = written_shard(spark, consensus, blob, tmp_path, batches=2)
    run = shard.batches()[1].run
    damaged = blob.path(sorted(f["path"] for f in run["files"])[0])
    before, after = flip_a_bit_that_still_decodes(damaged)
    # Hadoop's checksum file would catch it on this disk; an object store has none.
    crc = os.path.join(os.path.dirname(damaged), f".{os.path.basename(damaged)}.crc")
    if os.path.exists(crc):
        os.unlink(crc)
    runs_before = sorted(os.listdir(blob.path(shard.shard_id, "runs")))

    with pytest.raises(IntegrityError) as caught:
        compact(spark, shard)

    assert caught.value.details["file"] == damaged
    assert f"{damaged}: checksum mismatch: sha256" in str(caught.value) and caught.value.exit_code == 4
    state = shard.state()
    assert (state.since, state.upper) == (0, 2)  # nothing swapped
    assert sorted(os.listdir(blob.path(shard.shard_id, "runs"))) == runs_before  # no output written
    # The flip still decodes: a read that checks nothing returns other values; Spark's writer
    # put a CRC on every page, which a checking read verifies.
    assert pq.read_table(damaged).to_pylist() == after != before
    with pytest.raises(OSError, match="CRC checksum verification failed"):
        pq.ParquetFile(damaged, page_checksum_verification=True).read()
