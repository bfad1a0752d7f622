"""The Parquet footer check of a committed file (``file_problem``: checkpoint create and verify,
restore, the explanation of a failed read) reads through the blob's own filesystem: on an S3
root whose prefix holds a space, a non-ASCII character or ``%xx`` a good file is good; a store
that keeps failing the footer's read is ``BlobUnavailable`` (retryable), never a bad file; only
bytes that are no Parquet are. And a store that answers every attempt with an internal error
is reported as possibly the store's bug, not only as a passing failure."""

from __future__ import annotations

import hashlib
import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_upsert_provider.engine.blob.files import open_blob
from airflow_upsert_provider.engine.errors import BlobUnavailable
from airflow_upsert_provider.engine.table.runs import file_problem

PREFIXES = ["sp ace", "ünï/cødé 空", "pct%41", "a+b=c"]
RUN_FILE = "s/runs/ts=000000000000/w-1/_bucket=0/part-t1-0.parquet"


def parquet_bytes() -> bytes:
    out = io.BytesIO()
    pq.write_table(pa.table({"id": [1, 2, 3], "v": ["a", "b", "c"]}), out)
    return out.getvalue()


def put(blob, data: bytes) -> dict:
    blob.make_dirs(blob.parent(blob.path(RUN_FILE)))
    blob.write_file(blob.path(RUN_FILE), data, sync=True)
    return {"path": RUN_FILE, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


@pytest.mark.parametrize("prefix", PREFIXES)
def test_a_good_run_file_under_an_unusual_prefix_on_s3_passes_and_a_damaged_one_does_not(s3_root, prefix):
    blob = open_blob(f"{s3_root}/{prefix}")
    data = parquet_bytes()
    listed = put(blob, data)
    assert file_problem(blob, listed, "the shard's state") == (listed["sha256"], None)
    # Bytes that are no Parquet, of the recorded size and checksum: the footer check says so.
    damaged = put(blob, data[:-8] + b"XXXXXXXX")
    digest, reason = file_problem(blob, damaged, "the shard's state")
    assert digest is None and reason.startswith("not a readable Parquet file: ")


@pytest.mark.parametrize("prefix", PREFIXES)
def test_a_good_run_file_under_an_unusual_local_path_passes(tmp_path, prefix):
    blob = open_blob(str(tmp_path / prefix))
    blob.ensure_root()
    listed = put(blob, parquet_bytes())
    assert file_problem(blob, listed, "the shard's state") == (listed["sha256"], None)


def test_a_store_that_keeps_failing_the_footer_read_is_unavailable_not_a_bad_file(s3_faults):
    blob = open_blob(s3_faults.root)
    listed = put(blob, parquet_bytes())
    key = f"shards/{RUN_FILE}"
    # The checksum's (ranged) GET goes through; every GET after it (the footer's) answers 503.
    s3_faults.proxy.fail("GET", key, times=1000, status=503, skip=1)
    with pytest.raises(BlobUnavailable) as caught:
        file_problem(blob, listed, "the shard's state")
    error = caught.value
    assert error.retryable and error.details["operation"] == "read" and error.details["key"] == key
    assert [r.status for r in s3_faults.proxy.requests() if r.method == "GET" and r.key == key] == [
        206, *[503] * s3_faults.attempts]


def test_a_listing_answered_500_on_every_attempt_may_be_the_stores_bug(s3_faults):
    blob = open_blob(s3_faults.root)
    blob.write_file(blob.path("a/b"), b"x", sync=True)
    s3_faults.proxy.fail("GET", query="list-type=2", times=1000, status=500)
    with pytest.raises(BlobUnavailable) as caught:
        blob.listdir(blob.path("a"))
    message = caught.value.message
    assert caught.value.retryable
    assert "it may be the store's bug with this request (a listing that fails only when it is truncated" in message


def test_the_advice_after_the_retry_bound_names_a_possible_store_bug_only_for_internal_errors():
    from airflow_upsert_provider.engine.blob.objects import unavailable_advice

    operations = ["write", "read", "stat", "list", "delete", "check"]
    answers = {
        ("INTERNAL_FAILURE", "INTERNAL_FAILURE during ListObjectsV2"): True,
        ("UNKNOWN", "UNKNOWN (HTTP 500) during HeadObject"): True,
        ("UNKNOWN", "UNKNOWN (HTTP 501) during GetObject"): True,
        ("UNKNOWN", "UNKNOWN (HTTP 502) during PutObject"): True,
        ("SERVICE_UNAVAILABLE", "SERVICE_UNAVAILABLE during PutObject"): False,
        ("UNKNOWN", "UNKNOWN (HTTP 503) during HeadObject"): False,
        ("SLOW_DOWN", "SLOW_DOWN during PutObject"): False,
        ("UNKNOWN", "UNKNOWN (HTTP 429) during HeadObject"): False,
        ("NETWORK_CONNECTION", "NETWORK_CONNECTION during GetObject"): False,
    }
    for (code, reason), internal in answers.items():
        for operation in operations:
            advice = unavailable_advice(code, reason, operation)
            assert advice.startswith("a transient failure of the store: run the step again when it answers")
            assert ("may be the store's bug" in advice) is internal, (code, reason, operation)
            assert ("truncated" in advice) is (internal and operation == "list"), (code, reason, operation)
