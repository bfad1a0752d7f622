"""Frontier-stall paging from Airflow: the page sender, the trigger, the sensor in its three modes.

Pages go to a loopback HTTP server standing in for the PagerDuty Events API and a Slack
webhook: it records what was sent and answers from a script of status codes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from airflow_upsert_provider.notifications.frontier import (
    PageDeliveryError,
    PagerDutySender,
    RetryPolicy,
    SlackSender,
    asend_page,
)

INTEGRATION_KEY = "R0UT1NGKEY-secret-0123456789abcdef"
WEBHOOK_TOKEN = "/services/T000/B000/webhook-secret-xyz"
FAST = RetryPolicy(max_attempts=4, base_seconds=0.01, max_wait_seconds=0.05)


class PagerServer:
    """Loopback stand-in for the Events API (``/v2/enqueue``) and a Slack webhook (any other path)."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self._script: list[int] = []
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
                    self.send_header("Retry-After", "0")
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
    sender = SlackSender("slack_test")

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
