"""A StatsD server on loopback for tests: a UDP socket that keeps every line it receives."""

from __future__ import annotations

import socket
import threading


class StatsdListener:
    """Binds 127.0.0.1 on a free UDP port; ``lines()`` are the StatsD lines received so far,
    ``parsed()`` the same as (name, {tag: value}, value, type)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                data = self.sock.recv(65535)
            except OSError:
                return  # closed
            with self._lock:
                self._lines.extend(line for line in data.decode().split("\n") if line)

    def drain(self, marker: str, timeout: float = 30.0) -> list[str]:
        """Every line received once a line containing ``marker`` arrived (sent by the test
        itself after the code under test, UDP order on loopback being send order)."""
        probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        probe.sendto(f"{marker}:1|c".encode(), ("127.0.0.1", self.port))
        probe.close()
        done = threading.Event()
        for _ in range(int(timeout * 100)):
            with self._lock:
                if any(marker in line for line in self._lines):
                    done.set()
                    lines = [line for line in self._lines if marker not in line]
                    self._lines.clear()
                    return lines
            done.wait(0.01)
        raise AssertionError(f"the listener got no {marker!r} within {timeout}s")

    def close(self) -> None:
        self.sock.close()


def parse_line(line: str) -> tuple[str, dict[str, str], float, str]:
    """``name,k=v,...:value|type`` (InfluxDB tags) as (name, tags, value, type)."""
    head, _, rest = line.partition(":")
    value, _, kind = rest.partition("|")
    name, *tags = head.split(",")
    return name, dict(t.split("=", 1) for t in tags), float(value), kind
