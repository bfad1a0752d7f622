"""Two `upsert` connections naming different `aws` connections, used in threads of one process
as a triggerer runs deferrable sensors (and an api-server tests connections): each hook reaches
its own bucket with its own connection's credentials and no other, and this process's
environment is never changed. Against the loopback S3 server with its access checks on, each
connection an assumed role allowed on its own bucket only; this process's own chain is refused."""

from __future__ import annotations

import json
import os
import threading

import pytest

from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.hooks.upsert import UpsertShardHook
from tests.airflow.test_aws_connection import aws_connection, identities, upsert_connection  # noqa: F401

# A step of one thread may wait this long for the other's: a hang fails, it never passes.
STEP_SECONDS = 120


@pytest.fixture
def two_connections(s3_server, s3_root, identities, monkeypatch):  # noqa: F811
    """Connections ``lake_a`` and ``lake_b``, each with the blob root ``s3://<its bucket>/shards``
    and an aws connection allowed on that bucket only. Returns {conn_id: (bucket, key, secret, token)}."""
    found = {}
    s3_server.checking_access(False)
    buckets = {"lake_a": s3_root.split("/")[2], "lake_b": s3_server.create_bucket()}
    for conn_id, bucket in buckets.items():
        key, secret, token = s3_server.role_credentials(bucket)
        found[conn_id] = (bucket, key, secret, token)
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "upsert", "extra": {
            "consensus_url": "sqlite:////nonexistent/c.db", "blob_root": f"s3://{bucket}/shards",
            "aws_conn_id": f"aws_{conn_id}"}}))
        aws_connection(monkeypatch, f"aws_{conn_id}", key, secret, token, endpoint_url=s3_server.endpoint,
                       region_name="us-east-1")
    s3_server.checking_access(True)
    return found


def test_two_connections_in_threads_each_reach_only_their_own_bucket_and_leave_the_environment(
        s3_server, two_connections):
    before = dict(os.environ)
    opened = {name: threading.Event() for name in two_connections}
    written = {name: threading.Event() for name in two_connections}
    seen: dict[str, dict] = {}
    failures: list[BaseException] = []

    def sensor(conn_id: str, other: str) -> None:
        try:
            hook = UpsertShardHook(upsert_conn_id=conn_id)
            # The two hooks open their roots one after the other, then both use them: what one
            # hook set up must not change what the other's requests are signed with.
            if conn_id == "lake_b":
                assert opened["lake_a"].wait(STEP_SECONDS)
            blob = hook.get_blob(create=True)
            opened[conn_id].set()
            assert opened[other].wait(STEP_SECONDS)
            environment_while_open = dict(os.environ)
            blob.write_file(blob.path(f"by-{conn_id}"), conn_id.encode(), sync=True)
            read_back = blob.read_bytes(blob.path(f"by-{conn_id}"))
            written[conn_id].set()
            assert written[other].wait(STEP_SECONDS)
            # The other connection's root, with this connection's credentials: refused.
            from airflow_upsert_provider.engine.blob.files import open_blob

            other_root = f"s3://{two_connections[other][0]}/shards"
            try:
                open_blob(other_root, s3_credentials=hook.connection_s3_credentials()).check_root()
                other_reached = True
            except ConfigurationError as exc:
                other_reached = exc.message
            hook.close()
            seen[conn_id] = {"read_back": read_back, "environment": environment_while_open,
                             "other": other_reached}
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread below
            failures.append(exc)
            for event in (*opened.values(), *written.values()):
                event.set()

    threads = [threading.Thread(target=sensor, args=("lake_a", "lake_b")),
               threading.Thread(target=sensor, args=("lake_b", "lake_a"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(STEP_SECONDS * 3)
    assert not failures, failures
    s3_server.checking_access(False)  # the test's own listing signs with the dummy credentials
    for conn_id, (bucket, key, secret, token) in two_connections.items():
        assert seen[conn_id]["read_back"] == conn_id.encode()
        assert s3_server.keys(bucket, "shards/by-") == [f"shards/by-{conn_id}"]
        assert "access denied" in seen[conn_id]["other"]
        assert secret not in seen[conn_id]["other"] and token not in seen[conn_id]["other"]
        # Nothing of either connection ever entered this process's environment.
        assert seen[conn_id]["environment"] == before
    assert dict(os.environ) == before


def test_the_credentials_go_to_child_processes_only(s3_server, two_connections):
    bucket, key, secret, token = two_connections["lake_a"]
    before = dict(os.environ)
    hook = UpsertShardHook(upsert_conn_id="lake_a")
    hook.get_blob()
    child = hook.child_environment({"PYSPARK_PYTHON": "/usr/bin/python3"})
    assert (child["AWS_ACCESS_KEY_ID"], child["AWS_SECRET_ACCESS_KEY"], child["AWS_SESSION_TOKEN"]) == (
        key, secret, token)
    assert (child["AWS_ENDPOINT_URL_S3"], child["AWS_REGION"]) == (s3_server.endpoint, "us-east-1")
    assert child["PYSPARK_PYTHON"] == "/usr/bin/python3"
    assert dict(os.environ) == before
    hook.close()
    assert dict(os.environ) == before
