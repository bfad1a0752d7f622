"""The connection list's Test button, made to work for the ``upsert`` connection type.

Airflow 3.3.2's connection list posts a row's fields to ``POST /api/v2/connections/test`` with
``port: Number(connection.port)``, which is ``0`` for a connection without a port; the route
compares that with the stored port (none) and answers 400 "The host or port to test differs
from the stored connection" for every such connection (apache/airflow#73298). No form
declaration avoids it: the list sends the port whatever the form hides.

An upsert connection has no port (its form hides the field; the consensus URL names host and
port), so a port of 0 in a test request of that type can only be the list's rendering of
"none": a root middleware of the api-server drops it from the body before the route reads it.
Nothing else is changed, and requests of any other connection type pass through untouched.
Remove once the pinned Airflow carries the upstream fix.
"""

from __future__ import annotations

import json
from typing import Any, Awaitable, Callable

UPSERT_CONN_TYPE = "upsert"
TEST_ROUTE_SUFFIX = "/api/v2/connections/test"
# A test request is a connection's fields: far below this. A bigger body passes untouched.
MAX_BODY_BYTES = 1024 * 1024

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def corrected_test_body(body: bytes) -> bytes | None:
    """The body to pass on instead of ``body`` (a connection test request), or None to pass
    it unchanged: an ``upsert`` connection's request without its ``port`` when that is 0."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(data, dict) or data.get("conn_type") != UPSERT_CONN_TYPE:
        return None
    port = data.get("port")
    # bool is an int in Python: only a JSON number 0 is the list's "no port".
    if "port" not in data or type(port) is not int or port != 0:
        return None
    del data["port"]
    return json.dumps(data).encode("utf-8")


def is_connection_test(scope: Scope) -> bool:
    return (scope.get("type") == "http" and scope.get("method") == "POST"
            and str(scope.get("path", "")).rstrip("/").endswith(TEST_ROUTE_SUFFIX))


class UpsertConnectionTestPort:
    """ASGI middleware: applies :func:`corrected_test_body` to connection test requests."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not is_connection_test(scope):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        messages: list[Message] = []
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break  # the client went away: the route sees it as it would have
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if not message.get("more_body", False) or size > MAX_BODY_BYTES:
                break
        corrected = None
        if messages[-1]["type"] == "http.request" and not messages[-1].get("more_body", False):
            corrected = corrected_test_body(b"".join(chunks))
        if corrected is not None:
            messages = [{"type": "http.request", "body": corrected, "more_body": False}]
            scope = dict(scope, headers=[(k, v) for k, v in scope.get("headers", []) if k.lower() != b"content-length"]
                         + [(b"content-length", str(len(corrected)).encode())])
        replay = iter(messages)

        async def replayed() -> Message:
            for message in replay:
                return message
            return await receive()

        await self.app(scope, replayed, send)
