"""A blob root on object storage that cannot be used is a configuration error naming the
bucket, the prefix and the endpoint, never a secret: a missing bucket, denied access, an
endpoint where nothing listens. In process and through `upsertctl` (exit 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from airflow_upsert_provider.engine.blob.files import open_blob
from airflow_upsert_provider.engine.errors import ConfigurationError
from tests.conftest import REPO_ROOT, cli_env
from tests.pgserver import free_port
from tests.s3server import SECRET_ACCESS_KEY

SESSION_TOKEN = "upsert-test-session-token-9f3"


def refused(root: str, **check) -> ConfigurationError:
    with pytest.raises(ConfigurationError) as caught:
        open_blob(root).check_root(**check)
    error = caught.value
    assert error.details["field"] == "blob_root"
    assert error.exit_code == 2
    return error


def test_a_missing_bucket_is_named_with_prefix_and_endpoint(s3_server, s3_root, monkeypatch):
    monkeypatch.setenv("AWS_SESSION_TOKEN", SESSION_TOKEN)  # moto ignores it: it must not show either
    root = "s3://no-such-bucket-upsert/shards/prod"
    for check in ({"writable": True}, {"writable": False}):
        error = refused(root, **check)
        assert "bucket 'no-such-bucket-upsert' does not exist" in error.message
        assert "prefix 'shards/prod'" in error.message
        assert s3_server.endpoint in error.message
        assert SECRET_ACCESS_KEY not in json.dumps(error.to_dict())
        assert SESSION_TOKEN not in json.dumps(error.to_dict())
    with pytest.raises(ConfigurationError, match="no-such-bucket-upsert"):
        open_blob(root).ensure_root()


def test_denied_access_is_named_without_the_secret(s3_server, s3_root, monkeypatch):
    key_id, secret = s3_server.denied_credentials()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key_id)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    bucket = s3_root.split("/")[2]
    s3_server.checking_access(True)
    try:
        error = refused(s3_root)
    finally:
        s3_server.checking_access(False)
    assert "access denied" in error.message
    assert f"bucket {bucket!r}, prefix 'shards', endpoint {s3_server.endpoint}" in error.message
    assert secret not in json.dumps(error.to_dict())


def test_an_endpoint_where_nothing_listens_is_named(s3_root, monkeypatch):
    endpoint = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")  # the bound of retries; the default waits ~10 s
    bucket = s3_root.split("/")[2]
    error = refused(s3_root)
    assert "nothing answered at the endpoint" in error.message
    assert f"bucket {bucket!r}, prefix 'shards', endpoint {endpoint}" in error.message
    assert SECRET_ACCESS_KEY not in error.message


def test_a_prefix_that_is_an_object_is_refused(s3_root):
    blob = open_blob(s3_root)
    blob.write_file(blob.path("file"), b"x", sync=True)
    error = refused(blob.path("file"))
    assert "is an object, not a prefix" in error.message


def upsertctl(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "airflow_upsert_provider.cli", *args], env=env,
                          capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)


def test_upsertctl_reports_a_missing_bucket_with_exit_2_and_no_secret(s3_server, s3_root, tmp_path):
    env = cli_env(f"sqlite:///{tmp_path / 'consensus.db'}", "s3://no-such-bucket-upsert/shards")
    result = upsertctl("status", "orders", "--json", env=env)
    assert result.returncode == 2, result.stderr
    assert "bucket 'no-such-bucket-upsert' does not exist" in result.stderr
    assert s3_server.endpoint in result.stderr
    payload = json.loads(result.stdout)
    assert payload["error"] == "ConfigurationError" and payload["field"] == "blob_root"
    assert SECRET_ACCESS_KEY not in result.stdout + result.stderr


@pytest.mark.parametrize("how", ["option", "environment"])
def test_upsertctl_refuses_an_unknown_scheme_naming_the_value(how, tmp_path):
    env = cli_env(f"sqlite:///{tmp_path / 'consensus.db'}", "ftp://files.example/blob")
    args = ["--blob-root", "ftp://files.example/blob"] if how == "option" else []
    result = upsertctl(*args, "status", "orders", env=env)
    assert result.returncode == 2, result.stderr
    assert "'ftp://files.example/blob'" in result.stderr and "unsupported scheme 'ftp'" in result.stderr
    assert not os.path.exists(tmp_path / "consensus.db")  # refused before the store was opened


def test_upsertctl_refuses_credentials_in_the_uri_without_repeating_them(tmp_path):
    env = cli_env(f"sqlite:///{tmp_path / 'consensus.db'}", str(tmp_path / "blob"))
    result = upsertctl("--blob-root", "s3://AKIAX:s3cr3t-in-uri@bucket/p", "status", "orders", env=env)
    assert result.returncode == 2, result.stderr
    assert "carries credentials" in result.stderr
    assert "s3cr3t-in-uri" not in result.stdout + result.stderr


def test_store_failures_give_the_code_and_never_a_secret_of_the_environment(monkeypatch):
    from airflow_upsert_provider.engine.blob.objects import store_failure

    monkeypatch.setenv("AWS_SESSION_TOKEN", SESSION_TOKEN)
    assert store_failure(OSError("When getting information for bucket 'b': AWS Error UNKNOWN (HTTP status 403) "
                                 "during HeadBucket operation: No response body.")) == (
        "ACCESS_DENIED", "ACCESS_DENIED (HTTP 403) during HeadBucket")
    assert store_failure(OSError("AWS Error NETWORK_CONNECTION during HeadObject operation: curlCode: 7")) == (
        "NETWORK_CONNECTION", "NETWORK_CONNECTION during HeadObject")
    code, reason = store_failure(OSError(f"request signed with x-amz-security-token:{SESSION_TOKEN} refused"))
    assert code == "" and SESSION_TOKEN not in reason and "***" in reason
