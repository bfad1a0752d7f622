"""`upsertctl` takes its S3 credentials from the standard variables (AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_ENDPOINT_URL, AWS_REGION): with the S3 server's
access checks on, only an assumed role's key, secret and session token together open the
bucket, and a command that fails prints none of them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from airflow_upsert_provider.engine.blob.files import open_blob
from airflow_upsert_provider.engine.store.registry import open_consensus
from tests.conftest import REPO_ROOT, cli_env
from tests.helpers import make_shard
from tests.pgserver import free_port


def upsertctl(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "airflow_upsert_provider.cli", *args], env=env,
                          capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)


@pytest.fixture
def shard_on_s3(s3_server, s3_root, tmp_path):
    """A shard whose root is on the S3 server, then the server's access checks on: the dummy
    credentials of the tests open nothing any more."""
    url = f"sqlite:///{tmp_path / 'consensus.db'}"
    consensus = open_consensus(url)
    make_shard(consensus, open_blob(s3_root), tmp_path)
    consensus.dispose()
    role = s3_server.role_credentials()
    denied = s3_server.denied_credentials()
    s3_server.checking_access(True)
    yield url, role, denied
    s3_server.checking_access(False)


def credentials(key: str, secret: str, token: str | None = None) -> dict[str, str]:
    variables = {"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret}
    if token:
        variables["AWS_SESSION_TOKEN"] = token
    return variables


def test_the_standard_variables_reach_s3(s3_server, s3_root, shard_on_s3):
    url, (key, secret, token), _ = shard_on_s3
    env = cli_env(url, s3_root, **credentials(key, secret, token), AWS_REGION="us-east-1")
    listed = upsertctl("checkpoint", "list", "orders", env=env)
    assert listed.returncode == 0, listed.stderr
    assert "0 checkpoint(s)" in listed.stdout
    # The session token is part of the identity: without it the same key and secret are refused.
    env.pop("AWS_SESSION_TOKEN")
    refused = upsertctl("checkpoint", "list", "orders", env=env)
    assert refused.returncode == 2 and "cannot be used" in refused.stderr, refused.stderr
    assert secret not in refused.stdout + refused.stderr


def test_a_failing_command_prints_no_secret_given_through_the_variables(s3_server, s3_root, shard_on_s3):
    url, (key, secret, token), (denied_key, denied_secret) = shard_on_s3
    denied_token = "cli-denied-token-Rf6"
    failures = {
        "denied": cli_env(url, s3_root, **credentials(denied_key, denied_secret, denied_token)),
        "wrong endpoint": cli_env(url, s3_root, **credentials(key, secret, token),
                                  AWS_ENDPOINT_URL=f"http://127.0.0.1:{free_port()}", AWS_MAX_ATTEMPTS="2"),
    }
    for what, env in failures.items():
        for args in (["checkpoint", "list", "orders"], ["status", "orders", "--json"], ["gc", "orders"]):
            result = upsertctl(*args, env=env)
            assert result.returncode == 2, (what, args, result.stderr)
            output = result.stdout + result.stderr
            assert "blob root" in output and "bucket" in output, (what, output)
            for value in (secret, token, denied_secret, denied_token):
                assert value not in output, (what, args)
            if "--json" in args:
                assert json.loads(result.stdout)["field"] == "blob_root"
