"""A blob root on S3 takes its credentials from the Amazon provider's `aws` connection named by
the upsert connection's ``aws_conn_id``: the hook turns it into plain values and gives them to
the blob's filesystem, and to the processes the task starts in their environment, never to
this process's environment. In process (the
connections come from AIRFLOW_CONN_* variables), against the loopback S3 server with its access
checks on: only the connection's key, secret and session token together open the bucket."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass

import pytest

from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.hooks.upsert import UpsertShardHook
from tests.pgserver import free_port


@pytest.fixture(autouse=True)
def environment_restored():
    """Whatever a test leaves in this process's environment, no other test sees."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def upsert_connection(monkeypatch, blob_root: str, **extra: str) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_UPSERT_DEFAULT", json.dumps({"conn_type": "upsert", "extra": {
        "consensus_url": "sqlite:////nonexistent/c.db", "blob_root": blob_root, **extra}}))


def aws_connection(monkeypatch, conn_id: str, key: str, secret: str, token: str | None = None,
                   **extra: str) -> None:
    if token:
        extra["aws_session_token"] = token
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(
        {"conn_type": "aws", "login": key, "password": secret, "extra": extra}))


@dataclass
class Identities:
    machine: tuple[str, str]  # this process's own chain: refused by the server
    role: tuple[str, str, str]  # an assumed role's key, secret and token: allowed
    denied: tuple[str, str]  # another identity the server refuses


@pytest.fixture
def identities(s3_server, s3_root, monkeypatch):
    """Access checks on for the test, and this process's own chain holding credentials the
    server refuses: whatever reaches the bucket came from the aws connection."""
    found = Identities(s3_server.denied_credentials(), s3_server.role_credentials(), s3_server.denied_credentials())
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", found.machine[0])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", found.machine[1])
    # The machine's endpoint is a loopback port where nothing listens: the server is reached
    # only through the connection's endpoint, and nothing ever leaves this machine.
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "2")
    s3_server.checking_access(True)
    yield found
    s3_server.checking_access(False)


def test_the_aws_connection_resolves_to_plain_values(s3_root, monkeypatch):
    upsert_connection(monkeypatch, s3_root, aws_conn_id="aws_lake")
    aws_connection(monkeypatch, "aws_lake", "AKIALAKE", "lake-secret-Tq3", "lake-token-Vb8",
                   region_name="eu-central-1", endpoint_url="http://127.0.0.1:9000")
    credentials = UpsertShardHook().get_s3_credentials()
    assert (credentials.access_key_id, credentials.secret_access_key, credentials.session_token) == (
        "AKIALAKE", "lake-secret-Tq3", "lake-token-Vb8")
    assert (credentials.region, credentials.endpoint_url) == ("eu-central-1", "http://127.0.0.1:9000")
    assert "lake-secret-Tq3" not in repr(credentials) and "lake-token-Vb8" not in repr(credentials)


def test_a_blob_root_on_s3_is_reached_with_the_connection_credentials_never_put_into_this_process(
        s3_server, s3_root, identities, monkeypatch):
    key, secret, token = identities.role
    upsert_connection(monkeypatch, s3_root, aws_conn_id="aws_lake")
    aws_connection(monkeypatch, "aws_lake", key, secret, token, endpoint_url=s3_server.endpoint,
                   region_name="us-east-1")
    before = dict(os.environ)
    hook = UpsertShardHook()
    blob = hook.get_blob(create=True)  # HEAD, LIST, a probe PUT, GET and DELETE, signed with the connection's
    blob.write_file(blob.path("written-by-the-task"), b"x", sync=True)
    bucket = s3_root.split("/")[2]
    s3_server.checking_access(False)  # the test's own listing signs with the dummy credentials
    assert "shards/written-by-the-task" in s3_server.keys(bucket, "shards/")
    # Given to the filesystem, not to this process: the processes the task starts (a local
    # Spark JVM, spark-submit) get them in their own environment.
    assert dict(os.environ) == before
    child = hook.child_environment()
    assert (child["AWS_ACCESS_KEY_ID"], child["AWS_SESSION_TOKEN"]) == (key, token)
    assert child["AWS_ENDPOINT_URL_S3"] == s3_server.endpoint
    hook.close()
    assert dict(os.environ) == before


def test_without_aws_conn_id_the_machine_chain_is_used_and_refused_without_a_secret(
        s3_server, s3_root, identities, monkeypatch):
    upsert_connection(monkeypatch, s3_root)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)
    with pytest.raises(ConfigurationError) as caught:
        UpsertShardHook().get_blob()
    assert "access denied" in caught.value.message
    assert identities.machine[1] not in json.dumps(caught.value.to_dict())


def test_a_denied_connection_and_a_wrong_endpoint_are_errors_without_the_secret(
        s3_server, s3_root, identities, monkeypatch):
    key, secret = identities.denied
    upsert_connection(monkeypatch, s3_root, aws_conn_id="aws_lake")
    aws_connection(monkeypatch, "aws_lake", key, secret, None, endpoint_url=s3_server.endpoint)
    with pytest.raises(ConfigurationError) as denied:
        UpsertShardHook().get_blob()
    assert "access denied" in denied.value.message and s3_server.endpoint in denied.value.message
    assert secret not in json.dumps(denied.value.to_dict())

    nowhere = f"http://127.0.0.1:{free_port()}"
    key, secret, token = identities.role
    aws_connection(monkeypatch, "aws_lake", key, secret, token, endpoint_url=nowhere)
    with pytest.raises(ConfigurationError) as unreachable:
        UpsertShardHook().get_blob()
    assert "nothing answered at the endpoint" in unreachable.value.message and nowhere in unreachable.value.message
    text = json.dumps(unreachable.value.to_dict())
    assert secret not in text and token not in text


def test_a_local_root_ignores_aws_conn_id(tmp_path, monkeypatch):
    upsert_connection(monkeypatch, str(tmp_path / "blob"), aws_conn_id="aws_undefined")
    hook = UpsertShardHook()
    assert hook.get_s3_credentials() is None
    hook.get_blob(create=True)
    assert "AWS_ENDPOINT_URL_S3" not in os.environ


@pytest.mark.parametrize("problem", ["undefined", "wrong type", "no provider"])
def test_an_unusable_aws_conn_id_is_a_configuration_error_naming_it(problem, s3_root, monkeypatch):
    upsert_connection(monkeypatch, s3_root, aws_conn_id="aws_lake")
    if problem == "wrong type":
        monkeypatch.setenv("AIRFLOW_CONN_AWS_LAKE", json.dumps({"conn_type": "http", "password": "p-Kd2"}))
    elif problem == "no provider":
        aws_connection(monkeypatch, "aws_lake", "AKIALAKE", "lake-secret-Tq3")
        # What an installation without the [s3] extra sees: the Amazon provider cannot be imported.
        monkeypatch.setitem(sys.modules, "airflow.providers.amazon.aws.hooks.base_aws", None)
    with pytest.raises(ConfigurationError) as caught:
        UpsertShardHook().get_blob()
    error = caught.value
    assert error.details["field"] == "aws_conn_id" and error.exit_code == 2
    assert "'aws_lake'" in error.message
    expected = {"undefined": "is not defined", "wrong type": "has type 'http'",
                "no provider": "pip install 'airflow-upsert-provider[s3]'"}[problem]
    assert expected in error.message
    assert "lake-secret-Tq3" not in error.message and "p-Kd2" not in error.message


def test_submit_mode_hands_the_credentials_to_spark_submit_through_its_environment_never_argv(
        s3_server, s3_root, identities, tmp_path, monkeypatch):
    """On a YARN master the Spark provider turns ``env_vars`` into ``--conf`` arguments: the
    credentials are in the environment spark-submit is started with (not the task's own), and
    in neither. A recording spark-submit keeps the argv and environment it was started with."""
    from airflow.sdk.exceptions import AirflowException

    from airflow_upsert_provider.operators.upsert import MicroBatchUpsertOperator, _RunPlan
    from tests.airflow.test_submit_secrets import install_recorder

    record_file = install_recorder(tmp_path, monkeypatch)
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(
        {"conn_type": "spark", "host": "yarn", "extra": {"queue": "etl"}}))
    key, secret, token = identities.role
    upsert_connection(monkeypatch, s3_root, aws_conn_id="aws_lake")
    aws_connection(monkeypatch, "aws_lake", key, secret, token, endpoint_url=s3_server.endpoint)

    operator = MicroBatchUpsertOperator(task_id="upsert", shard="orders", spark_mode="submit")
    hook = UpsertShardHook()
    plan = _RunPlan("writer", 1, False, None, "fail")
    with pytest.raises(AirflowException, match="the Spark job ended without a result"):
        operator._run_submit(hook, plan)
    record = json.loads(record_file.read_text())
    argv = " ".join(record["argv"])
    assert "spark.yarn.appMasterEnv.PYSPARK_PYTHON=" in argv  # env_vars did become arguments
    assert secret not in argv and token not in argv
    env = record["env"]
    assert (env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"], env["AWS_SESSION_TOKEN"]) == (key, secret, token)
    assert env["AWS_ENDPOINT_URL_S3"] == s3_server.endpoint
    assert os.environ.get("AWS_ACCESS_KEY_ID") != key and "AWS_ENDPOINT_URL_S3" not in os.environ
    hook.close()


def test_a_connection_that_yields_no_credentials_is_named(s3_root, monkeypatch, tmp_path):
    upsert_connection(monkeypatch, s3_root, aws_conn_id="aws_empty")
    monkeypatch.setenv("AIRFLOW_CONN_AWS_EMPTY", json.dumps({"conn_type": "aws", "extra": {}}))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigurationError) as caught:
        UpsertShardHook().get_s3_credentials()
    assert "the aws connection 'aws_empty' gives no credentials (none found)" in caught.value.message
    assert caught.value.details["field"] == "aws_conn_id"
