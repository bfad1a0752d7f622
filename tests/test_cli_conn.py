"""`upsertctl --conn-id CONN`: the consensus URL (its password from the connection's password
field) and the blob root come from an Airflow `upsert` connection, here defined through
AIRFLOW_CONN_*, so the password is on no command line and in no output."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from sqlalchemy.engine import make_url

from tests.conftest import REPO_ROOT, cli_env

PASSWORD = "s3cret-pw"  # the test PostgreSQL server's (tests/pgserver.py): scram-sha-256


def without_password(url: str) -> str:
    stripped = url.replace(f":{PASSWORD}@", "@")
    assert make_url(stripped).password is None and make_url(stripped).username == "upsert"
    return stripped


def upsertctl(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "airflow_upsert_provider.cli", *argv], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def conn_env(tmp_path, consensus_url: str, blob_root: str, **connection) -> dict[str, str]:
    """A process environment that knows the store only through the connection `shard_store`."""
    env = cli_env(consensus_url, blob_root, AIRFLOW_HOME=str(tmp_path / "airflow"))
    for name in ("UPSERT_CONSENSUS_URL", "UPSERT_BLOB_ROOT"):
        env.pop(name)
    env["AIRFLOW_CONN_SHARD_STORE"] = json.dumps(
        {"conn_type": "upsert", "extra": {"consensus_url": consensus_url, "blob_root": blob_root}, **connection})
    return env


def test_conn_id_reads_the_store_and_its_password_from_the_connection(pg_url, tmp_path):
    url = without_password(pg_url)
    blob_root = str(tmp_path / "blob")
    env = conn_env(tmp_path, url, blob_root, password=PASSWORD)
    upgraded = upsertctl(env, "db", "upgrade", "--conn-id", "shard_store", "--json")
    assert upgraded.returncode == 0, upgraded.stderr
    assert json.loads(upgraded.stdout)["to_revision"]
    landing = tmp_path / "landing"
    (landing / "p0").mkdir(parents=True)
    created = upsertctl(env, "init", "orders", "--source", f"dir:{landing}", "--key", "id",
                        "--schema", "id BIGINT, name STRING", "--conn-id", "shard_store")
    assert created.returncode == 0, created.stderr
    assert os.path.isdir(blob_root)  # created where the connection says
    status = upsertctl(env, "--conn-id", "shard_store", "status", "orders", "--no-rows", "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["upper"] == 0
    for done in (upgraded, created, status):
        assert PASSWORD not in done.stdout + done.stderr
    # The password in the connection is the one used: without it the store refuses the login.
    refused = upsertctl(conn_env(tmp_path, url, blob_root), "db", "status", "--conn-id", "shard_store")
    assert refused.returncode == 2 and "no password supplied" in refused.stderr, refused.stderr


def test_conn_id_errors_name_the_option(sqlite_url, tmp_path):
    env = conn_env(tmp_path, sqlite_url, str(tmp_path / "blob"), password=PASSWORD)
    missing = upsertctl(env, "db", "status", "--conn-id", "other_store")
    assert missing.returncode == 2
    assert missing.stderr == ("upsertctl: Airflow connection 'other_store' is not defined (AIRFLOW_CONN_OTHER_STORE, "
                              "a secrets backend or Airflow's metadata database; conn type 'upsert')\n")
    both = upsertctl(env, "db", "status", "--conn-id", "shard_store", "--consensus", sqlite_url, "--json")
    assert both.returncode == 2 and json.loads(both.stdout)["field"] == "conn_id"
    assert "--conn-id gives the consensus store and the blob root: --consensus cannot be given beside it" in both.stderr
    env["AIRFLOW_CONN_KAFKA_ONE"] = json.dumps({"conn_type": "kafka", "extra": {}})
    wrong = upsertctl(env, "db", "status", "--conn-id", "kafka_one")
    assert wrong.returncode == 2 and "has type 'kafka'; expected 'upsert'" in wrong.stderr, wrong.stderr
