"""Faults of an object store between the blob and the S3 server (a fault-injecting proxy on
loopback, :mod:`tests.s3proxy`): a request that fails transiently (500, 503, throttling, a
connection cut) is retried by the filesystem layer within its bound (``AWS_MAX_ATTEMPTS``);
beyond it the blob raises :class:`BlobUnavailable` (retryable, exit 2) naming the operation,
bucket, key and endpoint, never a secret, and leaves nothing partial; a retry converges. Denied
access or a missing bucket met midway is the root's :class:`ConfigurationError`."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from airflow_upsert_provider.engine.blob.files import open_blob
from airflow_upsert_provider.engine.errors import BlobUnavailable, ConfigurationError
from tests.conftest import REPO_ROOT, cli_env
from tests.s3server import SECRET_ACCESS_KEY

# One transient fault of each kind a store or the network deals, as the proxy injects it.
FAULTS = {
    "500": lambda proxy, method, key, times: proxy.fail(method, key, times=times, status=500),
    "503": lambda proxy, method, key, times: proxy.fail(method, key, times=times, status=503),
    "throttled": lambda proxy, method, key, times: proxy.throttle(method, key, times=times),
    "cut": lambda proxy, method, key, times: proxy.cut_request(method, key, times=times),
}
# The reason each one leaves in the error (pyarrow's name of the AWS error).
REASONS = {"500": "INTERNAL_FAILURE", "503": "SERVICE_UNAVAILABLE", "throttled": "SLOW_DOWN",
           "cut": "NETWORK_CONNECTION"}

DATA = bytes(range(256)) * 4096  # 1 MiB


def statuses(proxy, method: str, key: str) -> list:
    return [r.status for r in proxy.requests() if r.method == method and r.key == key]


def stored(faults, key: str) -> bytes | None:
    """The object as the server holds it (asked directly, not through the proxy)."""
    client = faults.server.client()
    try:
        return client.get_object(Bucket=faults.bucket, Key=key)["Body"].read()
    except client.exceptions.NoSuchKey:
        return None


def assert_names_the_request(error: BlobUnavailable, faults, operation: str, key: str) -> None:
    assert error.retryable and error.exit_code == 2
    assert error.details == {"operation": operation, "bucket": faults.bucket, "key": key,
                             "endpoint": faults.proxy.endpoint, "reason": error.details["reason"]}
    assert f"s3://{faults.bucket}/{key}" in error.message
    assert f"bucket {faults.bucket!r}, prefix 'shards', endpoint {faults.proxy.endpoint}" in error.message
    assert f"retried up to {faults.attempts} attempts (AWS_MAX_ATTEMPTS)" in error.message
    assert SECRET_ACCESS_KEY not in json.dumps(error.to_dict())


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_put_failing_twice_is_retried_by_the_filesystem_layer_and_the_object_is_whole(s3_faults, fault):
    """Guards item 5: the filesystem layer retries a failed PUT within its bound."""
    blob = open_blob(s3_faults.root)
    FAULTS[fault](s3_faults.proxy, "PUT", "shards/runs/part-0$", 2)

    blob.write_file(blob.path("runs", "part-0"), DATA, sync=True)

    failed = "cut" if fault == "cut" else (500 if fault == "500" else 503)
    assert statuses(s3_faults.proxy, "PUT", "shards/runs/part-0") == [failed, failed, 200]
    assert hashlib.sha256(stored(s3_faults, "shards/runs/part-0")).digest() == hashlib.sha256(DATA).digest()


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_put_failing_beyond_the_bound_is_retryable_leaves_nothing_and_a_retry_converges(s3_faults, fault):
    blob = open_blob(s3_faults.root)
    path = blob.path("runs", "part-0")
    FAULTS[fault](s3_faults.proxy, "PUT", "shards/runs/part-0$", s3_faults.attempts)

    with pytest.raises(BlobUnavailable) as caught:
        blob.write_atomic(path, DATA)

    error = caught.value
    assert_names_the_request(error, s3_faults, "write", "shards/runs/part-0")
    assert f"{REASONS[fault]} during PutObject" in error.message
    assert error.message.startswith(f"writing {path} failed")
    assert len(statuses(s3_faults.proxy, "PUT", "shards/runs/part-0")) == s3_faults.attempts
    assert stored(s3_faults, "shards/runs/part-0") is None
    blob.write_atomic(path, DATA)
    assert stored(s3_faults, "shards/runs/part-0") == DATA


def test_the_bound_is_aws_max_attempts(s3_faults, monkeypatch):
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    blob = open_blob(s3_faults.root)
    s3_faults.proxy.fail("PUT", "part-0$", times=2)
    with pytest.raises(BlobUnavailable, match=r"retried up to 2 attempts \(AWS_MAX_ATTEMPTS\)"):
        blob.write_file(blob.path("part-0"), b"x", sync=True)
    assert statuses(s3_faults.proxy, "PUT", "shards/part-0") == [503, 503]


def test_a_get_cut_mid_body_is_retried_or_fails_retryably_never_short(s3_faults):
    blob = open_blob(s3_faults.root)
    path = blob.path("runs", "part-0")
    blob.write_file(path, DATA, sync=True)
    digest = hashlib.sha256(DATA).hexdigest()

    # Cut once: the filesystem layer reads the rest again; the bytes are whole.
    s3_faults.proxy.cut_response("GET", "shards/runs/part-0$", times=1)
    assert hashlib.sha256(blob.read_bytes(path)).hexdigest() == digest
    s3_faults.proxy.cut_response("GET", "shards/runs/part-0$", times=1)
    assert blob.checksum(path) == digest
    assert statuses(s3_faults.proxy, "GET", "shards/runs/part-0").count("cut") == 2

    # Cut on every attempt: an error, never fewer bytes.
    for read in (blob.read_bytes, blob.checksum):
        s3_faults.proxy.cut_response("GET", "shards/runs/part-0$", times=s3_faults.attempts)
        with pytest.raises(BlobUnavailable) as caught:
            read(path)
        assert_names_the_request(caught.value, s3_faults, "read", "shards/runs/part-0")
        assert "NETWORK_CONNECTION during GetObject" in caught.value.message
    assert blob.checksum(path) == digest


def test_a_listing_page_that_fails_is_retried_or_fails_the_walk_retryably(s3_faults):
    blob = open_blob(s3_faults.root)
    level = blob.path("runs", "ts=1", "w")
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda i: blob.write_file(blob.join(level, f"part-{i:05d}"), b"", sync=True), range(1001)))

    # The second page of the level fails twice: the walk follows it and misses nothing.
    s3_faults.proxy.fail("GET", query="continuation-token=", times=2)
    assert len(list(blob.walk_files(blob.path("runs")))) == 1001
    pages = [r.status for r in s3_faults.proxy.requests() if "continuation-token=" in r.query]
    assert pages == [503, 503, 200]

    # It fails on every attempt: the walk raises, and yields nothing of a level it could not
    # list whole (pyarrow follows a level's pages before the walk goes on).
    s3_faults.proxy.fail("GET", query="continuation-token=", times=s3_faults.attempts)
    seen = []
    with pytest.raises(BlobUnavailable) as caught:
        for entry in blob.walk_files(blob.path("runs")):
            seen.append(entry)
    assert seen == []
    assert_names_the_request(caught.value, s3_faults, "list", "shards/runs")
    assert "SERVICE_UNAVAILABLE during ListObjectsV2" in caught.value.message
    s3_faults.proxy.throttle("GET", query="list-type=2", times=s3_faults.attempts)
    with pytest.raises(BlobUnavailable, match="SLOW_DOWN during ListObjectsV2"):
        blob.listdir(level)


def test_stat_and_delete_failing_beyond_the_bound_are_retryable(s3_faults):
    blob = open_blob(s3_faults.root)
    path = blob.path("runs", "part-0")
    blob.write_file(path, b"x", sync=True)
    for call, operation in ((blob.exists, "stat"), (blob.size, "stat"), (blob.mtime, "stat")):
        s3_faults.proxy.fail("HEAD", "shards/runs/part-0$", times=s3_faults.attempts)
        with pytest.raises(BlobUnavailable) as caught:
            call(path)
        assert_names_the_request(caught.value, s3_faults, operation, "shards/runs/part-0")
    s3_faults.proxy.fail("POST", query="delete", times=s3_faults.attempts)
    with pytest.raises(BlobUnavailable) as caught:
        blob.delete_tree(blob.path("runs"))
    assert_names_the_request(caught.value, s3_faults, "delete", "shards/runs")
    assert blob.read_bytes(path) == b"x"
    blob.delete_tree(blob.path("runs"))
    assert not blob.exists(path)


@pytest.mark.parametrize("status, code, says", [(403, "AccessDenied", "access denied (ACCESS_DENIED)"),
                                                (404, "NoSuchBucket", "the bucket does not exist")])
def test_denied_access_or_a_missing_bucket_midway_is_the_configuration_error_of_the_root(s3_faults, status, code,
                                                                                       says):
    blob = open_blob(s3_faults.root)
    s3_faults.proxy.fail("PUT", "shards/part-0$", status=status, code=code)
    with pytest.raises(ConfigurationError) as caught:
        blob.write_file(blob.path("part-0"), b"x", sync=True)
    error = caught.value
    assert not error.retryable and error.details["field"] == "blob_root"
    assert says in error.message
    assert f"bucket {s3_faults.bucket!r}, prefix 'shards', endpoint {s3_faults.proxy.endpoint}" in error.message
    # Not retried: the store's answer will not change.
    assert [r.status for r in s3_faults.proxy.requests()] == [status]


def test_a_root_check_the_store_keeps_answering_503_is_retryable_not_a_configuration_error(s3_faults):
    s3_faults.proxy.fail(None, times=1000)
    with pytest.raises(BlobUnavailable) as caught:
        open_blob(s3_faults.root).check_root()
    assert_names_the_request(caught.value, s3_faults, "check", "shards")
    assert "UNKNOWN (HTTP 503) during HeadBucket" in caught.value.message


def test_upsertctl_on_a_root_whose_endpoint_keeps_answering_503_exits_2_retryable_naming_it(s3_faults, tmp_path):
    s3_faults.proxy.fail(None, times=1000)
    env = cli_env(f"sqlite:///{tmp_path / 'consensus.db'}", s3_faults.root)
    result = subprocess.run([sys.executable, "-m", "airflow_upsert_provider.cli", "status", "orders", "--json"],
                            env=env, capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert result.returncode == 2, result.stderr
    payload = json.loads(result.stdout)
    assert (payload["error"], payload["retryable"]) == ("BlobUnavailable", True)
    assert (payload["bucket"], payload["endpoint"]) == (s3_faults.bucket, s3_faults.proxy.endpoint)
    line = result.stderr.strip()
    assert line.startswith("upsertctl: checking the blob root at") and "\n" not in line
    assert f"bucket {s3_faults.bucket!r}, prefix 'shards', endpoint {s3_faults.proxy.endpoint}" in line
    assert SECRET_ACCESS_KEY not in result.stdout + result.stderr


@pytest.mark.parametrize("message, kind", [
    ("AWS Error SERVICE_UNAVAILABLE during PutObject operation: x", "transient"),
    ("AWS Error SLOW_DOWN during PutObject operation: x", "transient"),
    ("AWS Error INTERNAL_FAILURE during GetObject operation: x", "transient"),
    ("AWS Error UNKNOWN (HTTP status 503) during HeadObject operation: No response body.", "transient"),
    ("AWS Error UNKNOWN (HTTP status 429) during HeadObject operation: No response body.", "transient"),
    ("AWS Error NETWORK_CONNECTION during GetObject operation: curlCode: 18, Transferred a partial file", "transient"),
    ("AWS Error NETWORK_CONNECTION during GetObject operation: curlCode: 28, Timeout was reached", "transient"),
    ("AWS Error NETWORK_CONNECTION during HeadBucket operation: curlCode: 7, Couldn't connect to server",
     "unreachable"),
    ("AWS Error ACCESS_DENIED during PutObject operation: x", "denied"),
    ("AWS Error UNKNOWN (HTTP status 403) during HeadBucket operation: No response body.", "denied"),
    ("AWS Error NO_SUCH_BUCKET during ListObjectsV2 operation: x", "no_bucket"),
    ("AWS Error INVALID_PARAMETER_VALUE during PutObject operation: x", ""),
    ("Path does not exist 'bucket/key'", ""),
])
def test_failure_kinds(message, kind):
    from airflow_upsert_provider.engine.blob.objects import failure_kind

    assert failure_kind(OSError(message)) == kind
