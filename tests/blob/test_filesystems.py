"""``filesystem_for``: which pyarrow filesystem holds a blob location, and the path inside it.
Pure: building an S3 filesystem with an endpoint in the environment sends no request."""

from __future__ import annotations

import os

import pyarrow.fs as pafs
import pytest

from airflow_upsert_provider.engine.blob import filesystems
from airflow_upsert_provider.engine.blob.filesystems import filesystem_for, split_uri
from airflow_upsert_provider.engine.errors import ConfigurationError


@pytest.fixture
def s3_env(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)


def test_local_paths_and_file_uris_give_the_local_filesystem(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for given, expected in [
        (str(tmp_path / "blob"), str(tmp_path / "blob")),
        ("blob/x", str(tmp_path / "blob" / "x")),
        (f"file://{tmp_path}/blob", str(tmp_path / "blob")),
        (f"file://localhost{tmp_path}/blob", str(tmp_path / "blob")),
    ]:
        filesystem, path = filesystem_for(given)
        assert isinstance(filesystem, pafs.LocalFileSystem), given
        assert path == expected, given


def test_s3_uri_gives_the_s3_filesystem_and_bucket_key(s3_env):
    filesystem, path = filesystem_for("s3://bucket-a/prefix/runs/1/")
    assert isinstance(filesystem, pafs.S3FileSystem)
    assert path == "bucket-a/prefix/runs/1"
    assert filesystem_for("s3://bucket-a")[1] == "bucket-a"
    assert filesystem.region == "us-east-1"


def test_filesystems_are_cached_per_scheme_and_authority(s3_env):
    first = filesystem_for("s3://bucket-a/x")[0]
    assert filesystem_for("s3://bucket-a/y/z")[0] is first
    assert filesystem_for("s3://bucket-b/x")[0] is not first


def test_another_endpoint_gets_another_filesystem(s3_env, monkeypatch):
    first = filesystem_for("s3://bucket-a/x")[0]
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:10")
    assert filesystem_for("s3://bucket-a/x")[0] is not first


def test_other_credentials_get_another_filesystem_and_the_key_holds_none_of_them(s3_env, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAFIRST")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "first-secret-Hq7")
    first = filesystem_for("s3://bucket-a/x")[0]
    assert filesystem_for("s3://bucket-a/x")[0] is first
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "second-secret-Jm2")
    second = filesystem_for("s3://bucket-a/x")[0]
    assert second is not first
    monkeypatch.setenv("AWS_SESSION_TOKEN", "a-token-Pz4")
    assert filesystem_for("s3://bucket-a/x")[0] is not second
    assert not any(secret in repr(list(filesystems._cache))
                   for secret in ("first-secret-Hq7", "second-secret-Jm2", "a-token-Pz4"))


def test_given_credentials_sign_a_filesystem_of_their_own_and_reach_children_not_this_process(s3_env, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAMACHINE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "machine-secret")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "machine-token")
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    before = dict(os.environ)
    credentials = filesystems.S3Credentials("AKIACONN", "conn-secret-Wd9", endpoint_url="http://127.0.0.1:11")
    other = filesystems.S3Credentials("AKIAOTHER", "other-secret-Qx1", region="us-west-2")
    assert "conn-secret-Wd9" not in repr(credentials)
    machine = filesystem_for("s3://bucket-a/x")[0]
    given = filesystem_for("s3://bucket-a/x", credentials)[0]
    assert given is not machine and filesystem_for("s3://bucket-a/y", credentials)[0] is given
    assert filesystem_for("s3://bucket-a/x", other)[0] not in (machine, given)
    # The connection's endpoint; the region left open: the machine's, as the AWS SDKs do.
    assert (filesystems.s3_endpoint(credentials), filesystems.s3_region(credentials)) == (
        "http://127.0.0.1:11", "eu-west-1")
    assert filesystem_for("s3://bucket-a/x", other)[0].region == "us-west-2"
    assert dict(os.environ) == before
    assert not any(secret in repr(list(filesystems._cache)) for secret in ("conn-secret-Wd9", "other-secret-Qx1"))
    child = filesystems.child_environment(credentials)
    assert (child["AWS_ACCESS_KEY_ID"], child["AWS_SECRET_ACCESS_KEY"]) == ("AKIACONN", "conn-secret-Wd9")
    # The machine's token belongs to other credentials: not sent with these.
    assert "AWS_SESSION_TOKEN" not in child and child["AWS_REGION"] == "eu-west-1"
    assert child["AWS_ENDPOINT_URL_S3"] == "http://127.0.0.1:11"
    assert filesystems.child_environment(None, {"A": "1"}) == {"A": "1"}


def test_a_forked_process_builds_its_own_filesystems(s3_env, monkeypatch):
    first = filesystem_for("s3://bucket-a/x")[0]
    monkeypatch.setattr(filesystems, "_cache_pid", os.getpid() + 1)
    assert filesystem_for("s3://bucket-a/x")[0] is not first
    assert filesystem_for("s3://bucket-a/x")[0] is filesystem_for("s3://bucket-a/x")[0]


@pytest.mark.parametrize("uri", ["ftp://host/x", "s3a://bucket/x", "mem://x"])
def test_an_unknown_scheme_is_refused_naming_the_value(uri):
    with pytest.raises(ConfigurationError) as caught:
        filesystem_for(uri)
    assert caught.value.details["field"] == "blob_root"
    assert repr(uri) in caught.value.message
    assert "s3://" in caught.value.message  # says what is accepted


def test_a_uri_without_a_bucket_is_refused():
    with pytest.raises(ConfigurationError, match="names no bucket"):
        split_uri("s3:///prefix")


@pytest.mark.parametrize("uri", ["s3://AKIAEXAMPLE:s3cr3t-value@bucket/p", "gs://user:s3cr3t-value@bucket/p",
                                 "abfss://container:s3cr3t-value@account.dfs.core.windows.net/p"])
def test_credentials_in_a_uri_are_refused_without_repeating_them(uri):
    with pytest.raises(ConfigurationError) as caught:
        filesystem_for(uri)
    assert "s3cr3t-value" not in caught.value.message
    assert "credentials" in caught.value.message


def test_abfs_container_and_account_are_read_from_the_authority():
    assert split_uri("abfss://data@acct.dfs.core.windows.net/shards/a") == (
        "abfss", "data@acct.dfs.core.windows.net", "shards/a")


def test_aws_max_attempts_bounds_the_retries_and_a_bad_value_is_refused(s3_env, monkeypatch):
    default = filesystem_for("s3://bucket-a/x")[0]
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    assert filesystem_for("s3://bucket-a/x")[0] is not default
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "many")
    with pytest.raises(ConfigurationError, match="AWS_MAX_ATTEMPTS takes an integer from 1 to 100, not 'many'"):
        filesystem_for("s3://bucket-a/x")


@pytest.mark.parametrize("uri,shown", [
    ("s3://AKIAXX:wJalrX/K7MDENG/bPxRfiCYEXAMPLEKEY@lake/x", "s3://***@lake/x"),
    ("s3://AKIAXX@lake/x", "s3://***@lake/x"),
    ("s3://AKIAXX:wJalrXK7MDENG/x", "s3://***"),
    ("hdfs://user:pa/ss@nn:8020/x", "hdfs://***@nn:8020/x"),
    ("abfss://data:key/part@acct.dfs.core.windows.net/p", "abfss://***@acct.dfs.core.windows.net/p"),
    ("s3://lake/x?access_key=AKIAXX&secret_key=wJalrX", "s3://lake/x?***"),
])
def test_a_credential_of_any_shape_is_refused_and_cut_from_the_uri_shown(uri, shown):
    assert filesystems.display_uri(uri) == shown
    with pytest.raises(ConfigurationError) as caught:
        split_uri(uri)
    assert caught.value.message.startswith(f"blob root {shown!r} carries credentials in the URI")
    assert caught.value.details["field"] == "blob_root"


@pytest.mark.parametrize("uri,expected", [
    ("s3://lake/a:b@c/d", ("s3", "lake", "a:b@c/d")),  # ':' and '@' in a key are no credentials
    ("hdfs://nn:8020/x", ("hdfs", "nn:8020", "x")),
    ("abfss://data@acct.dfs.core.windows.net/p", ("abfss", "data@acct.dfs.core.windows.net", "p")),
])
def test_keys_ports_and_abfs_containers_are_not_taken_for_credentials(uri, expected):
    assert split_uri(uri) == expected
    assert filesystems.display_uri(uri) == uri


def test_a_query_string_is_refused_without_being_repeated():
    with pytest.raises(ConfigurationError, match=r"'s3://lake/x\?\*\*\*' has a query string") as caught:
        split_uri("s3://lake/x?versionId=opaque-value")
    assert "opaque-value" not in caught.value.message
