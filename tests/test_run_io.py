"""Run files written and read through pyarrow filesystems (engine/table/run_io.py), without
Spark: a writing task's function is called here in-process on record batches, as an executor
calls it, and the reader's planning and file reading are plain functions.
"""

from __future__ import annotations

import hashlib
import os
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.fs
import pyarrow.parquet as pq
import pytest

from airflow_upsert_provider.engine.blob import filesystems
from airflow_upsert_provider.engine.table import run_io
from airflow_upsert_provider.engine.table.run_io import RunFileTarget, plan_read_partitions, write_bucket_files

COLUMNS = ("id", "v", "_deleted", "_ts")
SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string()), ("_deleted", pa.bool_()), ("_ts", pa.int64()),
                    ("_bucket", pa.int32())])


def rows(bucket_ids: list[tuple[int, int]]) -> pa.RecordBatch:
    """A record batch of (bucket, id) pairs, in the given order."""
    return pa.RecordBatch.from_pylist(
        [{"id": i, "v": f"v{i}", "_deleted": i % 5 == 0, "_ts": 3, "_bucket": b} for b, i in bucket_ids], schema=SCHEMA
    )


def sorted_batches() -> list[pa.RecordBatch]:
    """Rows of buckets 0, 2 and 5 (1, 3 and 4 empty), sorted by (bucket, id), bucket 2
    spanning three batches."""
    return [
        rows([(0, 4), (0, 9), (2, 1)]),
        rows([(2, 3), (2, 8)]),
        rows([]),
        rows([(2, 10), (5, 2), (5, 7)]),
    ]


@pytest.fixture
def run_dir(tmp_path) -> str:
    path = tmp_path / "root" / "s" / "runs" / "ts=000000000003" / "w-abc"
    path.mkdir(parents=True)
    return str(path)


def target_for(tmp_path) -> RunFileTarget:
    return RunFileTarget(str(tmp_path / "root"), "s/runs/ts=000000000003/w-abc", COLUMNS)


def all_files(directory: str) -> set[str]:
    return {os.path.join(d, name) for d, _, names in os.walk(directory) for name in names}


def test_each_bucket_becomes_one_file_reported_with_its_size_rows_and_checksum(tmp_path, run_dir):
    reports = list(write_bucket_files(sorted_batches(), target_for(tmp_path), "t7"))
    root = str(tmp_path / "root")
    assert [r["rows"] for r in reports] == [2, 4, 2]
    assert [os.path.basename(os.path.dirname(r["path"])) for r in reports] == ["_bucket=0", "_bucket=2", "_bucket=5"]
    # Exactly the reported files, at their final names: no temporary name, no marker file.
    assert all_files(run_dir) == {os.path.join(root, r["path"]) for r in reports}
    for report in reports:
        assert report["path"].startswith("s/runs/ts=000000000003/w-abc/_bucket=")
        assert os.path.basename(report["path"]).startswith("part-t7-")
        with open(os.path.join(root, report["path"]), "rb") as handle:
            data = handle.read()
        assert report["bytes"] == len(data) and report["sha256"] == hashlib.sha256(data).hexdigest()
    table = pq.read_table(os.path.join(root, reports[1]["path"]))
    assert table.column_names == list(COLUMNS)
    assert table.column("id").to_pylist() == [1, 3, 8, 10]


def test_a_bucket_spanning_batches_is_one_file_of_bounded_row_groups(tmp_path, run_dir, monkeypatch):
    monkeypatch.setattr(run_io, "ROW_GROUP_BYTES", 1)  # every batch's slice flushed as its own row group
    reports = list(write_bucket_files(sorted_batches(), target_for(tmp_path), "t1"))
    middle = pq.ParquetFile(os.path.join(str(tmp_path / "root"), reports[1]["path"]))
    assert middle.metadata.num_rows == 4 and middle.metadata.num_row_groups == 3


def test_a_file_and_its_directories_are_fsynced_before_the_task_reports_it(tmp_path, run_dir, monkeypatch):
    """Invariant 17 on the executor: when a task reports a file (the report is what a
    commit will name), the file, its bucket directory and the run directory were fsynced."""
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    root = str(tmp_path / "root")
    reported = 0
    for report in write_bucket_files(sorted_batches(), target_for(tmp_path), "t1"):
        path = os.path.join(root, report["path"])
        assert path in synced, path
        assert os.path.dirname(path) in synced[synced.index(path):]
        assert run_dir in synced[synced.index(path):]
        reported += 1
    assert reported == 3


class RecordingHandler(pyarrow.fs.FileSystemHandler):
    """An object store double: pyarrow's in-memory filesystem, every call recorded."""

    def __init__(self) -> None:
        self.fs = pyarrow.fs._MockFileSystem()
        self.calls: list[tuple[str, str]] = []

    def _do(self, name, path, *args):
        self.calls.append((name, path))
        return getattr(self.fs, name)(path, *args)

    def get_type_name(self): return "recording"
    def normalize_path(self, path): return path
    def equals(self, other): return self is other
    def get_file_info(self, paths): return self.fs.get_file_info(paths)
    def get_file_info_selector(self, selector): return self.fs.get_file_info(selector)
    def create_dir(self, path, recursive): return self._do("create_dir", path, recursive)
    def delete_dir(self, path): return self._do("delete_dir", path)
    def delete_dir_contents(self, path, missing_dir_ok=False): return self._do("delete_dir_contents", path)
    def delete_root_dir_contents(self): self.calls.append(("delete_root_dir_contents", ""))
    def delete_file(self, path): return self._do("delete_file", path)
    def move(self, src, dest): self.calls.append(("move", src)); return self.fs.move(src, dest)
    def copy_file(self, src, dest): self.calls.append(("copy_file", src)); return self.fs.copy_file(src, dest)
    def open_input_stream(self, path): return self._do("open_input_stream", path)
    def open_input_file(self, path): return self._do("open_input_file", path)
    def open_output_stream(self, path, metadata):
        self.fs.create_dir(path.rsplit("/", 1)[0])  # an object store's key needs no parent
        return self._do("open_output_stream", path)
    def open_append_stream(self, path, metadata): return self._do("open_append_stream", path)


def test_on_an_object_store_each_file_is_written_once_at_its_final_name(monkeypatch):
    """No directory, no rename, no temporary name, no local fsync: one output stream (one
    PUT) per bucket file, at the name the task reports, holding the bytes it checksummed."""
    handler = RecordingHandler()
    store = pyarrow.fs.PyFileSystem(handler)
    monkeypatch.setattr(filesystems, "filesystem_for", lambda uri: (store, "bucket/prefix"))
    monkeypatch.setattr(os, "fsync", lambda fd: pytest.fail("an object store has nothing to fsync"))
    target = RunFileTarget("s3://bucket/prefix", "s/runs/ts=000000000003/w-abc", COLUMNS)
    reports = list(write_bucket_files(sorted_batches(), target, "t2"))
    assert handler.calls == [("open_output_stream", f"bucket/prefix/{r['path']}") for r in reports]
    for report in reports:
        data = handler.fs.open_input_stream(f"bucket/prefix/{report['path']}").read()
        assert report["bytes"] == len(data) and report["sha256"] == hashlib.sha256(data).hexdigest()


REJECTS = pa.schema([("file", pa.string()), ("line", pa.int64()), ("reason", pa.string()), ("record", pa.string())])


def test_quarantined_records_are_one_json_lines_object_per_task_at_its_final_name(monkeypatch):
    """What Spark's JSON writer writes, written by the task itself on an object store: one
    output stream (one PUT) at the name the task reports, one object per line (a null field
    left out), the checksum of the bytes written; a task without rows writes nothing."""
    import json

    handler = RecordingHandler()
    store = pyarrow.fs.PyFileSystem(handler)
    monkeypatch.setattr(filesystems, "filesystem_for", lambda uri: (store, "bucket/prefix"))
    monkeypatch.setattr(os, "fsync", lambda fd: pytest.fail("an object store has nothing to fsync"))
    target = RunFileTarget("s3://bucket/prefix", "s/rejects/ts=000000000003/w-abc", tuple(REJECTS.names))
    bad = [{"file": "/landing/p0/1.jsonl", "line": 1, "reason": "malformed JSON", "record": "not json"},
           {"file": "/landing/p0/1.jsonl", "line": 4, "reason": "id: not a BIGINT", "record": None}]
    batches = [pa.RecordBatch.from_pylist(bad[:1], schema=REJECTS), pa.RecordBatch.from_pylist([], schema=REJECTS),
               pa.RecordBatch.from_pylist(bad[1:], schema=REJECTS)]
    [report] = list(run_io.write_json_lines_task_file(batches, target, "t5"))
    assert report["path"].startswith("s/rejects/ts=000000000003/w-abc/part-t5-") and report["path"].endswith(".json")
    assert handler.calls == [("open_output_stream", f"bucket/prefix/{report['path']}")]
    data = handler.fs.open_input_stream(f"bucket/prefix/{report['path']}").read()
    assert [json.loads(line) for line in data.decode().splitlines()] == [bad[0], {k: v for k, v in bad[1].items() if v}]
    assert (report["rows"], report["bytes"], report["sha256"]) == (2, len(data), hashlib.sha256(data).hexdigest())
    assert list(run_io.write_json_lines_task_file(iter([]), target, "t6")) == []
    assert len(handler.calls) == 1


def test_a_quarantined_record_that_is_not_utf8_is_written_with_replacement_characters(tmp_path):
    """A line rejected because it is not UTF-8 reaches the writer as a string of invalid
    UTF-8 bytes (Spark does not validate): it is written with U+FFFD in their place, as
    Spark's own JSON writer does, instead of failing the batch."""
    import json

    raw = "caf\u00e9 ok".encode("latin-1")  # é as one Latin-1 byte: invalid UTF-8
    offsets = pa.py_buffer(np.array([0, len(raw)], dtype=np.int32).tobytes())
    record = pa.Array.from_buffers(pa.string(), 1, [None, offsets, pa.py_buffer(raw)])
    batch = pa.RecordBatch.from_arrays(
        [pa.array(["/landing/p0/1.jsonl"]), pa.array([3], pa.int64()), pa.array(["not UTF-8"]), record],
        schema=REJECTS)
    target = RunFileTarget(str(tmp_path), "s/rejects/ts=000000000001/w-abc", tuple(REJECTS.names))
    os.makedirs(tmp_path / target.run_path)  # the driver creates it on local disk
    [report] = list(run_io.write_json_lines_task_file([batch], target, "t7"))
    with open(os.path.join(tmp_path, report["path"]), encoding="utf-8") as handle:
        [line] = [json.loads(text) for text in handle]
    assert line == {"file": "/landing/p0/1.jsonl", "line": 3, "reason": "not UTF-8", "record": "caf\ufffd ok"}


def test_a_failed_task_removes_the_file_it_was_writing(tmp_path, run_dir):
    def failing():
        yield rows([(0, 1), (1, 2)])
        raise RuntimeError("executor lost its input")

    written = write_bucket_files(failing(), target_for(tmp_path), "t3")
    first = next(written)  # bucket 0 is complete when bucket 1 starts
    with pytest.raises(RuntimeError, match="executor lost its input"):
        next(written)
    assert all_files(run_dir) == {os.path.join(str(tmp_path / "root"), first["path"])}


def test_a_task_never_recreates_a_run_directory_deleted_under_it(tmp_path, run_dir):
    """GC may delete an unreferenced staging directory under a slow writer: the task fails
    with an error naming it (the writer restages) instead of filling a directory again."""
    from airflow_upsert_provider.engine.write.writer import staging_lost

    os.rmdir(run_dir)
    with pytest.raises(FileNotFoundError) as caught:
        list(write_bucket_files(sorted_batches(), target_for(tmp_path), "t4"))
    assert not os.path.exists(run_dir)
    assert staging_lost(caught.value, (run_dir, str(tmp_path / "rejects")), claimed=False)


# -- credentials -------------------------------------------------------------------------


SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


def test_no_credential_travels_in_what_the_executors_receive(monkeypatch):
    """What is pickled to the executors (the writing task, the reader class) and the reader's
    options name the root and the files, never a credential: executors resolve their own."""
    from pyspark import cloudpickle

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    target = RunFileTarget("s3://bucket/prefix", "s/runs/ts=000000000003/w-abc", COLUMNS)
    shipped = [
        cloudpickle.dumps(run_io.run_writer_task(target)),
        cloudpickle.dumps(run_io._run_reader_source()),
        repr(run_io.reader_options("s3://bucket/prefix", [{"path": "s/runs/a/_bucket=0/p.parquet", "bytes": 10}], 2)).encode(),
    ]
    for payload in shipped:
        assert SECRET.encode() not in payload and b"AKIAEXAMPLE" not in payload
    # The check can fail: a filesystem object built with the secret carries it when pickled.
    carried = cloudpickle.dumps(pyarrow.fs.S3FileSystem(access_key="AKIAEXAMPLE", secret_key=SECRET))
    assert SECRET.encode() in carried


# -- which path a root takes, and paths ----------------------------------------------------


@pytest.mark.parametrize(
    "root, executors",
    [("/var/lib/upsert", False), ("relative/blob", False), ("file:///var/lib/upsert", False),
     ("s3://bucket/prefix", True), ("gs://bucket/p", True), ("hdfs://nn:8020/p", True)],
)
def test_executors_do_run_io_for_roots_with_a_scheme(root, executors):
    assert run_io.executor_io(root) is executors


# -- reading -------------------------------------------------------------------------------


def test_read_partitions_pack_files_as_spark_packs_splits():
    mib = 1 << 20
    assert plan_read_partitions([], parallelism=2) == []
    # Small files share partitions, up to total / parallelism each.
    small = [(f"f{i}", 1 * mib) for i in range(8)]
    packed = plan_read_partitions(small, parallelism=2)
    assert len(packed) == 2 and sorted(p for part in packed for p in part) == sorted(p for p, _ in small)
    # A file larger than the limit is a partition of its own; none is split or dropped.
    big = [("big", 300 * mib), ("a", 10 * mib), ("b", 10 * mib)]
    assert plan_read_partitions(big, parallelism=1) == [["big"], ["a", "b"]]
    # More parallelism: more, smaller partitions.
    assert len(plan_read_partitions(small, parallelism=8)) == 8


def test_reader_options_carry_the_root_and_the_planned_files():
    options = run_io.reader_options("/b", [{"path": "r/_bucket=0/p.parquet", "bytes": 5, "sha256": "x"}], 2)
    assert options == {"root": "/b", "partitions": '[["r/_bucket=0/p.parquet"]]',
                       "sizes": '{"r/_bucket=0/p.parquet": 5}'}


def test_files_spark_wrote_are_read_in_the_run_schema(tmp_path):
    """A run Spark's writer wrote stores timestamps as INT96 and its columns in its own order:
    the reader yields the run schema's columns and types."""
    instant = datetime(2026, 11, 26, 1, 2, 3, 456789, tzinfo=timezone.utc)
    written = pa.table({"_ts": [1, 2], "at": [instant, None], "id": [7, 8]})
    path = tmp_path / "r" / "_bucket=0" / "part-0.parquet"
    path.parent.mkdir(parents=True)
    pq.write_table(written, str(path), use_deprecated_int96_timestamps=True)
    assert pq.ParquetFile(str(path)).schema.column(1).physical_type == "INT96"
    schema = pa.schema([("id", pa.int64()), ("at", pa.timestamp("us", tz="UTC")), ("_ts", pa.int64())])
    batches = list(run_io.read_files(str(tmp_path), ["r/_bucket=0/part-0.parquet"], schema))
    table = pa.Table.from_batches(batches)
    assert table.schema == schema
    assert table.to_pylist() == [{"id": 7, "at": instant, "_ts": 1}, {"id": 8, "at": None, "_ts": 2}]


def test_a_put_or_get_failing_beyond_the_bound_on_a_task_carries_blob_unavailable_to_the_driver(s3_faults):
    """pyarrow's OSError of a request the filesystem layer gave up on leaves the task as the
    engine's BlobUnavailable (retryable, exit 2), in the form that survives the trip through
    Spark to the driver, not as an unexplained worker exception."""
    from airflow_upsert_provider.engine.errors import BlobUnavailable
    from airflow_upsert_provider.engine.spark.executor_errors import ExecutorError, carried_error

    target = RunFileTarget(s3_faults.root, "s/runs/ts=000000000003/w-abc", COLUMNS)
    s3_faults.proxy.fail("PUT", r"/_bucket=2/", times=100, status=503)
    with pytest.raises(ExecutorError) as put:
        list(write_bucket_files(sorted_batches(), target, "t1"))
    error = carried_error(RuntimeError(f"Python worker failed: {put.value}"))
    assert isinstance(error, BlobUnavailable) and error.exit_code == 2 and error.retryable
    assert (error.details["operation"], error.details["bucket"]) == ("write", s3_faults.bucket)
    assert "/s/runs/ts=000000000003/w-abc/_bucket=2/part-t1-" in error.details["key"]

    s3_faults.proxy.clear()
    written = list(write_bucket_files(sorted_batches(), target, "t2"))
    s3_faults.proxy.fail("GET", r"/_bucket=5/", times=100, status=500)
    with pytest.raises(ExecutorError) as get:
        list(run_io.read_files(s3_faults.root, [w["path"] for w in written], SCHEMA.remove(4)))
    error = carried_error(get.value)
    assert isinstance(error, BlobUnavailable) and error.details["operation"] == "read"
    assert error.details["key"].endswith(next(w["path"] for w in written if "_bucket=5" in w["path"]))
