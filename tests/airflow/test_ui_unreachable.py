"""A consensus store that never answers holds neither the shard list nor the other stores:
each connection's store is listed in its own thread with a time limit, and one that does not
answer within it is marked unreachable."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

import airflow_upsert_provider.plugins.ui as ui
from tests.airflow.test_ui import _client, _connection_env, auth_manager, shard_store  # noqa: F401 - fixtures

HUNG_CONN = "upsert_hung"
HUNG_PASSWORD = "hung-pw-31d"
# Generous: a loaded machine answers the good store's page in a few seconds (and the store's
# driver waits 10 s per connection attempt for the hung one).
ANSWER_BOUND_SECONDS = 120


@pytest.fixture
def hung_store():
    """A loopback TCP port whose connections are accepted (by the kernel's backlog) and never
    answered: a PostgreSQL client waits for the server's first message until its timeout."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    try:
        yield f"postgresql://ledger@127.0.0.1:{server.getsockname()[1]}/ledger"
    finally:
        server.close()  # the abandoned listing's connection fails now, and its thread ends


def test_a_store_that_never_answers_is_marked_unreachable_and_the_others_are_listed_at_once(
        shard_store, hung_store, monkeypatch, auth_manager):
    for name, value in _connection_env(shard_store).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(f"AIRFLOW_CONN_{HUNG_CONN.upper()}", json.dumps({
        "conn_type": "upsert", "password": HUNG_PASSWORD,
        "extra": {"consensus_url": hung_store, "blob_root": "/nonexistent/blob"}}))
    # The page's own limit (5 s): half the driver's wait for the hung store's first answer (10 s),
    # so that store is still waiting at the deadline, and long enough for the good store and for
    # reading each connection on a loaded machine (at 1 s, a listing thread had not yet read its
    # connection when the deadline came).
    started = time.monotonic()
    response = _client().get("/api/shards")
    elapsed = time.monotonic() - started
    # The answer did not wait for the hung store: its listing is still waiting for it.
    assert any(t.name == f"upsert-ui-list-{HUNG_CONN}" and t.is_alive() for t in threading.enumerate()), \
        [t.name for t in threading.enumerate()]
    assert response.status_code == 200
    data = response.json()
    assert elapsed < ANSWER_BOUND_SECONDS, elapsed
    by_conn = {c["conn_id"]: c for c in data["connections"]}
    assert by_conn[HUNG_CONN]["unreachable"] is True
    assert by_conn[HUNG_CONN]["consensus"] == "postgresql"
    assert by_conn[HUNG_CONN]["error"].startswith(
        f"unreachable: its consensus store did not answer within {ui.STORE_LIST_SECONDS:g} s"), \
        by_conn[HUNG_CONN]
    assert by_conn["upsert_default"]["unreachable"] is False and by_conn["upsert_default"]["error"] is None
    assert {(s["conn_id"], s["shard"]) for s in data["shards"]} == {("upsert_default", "fresh"),
                                                                    ("upsert_default", "stuck")}
    assert data["total"] == 2
    assert HUNG_PASSWORD not in response.text and "ledger" not in response.text


def test_the_limit_applies_to_the_whole_list_not_to_each_store(shard_store, hung_store, monkeypatch, auth_manager):
    """Three hung stores and the limit: the page answers once, not three limits later."""
    for name, value in _connection_env(shard_store).items():
        monkeypatch.setenv(name, value)
    for n in range(3):
        monkeypatch.setenv(f"AIRFLOW_CONN_UPSERT_HUNG{n}", json.dumps({
            "conn_type": "upsert", "extra": {"consensus_url": hung_store, "blob_root": "/nonexistent/blob"}}))
    data = ui.list_shards()
    unreachable = sorted(c["conn_id"] for c in data["connections"] if c["unreachable"])
    assert unreachable == ["upsert_hung0", "upsert_hung1", "upsert_hung2"]
    assert [s["shard"] for s in data["shards"]] == ["fresh", "stuck"]
