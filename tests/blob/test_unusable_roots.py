"""Every blob root that cannot be used is refused by ``upsertctl`` with exit 2, a
``ConfigurationError`` on ``blob_root`` naming the root (credentials cut out) and the reason:
credentials written into the URI (also with ``/`` in the secret, or pyarrow's query syntax), a
query string, an endpoint that is no URL, an HDFS port that is no number, HDFS without a JVM,
GCS with unusable credentials, and Azure without credentials (whose SDK would abort the process).
Each runs ``upsertctl`` as a subprocess: a crash shows as its exit status."""

from __future__ import annotations

import json
import os

import pytest

from tests.blob.test_object_root import upsertctl
from tests.conftest import cli_env

SECRET = "wJalrX/K7MDENG/bPxRfiCYEXAMPLEKEY"
SECRET_PARTS = ("wJalrX", "K7MDENG", "bPxRfiCYEXAMPLEKEY")


def refused(tmp_path, root: str, **environment: str) -> tuple[str, dict]:
    """Run ``stream status`` on ``root``: it must exit 2 with the root's configuration error,
    before any consensus store was touched. Returns (stderr, the --json error)."""
    env = cli_env(f"sqlite:///{tmp_path / 'consensus.db'}", str(tmp_path / "blob"), **environment)
    result = upsertctl("--blob-root", root, "stream", "status", "s", "--json", env=env)
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    payload = json.loads(result.stdout)
    assert payload["error"] == "ConfigurationError" and payload["field"] == "blob_root", payload
    assert not os.path.exists(tmp_path / "consensus.db")
    return result.stderr, payload


@pytest.mark.parametrize("root", [
    f"s3://AKIAXX:{SECRET}@lake/x",
    f"s3://AKIAXX:{SECRET}@lake",
    f"gs://AKIAXX:{SECRET}@lake/x",
    f"hdfs://AKIAXX:{SECRET}@nn:8020/x",
    f"s3://lake/x?access_key=AKIAXX&secret_key={SECRET}",
    f"s3://lake/x?endpoint_override=h&secret_key={SECRET}",
    f"s3://lake/x?session_token={SECRET}",
])
def test_credentials_in_a_root_are_refused_by_shape_naming_neither_key_nor_secret(tmp_path, root):
    stderr, payload = refused(tmp_path, root)
    assert "carries credentials in the URI" in stderr
    for secret in ("AKIAXX", *SECRET_PARTS):
        assert secret not in stderr and secret not in json.dumps(payload), secret


def test_a_query_string_on_a_root_is_refused_not_made_part_of_object_keys(tmp_path):
    stderr, _ = refused(tmp_path, "s3://lake/x?versionId=3")
    assert "'s3://lake/x?***' has a query string, which would become part of every object key" in stderr


def test_a_malformed_endpoint_is_a_configuration_error_naming_the_root(tmp_path):
    stderr, _ = refused(tmp_path, "s3://lake/y", AWS_ENDPOINT_URL="http://[::1", AWS_ENDPOINT_URL_S3="")
    assert ("blob root s3://lake/y cannot be used: its s3:// filesystem cannot be set up: "
            "AWS_ENDPOINT_URL 'http://[::1' is not a URL") in stderr


def test_an_hdfs_port_that_is_no_number_is_refused(tmp_path):
    stderr, _ = refused(tmp_path, "hdfs://nn:abc/x")
    assert "blob root 'hdfs://nn:abc/x': the namenode's port 'abc' is not a number" in stderr


def test_hdfs_without_a_jvm_is_a_configuration_error(tmp_path):
    stderr, _ = refused(tmp_path, "hdfs://127.0.0.1:1/x", JAVA_HOME=str(tmp_path / "no-jvm"))
    assert "blob root hdfs://127.0.0.1:1/x cannot be used: its hdfs:// filesystem cannot be set up: " in stderr
    assert "libjvm" in stderr


def test_gcs_with_credentials_it_cannot_use_is_a_configuration_error(tmp_path):
    stderr, _ = refused(tmp_path, "gs://bkt/x", GOOGLE_APPLICATION_CREDENTIALS=str(tmp_path / "none.json"))
    assert "blob root gs://bkt/x cannot be used: reading failed: " in stderr
    assert "OAuth2 access token" in stderr


def test_azure_without_credentials_is_a_configuration_error_not_an_abort(tmp_path):
    root = "abfss://cont@acct.dfs.core.windows.net/x"
    stderr, _ = refused(tmp_path, root, AZURE_CLIENT_ID="", AZURE_TENANT_ID="", AZURE_CLIENT_SECRET="")
    assert (f"blob root {root} cannot be used: Azure's credential chain (DefaultAzureCredential) found no "
            "credentials and aborted a probe process (SIGABRT") in stderr
    assert "AZURE_CLIENT_SECRET" in stderr  # says what to configure
