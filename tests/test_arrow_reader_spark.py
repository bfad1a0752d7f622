"""The Arrow reader against the engine on Spark: random histories written by the engine's own
batches and compactions read the same through ``read_table`` (no Spark), ``Shard.read`` and
the oracle, at every as_of from since to upper."""

from __future__ import annotations

import json
import os
import random

import pytest

from airflow_upsert_provider.engine.maintenance.compaction import compact
from airflow_upsert_provider.engine.table.arrow_reader import read_table
from airflow_upsert_provider.engine.write.writer import Writer
from airflow_upsert_provider.sample_data import write_segment
from tests.arrow_runs import arrow_table
from tests.conftest import sqlite_only
from tests.helpers import make_shard
from tests.oracle import oracle_table, table_from_rows

PARTITIONS = 2
SEGMENTS = 4  # per partition


def write_landing(root: str, rng: random.Random) -> None:
    """Change records with repeated keys, order values from a small range (ties) or null,
    and tombstones. A key stays in one partition, as a keyed producer puts it: the engine
    ranks equal order values by batch across batches, the oracle by partition and offset,
    which agree only within a partition."""
    for seq in range(SEGMENTS):
        for p in range(PARTITIONS):
            lines = []
            for _ in range(rng.randrange(2, 9)):
                key = rng.randrange(10) * PARTITIONS + p
                deleted = rng.random() < 0.2
                lines.append(json.dumps({
                    "id": key,
                    "name": None if deleted else f"n{key}-{rng.randrange(100)}",
                    "amount": None if deleted else rng.randrange(200) / 2,
                    "updated_at": None if rng.random() < 0.15 else rng.randrange(4),
                    "deleted": deleted,
                }))
            write_segment(os.path.join(root, f"p{p}", f"{seq:05d}.jsonl"), lines)


@sqlite_only
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_arrow_reader_equals_spark_and_oracle_at_every_as_of(spark, consensus, blob, tmp_path, seed):
    from functools import reduce

    from pyspark.sql import functions as F

    rng = random.Random(seed)
    order_by = None if seed == 3 else "updated_at"
    shard = make_shard(consensus, blob, tmp_path, buckets=rng.choice([2, 3, 5]), order_by=order_by,
                       max_files_per_batch=rng.choice([1, 2, 3]))
    write_landing(shard.source.root, rng)

    def oracle(as_of: int) -> dict:
        return oracle_table(shard.source.root, order_by=order_by, max_offset=shard.bound_offsets(as_of))

    writer = Writer(shard, "w", spark_factory=lambda: spark)
    writer.run(max_batches=rng.randrange(1, 4), with_lag=False)
    upper = shard.state().upper
    for as_of in range(0, upper + 1):  # uncompacted runs: every as_of from 0
        assert arrow_table(read_table(shard, as_of)) == oracle(as_of), f"as_of {as_of}"
    compact(spark, shard, since=rng.randrange(1, upper + 1))
    writer.run(until_caught_up=True, with_lag=False)
    if rng.random() < 0.5:
        state = shard.state()
        compact(spark, shard, since=rng.randrange(state.since + 1, state.upper + 1))
    state = shard.state()
    assert state.upper >= 3 and state.since >= 1

    as_ofs = range(state.since, state.upper + 1)
    # One Spark job for every as_of.
    reads = [shard.read(spark, as_of).withColumn("_as_of", F.lit(as_of)) for as_of in as_ofs]
    rows = reduce(lambda a, b: a.unionByName(b), reads).collect()
    for as_of in as_ofs:
        on_spark = table_from_rows(
            {k: v for k, v in r.asDict().items() if k != "_as_of"} for r in rows if r["_as_of"] == as_of
        )
        expected = oracle(as_of)
        assert on_spark == expected, f"Spark, as_of {as_of}"
        assert arrow_table(read_table(shard, as_of)) == expected, f"Arrow, as_of {as_of}"


@sqlite_only
def test_a_bit_flipped_in_a_page_without_a_hadoop_checksum_file_fails_the_spark_read_naming_it(
        spark, consensus, blob, tmp_path):
    """Spark's own Parquet reader verifies page CRCs (engine/spark/reads.py,
    PAGE_CHECKSUM_CONF): a flip that still decodes in a run file with no Hadoop ``.crc`` beside
    it (a store without them, a file copied back without it) fails the read, which then names
    the file, as the pyarrow readers do."""
    from airflow_upsert_provider.engine.errors import IntegrityError
    from airflow_upsert_provider.engine.table.runs import read_runs
    from tests.maintenance.support import written_shard
    from tests.maintenance.test_compaction_integrity import flip_a_bit_that_still_decodes

    shard = written_shard(spark, consensus, blob, tmp_path, batches=2)
    runs = shard.live_runs()
    damaged = blob.path(sorted(f["path"] for f in runs[1]["files"])[0])
    flip_a_bit_that_still_decodes(damaged)
    os.unlink(os.path.join(os.path.dirname(damaged), f".{os.path.basename(damaged)}.crc"))

    with pytest.raises(IntegrityError) as caught:
        with shard.reading(runs):
            read_runs(spark, shard.config, shard.blob, runs).collect()
    assert caught.value.details["file"] == damaged and caught.value.exit_code == 4
    assert f"{damaged}: checksum mismatch: sha256" in caught.value.message
