"""The shard page, in a real api-server and a real (headless) Chromium.

Two shards in one store: ``fresh`` (its upper follows the source: OK) and ``stuck`` (its upper
stays while the source grows for longer than the stall threshold: STALLED, and its monitor has
a page open). Their frontier observations are recorded with ``observations.record_observation``,
as writers record them. A second connection's store holds 500 shards: the list is paged.

The browser test takes the screenshots docs/ui.md shows (into docs/img/ under `make docs-images`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from urllib.parse import quote

import pytest
from airflow.api_fastapi.core_api.security import get_user
from fastapi.testclient import TestClient

from airflow_upsert_provider.links import shard_page_url
from airflow_upsert_provider.engine.table.schema_changes import add_column
from airflow_upsert_provider.plugins.ui import URL_PREFIX, VIEW_HREF, create_ui_app, describe_schema_change
from tests.conftest import REPO_ROOT
from tests.helpers import batch, make_shard

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
PASSWORD = "ui-test-secret-9f3"
CONSENSUS_PASSWORD = "consensus-pw-7c1"
FRESH_POINTS = 9
STUCK_POINTS = 8
# The settings the stuck shard's monitor evaluated with (none the rules' default).
STUCK_MONITOR = {"cadence_seconds": 30.0, "stall_multiplier": 2.0, "min_stall_seconds": 120.0,
                 "window_seconds": 3720.0, "stale_after_seconds": 3600.0, "consecutive_breaches": 3}
UNKNOWN_FIELDS = {"email": {"records": 2, "file": "/landing/p0/0.jsonl"}}
STUCK_COLUMN = {"name": "discount", "type": "double", "nullable": True, "metadata": {}}
FLEET_CONN = "upsert_fleet"
FLEET_SHARDS = 500
DOCS_IMG = os.path.join(REPO_ROOT, "docs", "img")


def _observation(shard_id, at, upper, bound, hw, observer="writer:w", outcome="committed", lag_seconds=None,
                 last_commit_at=None, per_partition=False):
    from airflow_upsert_provider.engine.frontier.model import Observation, partition_lag_summary

    return Observation(
        shard_id=shard_id, observed_at=at, upper=upper, last_commit_at=at - 1 if last_commit_at is None else last_commit_at, high_watermark={"p0": hw},
        bound={"p0": bound}, stream_status="READY", stream_changed_at=0.0, lag=max(0, hw - bound), lag_unit="segments",
        lag_seconds=lag_seconds if hw > bound else None, observer=observer, writer_outcome=outcome,
        # Observations recorded before the lag per partition was kept have none (fresh's).
        partition_lag=partition_lag_summary({"p0": max(0, hw - bound)}) if per_partition else None,
    )


@pytest.fixture(scope="module")
def shard_store(tmp_path_factory):
    """The store (SQLite consensus, blob) with the two shards and their observations."""
    from airflow_upsert_provider.engine.blob.files import open_blob
    from airflow_upsert_provider.engine.store.registry import open_consensus
    from airflow_upsert_provider.engine.frontier.observations import record_observation, save_alert_state
    from airflow_upsert_provider.engine.frontier.alerts import AlertState
    from airflow_upsert_provider.engine.frontier.model import StallSettings

    root = tmp_path_factory.mktemp("ui-store")
    url = f"sqlite:///{root / 'consensus.db'}"
    consensus, blob = open_consensus(url), open_blob(str(root / "blob"))
    now = time.time()
    fresh = make_shard(consensus, blob, root / "fresh", shard_id="fresh")
    stuck = make_shard(consensus, blob, root / "stuck", shard_id="stuck")
    for ts in range(3):
        fresh.compare_and_append(ts, ts + 1, batch(ts, token=f"f{ts}", writer_id="airflow:dag:run:fresh:try1"), epoch=0)
    # Its one batch carried a field the schema does not name (ignored; the page says so).
    stuck_batch = batch(0, token="s0", writer_id="airflow:dag:run:stuck:try1")
    stuck_batch.stats.update(rows_in=3, rows_out=3, unknown_fields=UNKNOWN_FIELDS)
    stuck.compare_and_append(0, 1, stuck_batch, epoch=0)
    # Its table gained a column: schema version 2 (the page shows the versions).
    add_column(stuck, STUCK_COLUMN, "ops")
    # fresh: each look finds the source caught up; stuck: the source grows, the upper stays.
    for i in range(FRESH_POINTS):
        at = now - 480 + i * 60
        record_observation(consensus, _observation("fresh", at, min(3, 1 + i // 3), 100 * i, 100 * i))
    for i in range(STUCK_POINTS):
        at = now - 470 + i * 60
        record_observation(consensus, _observation(
            "stuck", at, 1, 40, 40 + 25 * (i + 1), observer="sensor:monitor", outcome=None,
            lag_seconds=60.0 * (i + 1), last_commit_at=now - 540, per_partition=True))
    # The stuck shard's monitor evaluated it last a minute ago and has had a page open since.
    assert save_alert_state(consensus, AlertState(
        "stuck", consecutive_breaches=4, firing=True, firing_status="STALLED", incident_started_at=now - 180,
        max_upper=1, last_status="STALLED", last_evaluated_at=now - 60, pages_sent=1,
        settings=StallSettings(**STUCK_MONITOR).to_dict(), evaluated_by="sensor:upsert_frontier_monitor/r/watch",
        last_sent_at=now - 175), 0)
    consensus.dispose()
    return {"url": url, "blob": str(root / "blob"), "now": now}


@pytest.fixture(scope="module")
def fleet_store(tmp_path_factory):
    """A store of FLEET_SHARDS shards (a second connection), built in a thread: an api-server
    starts meanwhile. ``ready()`` waits for it."""
    from airflow_upsert_provider.engine.blob.files import open_blob
    from airflow_upsert_provider.engine.store.registry import open_consensus

    root = tmp_path_factory.mktemp("ui-fleet")
    store: dict = {"url": f"sqlite:///{root / 'consensus.db'}", "blob": str(root / "blob")}
    failures: list[BaseException] = []

    def build() -> None:
        try:
            consensus, blob = open_consensus(store["url"]), open_blob(store["blob"])
            try:
                for n in range(FLEET_SHARDS):
                    make_shard(consensus, blob, root, shard_id=f"fleet_{n:03d}")
            finally:
                consensus.dispose()
        except BaseException as exc:  # noqa: BLE001 - handed to the test that waits
            failures.append(exc)

    builder = threading.Thread(target=build, name="fleet-store", daemon=True)
    builder.start()

    def ready() -> dict:
        builder.join()
        if failures:
            raise failures[0]
        return store

    store["ready"] = ready
    return store


def _connection_env(store) -> dict[str, str]:
    # The password goes in the connection's password field: the page must never show it.
    return {"AIRFLOW_CONN_UPSERT_DEFAULT": json.dumps({
        "conn_type": "upsert", "password": CONSENSUS_PASSWORD,
        "extra": {"consensus_url": store["url"], "blob_root": store["blob"]},
    })}


def _fleet_env(fleet) -> dict[str, str]:
    return {f"AIRFLOW_CONN_{FLEET_CONN.upper()}": json.dumps({
        "conn_type": "upsert", "extra": {"consensus_url": fleet["url"], "blob_root": fleet["blob"]}})}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- the app, in process ------------------------------------------------------------------------


class _AuthManager:
    """Stands in for Airflow's auth manager: ``allowed`` the connections a user may read
    (None: all); records what was asked."""

    def __init__(self, allowed: set[str] | None = None) -> None:
        self.allowed = allowed
        self.asked: list[tuple[str, frozenset[str], str]] = []

    def filter_authorized_connections(self, *, conn_ids, user, method="GET", team_name=None):
        self.asked.append((user, frozenset(conn_ids), method))
        return set(conn_ids) if self.allowed is None else set(conn_ids) & self.allowed


@pytest.fixture
def auth_manager(monkeypatch):
    import airflow.api_fastapi.app as airflow_app

    manager = _AuthManager()
    monkeypatch.setattr(airflow_app, "get_auth_manager", lambda: manager)
    return manager


def _client(user: object = "test-user") -> TestClient:
    app = create_ui_app()
    app.dependency_overrides[get_user] = lambda: user
    return TestClient(app)


def test_every_route_needs_a_signed_in_user_and_the_page_sends_a_signed_out_one_to_the_login():
    anonymous = TestClient(create_ui_app())
    for path in ("/api/shards", "/api/shards/stuck/observations", "/static/ui.js"):
        assert anonymous.get(path).status_code == 401, path
    # The page itself: Airflow's login route (any auth manager), coming back to the page after.
    page = anonymous.get("/?conn=upsert_default&shard=stuck", follow_redirects=False)
    assert page.status_code == 307
    assert page.headers["location"] == ("/api/v2/auth/login?next=" + quote(
        "http://testserver/?conn=upsert_default&shard=stuck", safe=""))
    assert "shard" not in page.text


def test_json_lists_both_shards_with_their_numbers_and_statuses(shard_store, monkeypatch, auth_manager):
    for name, value in _connection_env(shard_store).items():
        monkeypatch.setenv(name, value)
    client = _client()
    response = client.get("/api/shards")
    assert response.status_code == 200
    assert "default-src 'none'" in response.headers["content-security-policy"]
    data = response.json()
    assert CONSENSUS_PASSWORD not in response.text
    assert [c["conn_id"] for c in data["connections"]] == ["upsert_default"]
    assert data["connections"][0]["consensus"] == "sqlite"
    by_id = {s["shard"]: s for s in data["shards"]}
    assert set(by_id) == {"fresh", "stuck"}
    fresh, stuck = by_id["fresh"], by_id["stuck"]
    assert (fresh["upper"], fresh["since"], fresh["lag"], fresh["lag_text"], fresh["pending_for"]) == \
        (3, 0, 0, "0 segments", None)
    assert fresh["frontier"]["status"] == "OK", fresh["frontier"]
    assert fresh["last_writer"] == "airflow:dag:run:fresh:try1" and fresh["last_commit_at"] > 0
    assert (stuck["upper"], stuck["lag"], stuck["lag_unit"], stuck["lag_seconds"]) == \
        (1, 25 * STUCK_POINTS, "segments", 60.0 * STUCK_POINTS)
    # The lag in its unit and how long the oldest of it waits, as logs and pages say them.
    assert (stuck["lag_text"], stuck["pending_for"]) == (f"{25 * STUCK_POINTS} segments", "8m00s")
    assert stuck["frontier"]["status"] == "STALLED", stuck["frontier"]
    assert stuck["frontier"]["reasons"]
    assert stuck["stream"]["status"] == "READY" and stuck["last_checkpoint"] is None
    assert stuck["source"] == "dir"
    assert stuck["last_batch"]["unknown_fields"] == UNKNOWN_FIELDS and fresh["last_batch"]["unknown_fields"] == {}
    # The table's schema version and its history: version 1 made with the shard, then the column added.
    assert fresh["schema"]["version"] == 1 and [v["version"] for v in fresh["schema"]["history"]] == [1]
    assert stuck["schema"]["version"] == 2
    created, added = stuck["schema"]["history"]
    assert (created["version"], created["created_by"], created["change_text"]) == (1, None, "created")
    assert (added["version"], added["created_by"], added["change"], added["change_text"]) == (
        2, "ops", {"add": [{"name": "discount", "type": "double"}]}, "added discount double")
    assert 0 < created["created_at"] <= added["created_at"] <= time.time()

    points = client.get("/api/shards/stuck/observations").json()["points"]
    assert [p["high_watermark"] for p in points] == [40 + 25 * (i + 1) for i in range(STUCK_POINTS)]
    # The lag per partition as recorded; rows recorded before it was kept have none to show.
    stuck_detail = client.get("/api/shards/stuck/observations").json()
    assert [(p["partition"], p["lag"]) for p in stuck_detail["partitions"]] == [("p0", 25 * STUCK_POINTS)]
    assert stuck_detail["partition_lag"]["others"] == 0
    fresh_detail = client.get("/api/shards/fresh/observations").json()
    assert fresh_detail["partition_lag"] is None and [p["lag"] for p in fresh_detail["partitions"]] == [None]
    assert {p["bound"] for p in points} == {40}
    assert client.get("/api/shards/nope/observations").status_code == 404
    assert client.get("/api/shards/stuck/observations", params={"conn": "other"}).status_code == 404
    assert client.get("/static/../ui.py").status_code == 404


def test_a_schema_change_is_said_as_what_it_did_and_one_of_another_kind_as_recorded():
    assert describe_schema_change({"init": True}) == "created"
    assert describe_schema_change({"add": [{"name": "a", "type": "double"}, {"name": "b", "type": "string"}]}) == \
        "added a double, b string"
    assert describe_schema_change({"widen": [{"name": "qty", "type": "bigint"}]}) == "widened qty to bigint"
    assert describe_schema_change({"add": ["a"]}) == 'add: ["a"]'
    assert describe_schema_change({"policy": "add_columns"}) == 'policy: "add_columns"'
    assert describe_schema_change({}) == "—"


def test_looking_records_nothing(shard_store, monkeypatch, auth_manager):
    """The page evaluates the recorded window: no observation, no alert state is written."""
    from airflow_upsert_provider.engine.store.registry import open_consensus
    from airflow_upsert_provider.engine.frontier.observations import load_alert_state, observation_count

    for name, value in _connection_env(shard_store).items():
        monkeypatch.setenv(name, value)
    _client().get("/api/shards").raise_for_status()
    consensus = open_consensus(shard_store["url"])
    try:
        assert observation_count(consensus, "stuck") == STUCK_POINTS
        assert load_alert_state(consensus, "stuck")[1] == 1  # as the fixture saved it
        assert load_alert_state(consensus, "fresh")[1] == 0
    finally:
        consensus.dispose()


# A second connection whose PostgreSQL store does not answer: its host, user and database are
# what the page must not show, in any field or error message.
OTHER_CONN = "upsert_ledger"
OTHER_URL = "postgresql://ledger_writer:pg-pw-55e@127.0.0.1:1/ledger_prod_db"


def _two_connections(store, monkeypatch) -> None:
    for name, value in _connection_env(store).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AIRFLOW_CONN_UPSERT_LEDGER", json.dumps({
        "conn_type": "upsert", "extra": {"consensus_url": OTHER_URL, "blob_root": "/srv/ledger-blob-root"}}))


def test_a_user_sees_only_the_connections_the_auth_manager_lets_them_read(shard_store, monkeypatch, auth_manager):
    _two_connections(shard_store, monkeypatch)
    auth_manager.allowed = {OTHER_CONN}
    client = _client("reader-of-ledger")
    data = client.get("/api/shards").json()
    assert [c["conn_id"] for c in data["connections"]] == [OTHER_CONN]
    assert data["shards"] == []  # upsert_default's shards are not listed
    assert ("reader-of-ledger", frozenset({"upsert_default", OTHER_CONN}), "GET") in auth_manager.asked
    assert client.get("/api/shards/stuck/observations").status_code == 404
    assert client.get("/api/shards/stuck/observations", params={"conn": "upsert_default"}).status_code == 404

    auth_manager.allowed = {"upsert_default"}
    data = client.get("/api/shards").json()
    assert [c["conn_id"] for c in data["connections"]] == ["upsert_default"]
    assert {s["shard"] for s in data["shards"]} == {"fresh", "stuck"}
    assert client.get("/api/shards/stuck/observations").status_code == 200


def test_no_field_or_error_shows_what_locates_or_opens_a_store(shard_store, monkeypatch, auth_manager):
    _two_connections(shard_store, monkeypatch)
    response = _client().get("/api/shards")
    by_conn = {c["conn_id"]: c for c in response.json()["connections"]}
    assert by_conn["upsert_default"]["consensus"] == "sqlite"
    assert by_conn[OTHER_CONN]["consensus"] == "postgresql" and by_conn[OTHER_CONN]["error"]
    for shown in ("ledger_writer", "pg-pw-55e", "127.0.0.1", "ledger_prod_db", "/srv/ledger-blob-root",
                  shard_store["url"].removeprefix("sqlite:///"), CONSENSUS_PASSWORD):
        assert shown not in response.text, shown


def test_airflow_roles_that_may_not_read_connections_see_no_shard(shard_store, monkeypatch):
    """Airflow's simple auth manager: viewers and users may not read connections, ops may."""
    import airflow.api_fastapi.app as airflow_app
    from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager
    from airflow.api_fastapi.auth.managers.simple.user import SimpleAuthManagerUser

    _two_connections(shard_store, monkeypatch)
    monkeypatch.setattr(airflow_app, "get_auth_manager", lambda: SimpleAuthManager())
    for role, expected in (("viewer", []), ("user", []), ("op", ["upsert_default", OTHER_CONN])):
        data = _client(SimpleAuthManagerUser(username=role, role=role)).get("/api/shards").json()
        assert [c["conn_id"] for c in data["connections"]] == expected, role
        # How many they may not read (not which): the page says their role is why, not "no shard".
        assert data["unreadable"] == 2 - len(expected), role


# -- the api-server and a browser ---------------------------------------------------------------


@pytest.fixture(scope="module")
def api_server(airflow_home, shard_store, fleet_store, tmp_path_factory):
    """``airflow api-server`` on a loopback port, simple auth manager with one admin user."""
    with running_api_server(airflow_home, tmp_path_factory, {**_connection_env(shard_store), **_fleet_env(fleet_store)},
                            before_ready=fleet_store["ready"]) as server:
        yield server


def installed_pythonpath(env: dict[str, str]) -> str:
    """PYTHONPATH as deployed: only the installed distribution's entry points. A source tree
    with an *.egg-info is a second copy of them (Airflow would report the plugin's second
    registration as an import error) and leaves the path; a tree without one (a checkout beside
    the installed one) stays, so that the server runs the code under test."""
    def second_copy(path: str) -> bool:
        return os.path.abspath(path) == os.path.abspath(REPO_ROOT) and any(
            name.endswith(".egg-info") for name in os.listdir(REPO_ROOT))

    return os.pathsep.join(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and not second_copy(p))


@contextlib.contextmanager
def running_api_server(airflow_home, tmp_path_factory, connections: dict[str, str], before_ready=None, **settings: str):
    """``airflow api-server`` on a loopback port with ``connections`` (AIRFLOW_CONN_*) and
    Airflow ``settings`` (AIRFLOW__*), simple auth manager with one admin user; yields its base
    URL, log path and home."""
    home = airflow_home.clone(str(tmp_path_factory.mktemp("ui-airflow-home")))
    passwords = os.path.join(home.path, "passwords.json")
    with open(passwords, "w", encoding="utf-8") as f:
        json.dump({"admin": PASSWORD}, f)
    port = _free_port()
    env = dict(home.base_env, **connections, **settings,
               AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS="admin:admin",
               AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE=passwords,
               AIRFLOW__API__BASE_URL=f"http://127.0.0.1:{port}/")
    env["PYTHONPATH"] = installed_pythonpath(env)
    log_path = os.path.join(home.path, "api-server.log")
    log = open(log_path, "w", encoding="utf-8")
    proc = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "airflow"), "api-server", "--host", "127.0.0.1",
         "--port", str(port), "--workers", "1"],
        env=env, cwd=home.path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(base + "/api/v2/monitor/health", timeout=5):
                    break
            except (urllib.error.URLError, ConnectionError, OSError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    with open(log_path, encoding="utf-8") as f:
                        pytest.fail(f"api-server did not start:\n{f.read()[-5000:]}")
                time.sleep(1)
        if before_ready is not None:
            before_ready()
        yield {"base": base, "log": log_path, "home": home}
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
        log.close()


def _status(url: str, cookie: str | None = None) -> int:
    request = urllib.request.Request(url, headers={"Cookie": cookie} if cookie else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def test_anonymous_requests_to_the_api_server_are_refused_and_the_page_goes_to_the_login(api_server):
    for path in ("api/shards", "api/shards/stuck/observations", "static/ui.js"):
        assert _status(f"{api_server['base']}{URL_PREFIX}/{path}") in (401, 403), path
    page = f"{api_server['base']}{URL_PREFIX}/?shard=stuck"
    with pytest.raises(urllib.error.HTTPError) as redirected:
        urllib.request.build_opener(_NoRedirect).open(page, timeout=30)
    assert redirected.value.code == 307
    assert redirected.value.headers["location"] == "/api/v2/auth/login?next=" + quote(page, safe="")
    # ... which Airflow answers with its login page, the page to come back to in hand.
    with urllib.request.urlopen(page, timeout=30) as login:
        assert "/auth/login" in login.url and quote(page, safe="") in login.url


def _wait_for_points(page, count: int, timeout: float = 60) -> None:
    """The chart's points: one series for a directory shard (the segments pending)."""
    deadline = time.monotonic() + timeout
    while len(page.query_selector_all("#chart circle.pt")) != count:
        assert time.monotonic() < deadline, page.inner_html("#chart")[:2000]
        page.wait_for_timeout(200)


def _rows(frame) -> dict[tuple[str, str], dict[str, str]]:
    return {
        (tr.get_attribute("data-conn"), tr.get_attribute("data-shard")): {
            name: tr.query_selector(f"td.{name}").inner_text()
            for name in ("upper", "since", "lag", "pending-for", "frontier", "stream")
        }
        for tr in frame.query_selector_all("#shards tbody tr[data-shard]")
    }


def _wait_for_text(page, selector: str, text: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while text not in (page.text_content(selector) or "" if page.query_selector(selector) else ""):
        assert time.monotonic() < deadline, (selector, text, page.inner_text("body")[:2000])
        page.wait_for_timeout(200)


def _screenshot(target, name: str, tmp_path) -> None:
    """A small PNG of ``target`` (a page or an element), taken on every run; copied into
    docs/img/, where docs/ui.md shows it, when UPSERT_DOCS_IMAGES=1 (`make docs-images`), so
    that a test run leaves the checkout as it found it."""
    shot = tmp_path / name
    target.screenshot(path=str(shot))
    assert 5_000 < shot.stat().st_size < 400_000, (name, shot.stat().st_size)
    if os.environ.get("UPSERT_DOCS_IMAGES") == "1":
        shutil.copy(shot, os.path.join(DOCS_IMG, name))


def _observe_fresh_now(store) -> None:
    """One more writer observation of the caught-up shard, now: however long the api-server
    took to start, its newest observation is not old enough to read STALE."""
    from airflow_upsert_provider.engine.frontier.observations import record_observation
    from airflow_upsert_provider.engine.store.registry import open_consensus

    consensus = open_consensus(store["url"])
    try:
        record_observation(consensus, _observation("fresh", time.time(), 3, 800, 800))
    finally:
        consensus.dispose()


def test_the_page_in_chromium_pages_the_shards_draws_the_chart_and_follows_airflow(api_server, shard_store, tmp_path):
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"Chromium is required (apt-get install chromium): {CHROMIUM} not found")
    from playwright.sync_api import sync_playwright

    _observe_fresh_now(shard_store)

    base = api_server["base"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            # Signed out, the page leads to Airflow's login form, and back to the page after it.
            page.goto(f"{base}{URL_PREFIX}/")
            page.wait_for_selector("input[name=username]", timeout=60000)
            page.fill("input[name=username]", "admin")
            page.fill("input[name=password]", PASSWORD)
            page.click("button[type=submit]")
            page.wait_for_url(lambda url: "/auth/login" not in url, timeout=60000)
            page.wait_for_load_state("networkidle")

            # The navigation's external view leads to the page (in Airflow's iframe).
            plugins = page.evaluate("""async () => {
                const r = await fetch('/api/v2/plugins', {credentials: 'same-origin'}); return r.json(); }""")
            views = [v for plugin in plugins.get("plugins", []) for v in plugin.get("external_views", [])]
            assert any(v["href"] == VIEW_HREF and v["url_route"] == "upsert-shards" for v in views), plugins

            # Only the shard page's own errors count (Airflow's login page logs its 401s).
            errors.clear()
            page.goto(f"{base}{URL_PREFIX}/")
            page.wait_for_selector("#shards tbody tr[data-shard=stuck]", timeout=60000)
            rows = _rows(page)
            # One page of 50 of the 502 shards: both of upsert_default, then the fleet's first.
            assert len(rows) == 50 and page.inner_text("#range") == "shards 1–50 of 502"
            assert [shard for conn, shard in rows if conn == FLEET_CONN] == [f"fleet_{n:03d}" for n in range(48)]
            fresh, stuck = rows[("upsert_default", "fresh")], rows[("upsert_default", "stuck")]
            assert fresh["upper"] == "3" and fresh["lag"] == "0 segments"
            assert fresh["pending-for"] == "—"
            assert fresh["frontier"].startswith("OK")
            assert stuck["upper"] == "1" and stuck["lag"] == f"{25 * STUCK_POINTS} segments"
            assert stuck["pending-for"] == "8m00s"
            assert stuck["frontier"].startswith("STALLED") and "page open since" in stuck["frontier"]
            assert stuck["stream"].startswith("READY")
            assert CONSENSUS_PASSWORD not in page.content()
            # The last batch carried a field the schema does not name.
            assert page.inner_text("#shards tbody tr[data-shard=stuck] td.rows") == \
                "3 / 3\nignored, not in the schema: email (2)"

            # The first shard's chart, then the stalled one's: one point per observation and series.
            # (Polled from here: the page's CSP forbids the eval that wait_for_function would need.)
            _wait_for_points(page, FRESH_POINTS + 1)
            _screenshot(page, "ui.png", tmp_path)
            # A click on a row below the fold brings its detail (below the whole list) into view.
            assert page.evaluate("document.getElementById('detail').getBoundingClientRect().top") > 800
            page.click("#shards tbody tr[data-shard=stuck]")
            _wait_for_points(page, STUCK_POINTS)
            detail_top = page.evaluate("document.getElementById('detail').getBoundingClientRect().top")
            # scrollIntoView may stop a fraction of a pixel past the top (fractional layout).
            assert -1 < detail_top < 800, detail_top
            # A directory shard's chart is in its lag unit: the segments pending, one series.
            assert len(page.query_selector_all("#chart circle.pt.lag")) == STUCK_POINTS
            assert len(page.query_selector_all("#chart polyline")) == 1
            assert "stuck" in page.inner_text("#chart-title")
            assert page.inner_text("#legend").strip() == "segments pending"
            # Full width, with axis titles; the range shown is the smallest that holds the
            # shard's observations (8 minutes of them: 1h), until a range is clicked.
            chart = page.query_selector("#chart svg").bounding_box()
            assert chart["width"] >= page.query_selector("#detail").bounding_box()["width"] - 2
            assert page.text_content("#chart .x-title").startswith("time (UTC)")
            assert page.text_content("#chart .y-title") == "segments pending"
            assert page.get_attribute("#ranges button.active", "data-seconds") == "3600"
            page.click("#ranges button[data-seconds='21600']")
            _wait_for_text(page, "#chart .x-title", "time (UTC)")
            assert page.get_attribute("#ranges button.active", "data-seconds") == "21600"
            _wait_for_points(page, STUCK_POINTS)
            page.click("#ranges button[data-seconds='3600']")
            _wait_for_points(page, STUCK_POINTS)
            assert page.get_attribute("#ranges button.active", "data-seconds") == "3600"
            # Lag per partition in segments, as the newest observation recorded it (no note: no
            # partition left out). Then the verdict: the monitor's thresholds, its page.
            assert page.inner_text("#partitions tbody tr[data-partition=p0] td.lag") == f"{25 * STUCK_POINTS}"
            assert page.inner_text("#partitions-lag") == "Lag (segments)"
            assert not page.is_visible("#partitions-note")
            assert "monitor last evaluated with" in page.inner_text("#judged-with")
            thresholds = page.inner_text("#thresholds")
            assert "Stalled after\n2m00s (120s) = max(2 x cadence, 2m00s (120s))" in thresholds, thresholds
            assert "Stale after\n1h00m00s (3,600s)" in thresholds and "Cadence\n30s" in thresholds
            monitor = page.inner_text("#monitor")
            assert "open, incident since" in monitor and "sensor:upsert_frontier_monitor/r/watch" in monitor, monitor
            # The state's count of pages a channel took, and when the last one did.
            assert "Pages sent\n1" in monitor and "Last delivered\n20" in monitor, monitor
            # The table's schema version and its history.
            assert page.inner_text("#schema-version") == "version 2"
            history = [[td.inner_text() for td in tr.query_selector_all("td")]
                       for tr in page.query_selector_all("#schema-history tbody tr")]
            assert [(h[0], h[2], h[3]) for h in history] == [("1", "—", "created"), ("2", "ops", "added discount double")]
            assert all(h[1].startswith("20") for h in history), history
            _screenshot(page.query_selector("#detail"), "ui-shard.png", tmp_path)

            # The next page, and a filter.
            page.click("#next")
            _wait_for_text(page, "#range", "shards 51–100 of 502")
            assert ("upsert_fleet", "fleet_048") in _rows(page)
            page.fill("#match", "fleet_32")
            _wait_for_text(page, "#range", "shards 1–10 of 10")
            assert [shard for _, shard in _rows(page)] == [f"fleet_{n}" for n in range(320, 330)]
            assert not errors, errors

            # At 800 px the verdict stays in view, right after the shard's name.
            page.set_viewport_size({"width": 800, "height": 800})
            page.goto(f"{base}{URL_PREFIX}/")
            page.wait_for_selector("#shards tbody tr[data-shard=stuck] td.frontier .badge", timeout=60000)
            verdict = page.query_selector("#shards tbody tr[data-shard=stuck] td.frontier").bounding_box()
            assert verdict["x"] >= 0 and verdict["x"] + verdict["width"] <= 800, verdict
            assert page.inner_text("#shards tbody tr[data-shard=stuck] td.frontier .badge") == "STALLED"
            # A deep link to a shard that does not exist says so and selects no other shard.
            page.goto(f"{base}{URL_PREFIX}/?conn=upsert_default&shard=nope")
            _wait_for_text(page, "#errors", "no shard nope in connection upsert_default")
            page.wait_for_selector("#shards tbody tr[data-shard=stuck]", timeout=60000)
            assert page.query_selector("#shards tbody tr.selected") is None
            assert page.is_hidden("#detail")
            page.set_viewport_size({"width": 1280, "height": 800})

            # In Airflow's UI, dark: the operators' "Shard page" link opens the page framed, at its
            # shard (on the page of the list that holds it), in Airflow's theme.
            page.evaluate("localStorage.setItem('theme', 'dark')")
            page.goto(shard_page_url(FLEET_CONN, "fleet_321", base + "/"))
            frame = page.frame_locator("iframe").first
            frame.locator("#shards tbody tr.selected[data-shard=fleet_321]").wait_for(timeout=60000)
            assert frame.locator("#range").inner_text() == "shards 301–350 of 502"
            # Arriving by the link brings the shard's detail into view (it lies below the list).
            top = frame.locator("#detail").evaluate("d => d.getBoundingClientRect().top")
            assert -1 < top < frame.locator("body").evaluate("b => window.innerHeight"), top
            assert frame.locator("html").get_attribute("data-theme") == "dark"
            background = frame.locator("body").evaluate("b => getComputedStyle(b).backgroundColor")
            assert background == "rgb(17, 17, 19)", background
            page.goto(shard_page_url("upsert_default", "stuck", base + "/"))
            frame = page.frame_locator("iframe").first
            frame.locator("#shards tbody tr.selected[data-shard=stuck]").wait_for(timeout=60000)
            frame.locator("#chart circle.pt").first.wait_for(timeout=60000)
            page.wait_for_timeout(300)  # the chart's last repaint before the picture
            _screenshot(page, "ui-dark.png", tmp_path)
            # The page follows a change of Airflow's color mode while it is open.
            page.evaluate("document.documentElement.classList.replace('dark', 'light')")
            deadline = time.monotonic() + 30
            while frame.locator("html").get_attribute("data-theme") != "light":
                assert time.monotonic() < deadline
                page.wait_for_timeout(100)
            # The last writer links to its task try, opened by Airflow's UI around the frame.
            frame.locator("#shards tbody tr[data-shard=stuck] a.writer-link").click()
            page.wait_for_url(f"{base}/dags/dag/runs/run/tasks/stuck?try_number=1", timeout=60000)
        finally:
            browser.close()


def test_five_hundred_shards_are_listed_a_page_at_a_time(shard_store, fleet_store, monkeypatch, auth_manager):
    """The list reads the shards of one page only, whatever the store holds; a deep link finds
    its shard's page; a filter narrows the list."""
    from airflow_upsert_provider.plugins import ui

    for name, value in {**_connection_env(shard_store), **_fleet_env(fleet_store["ready"]())}.items():
        monkeypatch.setenv(name, value)
    summarized: list[str] = []
    summary = ui.shard_summary
    monkeypatch.setattr(ui, "shard_summary", lambda store, record, now: summarized.append(record.shard_id)
                        or summary(store, record, now))
    client = _client()
    first = client.get("/api/shards").json()
    assert (first["total"], first["offset"], first["limit"], len(first["shards"])) == (502, 0, 50, 50)
    assert {c["conn_id"]: c["shards"] for c in first["connections"]} == {"upsert_default": 2, FLEET_CONN: 500}
    assert len(summarized) == 50
    last = client.get("/api/shards", params={"offset": 500}).json()
    assert [s["shard"] for s in last["shards"]] == ["fleet_498", "fleet_499"]
    assert client.get("/api/shards", params={"limit": 201}).status_code == 422
    focused = client.get("/api/shards", params={"conn": FLEET_CONN, "shard": "fleet_321"}).json()
    assert focused["offset"] == 300 and "fleet_321" in [s["shard"] for s in focused["shards"]]
    matched = client.get("/api/shards", params={"match": "FLEET_49"}).json()
    assert matched["total"] == 10 and [s["shard"] for s in matched["shards"]][:2] == ["fleet_490", "fleet_491"]
    assert len(summarized) == 50 + 2 + 50 + 10


# -- the example DAGs' trigger forms ------------------------------------------------------------

EXAMPLE_DAGS = ("upsert_backfill", "upsert_fresh_data", "upsert_frontier_monitor", "upsert_kafka",
                "upsert_maintenance", "upsert_microbatch", "upsert_recovery")


def _sign_in(page, base: str) -> None:
    """Airflow's own login form, as a user signs in."""
    page.goto(base + "/")
    page.wait_for_selector("input[name=username]", timeout=60000)
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(lambda url: "/auth/login" not in url, timeout=60000)


def _api(page, path: str, method: str = "GET", body: dict | None = None) -> dict:
    """A call of Airflow's REST API with the signed-in page's token."""
    return page.evaluate("""async ([path, method, body]) => {
        const token = document.cookie.split('; ').find(c => c.startsWith('_token='))?.slice(7);
        const r = await fetch(path, {method, credentials: 'same-origin', headers: Object.assign(
            {'Content-Type': 'application/json'}, token ? {Authorization: 'Bearer ' + token} : {}),
            body: body ? JSON.stringify(body) : undefined});
        return {status: r.status, body: await r.text()}; }""", [path, method, body])


@contextlib.contextmanager
def signed_in_page(base: str, width: int = 1400, height: int = 1000):
    """A headless Chromium page signed in to Airflow's UI at ``base`` as the admin."""
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"Chromium is required (apt-get install chromium): {CHROMIUM} not found")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            _sign_in(page, base)
            yield page
        finally:
            browser.close()


@pytest.mark.slow
def test_every_example_dag_triggers_from_its_form_with_its_defaults(api_server):
    base = api_server["base"]
    with signed_in_page(base) as page:
        for dag_id in EXAMPLE_DAGS:
            page.goto(f"{base}/dags/{dag_id}")
            page.get_by_role("button", name="Trigger").first.click(timeout=60000)
            dialog = page.get_by_role("dialog")
            dialog.wait_for(timeout=30000)
            submit = dialog.get_by_role("button", name="Trigger")
            submit.wait_for(timeout=30000)
            assert submit.is_enabled(), (dag_id, dialog.inner_text()[:3000])
            submit.click()
            dialog.wait_for(state="hidden", timeout=30000)
            runs = _api(page, f"/api/v2/dags/{dag_id}/dagRuns")
            assert runs["status"] == 200, runs
            assert json.loads(runs["body"])["total_entries"] >= 1, (dag_id, runs)

        # A number out of range is refused with a message naming the param, not clamped
        # into range by the form and run.
        runs_before = json.loads(_api(page, "/api/v2/dags/upsert_backfill/dagRuns")["body"])["total_entries"]
        page.goto(f"{base}/dags/upsert_backfill")
        page.get_by_role("button", name="Trigger").first.click(timeout=60000)
        dialog = page.get_by_role("dialog")
        field = dialog.locator('[id="number-input:element_batch_size"] input')
        field.fill("-64")
        field.blur()
        assert field.input_value() == "-64"
        dialog.get_by_role("button", name="Trigger").click()
        message = dialog.get_by_text("batch_size", exact=False).last
        message.wait_for(timeout=30000)
        assert "-64" in dialog.inner_text() and "minimum of 1" in dialog.inner_text(), dialog.inner_text()[-2000:]
        runs_after = json.loads(_api(page, "/api/v2/dags/upsert_backfill/dagRuns")["body"])["total_entries"]
        assert runs_after == runs_before
