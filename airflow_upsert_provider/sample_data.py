"""Sample change data for the demo, the tests and the benchmarks.

Writes ``<root>/<partition>/<seq>.jsonl`` segments the way a producer should: into a hidden
temporary file, then renamed into place, so a reader never sees half a segment.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass

SAMPLE_SCHEMA_DDL = "id BIGINT, name STRING, amount DOUBLE, updated_at BIGINT, deleted BOOLEAN"
SAMPLE_KEYS = ("id",)
SAMPLE_ORDER_BY = "updated_at"
SAMPLE_DELETE_MARKER = "deleted"


@dataclass(frozen=True)
class SampleSpec:
    """What to generate.

    :param records: change records in all.
    :param keys: distinct key values (ids 0..keys-1).
    :param partitions: partitions ``p0..p{n-1}``.
    :param segments_per_partition: segment files per partition.
    :param delete_ratio: share of records that are tombstones.
    :param first_seq: offset of the first segment of each partition; segments are numbered
        first_seq, first_seq + seq_step, ...
    :param seed: random seed; the same spec writes the same files.
    """

    records: int = 200_000
    keys: int = 50_000
    partitions: int = 4
    segments_per_partition: int = 8
    delete_ratio: float = 0.05
    first_seq: int = 0
    seq_step: int = 10
    seed: int = 42


def write_segment(path: str, lines: list[str]) -> None:
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write("".join(line + "\n" for line in lines))
    os.replace(tmp, path)


def generate(root: str, spec: SampleSpec = SampleSpec()) -> list[str]:
    """Write the sample segments; return their paths in write order."""
    rng = random.Random(spec.seed)
    segments = spec.partitions * spec.segments_per_partition
    per_segment = max(1, spec.records // segments)
    written = []
    clock = spec.seed * 1_000_000 + spec.first_seq * 1000
    for index in range(spec.segments_per_partition):
        seq = spec.first_seq + index * spec.seq_step
        for p in range(spec.partitions):
            lines = []
            for _ in range(per_segment):
                # A coarse clock gives ties in the order column: the engine must break them
                # the same way every time (partition, offset, line).
                clock += rng.random() < 0.5
                key = rng.randrange(spec.keys)
                deleted = rng.random() < spec.delete_ratio
                record = {
                    "id": key,
                    "name": None if deleted else f"name-{key}-{rng.randrange(1000)}",
                    "amount": None if deleted else round(rng.uniform(0, 1000), 2),
                    "updated_at": clock,
                    "deleted": deleted,
                }
                lines.append(json.dumps(record))
            path = os.path.join(root, f"p{p}", f"{seq}.jsonl")
            write_segment(path, lines)
            written.append(path)
    return written


def sample_schema_json() -> str:
    """The sample schema as the JSON a shard stores (no SparkSession needed)."""
    from pyspark.sql.types import BooleanType, DoubleType, LongType, StringType, StructField, StructType

    return StructType(
        [
            StructField("id", LongType()),
            StructField("name", StringType()),
            StructField("amount", DoubleType()),
            StructField("updated_at", LongType()),
            StructField("deleted", BooleanType()),
        ]
    ).json()
