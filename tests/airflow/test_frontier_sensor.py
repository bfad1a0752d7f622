"""Frontier-stall paging from Airflow: the page sender, the trigger, the sensor in its three modes.

Pages go to a loopback HTTP server standing in for the PagerDuty Events API and a Slack
webhook: it records what was sent and answers from a script of status codes.
"""

from __future__ import annotations

import asyncio
import glob
import importlib
import json
import logging
import os
import threading
import re
import time
from collections.abc import Iterable
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException
from airflow.triggers.base import TriggerEvent

from airflow_upsert_provider.engine.frontier import observations
from airflow_upsert_provider.engine.blob.files import open_blob
from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.engine.frontier.model import StallSettings
from airflow_upsert_provider.engine.frontier.pages import dedup_key
from airflow_upsert_provider.notifications.frontier import (
    FrontierPageNotifier,
    PageDeliveryError,
    PagerDutySender,
    RetryPolicy,
    SlackSender,
    asend_page,
)
from airflow_upsert_provider.sample_data import SampleSpec
from airflow_upsert_provider.engine.table.shard import Shard
from airflow_upsert_provider.engine.write.writer import Writer
from airflow_upsert_provider.sensors.frontier import FrontierStallSensor
from airflow_upsert_provider.triggers.frontier import FrontierTrigger
from tests.airflow.conftest import failure_text
from tests.helpers import batch, make_shard

INTEGRATION_KEY = "R0UT1NGKEY-secret-0123456789abcdef"
WEBHOOK_TOKEN = "/services/T000/B000/webhook-secret-xyz"
FAST = RetryPolicy(max_attempts=4, base_seconds=0.01, max_wait_seconds=0.05)


class PagerServer:
    """Loopback stand-in for the Events API (``/v2/enqueue``) and a Slack webhook (any other path)."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self._script: list[int] = []
        self.retry_after = "0"  # the Retry-After header of a 429
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body: Any = json.loads(raw)
                except ValueError:
                    body = raw.decode(errors="replace")
                events_api = self.path.endswith("/enqueue")
                with server._lock:
                    status = server._script.pop(0) if server._script else (202 if events_api else 200)
                    server.requests.append({"path": self.path, "body": body, "status": status})
                if events_api:
                    dedup = body.get("dedup_key", "") if isinstance(body, dict) else ""
                    reply = json.dumps({"status": "success" if status < 300 else "invalid event",
                                        "dedup_key": dedup, "message": "Event processed"}).encode()
                    content_type = "application/json"
                else:
                    reply, content_type = (b"ok" if status == 200 else b"invalid_payload"), "text/plain"
                self.send_response(status)
                if status == 429:
                    self.send_header("Retry-After", server.retry_after)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def script(self, statuses: Iterable[int]) -> None:
        """Status codes of the next responses, in order; then 202 (Events API) / 200 (webhook)."""
        with self._lock:
            self._script = list(statuses)

    def statuses(self) -> list[int]:
        return [r["status"] for r in self.requests]

    def events(self) -> list[dict[str, Any]]:
        """Bodies of the Events API requests that were accepted."""
        return [r["body"] for r in self.requests if r["path"].endswith("/enqueue") and r["status"] < 300]

    def slack_messages(self) -> list[dict[str, Any]]:
        return [r["body"] for r in self.requests if not r["path"].endswith("/enqueue") and r["status"] == 200]

    def clear(self) -> None:
        with self._lock:
            self.requests.clear()
            self._script.clear()

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


@pytest.fixture
def pager():
    server = PagerServer()
    yield server
    server.close()


def conn_env(pager: PagerServer) -> dict[str, str]:
    """Airflow connections (environment variables) pointing PagerDuty and Slack at the loopback server."""
    return {
        "AIRFLOW_CONN_PAGERDUTY_TEST": json.dumps(
            {"conn_type": "pagerduty_events", "password": INTEGRATION_KEY, "host": pager.url}),
        "AIRFLOW_CONN_SLACK_TEST": json.dumps(
            {"conn_type": "slackwebhook", "password": WEBHOOK_TOKEN, "host": pager.url}),
    }


def sample_event(action: str = "trigger") -> dict[str, Any]:
    return {
        "action": action, "dedup_key": "airflow-upsert/test/orders",
        "summary": "STALLED: orders stuck 14m, +5,210 records behind", "severity": "critical",
        "source": "airflow-upsert-provider", "component": "orders", "group": "test",
        "custom_details": {"shard": "orders", "status": "STALLED", "rule": "stalled: ...", "upper": 7,
                           "reasons": ["the source grew by 5,210 records while the upper stayed at 7"]},
        "links": [],
    }


# -- the sender ------------------------------------------------------------------------------


def test_pagerduty_retries_429_and_5xx_then_delivers_and_never_retries_400(pager, caplog):
    caplog.set_level(logging.DEBUG)
    sender = PagerDutySender(integration_key=INTEGRATION_KEY, base_url=pager.url)

    pager.script([429, 503, 500])
    [delivery] = asyncio.run(asend_page(sample_event(), pagerduty=sender, policy=FAST))
    assert pager.statuses() == [429, 503, 500, 202]
    assert (delivery.channel, delivery.action, delivery.attempts) == ("pagerduty", "trigger", 4)
    assert delivery.dedup_key == "airflow-upsert/test/orders"
    # What the Events API received: the routing key, the action, the dedup key and the details.
    sent = pager.events()[0]
    assert sent["routing_key"] == INTEGRATION_KEY and sent["event_action"] == "trigger"
    assert sent["dedup_key"] == "airflow-upsert/test/orders"
    assert sent["payload"]["component"] == "orders" and sent["payload"]["severity"] == "critical"
    assert sent["payload"]["custom_details"]["upper"] == 7

    pager.clear()
    pager.script([400])
    with pytest.raises(PageDeliveryError) as refused:
        asyncio.run(asend_page(sample_event(), pagerduty=sender, policy=FAST))
    assert pager.statuses() == [400]
    assert (refused.value.status, refused.value.retryable, refused.value.attempts) == (400, False, 1)

    pager.clear()
    pager.script([502] * 10)
    with pytest.raises(PageDeliveryError) as exhausted:
        asyncio.run(asend_page(sample_event(), pagerduty=sender, policy=FAST))
    assert pager.statuses() == [502] * FAST.max_attempts
    assert (exhausted.value.status, exhausted.value.retryable) == (502, True)
    assert INTEGRATION_KEY not in caplog.text + str(refused.value) + str(exhausted.value)


def test_slack_webhook_retries_429_and_5xx_never_400_and_keeps_the_webhook_secret(pager, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG)
    for name, value in conn_env(pager).items():
        monkeypatch.setenv(name, value)
    sender = SlackSender.from_connection("slack_test")

    pager.script([429, 500])
    [delivery] = asyncio.run(asend_page(sample_event("resolve"), slack=sender, policy=FAST))
    assert pager.statuses() == [429, 500, 200] and delivery.attempts == 3
    assert pager.requests[-1]["path"] == WEBHOOK_TOKEN
    text = pager.slack_messages()[0]["text"]
    assert "STALLED: orders stuck 14m" in text and "upper: `7`" in text and "airflow-upsert/test/orders" in text

    pager.clear()
    pager.script([400])
    with pytest.raises(PageDeliveryError) as refused:
        asyncio.run(asend_page(sample_event(), slack=sender, policy=FAST))
    assert pager.statuses() == [400] and refused.value.retryable is False
    assert "webhook-secret" not in caplog.text + str(refused.value)


def test_a_page_without_a_dedup_key_or_with_an_unknown_action_is_refused_before_sending(pager):
    sender = PagerDutySender(integration_key=INTEGRATION_KEY, base_url=pager.url)
    with pytest.raises(ValueError, match="dedup_key"):
        asyncio.run(asend_page(dict(sample_event(), dedup_key=""), pagerduty=sender, policy=FAST))
    with pytest.raises(ValueError, match="action"):
        asyncio.run(asend_page(dict(sample_event(), action="acknowledge"), pagerduty=sender, policy=FAST))
    assert pager.requests == []



def test_the_notifier_delivers_a_page_composed_elsewhere(pager, monkeypatch):
    for name, value in conn_env(pager).items():
        monkeypatch.setenv(name, value)
    notifier = FrontierPageNotifier(event=json.dumps(sample_event("resolve")), pagerduty_events_conn_id="pagerduty_test")
    notifier.notify({})
    [sent] = pager.events()
    assert (sent["event_action"], sent["dedup_key"]) == ("resolve", "airflow-upsert/test/orders")
    assert sent["payload"]["custom_details"]["shard"] == "orders"
    with pytest.raises(ValueError, match="event must be a page"):
        FrontierPageNotifier(event=["not", "a", "page"], pagerduty_events_conn_id="pagerduty_test").notify({})
    assert len(pager.requests) == 1

# -- the sensor against a real shard (in this process, poke mode) ------------------------------

# Offsets 0, 10, 20, 30 in p0 and p1; one file of each partition a batch.
SPEC = SampleSpec(records=160, keys=40, partitions=2, segments_per_partition=4, seed=7)
POKE = 0.5
# Stalled after max(2 x 0.5 s, 2 s) = 2 s of pending records and an unmoved upper.
QUICK = dict(cadence_seconds=0.5, stall_multiplier=2, min_stall_seconds=2, window_seconds=600,
             consecutive_breaches=2)


def upsert_env(consensus_url: str, blob_root: str) -> dict[str, str]:
    return {"AIRFLOW_CONN_UPSERT_DEFAULT": json.dumps(
        {"conn_type": "upsert", "extra": {"consensus_url": consensus_url, "blob_root": blob_root}})}


def commit_next(shard) -> int:
    """Bind and commit the next batch with an empty run (no Spark): the frontier moves."""
    ts = shard.state().upper
    assert shard.mint_binding(ts, minted_by="test") is not None
    return shard.compare_and_append(ts, ts + 1, batch(ts, token=f"t{ts}"), epoch=0).upper


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def sensor_context(run_id: str) -> dict[str, Any]:
    ti = SimpleNamespace(dag_id="monitor", run_id=run_id, task_id="watch", map_index=-1, try_number=1,
                         log_url=None)
    return {"ti": ti, "run_id": run_id}


def sensor_observations(consensus, since: float) -> list:
    return [o for o in observations.observation_window(consensus, "orders", since, time.time() + 1)
            if o.observer.startswith("sensor:")]


def test_a_pinned_writer_reporting_success_pages_within_two_pokes_then_resolves_with_the_same_key(
        consensus_url, consensus, blob, tmp_path, pager, monkeypatch):
    for name, value in {**conn_env(pager), **upsert_env(consensus_url, blob.root)}.items():
        monkeypatch.setenv(name, value)
    shard = make_shard(consensus, blob, tmp_path, spec=SPEC, max_files_per_batch=2)
    # The source grew now (all 8 segments landed) and the writer runs but commits nothing.
    source_grew_at = time.time()
    for path in glob.glob(str(tmp_path / "landing" / "*" / "*.jsonl")):
        os.utime(path, (source_grew_at, source_grew_at))

    # A real writer, pinned: its planning finds nothing to bind (the bug-shaped failure), so
    # every run reports success, commits nothing, starts no Spark, and records what it saw.
    pinned_shard = Shard.open(consensus, blob, "orders")
    monkeypatch.setattr(pinned_shard, "mint_binding", lambda *args, **kwargs: None)
    pinned = Writer(pinned_shard, "pinned", spark_factory=lambda: pytest.fail("a pinned writer starts no Spark"))

    def pinned_writer_then_now() -> float:
        # Before every round the pinned writer has run once more, successfully, committing nothing.
        report = pinned.run(max_batches=1)
        assert [r.outcome for r in report.results] == ["nothing_to_do"]
        return time.time()

    def sensor(run_id: str, watch_seconds: float) -> FrontierStallSensor:
        task = FrontierStallSensor(task_id="watch", shard="orders", poke_interval=POKE, watch_seconds=watch_seconds,
                                   pagerduty_events_conn_id="pagerduty_test", slack_webhook_conn_id="slack_test",
                                   namespace="test", **QUICK)
        task.clock = pinned_writer_then_now
        return task

    with pytest.raises(AirflowFailException) as failed:
        sensor("scheduled__1", 60).execute(sensor_context("scheduled__1"))
    detected_at = time.time()
    stall_seconds = StallSettings(**QUICK).stall_seconds
    # Stall time counts from the first look that saw the records pending (the pinned writer's
    # first run), not from the files' mtime. The stall crossed its threshold 2 s after it; the
    # task failed at the second round after that (two breaching rounds in a row), not before
    # the threshold. Rounds are counted, not timed: how long a round takes depends on the machine.
    first_seen = observations.observation_window(consensus, "orders", source_grew_at)[0]
    # 8 segment files pending (offsets 0 to 30 by tens in two partitions), not 62 offsets.
    assert first_seen.observer == "writer:pinned" and (first_seen.lag, first_seen.lag_unit) == (8, "segments")
    rounds = sensor_observations(consensus, source_grew_at)
    assert len([o for o in rounds if o.observed_at >= first_seen.observed_at + stall_seconds]) == 2
    assert detected_at - first_seen.observed_at >= stall_seconds
    message = str(failed.value)
    assert message.startswith(f"shard orders: frontier STALLED; upper 0 stuck since {iso(first_seen.observed_at)} (")
    # A short block, one fact a line, the time behind as people read it.
    lines = message.splitlines()
    assert "last advance never" in lines[0] and re.fullmatch(r"  behind: 8 segments pending, the oldest for (\d+m)?\d+s",
                                                                  lines[1]), lines
    assert lines[2].startswith("  window 10m00s from") and lines[3].startswith("  rule: stalled: source grew")
    assert "writers running and committing nothing: writer:pinned" in message

    [trigger] = pager.events()
    assert trigger["event_action"] == "trigger" and trigger["routing_key"] == INTEGRATION_KEY
    assert trigger["dedup_key"] == dedup_key("orders", "test")
    payload = trigger["payload"]
    assert payload["summary"].startswith("STALLED: orders stuck ") and ", +8 segments / " in payload["summary"]
    assert (payload["component"], payload["group"], payload["severity"]) == ("orders", "test", "critical")
    details = payload["custom_details"]
    assert (details["shard"], details["status"], details["upper"], details["lag"], details["lag_unit"]) == \
        ("orders", "STALLED", 0, 8, "segments")
    assert details["stuck_seconds"] >= stall_seconds and details["lag_seconds"] >= stall_seconds
    assert details["writers_running"] is True and details["run_ids"] == ["scheduled__1"]
    assert details["consecutive_breaches"] == 2 and details["window"]["seconds"] == 600
    slack = pager.slack_messages()[0]["text"]
    assert "STALLED: orders stuck" in slack and "\n• lag: `8 segments pending, the oldest for " in slack
    state, _ = observations.load_alert_state(consensus, "orders")
    assert (state.firing, state.firing_status, state.pages_sent) == (True, "STALLED", 1)

    # The next run: the same incident still breaches; the task fails again, nobody is paged again.
    pager.clear()
    with pytest.raises(AirflowFailException, match="same incident: not paged again"):
        sensor("scheduled__2", 60).execute(sensor_context("scheduled__2"))
    assert pager.requests == []

    # The writer is unpinned: the frontier moves, the page is resolved under the same key.
    assert commit_next(shard) == 1
    result = sensor("scheduled__3", 0).execute(sensor_context("scheduled__3"))
    assert (result["status"], result["action"], result["state"]["firing"]) == ("OK", "resolve", False)
    [resolve] = pager.events()
    assert resolve["event_action"] == "resolve" and resolve["dedup_key"] == trigger["dedup_key"]
    assert resolve["payload"]["summary"] == "RESOLVED: orders frontier moving again (upper 1)"
    assert pager.slack_messages()[0]["text"].startswith(":white_check_mark: *RESOLVED: orders")


def test_an_undelivered_page_rearms_the_alert_and_the_next_round_pages_again(sqlite_url, blob, tmp_path, pager,
                                                                             monkeypatch):
    for name, value in {**conn_env(pager), **upsert_env(sqlite_url, blob.root)}.items():
        monkeypatch.setenv(name, value)
    consensus = open_consensus(sqlite_url)
    try:
        shard = make_shard(consensus, blob, tmp_path, spec=SPEC, max_files_per_batch=2)
        landed = time.time() - 600
        for path in glob.glob(str(tmp_path / "landing" / "*" / "*.jsonl")):
            os.utime(path, (landed, landed))
        # A writer saw the records pending a moment ago (stall time counts from the first look
        # that saw them, not from the files' mtime).
        observations.record_observation(consensus, observations.observe(shard, observer="writer:w",
                                                                        now=time.time() - 5))
        task = FrontierStallSensor(task_id="watch", shard="orders", poke_interval=0.01, watch_seconds=60,
                                   pagerduty_events_conn_id="pagerduty_test", **dict(QUICK, consecutive_breaches=1))
        # The Events API refuses the event (400): not retried, not delivered.
        pager.script([400])
        with pytest.raises(AirflowException) as undelivered:
            task.execute(sensor_context("scheduled__1"))
        assert not isinstance(undelivered.value, AirflowFailException)  # Airflow retries the task
        assert "the trigger was NOT delivered" in str(undelivered.value)
        assert "re-armed" in str(undelivered.value) and INTEGRATION_KEY not in str(undelivered.value)
        assert pager.statuses() == [400]
        # The page stays in the outbox, due again at once.
        state, _ = observations.load_alert_state(consensus, "orders")
        assert (state.firing, state.pages_sent) == (True, 0)  # decided, not delivered
        assert [(e["event"]["action"], e["leased_until"]) for e in state.outbox] == [("trigger", 0.0)]
        # The retry pages at once.
        with pytest.raises(AirflowFailException, match="frontier STALLED"):
            task.execute(sensor_context("scheduled__1"))
        assert pager.statuses() == [400, 202] and pager.events()[0]["event_action"] == "trigger"
        assert observations.load_alert_state(consensus, "orders")[0].outbox == ()
    finally:
        consensus.dispose()


@pytest.fixture
def stalled_orders(sqlite_url, blob, tmp_path, pager, monkeypatch):
    """Shard ``orders`` with records pending since a writer's look 30 s ago, and the upsert,
    PagerDuty and Slack connections set: (consensus, shard, now)."""
    for name, value in {**conn_env(pager), **upsert_env(sqlite_url, blob.root)}.items():
        monkeypatch.setenv(name, value)
    consensus = open_consensus(sqlite_url)
    shard = make_shard(consensus, blob, tmp_path, spec=SPEC, max_files_per_batch=2)
    now = time.time()
    observations.record_observation(consensus, observations.observe(shard, observer="writer:w", now=now - 30))
    yield SimpleNamespace(consensus=consensus, shard=shard, now=now)
    consensus.dispose()


class WorkerKilled(BaseException):
    """The worker dies (SIGKILL, OOM) between the round's decision and the page's delivery."""


def clocked_sensor(at: float, **kwargs: Any) -> FrontierStallSensor:
    """A sensor of shard ``orders`` paging PagerDuty (namespace test), its rounds at ``at``."""
    task = FrontierStallSensor(task_id="watch", shard="orders", poke_interval=0.01,
                               pagerduty_events_conn_id="pagerduty_test", namespace="test",
                               **dict(QUICK, consecutive_breaches=1), **kwargs)
    task.clock = lambda: at
    return task


def die_before_sending(monkeypatch, task: FrontierStallSensor, run_id: str) -> None:
    """Run ``task`` with its worker killed between the round's decision and the delivery."""
    from airflow_upsert_provider.notifications import frontier as notifications

    def killed(*args: Any, **kwargs: Any) -> None:
        raise WorkerKilled()

    with monkeypatch.context() as kill:
        kill.setattr(notifications, "send_page", killed)
        with pytest.raises(WorkerKilled):
            task.execute(sensor_context(run_id))


def test_a_page_decided_by_a_worker_killed_before_sending_it_is_sent_by_a_later_round(stalled_orders, pager,
                                                                                      monkeypatch):
    from airflow_upsert_provider.engine.frontier.alerts import OUTBOX_LEASE_SECONDS

    consensus, shard, now = stalled_orders.consensus, stalled_orders.shard, stalled_orders.now

    def sensor(run_id: str, at: float) -> FrontierStallSensor:
        return clocked_sensor(at, watch_seconds=60)

    die_before_sending(monkeypatch, sensor("scheduled__1", now), "scheduled__1")
    assert pager.requests == []
    state, _ = observations.load_alert_state(consensus, "orders")
    assert state.firing is True

    # A round while the dead worker's lease runs: the page is not sent twice at once.
    with pytest.raises(AirflowFailException, match="same incident"):
        sensor("scheduled__1", now + 1).execute(sensor_context("scheduled__1"))
    assert pager.requests == []

    # The first round after the lease sends it: the incident pages after all, once.
    lease = OUTBOX_LEASE_SECONDS
    with pytest.raises(AirflowFailException) as failed:
        sensor("scheduled__2", now + lease + 1).execute(sensor_context("scheduled__2"))
    assert "its page, decided earlier and left undelivered, is sent now" in str(failed.value)
    [page] = pager.events()
    assert (page["event_action"], page["dedup_key"]) == ("trigger", dedup_key("orders", "test"))
    assert page["payload"]["summary"].startswith("STALLED: orders stuck")
    assert page["payload"]["custom_details"]["run_ids"] == ["scheduled__1"]  # the round that decided it
    assert observations.load_alert_state(consensus, "orders")[0].outbox == ()

    # Delivered: later rounds of the same incident page nobody.
    with pytest.raises(AirflowFailException, match="same incident"):
        sensor("scheduled__3", now + lease + 2).execute(sensor_context("scheduled__3"))
    assert len(pager.requests) == 1


def test_a_resolve_decided_while_a_dead_workers_trigger_is_leased_reaches_pagerduty_after_it(
        stalled_orders, pager, monkeypatch):
    """Issue 34 item 2: a round decides the trigger and dies before sending; the shard catches
    up and a live round decides the resolve. PagerDuty gets the trigger (once its lease ran
    out) and then the resolve, never the resolve first (an incident nothing would resolve)."""
    from airflow_upsert_provider.engine.frontier.alerts import OUTBOX_LEASE_SECONDS

    consensus, shard, now = stalled_orders.consensus, stalled_orders.shard, stalled_orders.now

    def sensor(at: float) -> FrontierStallSensor:
        return clocked_sensor(at, watch_seconds=0, slack_webhook_conn_id="slack_test")

    die_before_sending(monkeypatch, sensor(now), "scheduled__1")
    while commit_next(shard) < 4:  # the writer catches up: nothing pending
        pass
    sensor(now + 1).execute(sensor_context("scheduled__2"))  # decides the resolve: it waits
    assert pager.requests == []
    state, _ = observations.load_alert_state(consensus, "orders")
    assert [(e["event"]["action"], e["taken"]) for e in state.outbox] == [("trigger", True), ("resolve", False)]

    sensor(now + OUTBOX_LEASE_SECONDS + 1).execute(sensor_context("scheduled__3"))
    sensor(now + OUTBOX_LEASE_SECONDS + 2).execute(sensor_context("scheduled__4"))
    assert [e["event_action"] for e in pager.events()] == ["trigger", "resolve"]
    assert {e["dedup_key"] for e in pager.events()} == {dedup_key("orders", "test")}
    slack = [m["text"].split("*")[1] for m in pager.slack_messages()]
    assert slack[0].startswith("STALLED: orders") and slack[1].startswith("RESOLVED: orders")
    assert observations.load_alert_state(consensus, "orders")[0].outbox == ()


def test_a_page_that_reached_pagerduty_is_sent_only_to_slack_when_slack_failed(sqlite_url, blob, tmp_path, pager,
                                                                              monkeypatch):
    """Delivery is recorded per channel: Slack refusing (500 on every attempt) releases the page
    for Slack alone; the next round does not page PagerDuty twice. The sensor's delivery policy
    (six attempts, as the default's, with short waits) decides the attempts."""
    for name, value in {**conn_env(pager), **upsert_env(sqlite_url, blob.root)}.items():
        monkeypatch.setenv(name, value)
    consensus = open_consensus(sqlite_url)
    try:
        shard = make_shard(consensus, blob, tmp_path, spec=SPEC, max_files_per_batch=2)
        observations.record_observation(consensus, observations.observe(shard, observer="writer:w",
                                                                        now=time.time() - 30))
        policy = RetryPolicy(max_attempts=6, base_seconds=0.01, max_wait_seconds=0.05)
        task = FrontierStallSensor(task_id="watch", shard="orders", poke_interval=0.01, watch_seconds=60,
                                   pagerduty_events_conn_id="pagerduty_test", slack_webhook_conn_id="slack_test",
                                   delivery_policy=policy, **dict(QUICK, consecutive_breaches=1))
        pager.script([202] + [500] * 6)  # PagerDuty takes it; Slack fails every attempt
        with pytest.raises(AirflowException) as undelivered:
            task.execute(sensor_context("scheduled__1"))
        assert "not again to pagerduty, which got it" in str(undelivered.value)
        assert "slack: HTTP 500 (after 6 attempts)" in str(undelivered.value)
        # PagerDuty once, then Slack six times (the policy's attempts), each the same message.
        assert [("slack", "enqueue")[r["path"].endswith("/enqueue")] for r in pager.requests] == \
            ["enqueue"] + ["slack"] * 6
        assert pager.statuses() == [202] + [500] * 6
        assert len({json.dumps(r["body"], sort_keys=True) for r in pager.requests[1:]}) == 1
        assert pager.requests[1]["body"]["text"].startswith(":rotating_light: *STALLED: orders")
        state, _ = observations.load_alert_state(consensus, "orders")
        assert [e["delivered"] for e in state.outbox] == [["pagerduty"]]
        with pytest.raises(AirflowFailException, match="frontier STALLED"):
            task.execute(sensor_context("scheduled__1"))
        assert [e["event_action"] for e in pager.events()] == ["trigger"]  # PagerDuty paged once
        assert len(pager.slack_messages()) == 1 and observations.load_alert_state(consensus, "orders")[0].outbox == ()
        assert pager.statuses() == [202] + [500] * 6 + [200]
    finally:
        consensus.dispose()


def test_a_delivery_policy_longer_than_the_outbox_lease_is_refused_where_it_is_given():
    slow = RetryPolicy(max_attempts=20, base_seconds=1.0, max_wait_seconds=300.0)
    with pytest.raises(ValueError, match="FrontierStallSensor 'watch': delivery_policy .* outbox lease"):
        FrontierStallSensor(task_id="watch", shard="orders", delivery_policy=slow)
    with pytest.raises(ValueError, match="FrontierPageNotifier: delivery_policy .* outbox lease"):
        FrontierPageNotifier(event=sample_event(), delivery_policy=slow)
    assert FrontierStallSensor(task_id="watch", shard="orders", delivery_policy=FAST).delivery_policy is FAST


def test_pagerduty_retry_after_is_honoured_up_to_the_cap(pager):
    """Issue 34 (seed N4): a 429's Retry-After sets the wait, capped at the policy's longest wait."""
    sender = PagerDutySender(integration_key=INTEGRATION_KEY, base_url=pager.url)
    policy = RetryPolicy(max_attempts=3, base_seconds=0.01, max_wait_seconds=40.0)
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)

    pager.retry_after = "30"
    pager.script([429])
    asyncio.run(sender.send(sample_event(), policy, sleep))
    pager.retry_after = "3600"
    pager.script([429])
    asyncio.run(sender.send(sample_event(), policy, sleep))
    assert waits == [30.0, 40.0] and pager.statuses() == [429, 202, 429, 202]


def test_bad_settings_and_an_unknown_shard_fail_without_retry_naming_them(sqlite_url, blob, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_UPSERT_DEFAULT", upsert_env(sqlite_url, blob.root)["AIRFLOW_CONN_UPSERT_DEFAULT"])
    with pytest.raises(AirflowFailException, match="window_seconds"):
        FrontierStallSensor(task_id="w", shard="orders", window_seconds=10, min_stall_seconds=60).execute(
            sensor_context("r"))
    with pytest.raises(AirflowFailException, match="consecutive_breaches"):
        FrontierStallSensor(task_id="w", shard="orders", consecutive_breaches="two").execute(sensor_context("r"))
    for silencer in ("soft_fail", "never_fail", "silent_fail"):
        with pytest.raises(ValueError, match=f"{silencer} is not allowed"):
            FrontierStallSensor(task_id="w", shard="orders", **{silencer: True})
    with pytest.raises(AirflowFailException, match="shard 'ordres' does not exist"):
        FrontierStallSensor(task_id="w", shard="ordres", poke_interval=0.01).execute(sensor_context("r"))


# -- the trigger ---------------------------------------------------------------------------------


def test_trigger_round_trips_and_yields_the_page_of_a_real_stalled_shard(sqlite_url, blob, tmp_path, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_UPSERT_DEFAULT", upsert_env(sqlite_url, blob.root)["AIRFLOW_CONN_UPSERT_DEFAULT"])
    consensus = open_consensus(sqlite_url)
    try:
        shard = make_shard(consensus, blob, tmp_path, spec=SPEC, max_files_per_batch=2)
        landed = time.time() - 600
        for path in glob.glob(str(tmp_path / "landing" / "*" / "*.jsonl")):
            os.utime(path, (landed, landed))
        # A writer saw the records pending a moment ago (stall time counts from the first look
        # that saw them, not from the files' mtime).
        observations.record_observation(consensus, observations.observe(shard, observer="writer:w",
                                                                        now=time.time() - 5))
        settings = StallSettings(**QUICK)
        trigger = FrontierTrigger(shard="orders", upsert_conn_id="upsert_default", settings=settings.to_dict(),
                                  observer="sensor:monitor/r1/watch", watch_until=time.time() + 60,
                                  poke_interval=0.01, namespace="test", run_ids=["r1"])
        classpath, kwargs = trigger.serialize()
        assert classpath == "airflow_upsert_provider.triggers.frontier.FrontierTrigger"
        assert json.loads(json.dumps(kwargs)) == kwargs  # what the triggerer stores
        module, name = classpath.rsplit(".", 1)
        rebuilt = getattr(importlib.import_module(module), name)(**kwargs)
        assert rebuilt.serialize() == (classpath, kwargs)

        async def first_event() -> TriggerEvent:
            return await anext(rebuilt.run())

        event = asyncio.run(asyncio.wait_for(first_event(), timeout=30))
        decision = event.payload
        # Two breaching rounds in the trigger (the first only counts), then the page to send.
        assert decision["kind"] == "page" and decision["round"]["action"] == "trigger"
        assert decision["round"]["state"]["consecutive_breaches"] == 2
        assert decision["page"]["dedup_key"] == dedup_key("orders", "test")
        assert decision["page"]["custom_details"]["run_ids"] == ["r1"]
        assert decision["message"].startswith("shard orders: frontier STALLED; upper 0")
        assert len([o for o in sensor_observations(consensus, 0) if o.observer == "sensor:monitor/r1/watch"]) == 2

        # A healthy shard's watch ends with one event when the watch is over.
        assert commit_next(shard) == 1
        quiet = FrontierTrigger(**dict(kwargs, watch_until=time.time() + 0.05))
        ended = asyncio.run(asyncio.wait_for(anext(quiet.run()), timeout=30)).payload
        assert (ended["kind"], ended["round"]["action"], ended["round"]["status"]) == ("resolve", "resolve", "OK")
    finally:
        consensus.dispose()


# -- through Airflow: `airflow dags test` in the shared Airflow home ------------------------------

MODES_DAG = '''
from datetime import datetime

from airflow.sdk import DAG

from airflow_upsert_provider.sensors.frontier import FrontierStallSensor

QUICK = dict(cadence_seconds=0.5, stall_multiplier=2, min_stall_seconds=2, window_seconds=600,
             consecutive_breaches=2, watch_seconds=120, poke_interval=1, namespace="modes",
             pagerduty_events_conn_id="pagerduty_test", slack_webhook_conn_id="slack_test",
             upsert_conn_id="upsert_modes")

with DAG(dag_id="frontier_sensor_modes", schedule=None, start_date=datetime(2026, 1, 1), catchup=False):
    FrontierStallSensor(task_id="poke", shard="in_poke", mode="poke", **QUICK)
    FrontierStallSensor(task_id="reschedule", shard="in_reschedule", mode="reschedule", **QUICK)
    FrontierStallSensor(task_id="deferrable", shard="in_deferrable", deferrable=True, **QUICK)
'''


def stalled_shards(consensus, blob, tmp_path, shard_ids: Iterable[str], *, landed_ago: float = 600,
                   seen_ago: float = 5) -> list:
    """Shards on one source whose records all landed ``landed_ago`` seconds ago and of which
    nothing was ever committed; a writer observed each ``seen_ago`` seconds ago."""
    shards = []
    for i, shard_id in enumerate(shard_ids):
        shards.append(make_shard(consensus, blob, tmp_path, spec=SPEC if i == 0 else None, shard_id=shard_id,
                                 max_files_per_batch=2))
    landed = time.time() - landed_ago
    for path in glob.glob(str(tmp_path / "landing" / "*" / "*.jsonl")):
        os.utime(path, (landed, landed))
    # Stall time counts from the first look that saw the records pending: this one.
    for shard in shards:
        observations.record_observation(consensus, observations.observe(
            shard, observer="writer:w", writer_outcome="nothing_to_do", now=time.time() - seen_ago))
    return shards


@pytest.mark.long_process
def test_the_sensor_pages_in_every_mode_and_the_monitor_dag_pages_only_the_stalled_shard(airflow_home, tmp_path,
                                                                                         pager):
    """Two DAGs, each on a store of its own, run one after the other in one Airflow process (their
    point is what each run does, not a process of its own): the sensor in poke, reschedule and
    deferrable mode, through the `upsert_modes` connection; then the monitor DAG, which lists
    every shard of its store, through `upsert_default`."""
    from tests.conftest import REPO_ROOT

    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "frontier_sensor_modes.py").write_text(MODES_DAG)
    (dags / "upsert_frontier_monitor.py").symlink_to(os.path.join(REPO_ROOT, "dags", "upsert_frontier_monitor.py"))
    modes_url, modes_blob = f"sqlite:///{tmp_path / 'modes.db'}", open_blob(str(tmp_path / "modes-blob"))
    url, blob = f"sqlite:///{tmp_path / 'consensus.db'}", open_blob(str(tmp_path / "blob"))
    for root in (modes_blob, blob):
        root.ensure_root()
    modes_consensus, consensus = open_consensus(modes_url), open_consensus(url)
    try:
        stalled_shards(modes_consensus, modes_blob, tmp_path / "modes", ["in_poke", "in_reschedule", "in_deferrable"])
        _, caught_up = stalled_shards(consensus, blob, tmp_path / "monitor", ["orders", "customers"], seen_ago=300)
        # customers is caught up: everything in its source is committed.
        while sum(caught_up.status().lag_offsets.values()):
            commit_next(caught_up)
        observations.record_observation(consensus, observations.observe(caught_up, observer="writer:w",
                                                                        now=time.time() - 5))
        modes_conn = json.loads(airflow_home.env(modes_url, modes_blob.root)["AIRFLOW_CONN_UPSERT_DEFAULT"])
        env = airflow_home.env(url, blob.root, AIRFLOW__CORE__DAGS_FOLDER=str(dags),
                               AIRFLOW_CONN_UPSERT_MODES=json.dumps(modes_conn), **conn_env(pager))
        conf = {"cadence_seconds": 60, "min_stall_seconds": 120, "window_seconds": 3600, "consecutive_breaches": 1,
                "watch_seconds": 0, "namespace": "prod", "pagerduty_conn_id": "pagerduty_test",
                "slack_conn_id": "slack_test"}
        with airflow_home.dags_test_process(env) as airflow:
            proc = airflow.dags_test("frontier_sensor_modes")
            assert_sensor_modes_paged(airflow_home, modes_consensus, pager, proc)
            sent_before = len(pager.events())
            proc = airflow.dags_test("upsert_frontier_monitor", conf=conf)
        assert_monitor_paged_only_the_stalled_shard(airflow_home, pager.events()[sent_before:], proc)
    finally:
        modes_consensus.dispose()
        consensus.dispose()


def assert_sensor_modes_paged(airflow_home, consensus, pager: PagerServer, proc) -> None:
    run_id = airflow_home.latest_run("frontier_sensor_modes")
    for task_id in ("poke", "reschedule", "deferrable"):
        # Failed on its page, without retry.
        assert airflow_home.task_instance("frontier_sensor_modes", run_id, task_id) == ("failed", 1), \
            failure_text(proc)
    pages = {e["payload"]["component"]: e for e in pager.events()}
    assert sorted(pages) == ["in_deferrable", "in_poke", "in_reschedule"]
    for shard_id, page in pages.items():
        assert page["event_action"] == "trigger" and page["dedup_key"] == dedup_key(shard_id, "modes")
        details = page["payload"]["custom_details"]
        assert (details["status"], details["upper"], details["lag"], details["lag_unit"]) == \
            ("STALLED", 0, 8, "segments")
        assert details["run_ids"] == [run_id] and details["consecutive_breaches"] == 2
        # Two rounds each (the first breach only counts), observed under the task's identity.
        mine = [o for o in observations.observation_window(consensus, shard_id, 0, time.time() + 1)
                if o.observer == f"sensor:frontier_sensor_modes/{run_id}/{shard_id[3:]}"]
        assert len(mine) == 2, (shard_id, [o.observer for o in mine])
    output = proc.stdout + proc.stderr
    for task_id in ("in_poke", "in_reschedule", "in_deferrable"):
        assert f"shard {task_id}: frontier STALLED; upper 0 stuck since" in output
    assert INTEGRATION_KEY not in output and "webhook-secret" not in output
    assert len(pager.slack_messages()) == 3
    # The reschedule mode did give its slot back between its pokes.
    assert airflow_home.query(
        "SELECT count(*) FROM task_reschedule tr JOIN task_instance ti ON tr.ti_id = ti.id "
        "WHERE ti.dag_id = ? AND ti.task_id = 'reschedule'", "frontier_sensor_modes")[0][0] >= 1


def assert_monitor_paged_only_the_stalled_shard(airflow_home, pages: list[dict], proc) -> None:
    run_id = airflow_home.latest_run("upsert_frontier_monitor")
    assert airflow_home.task_instance("upsert_frontier_monitor", run_id, "shards") == ("success", 1), \
        failure_text(proc)
    assert airflow_home.task_instance("upsert_frontier_monitor", run_id, "prune_history") == ("success", 1), \
        failure_text(proc)
    states = dict(airflow_home.query(
        "SELECT map_index, state FROM task_instance WHERE dag_id = ? AND run_id = ? AND task_id = 'watch'",
        "upsert_frontier_monitor", run_id))
    # The store lists shards by id: customers (0), orders (1).
    assert states == {0: "success", 1: "failed"}, failure_text(proc)
    [page] = pages
    assert page["dedup_key"] == dedup_key("orders", "prod") and page["payload"]["group"] == "prod"
    assert page["payload"]["custom_details"]["status"] == "STALLED"
    rows = airflow_home.query(
        "SELECT value FROM xcom WHERE dag_id = ? AND run_id = ? AND task_id = 'watch' AND map_index = 0 "
        "AND key = 'return_value'", "upsert_frontier_monitor", run_id)
    watched = json.loads(rows[0][0])
    # It caught up within the window: the upper moved, nothing is pending.
    assert (watched["shard"], watched["status"], watched["action"]) == ("customers", "OK", None)
    assert (watched["evaluation"]["lag"], watched["evaluation"]["lag_unit"]) == (0, "segments")
    assert watched["state"]["firing"] is False


BLIND_DAG = '''
from datetime import datetime

from airflow.sdk import DAG

from airflow_upsert_provider.sensors.frontier import FrontierStallSensor

with DAG(dag_id="frontier_blind_record", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
         default_args={"retries": 0}):
    # One evaluation a run; the first that fails pages.
    FrontierStallSensor(task_id="watch", shard="orders", mode="poke", watch_seconds=0, poke_interval=1,
                        blind_page_seconds=0, namespace="blind", pagerduty_events_conn_id="pagerduty_test")
'''


@pytest.mark.long_process
def test_a_monitor_page_sent_while_the_store_refused_every_write_is_resolved_by_the_next_run(
        airflow_home, tmp_path, pager, pg_server, pg_url):
    """Issue 34 item 3: a run whose store refuses every write (a PostgreSQL database set read-only)
    pages "monitor blind" and can record it nowhere in the store; it is kept in an Airflow
    Variable named by the page's dedup key, and the next run's first working round resolves it."""
    import psycopg

    from airflow_upsert_provider.engine.frontier.blind import MONITOR_KEY

    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "frontier_blind_record.py").write_text(BLIND_DAG)
    blob = open_blob(str(tmp_path / "blob"))
    blob.ensure_root()
    consensus = open_consensus(pg_url)
    database = pg_url.rsplit("/", 1)[1]

    def read_only(on: bool) -> None:
        with psycopg.connect(pg_server.url(), autocommit=True) as conn:
            conn.execute(f'ALTER DATABASE "{database}" SET default_transaction_read_only = {"on" if on else "off"}')

    key = dedup_key("orders" + MONITOR_KEY, "blind")

    def recorded() -> list[str]:
        # Its value is encrypted with the home's Fernet key; its name is what the on-call engineer sees.
        return [row[0] for row in airflow_home.query("SELECT key FROM variable WHERE key LIKE ?",
                                                     "airflow-upsert-monitor-blind:%")]

    try:
        shard = make_shard(consensus, blob, tmp_path, spec=SPEC, max_files_per_batch=2)
        while commit_next(shard) < 4:  # caught up: nothing pending, the shard itself is healthy
            pass
        env = airflow_home.env(pg_url, blob.root, AIRFLOW__CORE__DAGS_FOLDER=str(dags), **conn_env(pager))

        # Both runs in one Airflow process: their point is what the first left recorded, not a process.
        with airflow_home.dags_test_process(env) as airflow:
            read_only(True)
            proc = airflow.dags_test("frontier_blind_record")
            first = airflow_home.latest_run("frontier_blind_record")
            assert airflow_home.task_instance("frontier_blind_record", first, "watch") == ("failed", 1), \
                failure_text(proc)
            [trigger] = pager.events()
            assert (trigger["event_action"], trigger["dedup_key"]) == ("trigger", key)
            assert "read-only transaction" in trigger["payload"]["summary"], trigger["payload"]["summary"]
            # The store took nothing; Airflow keeps the sent page.
            assert observations.load_alert_state(consensus, "orders")[0].blind is None
            assert recorded() == ["airflow-upsert-monitor-blind:blind:orders"], failure_text(proc)

            read_only(False)
            proc = airflow.dags_test("frontier_blind_record")
            second = airflow_home.latest_run("frontier_blind_record")
        assert second != first
        assert airflow_home.task_instance("frontier_blind_record", second, "watch") == ("success", 1), \
            failure_text(proc)
        assert [(e["event_action"], e["dedup_key"]) for e in pager.events()] == [("trigger", key), ("resolve", key)]
        assert pager.events()[1]["payload"]["summary"] == "RESOLVED: the frontier monitor evaluates shard orders again"
        assert recorded() == []
        state, _ = observations.load_alert_state(consensus, "orders")
        assert (state.blind, state.outbox) == (None, ())
    finally:
        read_only(False)
        consensus.dispose()


def test_a_monitor_that_cannot_evaluate_pages_under_its_own_key_and_resolves_when_it_can_again(
        sqlite_url, blob, tmp_path, pager, monkeypatch):
    from airflow_upsert_provider.engine.frontier.blind import MONITOR_KEY

    password = "monitor-db-pw-never-shown"
    down = json.dumps({"conn_type": "upsert", "password": password, "extra": {
        "consensus_url": "postgresql://monitor@127.0.0.1:1/upsert", "blob_root": blob.root}})
    up = upsert_env(sqlite_url, blob.root)["AIRFLOW_CONN_UPSERT_DEFAULT"]
    for name, value in conn_env(pager).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AIRFLOW_CONN_UPSERT_DEFAULT", down)  # the consensus store is down
    consensus = open_consensus(sqlite_url)
    try:
        make_shard(consensus, blob, tmp_path, spec=SPEC, max_files_per_batch=2)
        start = time.time()
        attempts: list[float] = []

        def clock() -> float:
            # Each evaluation attempt is 10 s after the previous one. Once the monitor's page is
            # out, the store comes back.
            if pager.events():
                monkeypatch.setenv("AIRFLOW_CONN_UPSERT_DEFAULT", up)
            attempts.append(start + 10 * len(attempts))
            return attempts[-1]

        task = FrontierStallSensor(task_id="watch", shard="orders", poke_interval=0.01, watch_seconds=600,
                                   pagerduty_events_conn_id="pagerduty_test", namespace="test",
                                   blind_page_seconds=30, **QUICK)
        task.clock = clock
        result = task.poke(sensor_context("scheduled__1"))
        assert result.is_done is False and result.xcom_value["shard"] == "orders"

        trigger, resolve = pager.events()
        key = dedup_key("orders" + MONITOR_KEY, "test")  # one monitor page per namespace and shard
        assert (trigger["event_action"], trigger["dedup_key"]) == ("trigger", key)
        assert (resolve["event_action"], resolve["dedup_key"]) == ("resolve", key)
        assert key != dedup_key("orders", "test")
        # Its resolve went through the outbox, which is empty again; nothing open is left recorded.
        state, _ = observations.load_alert_state(consensus, "orders")
        assert (state.outbox, state.blind) == ((), None)
        # Paged at the attempt 30 s after the first failure (the fourth), not before.
        assert len(attempts) == 5
        details = trigger["payload"]["custom_details"]
        assert (details["status"], details["failing_seconds"], details["limit_seconds"]) == ("MONITOR_BLIND", 30, 30)
        assert trigger["payload"]["summary"].startswith(
            "MONITOR BLIND: cannot evaluate shard orders for 30s: ConsensusUnavailable: cannot reach consensus store")
        assert trigger["payload"]["severity"] == "critical"
        assert resolve["payload"]["summary"] == "RESOLVED: the frontier monitor evaluates shard orders again"
        assert password not in json.dumps(pager.requests)
        # The round that worked is a real one: it observed the shard.
        assert [(o.observer, o.observed_at) for o in observations.observation_window(consensus, "orders", 0)] == \
            [("sensor:monitor/scheduled__1/watch", attempts[-1])]
    finally:
        consensus.dispose()


def test_the_trigger_pages_when_it_cannot_evaluate_and_resolves_when_it_can(sqlite_url, blob, tmp_path,
                                                                            monkeypatch):
    from airflow_upsert_provider.engine.frontier.blind import MONITOR_KEY

    down = json.dumps({"conn_type": "upsert", "extra": {
        "consensus_url": "postgresql://monitor@127.0.0.1:1/upsert", "blob_root": blob.root}})
    monkeypatch.setenv("AIRFLOW_CONN_UPSERT_DEFAULT", down)
    consensus = open_consensus(sqlite_url)
    try:
        make_shard(consensus, blob, tmp_path, spec=SPEC, max_files_per_batch=2)
        kwargs = dict(shard="orders", upsert_conn_id="upsert_default", settings=StallSettings(**QUICK).to_dict(),
                      observer="sensor:monitor/r1/watch", watch_until=time.time() + 600, poke_interval=0.01,
                      namespace="test", blind_limit=0.0)

        def first_event(trigger: FrontierTrigger) -> dict:
            return asyncio.run(asyncio.wait_for(anext(trigger.run()), timeout=60)).payload

        blind = first_event(FrontierTrigger(**kwargs))
        assert blind["kind"] == "blind" and blind["blind"]["paged"] is True
        key = dedup_key("orders" + MONITOR_KEY, "test")
        assert (blind["page"]["action"], blind["page"]["dedup_key"]) == ("trigger", key)
        assert "ConsensusUnavailable: cannot reach consensus store" in blind["message"]
        json.dumps(blind)  # what the triggerer hands the worker

        monkeypatch.setenv("AIRFLOW_CONN_UPSERT_DEFAULT", upsert_env(sqlite_url, blob.root)["AIRFLOW_CONN_UPSERT_DEFAULT"])
        back = first_event(FrontierTrigger(**dict(kwargs, blind=blind["blind"])))
        # The round that works queues the resolve in the outbox: the worker delivers it with its pages.
        assert back["kind"] == "watch" and back["round"]["shard"] == "orders"
        assert [(p["event"]["action"], p["event"]["dedup_key"]) for p in back["pages"]] == [("resolve", key)]
    finally:
        consensus.dispose()


def test_the_monitor_dag_pages_on_its_last_try_when_the_store_cannot_be_listed(pager, monkeypatch):
    import importlib.util

    from airflow_upsert_provider.engine.errors import ConsensusUnavailable
    from airflow_upsert_provider.engine.frontier.blind import MONITOR_KEY
    from tests.conftest import REPO_ROOT

    for name, value in conn_env(pager).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AIRFLOW_CONN_UPSERT_DEFAULT", json.dumps({"conn_type": "upsert", "extra": {
        "consensus_url": "postgresql://monitor@127.0.0.1:1/upsert", "blob_root": "/nonexistent"}}))
    spec = importlib.util.spec_from_file_location("monitor_dag", os.path.join(REPO_ROOT, "dags",
                                                                             "upsert_frontier_monitor.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    list_shards = module.dag.get_task("shards").python_callable
    params = {"shards": [], "namespace": "prod", "pagerduty_conn_id": "pagerduty_test", "slack_conn_id": ""}
    started = SimpleNamespace(start_date=datetime.fromtimestamp(time.time() - 130, tz=timezone.utc))
    # Tries before the last: the failure only, Airflow retries.
    with pytest.raises(ConsensusUnavailable):
        list_shards(params=params, ti=SimpleNamespace(try_number=1), dag_run=started)
    assert pager.requests == []
    # The last try: the monitor's own page, then the failure.
    with pytest.raises(ConsensusUnavailable):
        list_shards(params=params, ti=SimpleNamespace(try_number=module.LIST_RETRIES + 1), dag_run=started)
    [page] = pager.events()
    assert (page["event_action"], page["dedup_key"]) == ("trigger", dedup_key(MONITOR_KEY, "prod"))
    assert page["payload"]["summary"].startswith(
        "MONITOR BLIND: cannot evaluate its shards for 2m: ConsensusUnavailable: cannot reach consensus store")
