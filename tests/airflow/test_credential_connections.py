"""Secrets stay in connections, never in DAG code (issue 34 item 12): the schema upgrade as a
task through the `upsert` connection, and PublishIcebergOperator's catalog through an
`iceberg_catalog` connection whose extra holds PyIceberg's catalog properties. The operators
run in this process through Airflow's own connection lookup (AIRFLOW_CONN_*) and log
masking; the password is on the test PostgreSQL server (scram-sha-256), so a store that
opens proves it travelled, and it appears in no log line, result or error."""

from __future__ import annotations

import json
import logging
import threading

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_upsert_provider.engine.blob.files import open_blob
from airflow_upsert_provider.engine.maintenance import iceberg_catalog
from airflow_upsert_provider.engine.store.migrations import schema_status
from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.operators.db import UpgradeConsensusSchemaOperator
from airflow_upsert_provider.operators.maintenance import PublishIcebergOperator
from tests.arrow_runs import expected_table
from tests.maintenance.test_iceberg import TABLE, by_key, compacted_shard
from tests.store.test_migrations import create_legacy_store
from tests.test_cli_conn import PASSWORD, without_password


def use_connections(monkeypatch, consensus_url: str, blob_root: str, **connections: dict) -> None:
    """`upsert_default` on the store, its password in the password field; more connections by id."""
    monkeypatch.setenv("AIRFLOW_CONN_UPSERT_DEFAULT", json.dumps({
        "conn_type": "upsert", "password": PASSWORD,
        "extra": {"consensus_url": without_password(consensus_url), "blob_root": blob_root}}))
    for conn_id, connection in connections.items():
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(connection))


def logged(caplog, capfd) -> str:
    """What the task logged: the standard library's records and Airflow's structured log
    (written to the process's output)."""
    out, err = capfd.readouterr()
    return "\n".join(record.getMessage() for record in caplog.records) + out + err


def test_the_schema_upgrade_operator_upgrades_through_the_connection(pg_url, tmp_path, monkeypatch, caplog, capfd):
    create_legacy_store(pg_url)  # tables of ours, no revision: every other command refuses it
    use_connections(monkeypatch, pg_url, str(tmp_path / "blob"))
    assert UpgradeConsensusSchemaOperator.template_fields == ()
    with caplog.at_level(logging.INFO):
        result = UpgradeConsensusSchemaOperator(task_id="db_upgrade").execute({})
    assert (result["from_revision"], result["upgraded"]) == (None, True)
    consensus = open_consensus(pg_url, create=False)  # the check on open passes now
    try:
        status = schema_status(consensus)
    finally:
        consensus.dispose()
    assert (status["state"], status["store_revision"]) == ("current", result["to_revision"])
    again = UpgradeConsensusSchemaOperator(task_id="db_upgrade").execute({})
    assert again == {"from_revision": result["to_revision"], "to_revision": result["to_revision"], "upgraded": False}
    text = logged(caplog, capfd)
    assert f"schema revision none -> {result['to_revision']} (upgraded)" in text
    assert PASSWORD not in text + json.dumps(result)


def test_the_schema_upgrade_operator_fails_retryably_naming_the_store_without_its_password(
        tmp_path, monkeypatch, caplog, capfd):
    use_connections(monkeypatch, f"postgresql://upsert:{PASSWORD}@127.0.0.1:1/upsert", str(tmp_path / "blob"))
    with pytest.raises(AirflowException) as raised:
        UpgradeConsensusSchemaOperator(task_id="db_upgrade").execute({})
    assert not isinstance(raised.value, AirflowFailException)
    assert "127.0.0.1:1/upsert" in str(raised.value) and str(raised.value).endswith("(retryable)")
    assert PASSWORD not in str(raised.value) + logged(caplog, capfd)


def test_publish_through_an_iceberg_catalog_connection_with_its_password(pg_url, tmp_path, monkeypatch, caplog, capfd):
    """A SQL catalog in another PostgreSQL database, reached with the connection's password;
    its extra's `warehouse` puts the tables where the connection says."""
    blob = open_blob(str(tmp_path / "blob"))
    blob.ensure_root()
    consensus = open_consensus(pg_url)
    catalog_db = pg_url.rsplit("/", 1)[0] + "/postgres"
    warehouse = tmp_path / "warehouse"
    try:
        shard, history = compacted_shard(consensus, blob, tmp_path, seed=21, batches=3, since=2)
        use_connections(monkeypatch, pg_url, blob.root, lake={
            "conn_type": "iceberg_catalog", "password": PASSWORD,
            "extra": {"uri": without_password(catalog_db), "warehouse": f"file://{warehouse}"}})
        with caplog.at_level(logging.INFO):
            result = PublishIcebergOperator(task_id="publish", shard="orders", table=TABLE,
                                            iceberg_conn_id="lake").execute({})
        assert (result["outcome"], result["since"]) == ("published", 2)
        properties = iceberg_catalog.catalog_properties(pg_url, blob.root, catalog_db)
        catalog = iceberg_catalog.open_catalog({**properties, "warehouse": f"file://{warehouse}"})
        try:
            table = catalog.load_table(TABLE)
            assert table.location() == f"file://{warehouse}/analytics/orders"
            assert by_key(table.scan().to_arrow()) == expected_table(shard.config, history, 2)
        finally:
            iceberg_catalog.close_catalog(catalog)
        assert PASSWORD not in logged(caplog, capfd) + json.dumps(result)
        # Both ways of naming the catalog at once: refused, nothing published.
        with pytest.raises(AirflowFailException, match="iceberg_conn_id or catalog_uri, not both"):
            PublishIcebergOperator(task_id="publish", shard="orders", table=TABLE, iceberg_conn_id="lake",
                                   catalog_uri=without_password(catalog_db)).execute({})
    finally:
        consensus.dispose()


class RefusingCatalog:
    """A loopback HTTP server in the place of a REST catalog: it records each request's path
    and Authorization header, and answers 503 (a catalog that is down)."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        seen = self.seen = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the base class's name
                seen.append((self.path, self.headers.get("Authorization")))
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_POST = do_GET  # noqa: N815

            def log_message(self, format: str, *args) -> None:  # noqa: A002
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.uri = f"http://127.0.0.1:{self.server.server_address[1]}/api"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_rest_catalog_connection_sends_its_token_to_the_catalog_only(
        sqlite_url, tmp_path, monkeypatch, caplog, capfd):
    """The connection's password reaches the REST catalog as its bearer token; the catalog is
    down: retryable, the catalog named, the token in no error or log line."""
    token = "rest-token-Zq81"
    blob = open_blob(str(tmp_path / "blob"))
    blob.ensure_root()
    consensus = open_consensus(sqlite_url)
    catalog = RefusingCatalog()
    try:
        compacted_shard(consensus, blob, tmp_path, seed=22, batches=2, since=2)
        monkeypatch.setenv("AIRFLOW_CONN_UPSERT_DEFAULT", json.dumps(
            {"conn_type": "upsert", "extra": {"consensus_url": sqlite_url, "blob_root": blob.root}}))
        monkeypatch.setenv("AIRFLOW_CONN_REST_LAKE", json.dumps(
            {"conn_type": "iceberg_catalog", "password": token, "extra": {"uri": catalog.uri}}))
        with caplog.at_level(logging.INFO), pytest.raises(AirflowException) as raised:
            PublishIcebergOperator(task_id="publish", shard="orders", table=TABLE,
                                   iceberg_conn_id="rest_lake").execute({})
        assert f"REST catalog {catalog.uri} could not be used" in str(raised.value)
        assert str(raised.value).endswith("(retryable)")
        assert catalog.seen and catalog.seen[0] == ("/api/v1/config", f"Bearer {token}")
        assert token not in str(raised.value) + logged(caplog, capfd)
        monkeypatch.setenv("AIRFLOW_CONN_NOT_A_CATALOG", json.dumps({"conn_type": "upsert", "extra": {}}))
        with pytest.raises(AirflowFailException, match="'not_a_catalog' has type 'upsert'; expected 'iceberg_catalog'"):
            PublishIcebergOperator(task_id="publish", shard="orders", table=TABLE,
                                   iceberg_conn_id="not_a_catalog").execute({})
    finally:
        catalog.stop()
        consensus.dispose()


DISCOVERY = r"""
import json
from airflow.providers_manager import ProvidersManager

pm = ProvidersManager()
hook = pm.hooks["iceberg_catalog"]
print(json.dumps({"hook_class": hook.hook_class_name, "hook_name": hook.hook_name,
                  "connection_id_attr": hook.connection_id_attribute_name,
                  "behaviour": pm.field_behaviours.get("iceberg_catalog")}))
"""


def test_airflow_discovers_the_iceberg_catalog_connection_type(airflow_home):
    import sys

    from tests.airflow.conftest import failure_text

    proc = airflow_home.run([sys.executable, "-c", DISCOVERY], airflow_home.base_env)
    assert proc.returncode == 0, failure_text(proc)
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (found["hook_class"], found["hook_name"], found["connection_id_attr"]) == (
        "airflow_upsert_provider.hooks.iceberg.IcebergCatalogHook", "Iceberg catalog", "iceberg_conn_id")
    behaviour = found["behaviour"]
    assert set(behaviour["hidden_fields"]) == {"host", "port", "schema"}
    assert behaviour["relabeling"]["password"].startswith("Secret:")
