"""A fault-injecting HTTP proxy on a loopback port, in front of the S3 test server.

Clients reach it through ``AWS_ENDPOINT_URL`` as they would the server (buckets addressed by
path, plain HTTP). A test sets its faults deterministically, before the requests they hit:

- ``fail(method, key, times=n, status=503)``: answer the next ``n`` matching requests with an
  S3 error (500 ``InternalError``, 503 ``ServiceUnavailable``) without forwarding them;
- ``throttle(method, key, times=n)``: answer with 503 ``SlowDown``, S3's throttling;
- ``cut_request(...)``: read the request's headers and half its body, then drop the connection
  (nothing is forwarded: the server never sees it);
- ``cut_response(...)``: forward the request, send the server's status, headers and half its
  body, then drop the connection;
- ``hold(method, key)``: keep the next matching request until the test calls ``release()``
  on the returned :class:`Hold` (``arrived`` is set when it is held), then forward it;
- ``store_aws_chunked(key)``: forward matching PUTs whose body is in ``aws-chunked`` framing
  (the AWS SDK's streaming upload with a trailing checksum) as a plain body that still holds
  the framing and the trailer, as s3rver stores them: the object differs from what was written.

A rule matches a request by method (None: any) and a regular expression searched in its object
key (``query`` likewise in its query string: ``query="list-type=2"`` matches listings). Every
request is recorded as ``(method, key, status)``: the status answered, or ``"cut"``.
"""

from __future__ import annotations

import http.client
import re
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

# Headers of one connection, not of the request or response they travel with.
HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade",
              "expect"}
# Request headers that announce an aws-chunked body (dropped by ``store_aws_chunked``).
AWS_CHUNKED_HEADERS = {"content-encoding", "x-amz-decoded-content-length", "x-amz-trailer", "x-amz-content-sha256"}
ERROR_CODES = {500: "InternalError", 503: "ServiceUnavailable"}
# A hold that nobody releases ends with the test, not never.
HOLD_LIMIT_SECONDS = 120


@dataclass(frozen=True)
class Request:
    method: str
    bucket: str
    key: str
    query: str
    status: int | str


@dataclass
class Hold:
    arrived: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)

    def release(self) -> None:
        self.released.set()


@dataclass
class Rule:
    method: str | None
    key: str
    query: str
    times: int
    action: str  # "error", "cut_request", "cut_response", "hold", "store_aws_chunked"
    status: int = 503
    code: str = ""
    hold: Hold | None = None
    body: str | None = None
    skip: int = 0  # matching requests let through before the rule takes any

    def matches(self, method: str, key: str, query: str, body: bytes | None) -> bool:
        if self.body is not None and (body is None or re.search(self.body, body.decode("latin-1")) is None):
            return False
        return (self.times > 0 and (self.method is None or self.method == method)
                and re.search(self.key, key) is not None and re.search(self.query, query) is not None)


class S3FaultProxy:
    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self._lock = threading.Lock()
        self._rules: list[Rule] = []
        self._requests: list[Request] = []
        self._server: ThreadingHTTPServer | None = None
        self.endpoint = ""

    # -- faults ---------------------------------------------------------------------------------

    def fail(self, method: str | None, key: str = "", *, times: int = 1, status: int = 503, code: str = "",
             query: str = "", body: str | None = None, skip: int = 0) -> None:
        """``body``: a regular expression the request's body must hold too (the keys of a
        batched DELETE are in its body). ``skip``: let that many matching requests through first."""
        self._add(Rule(method, key, query, times, "error", status, code or ERROR_CODES.get(status, "InternalError"),
                       body=body, skip=skip))

    def throttle(self, method: str | None, key: str = "", *, times: int = 1, query: str = "") -> None:
        self._add(Rule(method, key, query, times, "error", 503, "SlowDown"))

    def cut_request(self, method: str | None, key: str = "", *, times: int = 1, query: str = "") -> None:
        self._add(Rule(method, key, query, times, "cut_request"))

    def cut_response(self, method: str | None, key: str = "", *, times: int = 1, query: str = "") -> None:
        self._add(Rule(method, key, query, times, "cut_response"))

    def hold(self, method: str | None, key: str = "", *, query: str = "") -> Hold:
        hold = Hold()
        self._add(Rule(method, key, query, 1, "hold", hold=hold))
        return hold

    def store_aws_chunked(self, key: str = "", *, times: int = 1_000_000) -> None:
        self._add(Rule("PUT", key, "", times, "store_aws_chunked"))

    def clear(self) -> None:
        """Drop every fault not spent yet, and release every hold."""
        with self._lock:
            for rule in self._rules:
                if rule.hold is not None:
                    rule.hold.release()
            self._rules.clear()

    def _add(self, rule: Rule) -> None:
        with self._lock:
            self._rules.append(rule)

    def _take(self, method: str, key: str, query: str, body: bytes | None) -> Rule | None:
        """The first rule matching the request, spending one of its times. Without ``body``
        (not read yet), rules on the body are passed over."""
        with self._lock:
            for rule in self._rules:
                # Once the body is read, only rules on the body are left to match.
                if (body is None or rule.body is not None) and rule.matches(method, key, query, body):
                    if rule.skip:
                        rule.skip -= 1
                        continue
                    rule.times -= 1
                    return rule
        return None

    # -- the record -----------------------------------------------------------------------------

    def requests(self) -> list[Request]:
        with self._lock:
            return list(self._requests)

    def _record(self, request: Request) -> None:
        with self._lock:
            self._requests.append(request)

    # -- the server -----------------------------------------------------------------------------

    def start(self) -> "S3FaultProxy":
        proxy = self

        class Handler(_Handler):
            owner = proxy

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        host, port = self._server.server_address[:2]
        self.endpoint = f"http://{host}:{port}"
        threading.Thread(target=self._server.serve_forever, name="s3-fault-proxy", daemon=True).start()
        return self

    def stop(self) -> None:
        self.clear()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


class _Handler(BaseHTTPRequestHandler):
    owner: S3FaultProxy
    # Keep-alive, as the S3 clients expect; a cut connection is closed.
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base class's name
        pass

    def do_GET(self) -> None:
        self._proxy()

    do_PUT = do_POST = do_DELETE = do_HEAD = do_GET

    def _proxy(self) -> None:
        parts = urlsplit(self.path)
        bucket, _, key = parts.path.lstrip("/").partition("/")
        bucket, key, query = unquote(bucket), unquote(key), parts.query
        method = self.command

        def record(status: int | str) -> None:
            self.owner._record(Request(method, bucket, key, query, status))

        rule = self.owner._take(method, key, query, None)
        if rule is not None and rule.action == "cut_request":
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length // 2)
            record("cut")
            self._drop()
            return
        body = self._body()
        if rule is None:
            rule = self.owner._take(method, key, query, body)
        if rule is not None and rule.action == "error":
            record(rule.status)
            self._error(rule.status, rule.code, f"/{bucket}/{key}")
            return
        if rule is not None and rule.action == "hold":
            assert rule.hold is not None
            rule.hold.arrived.set()
            rule.hold.released.wait(HOLD_LIMIT_SECONDS)
        framed = rule is not None and rule.action == "store_aws_chunked"
        status, headers, data = self._forward(method, body, framed=framed)
        if rule is not None and rule.action == "cut_response":
            record("cut")
            self.send_response_only(status)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self._drop()
            return
        record(status)
        self.send_response_only(status)
        for name, value in headers:
            self.send_header(name, value)
        if method == "HEAD":
            if self._upstream_length is not None:
                self.send_header("Content-Length", self._upstream_length)
        else:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if method != "HEAD":
            self.wfile.write(data)
        self.wfile.flush()

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _forward(self, method: str, body: bytes, *, framed: bool = False) -> tuple[int, list[tuple[str, str]], bytes]:
        connection = http.client.HTTPConnection(*self.owner.upstream, timeout=60)
        try:
            headers = {name: value for name, value in self.headers.items() if name.lower() not in HOP_BY_HOP}
            if framed and "aws-chunked" in self.headers.get("Content-Encoding", ""):
                # What tells the server the body is framed goes; the framed bytes stay.
                headers = {name: value for name, value in headers.items()
                           if name.lower() not in AWS_CHUNKED_HEADERS}
                headers["x-amz-content-sha256"] = "UNSIGNED-PAYLOAD"
            if body or "Content-Length" in self.headers:
                headers["Content-Length"] = str(len(body))
            connection.request(method, self.path, body=body or None, headers=headers)
            response = connection.getresponse()
            data = response.read()
            self._upstream_length = response.getheader("Content-Length")
            kept = [(name, value) for name, value in response.getheaders()
                    if name.lower() not in HOP_BY_HOP and name.lower() != "content-length"]
            return response.status, kept, data
        finally:
            connection.close()

    def _error(self, status: int, code: str, resource: str) -> None:
        body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                f"<Message>injected by the test proxy</Message><Resource>{resource}</Resource>"
                "<RequestId>fault-proxy</RequestId></Error>").encode()
        self.send_response_only(status)
        self.send_header("Content-Type", "application/xml")
        if self.command == "HEAD":
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        self.wfile.flush()

    def _drop(self) -> None:
        self.close_connection = True
        self.wfile.flush()
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
