"""The data files of a publish written by Spark executors.

Where the shard runs on Spark (a cluster, or local), the buckets a publish rewrites are merged
by Spark (``runs.read_runs``, as a Spark read merges them) and written by the executors: each
task writes Parquet files in the Iceberg table's schema (its field ids in the files' schema,
so every Iceberg reader maps columns by id), one bucket per file, named as the Arrow path
names them (:func:`iceberg_buckets.task_id`), under the table's ``data/`` location. The
driver commits them as ONE snapshot, as the Arrow path does.

Where: the table's location may be a filesystem path every executor reaches (local disk, a
shared mount) or object storage (``s3://`` and the other schemes of
``blob.filesystems``). Executors write through pyarrow's filesystems, as they write run files
(``table/run_io.py``): each opens the store with the credential chain of the machine it runs
on; what crosses from the driver is the data location, the schema, the attempt's uuid and the
file size target, never a credential, so none reaches the Spark plan, its UI, a log or ``ps``.
The catalog's own FileIO properties (a connection's ``s3.*`` keys) are the driver's and are
not sent: executors need the store's credentials in their own environment, as for runs
(docs/storage.md).

Read back: each task reports every file's path, bytes and rows. The driver asks the store for
each file's size (one HEAD) and reads its footer (one ranged GET, the size known): a size
other than the one written, or a footer of other rows, is an :class:`IntegrityError` naming
the file (a store that changed the upload), and nothing is committed. The footer gives the
Iceberg data file entry (PyIceberg's ``parquet_file_to_data_file``: row counts, column
statistics). Requests follow the files written, never the table.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

from airflow_upsert_provider.engine.blob.filesystems import split_uri
from airflow_upsert_provider.engine.errors import ConfigurationError, IntegrityError, first_line
from airflow_upsert_provider.engine.maintenance.iceberg_buckets import WHOLE, task_id
from airflow_upsert_provider.engine.table.run_io import (
    OBJECT_HOLD_BYTES,
    WRITTEN_SCHEMA,
    HashingSink,
    RunFileTarget,
    abandon_parquet_file,
    raise_carried_error,
    raise_store_error,
    run_writer_task,
    sync_local,
)
from airflow_upsert_provider.engine.table.runs import bucket_column, read_runs
from airflow_upsert_provider.engine.table.shard import Shard

if TYPE_CHECKING:
    import pyarrow
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table

    from airflow_upsert_provider.engine.config import ShardConfig
    from pyspark.sql import SparkSession

# Data files one task may write per bucket (task ids are bucket-scoped, below 10**6).
FILES_PER_TASK = 1000


def data_location(table: "Table") -> str:
    """The URI (``file://`` for a local path) of the table's ``data/`` directory, where the
    executors write; a :class:`ConfigurationError` naming the table and its location when no
    pyarrow filesystem of the executors' reaches it (a scheme ``blob.filesystems`` does not
    know, credentials in the URI)."""
    location = table.location().rstrip("/")
    try:
        scheme, _authority, path = split_uri(location)
    except ConfigurationError as exc:
        raise ConfigurationError(
            f"Iceberg table {'.'.join(table.name())} is at a location Spark executors cannot write to "
            f"({exc.message}); publish it without Spark",
            field="spark",
            table=".".join(table.name()),
        ) from None
    return f"{location}/data" if scheme else f"file://{path}/data"


def write_on_executors(
    spark: "SparkSession", shard: Shard, table: "Table", by_bucket: dict[str, list[dict[str, Any]]],
    rewrite: Sequence[str], target_bytes: int, group_count: int, write_uuid: str | None = None, *,
    config: "ShardConfig | None" = None, schema: "Schema | None" = None,
) -> list[dict[str, Any]]:
    """Merge the ``rewrite`` buckets' live run files with Spark and write their rows as data
    files of ``table`` on the executors; what they report per file: ``{path, bytes, rows}``
    (``path`` a URI under :func:`data_location`), each file holding rows of one bucket among
    ``group_count`` (the key hash the runs' groups were taken by, ``runs.read_group_count``).
    ``target_bytes`` bounds a file's Arrow bytes. A store's failure on an executor is the
    engine's error of it (:class:`BlobUnavailable` for a transient one). ``config``: the
    columns to merge (default the shard's); ``schema``: the Iceberg schema the files are in
    (default the table's; a publish updating the schema passes its transaction's)."""
    # The table's Parquet writer settings as PyIceberg's writer reads them: no public API.
    from pyiceberg.io.pyarrow import _get_parquet_writer_kwargs, schema_to_pyarrow
    from pyspark.sql import functions as F

    if not rewrite:
        return []
    location = data_location(table)
    files = [f for key in rewrite for f in by_bucket[key]]
    config = config or shard.config
    frame = read_runs(spark, config, shard.blob, [{"files": files}])
    whole = list(rewrite) == [WHOLE]
    frame = frame.withColumn("_bucket", F.lit(-1) if whole else bucket_column(config, group_count))
    # One task per bucket (or a few): each writes its buckets' rows and nothing else.
    frame = frame.repartition(len(rewrite), "_bucket")
    schema = schema_to_pyarrow(schema or table.schema(), include_field_ids=True)
    # The table's Parquet settings (codec, level, page sizes) as PyIceberg's own writer reads them.
    write = partial(write_data_files, schema=schema, write_uuid=write_uuid or str(uuid.uuid4()),
                    target_bytes=target_bytes, parquet_options=_get_parquet_writer_kwargs(table.properties))
    target = RunFileTarget(location, "", tuple(schema.names))
    with shard.reading([{"files": files}]):  # a damaged run file: an IntegrityError naming it
        try:
            reports = frame.mapInArrow(run_writer_task(target, write), WRITTEN_SCHEMA).collect()
        except Exception as exc:
            raise_carried_error(exc)
            raise
    return [{"path": r["path"], "bytes": r["bytes"], "rows": r["rows"]} for r in reports]


def write_data_files(
    batches: Iterable["pyarrow.RecordBatch"], target: RunFileTarget, task_tag: str, *,
    schema: "pyarrow.Schema", write_uuid: str, target_bytes: int, parquet_options: Mapping[str, Any] | None = None,
) -> Iterator[dict[str, Any]]:
    """On an executor: write the rows of one task (``_bucket`` beside ``schema``'s columns;
    -1: the whole table) as data files under ``target.root`` (the table's data location),
    a new file for a bucket once its file holds ``target_bytes``, and yield ``{path, bytes,
    rows, sha256}`` for each file once complete (on local disk, durable). ``parquet_options``:
    the Parquet writer's settings (the table's codec and page sizes). On an object store
    a file is sent once complete or once it outgrows the store's part size (``HashingSink``);
    a failed task leaves no readable partial file where it can (``run_io``)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.fs
    import pyarrow.parquet as pq
    from pyspark import TaskContext

    from airflow_upsert_provider.engine.blob.filesystems import filesystem_for

    filesystem, directory = filesystem_for(target.root)
    local = isinstance(filesystem, pyarrow.fs.LocalFileSystem)
    task = TaskContext.get().partitionId()
    open_files: dict[int, dict[str, Any]] = {}
    counts: dict[int, int] = {}

    def new_file(bucket: int) -> dict[str, Any]:
        key = WHOLE if bucket < 0 else str(bucket)
        n = counts.get(bucket, 0)
        counts[bucket] = n + 1
        if n >= FILES_PER_TASK:
            raise ValueError(f"bucket {key}: more than {FILES_PER_TASK} data files from one task")
        name = f"00000-{task_id(key, task * FILES_PER_TASK + n)}-{write_uuid}.parquet"
        full = f"{directory.rstrip('/')}/{name}"
        sink = HashingSink(partial(filesystem.open_output_stream, full), hold_bytes=0 if local else OBJECT_HOLD_BYTES)
        return {"path": f"{target.root.rstrip('/')}/{name}", "full": full, "sink": sink, "rows": 0, "bytes": 0,
                "writer": pq.ParquetWriter(sink, schema, **(parquet_options or {}))}

    def finish(held: dict[str, Any]) -> dict[str, Any]:
        held["writer"].close()
        held["sink"].close()
        if local:
            sync_local(held["full"])
        return {"path": held["path"], "bytes": held["sink"].size, "rows": held["rows"],
                "sha256": held["sink"].hexdigest}

    if local:
        os.makedirs(directory, exist_ok=True)
    try:
        for batch in batches:
            buckets = batch.column("_bucket")
            rows = pa.Table.from_batches([batch]).drop_columns(["_bucket"])
            for bucket in pc.unique(buckets).to_pylist():
                part = rows.filter(pc.equal(buckets, bucket)).cast(schema)
                held = open_files.get(bucket)
                if held is not None and held["bytes"] >= target_bytes:
                    del open_files[bucket]
                    yield finish(held)
                    held = None
                if held is None:
                    held = open_files[bucket] = new_file(bucket)
                held["writer"].write_table(part)
                held["rows"] += part.num_rows
                held["bytes"] += part.nbytes
        while open_files:
            yield finish(open_files.pop(next(iter(open_files))))
    except BaseException as exc:
        for held in open_files.values():
            abandon_parquet_file(filesystem, held["writer"], held["sink"], held["full"])
        if not local and isinstance(exc, OSError):
            raise_store_error(target.root, exc, "write", target.root)
        raise


def written_file_problem(path: str, reported_bytes: int, reported_rows: int, stored_bytes: int,
                         footer_rows: int | None = None) -> str | None:
    """Why a data file an executor reported is not what the store holds, or None when the
    store's size and the footer's row count (None: not read yet) are what was written. Pure."""
    if stored_bytes != reported_bytes:
        return (f"the store holds {stored_bytes} bytes of data file {path}, its executor wrote {reported_bytes} "
                "(the store changed the upload: docs/storage.md, \"Stores that change uploads\")")
    if footer_rows is not None and footer_rows != reported_rows:
        return f"data file {path} holds {footer_rows} rows by its footer, its executor wrote {reported_rows}"
    return None


def data_files_of(table: "Table", metadata: Any, written: Sequence[Mapping[str, Any]]) -> Iterator[Any]:
    """The Iceberg data file entry of each file the executors reported (``{path, bytes,
    rows}``), from its footer, after checking the store holds what was written
    (:func:`written_file_problem`): per file, one request for its size and one for its
    footer. A mismatch is an :class:`IntegrityError` naming the file."""
    from pyiceberg.io.pyarrow import parquet_file_to_data_file

    from airflow_upsert_provider.engine.blob.filesystems import filesystem_for

    for report in written:
        filesystem, inner = filesystem_for(report["path"])
        try:
            stream = filesystem.open_input_file(inner)  # the store's size of it: one request
        except FileNotFoundError:
            raise IntegrityError(f"data file {report['path']}, written by an executor, is not in the store; "
                                 "nothing was published", file=report["path"]) from None
        with stream:
            problem = written_file_problem(report["path"], report["bytes"], report["rows"], stream.size())
            if problem is None:
                try:
                    entry = parquet_file_to_data_file(_OpenedFile(stream, report["path"]), metadata, report["path"])
                except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
                    problem = f"data file {report['path']} does not parse ({first_line(exc)})"
                else:
                    problem = written_file_problem(report["path"], report["bytes"], report["rows"], stream.size(),
                                                   entry.record_count)
        if problem is not None:
            raise IntegrityError(f"{problem}; nothing was published", file=report["path"])
        yield entry


class _OpenedFile:
    """The one file PyIceberg's footer read asks for, already opened (its size known): the
    footer is then one ranged read, with no second request for the size."""

    def __init__(self, stream: "pyarrow.NativeFile", location: str) -> None:
        self.stream, self.location = stream, location

    def new_input(self, _location: str) -> "_OpenedFile":
        return self

    def __len__(self) -> int:
        return self.stream.size()

    def open(self, seekable: bool = True) -> "Any":
        return contextlib.nullcontext(self.stream)


def remove_attempt(table: "Table", write_uuid: str) -> None:
    """Delete what a failed attempt's executors wrote (names holding ``write_uuid``): no
    snapshot references them. A listing of ``data/``, only after a failure; a file that
    cannot be deleted is left for an orphan-file removal."""
    import pyarrow.fs

    from airflow_upsert_provider.engine.blob.filesystems import filesystem_for

    filesystem, directory = filesystem_for(data_location(table))
    try:
        infos = filesystem.get_file_info(pyarrow.fs.FileSelector(directory, allow_not_found=True))
    except OSError:
        return
    for info in infos:
        if write_uuid in info.base_name:
            try:
                filesystem.delete_file(info.path)
            except OSError:
                pass
