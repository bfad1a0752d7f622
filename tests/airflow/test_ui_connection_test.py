"""The connection list's Test button for an upsert connection (apache/airflow#73298: the list
posts ``port: 0`` for a connection without a port, and Airflow 3.3.2 answers 400).

The rule (which request bodies change, how) is tested over a grid of bodies; the button itself in
a real api-server and a real (headless) Chromium, as on-call clicks it.
"""

from __future__ import annotations

import itertools
import json

import pytest

from airflow_upsert_provider.engine.blob.files import open_blob
from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.plugins.connection_test import corrected_test_body, is_connection_test
from tests.airflow.test_ui import _api, running_api_server, signed_in_page

PORTS = [0, None, 1, 5432, -1, 0.0, "0", "", True, False, "absent"]
CONN_TYPES = ["upsert", "spark", "postgres", "", None, "absent", "UPSERT"]


def _body(conn_type, port) -> dict:
    body = {"connection_id": "c", "host": "", "login": "", "password": "***", "schema": "", "extra": "{}"}
    if conn_type != "absent":
        body["conn_type"] = conn_type
    if port != "absent":
        body["port"] = port
    return body


def test_only_an_upsert_test_request_with_port_0_loses_its_port_and_nothing_else_changes():
    for conn_type, port in itertools.product(CONN_TYPES, PORTS):
        body = _body(conn_type, port)
        corrected = corrected_test_body(json.dumps(body).encode())
        if conn_type == "upsert" and type(port) is int and port == 0:
            assert corrected is not None, (conn_type, port)
            assert json.loads(corrected) == {k: v for k, v in body.items() if k != "port"}, (conn_type, port)
        else:
            assert corrected is None, (conn_type, port)


@pytest.mark.parametrize("body", [b"", b"not json", b"[1, 2]", b'"upsert"', b"\xff\xfe", b"null"])
def test_a_body_that_is_not_a_json_object_passes_unchanged(body):
    assert corrected_test_body(body) is None


def test_only_posts_to_the_test_route_are_looked_at():
    for method, path, expected in [
        ("POST", "/api/v2/connections/test", True), ("POST", "/sub/path/api/v2/connections/test/", True),
        ("GET", "/api/v2/connections/test", False), ("POST", "/api/v2/connections", False),
        ("POST", "/api/v2/connections/test2", False), ("PATCH", "/api/v2/connections/test", False),
    ]:
        assert is_connection_test({"type": "http", "method": method, "path": path}) is expected, (method, path)
    assert is_connection_test({"type": "websocket", "path": "/api/v2/connections/test"}) is False


@pytest.fixture(scope="module")
def test_store(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("conn-test-store")
    url = f"sqlite:///{root / 'consensus.db'}"
    consensus = open_consensus(url)
    for shard_id in ("orders", "customers", "events"):
        consensus.create_shard(shard_id, "{}")
    consensus.dispose()
    open_blob(str(root / "blob")).ensure_root()
    return {"url": url, "blob": str(root / "blob")}


@pytest.fixture(scope="module")
def server(airflow_home, tmp_path_factory):
    # The Test button is off unless an administrator enables it.
    with running_api_server(airflow_home, tmp_path_factory, {}, AIRFLOW__CORE__TEST_CONNECTION="Enabled") as running:
        yield running


def test_the_connection_lists_test_button_tests_an_upsert_connection_saved_without_a_port(server, test_store):
    base = server["base"]
    with signed_in_page(base, 1400, 900) as page:
        # Saved as the Add form saves it: no port.
        created = _api(page, "/api/v2/connections", "POST", {
            "connection_id": "upsert_listed", "conn_type": "upsert",
            "extra": json.dumps({"consensus_url": test_store["url"], "blob_root": test_store["blob"]})})
        assert created["status"] == 201, created
        assert json.loads(created["body"])["port"] is None
        page.goto(f"{base}/connections")
        row = page.get_by_role("row").filter(has_text="upsert_listed")
        row.wait_for(timeout=60000)
        with page.expect_request("**/api/v2/connections/test") as sent, \
                page.expect_response("**/api/v2/connections/test") as answered:
            row.get_by_role("button", name="Test Connection").click()
        # What the list posts (the upstream bug's port 0), and what the server made of it.
        assert json.loads(sent.value.post_data)["port"] == 0
        response = answered.value
        assert response.status == 200, response.text()
        expected = f"3 shards found in {test_store['url']}; blob root {test_store['blob']} is writable"
        assert response.json() == {"status": True, "message": expected}
        toast = page.get_by_text("Test Connection Successful")
        toast.wait_for(timeout=30000)
        assert page.get_by_text(expected).count() >= 1
