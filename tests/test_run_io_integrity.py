"""Run files that must never be read as data (engine/table/run_io.py), without Spark: what a
writing task that failed mid-file leaves on the S3 server (behind the fault proxy) is never a
readable Parquet file holding part of the rows, and a bit flipped in a run file's page that
still decodes is caught by the page's checksum."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_upsert_provider.engine.table import run_io
from airflow_upsert_provider.engine.table.run_io import RunFileTarget, write_bucket_files
from tests.test_run_io import COLUMNS, SCHEMA, rows


def fail_mid_file(s3_faults) -> tuple[dict, list[str], str]:
    """A task on the S3 root that completes its bucket-0 file, then fails while writing
    bucket 1: (the file it reported, the object keys left under the runs, their prefix)."""

    def failing():
        yield rows([(0, 1), (1, 2)])
        yield rows([(1, 3)])
        raise RuntimeError("executor lost its input")

    target = RunFileTarget(s3_faults.root, "s/runs/ts=000000000003/w-abc", COLUMNS)
    written = write_bucket_files(failing(), target, "t3")
    first = next(written)
    with pytest.raises(RuntimeError, match="executor lost its input"):
        next(written)
    prefix = s3_faults.root.split("/", 3)[3] + "/s/runs/"
    return first, sorted(k for k in s3_faults.server.keys(s3_faults.bucket, prefix) if not k.endswith("/")), prefix


def test_a_failed_task_whose_delete_fails_leaves_no_readable_partial_file(s3_faults, monkeypatch):
    monkeypatch.setattr(run_io, "ROW_GROUP_BYTES", 1)  # every piece reaches the stream at once
    # As a file past pyarrow's part size: its stream is open, and closing it completes the upload.
    monkeypatch.setattr(run_io, "OBJECT_HOLD_BYTES", 0)
    # The cleanup's DELETE of the abandoned bucket-1 file fails on every attempt.
    s3_faults.proxy.fail("DELETE", r"/_bucket=1/", times=100, status=503)
    first, left, _prefix = fail_mid_file(s3_faults)
    assert left[0].endswith(first["path"]) and len(left) == 2 and "/_bucket=1/part-t3-" in left[1]
    body = s3_faults.server.client().get_object(Bucket=s3_faults.bucket, Key=left[1])["Body"].read()
    assert body[:4] == b"PAR1"  # the rows the task wrote did reach the store
    with pytest.raises(pa.ArrowInvalid):
        pq.ParquetFile(io.BytesIO(body))  # but no footer: no reader takes it for data


def test_a_failed_tasks_file_below_the_part_size_never_reaches_the_store(s3_faults, monkeypatch):
    """A task that fails mid-file sends no request for that file: no object, completed or
    partial, and no multipart upload in progress, even with every DELETE failing; the file
    it completed before is uploaded whole."""
    monkeypatch.setattr(run_io, "ROW_GROUP_BYTES", 1)  # every piece reaches the sink at once
    s3_faults.proxy.fail("DELETE", "", times=100, status=503)
    first, left, prefix = fail_mid_file(s3_faults)
    assert len(left) == 1 and left[0].endswith(first["path"])
    body = s3_faults.server.client().get_object(Bucket=s3_faults.bucket, Key=left[0])["Body"].read()
    assert pq.read_table(io.BytesIO(body)).num_rows == 1 and len(body) == first["bytes"]
    uploads = s3_faults.server.client().list_multipart_uploads(Bucket=s3_faults.bucket, Prefix=prefix)
    assert uploads.get("Uploads", []) == []
    # Not one request named the abandoned bucket-1 file: nothing to complete, abort or delete.
    assert [(r.method, r.key) for r in s3_faults.proxy.requests() if "/_bucket=1/" in r.key] == []


def test_a_bit_flipped_in_a_page_that_still_decodes_fails_the_read(tmp_path):
    root = tmp_path / "root"
    (root / "s" / "runs" / "ts=000000000001" / "w-abc").mkdir(parents=True)
    target = RunFileTarget(str(root), "s/runs/ts=000000000001/w-abc", COLUMNS)
    batch = pa.RecordBatch.from_pylist(
        [{"id": i, "v": v, "_deleted": False, "_ts": 1, "_bucket": 0}
         for i, v in enumerate(["aaa", "mmm-unique", "zzz"])], schema=SCHEMA)
    [written] = list(write_bucket_files([batch], target, "t1"))
    path = root / written["path"]
    data = bytearray(path.read_bytes())
    assert data.count(b"mmm-unique") == 1
    data[data.find(b"mmm-unique") + 4] ^= 1  # "mmm-tnique": same length, still valid UTF-8
    path.write_bytes(bytes(data))

    with pytest.raises(OSError, match="CRC checksum verification failed"):
        list(run_io.read_files(str(root), [written["path"]], SCHEMA.remove(4)))
