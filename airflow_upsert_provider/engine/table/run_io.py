"""Run files written and read by Spark executors through pyarrow filesystems.

Each executor opens the blob with :func:`~airflow_upsert_provider.engine.blob.filesystems.filesystem_for`
itself, so that an object store (``s3://`` and the other schemes pyarrow knows) is reached with
the executor's own credential chain on a stock ``pip install pyspark`` (Spark's Hadoop has no
S3 connector there). What crosses from the driver to the executors is the blob root, the run's
relative paths and the schema: never a credential (a root carrying one is refused when the
blob is opened).

Writing: every task writes each bucket it holds as one Parquet file straight to its final,
unique name under the run directory (no temporary name, no rename, no marker file), hashes
the bytes as they go out, and reports (path, bytes, rows, SHA-256); the driver collects the
reports into the run's description, so nothing is read back to describe a run. On the local
filesystem the task fsyncs the file and the run directory before it reports (data durable
before the commit that names it); on an object store a completed PUT is durable.

The reports come back through ``mapInArrow(...).collect()`` rather than a Python data source
writer: a data source writer's ``commit(messages)`` runs in a Python worker the JVM starts,
not in the process that called ``save()`` (nor on the client of a Spark Connect server), so
its messages could reach the caller only through one more object written and read back.

Reading: a Python data source (:func:`read_run_files`) whose input partitions are groups of
the listed files, each read on an executor with pyarrow, yielding record batches in the run
schema.

Which path a root takes is decided in one place, :func:`executor_io`.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import uuid
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator


if TYPE_CHECKING:
    import pyarrow
    import pyarrow.fs
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from airflow_upsert_provider.engine.blob.interface import Blob

# What each writing task reports per file it wrote.
WRITTEN_SCHEMA = "path STRING, bytes BIGINT, rows BIGINT, sha256 STRING"
# Rows gathered before a row group is written: Spark hands a task record batches of 10k rows,
# and a row group per batch would make files of many small row groups.
ROW_GROUP_BYTES = 64 << 20
# How the files of a read are packed into input partitions, as Spark packs file splits:
# at most this many bytes per partition, each file counting this much more for its opening.
READ_PARTITION_BYTES = 128 << 20
READ_OPEN_COST_BYTES = 4 << 20
# The name the run reader data source is registered under in a session.
READER_SOURCE_NAME = "upsert_run_files"
# Bytes of a file written to an object store that are held back until the file is complete:
# pyarrow's S3 stream (opened with allow_delayed_open, blob/filesystems.py) sends an object
# below its part size (10 MiB) as one PUT when closed, and a bigger one as a multipart upload
# that closing completes and nothing in pyarrow's Python API aborts (docs/storage.md).
# Opening the stream only for a file that is complete or has outgrown this, a failed task's
# smaller file sends no request at all. pyarrow buffers as much itself: nothing more is held.
OBJECT_HOLD_BYTES = 10 * 1024 * 1024 - 1


def executor_io(root: str) -> bool:
    """Whether runs under ``root`` are written and read by executors through pyarrow (every
    root with a scheme other than ``file://``) rather than by Spark's own Parquet writer and
    reader (local and POSIX-mounted roots).

    Local disk keeps Spark's native path: bench/bench_run_io.py measured both there in one run
    (2 cores, two runs): pyarrow writes on a par or faster (0.65-1.16x Spark's writer with
    its driver-side checksum), but reads and merges 1M and 5M rows 1.08-1.38x slower and
    compacts them 0.98-1.71x (every row crosses from a Python worker to the JVM as Arrow,
    where Spark's reader decodes Parquet in the JVM): beyond the 15% one code path would be
    worth. Figures: docs/performance.md, "Run files through pyarrow"."""
    from airflow_upsert_provider.engine.blob.filesystems import split_uri

    return bool(split_uri(root)[0])


# -- writing --------------------------------------------------------------------------------


class HashingSink:
    """A writable file object over a pyarrow output stream that hashes and counts the bytes
    as they go out: the checksum of a file is known when it is closed, without reading it.

    ``open_stream`` opens the stream: at once, or with ``hold_bytes`` (an object store's) only
    when the file is closed or has outgrown them, its first bytes held here until then, so
    that a file abandoned before that never reaches the store (:meth:`abort`)."""

    def __init__(self, open_stream: Callable[[], "pyarrow.NativeFile"], *, hold_bytes: int = 0) -> None:
        self._open_stream = open_stream
        self._hold_bytes = hold_bytes
        self._held = bytearray()
        self._stream = open_stream() if hold_bytes <= 0 else None
        self._sha256 = hashlib.sha256()
        self.size = 0
        self.closed = False
        self.aborted = False

    def write(self, data: Any) -> int:
        if self.aborted:
            raise OSError(errno.ECANCELED, "the file was abandoned after a failure")
        view = memoryview(data)
        self._sha256.update(view)
        self.size += view.nbytes
        if self._stream is None and self.size <= self._hold_bytes:
            self._held += view
        else:
            self._release()
            self._stream.write(view)
        return view.nbytes

    def _release(self) -> None:
        """Open the stream if it is not yet, and send it the bytes held."""
        if self._stream is None:
            self._stream = self._open_stream()
            if self._held:
                self._stream.write(self._held)
            self._held = bytearray()

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        if self._stream is not None:
            self._stream.flush()

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._release()
            self._stream.close()

    def abort(self) -> bool:
        """Give up on the file after a failure: no byte more reaches the stream (not the
        Parquet footer a writer's close or finalizer would add), so what a store keeps of it
        is never a readable Parquet file with part of the rows. Returns whether anything may
        have reached the store: False when the stream was never opened (the bytes held are
        dropped); otherwise the stream is released, which on an object store completes the
        upload (pyarrow exposes no abort), and the caller deletes the object (GC collects it
        if that fails too)."""
        self.aborted = True
        if self._stream is None:
            self.closed = True
            self._held = bytearray()
            return False
        self.close()
        return True

    @property
    def hexdigest(self) -> str:
        return self._sha256.hexdigest()


@dataclass(frozen=True)
class RunFileTarget:
    """Where a writing task puts its files: the blob root (a local path or a URI), the run
    directory relative to it, and the columns a run file holds. Pickled to the executors:
    no credential in it."""

    root: str
    run_path: str
    columns: tuple[str, ...]


def sync_local(path: str) -> None:
    """fsync a file another handle wrote, then its bucket directory and the run directory
    above it (the new names)."""
    from airflow_upsert_provider.engine.common.atomic_file import fsync_dir

    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    bucket_dir = os.path.dirname(path)
    fsync_dir(bucket_dir)
    fsync_dir(os.path.dirname(bucket_dir))


def write_bucket_files(
    batches: Iterable["pyarrow.RecordBatch"], target: RunFileTarget, task_tag: str
) -> Iterator[dict[str, Any]]:
    """Write the rows of one task, sorted by (``_bucket``, key), as one Parquet file per bucket
    (``<run>/_bucket=<n>/part-<task>-<nonce>.parquet``, the layout Spark's writer gives a run)
    and yield ``{path, bytes, rows, sha256}`` for each file once it is complete (and, on local
    disk, durable). A bucket without rows writes no file. The run directory must exist on
    local disk: a task never creates it, so a run directory deleted under a writer fails the
    task with an error naming it instead of coming back half-filled."""
    import pyarrow as pa
    import pyarrow.fs
    import pyarrow.parquet as pq

    from airflow_upsert_provider.engine.blob.filesystems import filesystem_for

    filesystem, base = filesystem_for(target.root)
    local = isinstance(filesystem, pyarrow.fs.LocalFileSystem)
    current: dict[str, Any] | None = None
    pending: list[pa.RecordBatch] = []
    pending_bytes = 0

    def flush() -> None:
        nonlocal pending, pending_bytes
        if pending:
            table = pa.Table.from_batches(pending)
            current["writer"].write_table(table, row_group_size=table.num_rows)
            current["rows"] += table.num_rows
        pending, pending_bytes = [], 0

    def finish() -> dict[str, Any]:
        flush()
        current["writer"].close()
        current["sink"].close()
        if local:
            sync_local(current["full"])
        return {"path": current["path"], "bytes": current["sink"].size, "rows": current["rows"],
                "sha256": current["sink"].hexdigest}

    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            buckets = batch.column("_bucket").to_numpy(zero_copy_only=False)
            data = batch.select(list(target.columns))
            start = 0
            # Rows are sorted by bucket: each change of value starts the next bucket's file.
            for end in [*(int(i) + 1 for i in (buckets[1:] != buckets[:-1]).nonzero()[0]), len(buckets)]:
                bucket = int(buckets[start])
                if current is None or current["bucket"] != bucket:
                    if current is not None:
                        done, current = finish(), None
                        yield done
                    relative = f"{target.run_path}/_bucket={bucket}/part-{task_tag}-{uuid.uuid4().hex[:8]}.parquet"
                    full = f"{base.rstrip('/')}/{relative}"
                    if local:
                        try:
                            os.mkdir(os.path.dirname(full))
                        except FileExistsError:  # another attempt at this bucket made it
                            pass
                    sink = HashingSink(partial(filesystem.open_output_stream, full),
                                       hold_bytes=0 if local else OBJECT_HOLD_BYTES)
                    current = {"bucket": bucket, "path": relative, "full": full, "sink": sink, "rows": 0,
                               "writer": pq.ParquetWriter(sink, data.schema, write_page_checksum=True)}
                piece = data.slice(start, end - start)
                pending.append(piece)
                pending_bytes += piece.nbytes
                if pending_bytes >= ROW_GROUP_BYTES:
                    flush()
                start = end
        if current is not None:
            done, current = finish(), None
            yield done
    except BaseException as exc:
        # A failed task leaves no partial file behind where it can, and never a readable one:
        # the Parquet writer is abandoned without its footer. What a killed task, or a failed
        # deletion, leaves in the run directory is named by no run: GC collects it after its
        # grace period.
        if current is not None:
            abandon_parquet_file(filesystem, current["writer"], current["sink"], current["full"])
        if not local and isinstance(exc, OSError):
            failed = f"{target.root.rstrip('/')}/{current['path']}" if current is not None else target.root
            raise_store_error(target.root, exc, "write", failed)
        raise


def abandon_parquet_file(filesystem: "pyarrow.fs.FileSystem", writer: Any, sink: HashingSink, full: str) -> None:
    """Give up on a Parquet file a failed task was writing to ``sink``: ``writer`` never
    writes its footer, and what may have reached the store is deleted where it can be (what
    is left is named by nothing: GC, or an orphan-file removal, collects it)."""
    writer.is_open = False  # its close (or finalizer) would write the footer
    try:
        if sink.abort():
            filesystem.delete_file(full)
    except Exception:
        pass


def _task_tag() -> str:
    """This task attempt's id (unique in the Spark application), for its file names."""
    from pyspark import TaskContext

    context = TaskContext.get()
    return f"t{context.taskAttemptId()}" if context is not None else "t0"


FileWriter = Callable[[Iterable["pyarrow.RecordBatch"], RunFileTarget, str], Iterator[dict[str, Any]]]


def run_writer_task(
    target: RunFileTarget, write_files: FileWriter | None = None
) -> Callable[[Iterator["pyarrow.RecordBatch"]], Iterator["pyarrow.RecordBatch"]]:
    """The function each task runs (``mapInArrow``): writes its files with ``write_files``
    (a run's bucket files by default) and yields one report row per file, in
    :data:`WRITTEN_SCHEMA`. It carries ``target`` and nothing else to the executors."""
    write = write_files or write_bucket_files

    def write_task(batches: Iterator["pyarrow.RecordBatch"]) -> Iterator["pyarrow.RecordBatch"]:
        import pyarrow as pa

        schema = pa.schema([("path", pa.string()), ("bytes", pa.int64()), ("rows", pa.int64()), ("sha256", pa.string())])
        for written in write(batches, target, _task_tag()):
            yield pa.RecordBatch.from_pylist([written], schema=schema)

    return write_task


def _written_by_tasks(rows: "DataFrame", target: RunFileTarget, write_files: FileWriter) -> dict[str, Any]:
    """Run ``write_files`` in every task of ``rows`` and gather what the tasks report:
    ``{path, files: [{path, bytes, sha256}], rows}``, paths relative to the blob root."""
    try:
        reports = rows.mapInArrow(run_writer_task(target, write_files), WRITTEN_SCHEMA).collect()
    except Exception as exc:
        raise_carried_error(exc)  # a PUT that failed beyond the bound: BlobUnavailable, retryable
        raise
    files = sorted(({"path": r["path"], "bytes": r["bytes"], "sha256": r["sha256"]} for r in reports),
                   key=lambda f: f["path"])
    return {"path": target.run_path, "files": files, "rows": sum(r["rows"] for r in reports)}


def write_run_files(rows: "DataFrame", columns: list[str], blob: "Blob", run_dir: str) -> dict[str, Any]:
    """Write ``rows`` (``columns`` plus ``_bucket``, partitioned by bucket and sorted by
    (``_bucket``, key) within partitions) as a run under ``run_dir`` (which exists on local
    disk), on the executors; return the run's description: ``{path, files: [{path, bytes,
    sha256}], rows}``, paths relative to the blob root."""
    return _written_by_tasks(rows, RunFileTarget(blob.root, blob.relative(run_dir), tuple(columns)), write_bucket_files)


def write_json_lines_task_file(
    batches: Iterable["pyarrow.RecordBatch"], target: RunFileTarget, task_tag: str
) -> Iterator[dict[str, Any]]:
    """Write the rows of one task as one JSON Lines file (``<dir>/part-<task>-<nonce>.json``,
    one object per row, null fields left out as Spark's JSON writer leaves them) straight
    to its final name, and yield its ``{path, bytes, rows, sha256}`` once complete (and, on
    local disk, durable). A task without rows writes no file; on failure the partial file
    is deleted where it can be, as :func:`write_bucket_files` does."""
    import pyarrow.fs

    from airflow_upsert_provider.engine.blob.filesystems import filesystem_for

    filesystem, base = filesystem_for(target.root)
    relative = f"{target.run_path}/part-{task_tag}-{uuid.uuid4().hex[:8]}.json"
    full = f"{base.rstrip('/')}/{relative}"
    sink: HashingSink | None = None
    rows = 0
    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            if sink is None:
                sink = HashingSink(partial(filesystem.open_output_stream, full),
                                   hold_bytes=0 if isinstance(filesystem, pyarrow.fs.LocalFileSystem) else OBJECT_HOLD_BYTES)
            lines = [
                json.dumps({k: v for k, v in row.items() if v is not None}, ensure_ascii=False, separators=(",", ":"))
                for row in _lenient_rows(batch.select(list(target.columns)))
            ]
            sink.write(("\n".join(lines) + "\n").encode("utf-8"))
            rows += batch.num_rows
        if sink is None:
            return
        sink.close()
        if isinstance(filesystem, pyarrow.fs.LocalFileSystem):
            sync_local(full)
        yield {"path": relative, "bytes": sink.size, "rows": rows, "sha256": sink.hexdigest}
    except BaseException as exc:
        if sink is not None:
            try:
                if sink.abort():
                    filesystem.delete_file(full)
            except Exception:
                pass
        if not isinstance(filesystem, pyarrow.fs.LocalFileSystem) and isinstance(exc, OSError):
            raise_store_error(target.root, exc, "write", f"{target.root.rstrip('/')}/{relative}")
        raise


def _lenient_rows(batch: "pyarrow.RecordBatch") -> list[dict[str, Any]]:
    """The rows of ``batch`` as dicts, its strings decoded with invalid UTF-8 replaced by
    U+FFFD, as Spark's own JSON writer does: a quarantined record is often a line that was
    rejected because it is not UTF-8, and it must be written, not fail the batch."""
    import pyarrow as pa

    columns = {}
    for name, column in zip(batch.schema.names, batch.columns):
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            # Arrow casts string to binary without validating; decoding is then ours.
            columns[name] = [None if v is None else v.decode("utf-8", "replace")
                             for v in column.cast(pa.large_binary()).to_pylist()]
        else:
            columns[name] = column.to_pylist()
    names = list(columns)
    return [dict(zip(names, values)) for values in zip(*columns.values())] if names else []


def write_json_lines_files(rows: "DataFrame", blob: "Blob", directory: str) -> dict[str, Any]:
    """Write ``rows`` as JSON Lines under ``directory`` (which exists on local disk), one file
    per task that holds rows, written by its executor as runs are; return ``{path, files:
    [{path, bytes, sha256}], rows}``, paths relative to the blob root. For what Spark's JSON
    writer cannot reach (quarantined records on object storage)."""
    return _written_by_tasks(rows, RunFileTarget(blob.root, blob.relative(directory), tuple(rows.columns)),
                             write_json_lines_task_file)

# -- reading --------------------------------------------------------------------------------


def plan_read_partitions(
    files: list[tuple[str, int]],
    *,
    parallelism: int,
    max_bytes: int = READ_PARTITION_BYTES,
    open_cost: int = READ_OPEN_COST_BYTES,
) -> list[list[str]]:
    """Pack ``files`` (relative path, bytes) into input partitions the way Spark packs file
    splits: a partition holds at most ``min(max_bytes, max(open_cost, total / parallelism))``
    bytes (each file weighing ``open_cost`` more), largest files first, unless one file alone
    is larger. The listed order of files within a partition is kept stable."""
    if not files:
        return []
    total = sum(size + open_cost for _, size in files)
    target = min(max_bytes, max(open_cost, total // max(1, parallelism)))
    partitions: list[list[str]] = []
    current: list[str] = []
    current_bytes = 0
    for path, size in sorted(files, key=lambda f: (-f[1], f[0])):
        weight = size + open_cost
        if current and current_bytes + weight > target:
            partitions.append(current)
            current, current_bytes = [], 0
        current.append(path)
        current_bytes += weight
    partitions.append(current)
    return partitions


# Rows per batch read_files yields (pyarrow's dataset default).
READ_BATCH_ROWS = 131_072


def read_files(
    root: str, paths: list[str], schema: "pyarrow.Schema", *, sizes: "list[int | None] | None" = None,
    batch_rows: int = READ_BATCH_ROWS,
) -> Iterator["pyarrow.RecordBatch"]:
    """The rows of the run files at ``paths`` (relative to ``root``), as record batches in
    ``schema``: the columns by name, cast to the run schema's types (a run Spark wrote stores
    timestamps as INT96, which pyarrow reads as nanoseconds). Every page's CRC is checked (runs
    written here carry one per page; a page without one is read unchecked).

    ``sizes``: each file's size as the shard's state lists it; given, an object store is asked
    for no HEAD before the file's GETs (a file whose size differs fails to read, and the
    caller's check of what failed names it). ``batch_rows``: rows per batch at most; on local
    disk also what is decoded at once, whatever a file's row groups hold."""
    import pyarrow.dataset as ds
    import pyarrow.fs
    import pyarrow.parquet as pq

    from airflow_upsert_provider.engine.blob.filesystems import filesystem_for

    filesystem, base = filesystem_for(root)
    local = isinstance(filesystem, pyarrow.fs.LocalFileSystem)
    # A bit flipped in a page that still decodes is caught by the page's CRC.
    parquet = ds.ParquetFileFormat(
        read_options=ds.ParquetReadOptions(coerce_int96_timestamp_unit="us"),
        default_fragment_scan_options=ds.ParquetFragmentScanOptions(page_checksum_verification=True),
    )
    for n, path in enumerate(paths):
        try:
            full_path = f"{base.rstrip('/')}/{path}"
            if local:
                # Decoded batch_rows at a time within a row group: a dataset scan decodes a whole
                # row group before its first batch, and Spark's writer (local runs) puts a bucket
                # of a 50M-row table in one row group of millions of rows. On object storage,
                # opening a file this way costs a HEAD; the executors write row groups of at most
                # ROW_GROUP_BYTES there.
                parquet_file = pq.ParquetFile(full_path, coerce_int96_timestamp_unit="us",
                                              page_checksum_verification=True)
                present = set(parquet_file.schema_arrow.names)
            else:
                fragment = parquet.make_fragment(full_path, filesystem, file_size=sizes[n] if sizes else None)
                present = set(fragment.physical_schema.names)
            # A run written with an older schema version lacks the columns added since: they
            # read as null (its footer, read for the scan anyway, says which it has).
            stored = [name for name in schema.names if name in present]
            if local:
                batches = parquet_file.iter_batches(batch_size=batch_rows, columns=stored, use_threads=False)
            else:
                # One batch at a time: nothing read ahead of what the consumer asks for.
                batches = fragment.to_batches(columns=stored, batch_size=batch_rows, use_threads=False,
                                              batch_readahead=0, fragment_readahead=0)
            for batch in batches:
                if len(stored) < len(schema.names):
                    batch = with_null_columns(batch, schema)
                yield batch.select(schema.names).cast(schema) if batch.schema != schema else batch
        except OSError as exc:
            if not local:
                raise_store_error(root, exc, "read", f"{root.rstrip('/')}/{path}")
            raise


def with_null_columns(batch: "pyarrow.RecordBatch", schema: "pyarrow.Schema") -> "pyarrow.RecordBatch":
    """``batch`` with a column of nulls for every field of ``schema`` it lacks, in
    ``schema``'s order. Pure."""
    import pyarrow as pa

    columns = [
        batch.column(field.name) if field.name in batch.schema.names else pa.nulls(batch.num_rows, field.type)
        for field in schema
    ]
    return pa.RecordBatch.from_arrays(columns, schema=pa.schema(
        [batch.schema.field(f.name) if f.name in batch.schema.names else f for f in schema]))


def raise_store_error(root: str, exc: OSError, operation: str, uri: str) -> None:
    """On an executor: raise the engine error (``BlobUnavailable``, ``ConfigurationError``) a
    failed request to the object store stands for, in the form that reaches the driver in its
    class (:func:`carried_error` there); return when ``exc`` is of no kind the store explains."""
    from airflow_upsert_provider.engine.blob.objects import request_error
    from airflow_upsert_provider.engine.spark.executor_errors import ExecutorError

    error = request_error(root, exc, operation, uri)
    if error is not None:
        raise ExecutorError(error) from None


def raise_carried_error(exc: BaseException) -> None:
    """On the driver: raise the engine error an executor's task failed with, in its class;
    return when the Spark error ``exc`` carries none."""
    from airflow_upsert_provider.engine.spark.executor_errors import carried_error

    carried = carried_error(exc)
    if carried is not None:
        raise carried from None


_reader_source: type | None = None


def _run_reader_source() -> type:
    """The data source class that reads run files (one class per process: it carries no state,
    a read's root, files and schema come in its options)."""
    global _reader_source
    if _reader_source is not None:
        return _reader_source
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class RunFilesReader(DataSourceReader):
        def __init__(self, options: dict[str, str], schema: "StructType") -> None:
            self.root = options["root"]
            self.partitioned = json.loads(options["partitions"])
            self.sizes = json.loads(options.get("sizes", "{}"))
            self.schema = schema

        def partitions(self) -> list[InputPartition]:
            return [InputPartition(paths) for paths in self.partitioned]

        def read(self, partition: InputPartition) -> Iterator["pyarrow.RecordBatch"]:
            from pyspark.sql.pandas.types import to_arrow_schema

            if partition.value is None:
                return  # Spark reads one placeholder partition when there are none
            yield from read_files(self.root, partition.value, to_arrow_schema(self.schema, timezone="UTC"),
                                  sizes=[self.sizes.get(path) for path in partition.value])

    class RunFilesSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return READER_SOURCE_NAME

        def schema(self) -> str:
            raise ValueError("the run reader is given the run schema by the caller")

        def reader(self, schema: "StructType") -> DataSourceReader:
            return RunFilesReader(dict(self.options), schema)

    _reader_source = RunFilesSource
    return RunFilesSource


def _read_parallelism(spark: "SparkSession") -> int:
    try:
        return int(spark.sparkContext.defaultParallelism)
    except Exception:  # a Spark Connect client has no SparkContext
        return int(spark.conf.get("spark.sql.shuffle.partitions", "8") or 8)


def reader_options(root: str, files: list[dict[str, Any]], parallelism: int) -> dict[str, str]:
    """The run reader's options for one read: the root, the files packed into input
    partitions, and each file's listed size (an executor opens a file with it: no HEAD
    request before its GETs). Options are part of what Spark records about a query: nothing
    secret here."""
    partitions = plan_read_partitions([(f["path"], int(f["bytes"])) for f in files], parallelism=parallelism)
    sizes = {f["path"]: int(f["bytes"]) for f in files}
    return {"root": root, "partitions": json.dumps(partitions), "sizes": json.dumps(sizes)}


def read_run_files(spark: "SparkSession", schema: "StructType", root: str, files: list[dict[str, Any]]) -> "DataFrame":
    """The rows of the run ``files`` (``{path, bytes}``, paths relative to ``root``) in
    ``schema``, read by executors through pyarrow. Lazy like any DataFrame."""
    # Registered on every read: registering again replaces the same stateless class, and a
    # session this process opened later (or a Connect session the server renewed) has it too.
    spark.dataSource.register(_run_reader_source())
    return (
        spark.read.format(READER_SOURCE_NAME)
        .schema(schema)
        .options(**reader_options(root, files, _read_parallelism(spark)))
        .load()
    )
