"""The data files of a publish written by Spark executors.

Where the shard runs on Spark (a cluster, or local), the buckets a publish rewrites are merged
by Spark (``runs.read_runs``, as a Spark read merges them) and written by the executors: each
task writes Parquet files in the Iceberg table's schema (its field ids in the files' schema,
so every Iceberg reader maps columns by id), one bucket per file, named as the Arrow path
names them (:func:`iceberg_buckets.task_id`), under the table's ``data/`` directory. The
executors hand back the paths only; the driver reads each file's footer into an Iceberg data
file entry (PyIceberg's ``parquet_file_to_data_file``: row counts, column statistics) and the
publish commits them as ONE snapshot, as the Arrow path does.

The table's location must be a filesystem path every executor reaches (local disk, a shared
mount): executors write straight to it.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_upsert_provider.engine.blob.filesystems import split_uri
from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.engine.maintenance.iceberg_buckets import WHOLE, task_id
from airflow_upsert_provider.engine.table.runs import bucket_column, read_runs
from airflow_upsert_provider.engine.table.shard import Shard

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyspark.sql import SparkSession

# Data files one task may write per bucket (task ids are bucket-scoped, below 10**6).
FILES_PER_TASK = 1000


def data_directory(table: "Table") -> str:
    """The local path of the table's ``data/`` directory; a :class:`ConfigurationError`
    naming the location when it is not a filesystem path."""
    location = table.location().rstrip("/")
    scheme, _authority, path = split_uri(location)
    if scheme:
        raise ConfigurationError(
            f"Iceberg table {'.'.join(table.name())} is at {location}: Spark executors write a publish's data "
            "files only to a filesystem path they all reach; publish it without Spark",
            field="spark",
            table=".".join(table.name()),
        )
    return f"{path}/data"


def write_on_executors(
    spark: "SparkSession", shard: Shard, table: "Table", by_bucket: dict[str, list[dict[str, Any]]],
    rewrite: Sequence[str], target_bytes: int, group_count: int, write_uuid: str | None = None,
) -> list[str]:
    """Merge the ``rewrite`` buckets' live run files with Spark and write their rows as data
    files of ``table`` on the executors; the URIs of the files written (``file://``), each
    holding rows of one bucket among ``group_count`` (the key hash the runs' groups were
    taken by, ``runs.read_group_count``). ``target_bytes`` bounds a file's Arrow bytes."""
    import pyarrow as pa
    from pyiceberg.io.pyarrow import schema_to_pyarrow
    from pyspark.sql import functions as F

    if not rewrite:
        return []
    directory = data_directory(table)
    write_uuid = write_uuid or str(uuid.uuid4())
    files = [f for key in rewrite for f in by_bucket[key]]
    frame = read_runs(spark, shard.config, shard.blob, [{"files": files}])
    whole = list(rewrite) == [WHOLE]
    frame = frame.withColumn("_bucket", F.lit(-1) if whole else bucket_column(shard.config, group_count))
    # One task per bucket (or a few): each writes its buckets' rows and nothing else.
    frame = frame.repartition(len(rewrite), "_bucket")
    target = schema_to_pyarrow(table.schema(), include_field_ids=True)

    def write(batches):
        import os

        import pyarrow.compute as pc
        import pyarrow.parquet as pq
        from pyspark import TaskContext

        task = TaskContext.get().partitionId()
        open_files: dict[int, Any] = {}
        counts: dict[int, int] = {}
        written: list[str] = []

        def new_writer(bucket: int):
            key = WHOLE if bucket < 0 else str(bucket)
            n = counts.get(bucket, 0)
            counts[bucket] = n + 1
            if n >= FILES_PER_TASK:
                raise ValueError(f"bucket {key}: more than {FILES_PER_TASK} data files from one task")
            path = f"{directory}/00000-{task_id(key, task * FILES_PER_TASK + n)}-{write_uuid}.parquet"
            written.append(path)
            return [pq.ParquetWriter(path, target), 0]

        os.makedirs(directory, exist_ok=True)
        try:
            for batch in batches:
                buckets = batch.column("_bucket")
                rows = pa.Table.from_batches([batch]).drop_columns(["_bucket"])
                for bucket in pc.unique(buckets).to_pylist():
                    part = rows.filter(pc.equal(buckets, bucket)).cast(target)
                    held = open_files.get(bucket)
                    if held is None or held[1] >= target_bytes:
                        if held is not None:
                            held[0].close()
                        held = open_files[bucket] = new_writer(bucket)
                    held[0].write_table(part)
                    held[1] += part.nbytes
        finally:
            for held in open_files.values():
                held[0].close()
        yield pa.RecordBatch.from_pydict({"path": [f"file://{p}" for p in written]})

    with shard.reading([{"files": files}]):  # a damaged run file: an IntegrityError naming it
        return [row["path"] for row in frame.mapInArrow(write, "path string").collect()]


def remove_attempt(table: "Table", write_uuid: str) -> None:
    """Delete what a failed attempt's executors wrote (names holding ``write_uuid``): no
    snapshot references them. A listing of ``data/``, only after a failure."""
    import os

    directory = data_directory(table)
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return
    for name in names:
        if write_uuid in name:
            try:
                os.remove(os.path.join(directory, name))
            except FileNotFoundError:
                pass
