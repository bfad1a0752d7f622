"""`UpsertShardHook.test_connection`: what the connection list's Test Connection button, `airflow
connections test` and the REST API show (in process, no Spark)."""

from __future__ import annotations

import json
import os

import pytest

from airflow_upsert_provider.engine.blob.files import open_blob
from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.hooks.upsert import UpsertShardHook

PASSWORD = "conn-test-secret-5d2"


def _connection(monkeypatch, consensus_url: str, blob_root: str, password: str | None = None) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_UPSERT_DEFAULT", json.dumps({
        "conn_type": "upsert", **({"password": password} if password else {}),
        "extra": {"consensus_url": consensus_url, "blob_root": blob_root}}))


@pytest.fixture
def store(tmp_path) -> dict:
    url = f"sqlite:///{tmp_path / 'consensus.db'}"
    consensus = open_consensus(url)
    for shard_id in ("orders", "customers"):
        consensus.create_shard(shard_id, "{}")
    consensus.dispose()
    blob_root = tmp_path / "blob"
    open_blob(str(blob_root)).ensure_root()
    return {"url": url, "blob": str(blob_root)}


def test_a_working_connection_counts_its_shards_and_leaves_no_file(store, monkeypatch):
    _connection(monkeypatch, store["url"], store["blob"])
    assert UpsertShardHook().test_connection() == (
        True, f"2 shards found in {store['url']}; blob root {store['blob']} is writable")
    assert os.listdir(store["blob"]) == []


def test_the_test_button_path_reaches_the_hook(store):
    """What Airflow's connection test endpoint calls: Connection.test_connection, through the
    provider's hook class for the `upsert` type."""
    from airflow.models.connection import Connection

    conn = Connection(conn_id="upsert_default", conn_type="upsert",
                      extra=json.dumps({"consensus_url": store["url"], "blob_root": store["blob"]}))
    os.environ["AIRFLOW_CONN_UPSERT_DEFAULT"] = conn.get_uri()
    try:
        status, message = conn.test_connection()
    finally:
        del os.environ["AIRFLOW_CONN_UPSERT_DEFAULT"]
    assert status is True and message.startswith("2 shards found"), message


@pytest.mark.parametrize("url, reason", [
    ("mysql://x", "mysql"),
    ("not a url", "consensus"),
])
def test_an_unusable_consensus_url_is_refused_with_the_reason(store, monkeypatch, url, reason):
    _connection(monkeypatch, url, store["blob"])
    ok, message = UpsertShardHook().test_connection()
    assert ok is False and reason in message, message


def test_a_missing_store_is_reported_not_created(tmp_path, store, monkeypatch):
    missing = tmp_path / "nowhere" / "consensus.db"
    _connection(monkeypatch, f"sqlite:///{missing}", store["blob"])
    ok, message = UpsertShardHook().test_connection()
    assert ok is False and str(missing) in message and "does not exist" in message
    assert not missing.exists() and not missing.parent.exists()


def test_a_missing_blob_root_is_reported(tmp_path, store, monkeypatch):
    _connection(monkeypatch, store["url"], str(tmp_path / "no-blob"))
    ok, message = UpsertShardHook().test_connection()
    assert ok is False and "no-blob" in message and "does not exist" in message
    assert not (tmp_path / "no-blob").exists()


def test_no_secret_in_the_answer(store, monkeypatch):
    """An unreachable PostgreSQL store with a password: the answer says why, never the password."""
    _connection(monkeypatch, "postgresql://upsert@127.0.0.1:1/upsert?connect_timeout=2", store["blob"],
                password=PASSWORD)
    ok, message = UpsertShardHook().test_connection()
    assert ok is False and "cannot reach consensus store" in message and PASSWORD not in message, message


# The connection form's numbers: Airflow's form clamps a number into a schema's minimum
# silently, so the form declares none and the hook refuses a bad value where it is used.
@pytest.mark.parametrize("field, value, expected", [
    ("default_buckets", -3, "connection field 'default_buckets' must be at least 1, got -3"),
    ("default_buckets", 0, "connection field 'default_buckets' must be at least 1, got 0"),
    ("default_max_files_per_batch", 0, "connection field 'default_max_files_per_batch' must be at least 1, got 0"),
    ("default_max_files_per_batch", "-1", "connection field 'default_max_files_per_batch' must be at least 1, got '-1'"),
    ("default_buckets", 2.5, "connection field 'default_buckets' must be an integer, got 2.5"),
    ("default_buckets", True, "connection field 'default_buckets' must be an integer, got True"),
    ("default_buckets", "eight", "connection field 'default_buckets' must be an integer, got 'eight'"),
])
def test_an_out_of_range_number_is_refused_naming_the_field(store, monkeypatch, field, value, expected):
    from airflow_upsert_provider.engine.errors import ConfigurationError

    monkeypatch.setenv("AIRFLOW_CONN_UPSERT_DEFAULT", json.dumps({
        "conn_type": "upsert", "extra": {"consensus_url": store["url"], "blob_root": store["blob"], field: value}}))
    with pytest.raises(ConfigurationError) as refused:
        UpsertShardHook().settings
    assert str(refused.value) == expected
    assert UpsertShardHook().test_connection() == (False, expected)


@pytest.mark.parametrize("field, value, expected", [
    ("default_buckets", 1, 1), ("default_buckets", "16", 16), ("default_buckets", 8.0, 8), ("default_buckets", None, None),
    ("default_buckets", "", None), ("default_max_files_per_batch", 1, 1), ("default_max_files_per_batch", 500, 500),
])
def test_a_valid_number_or_a_blank_is_taken_as_it_is(store, monkeypatch, field, value, expected):
    monkeypatch.setenv("AIRFLOW_CONN_UPSERT_DEFAULT", json.dumps({
        "conn_type": "upsert", "extra": {"consensus_url": store["url"], "blob_root": store["blob"], field: value}}))
    assert getattr(UpsertShardHook().settings, field) == expected


def test_the_form_declares_no_bound_it_would_clamp_to():
    from airflow_upsert_provider import get_provider_info

    fields = next(c for c in get_provider_info()["connection-types"] if c["connection-type"] == "upsert")["conn-fields"]
    for name in ("default_buckets", "default_max_files_per_batch"):
        assert "minimum" not in fields[name]["schema"] and "maximum" not in fields[name]["schema"], name
