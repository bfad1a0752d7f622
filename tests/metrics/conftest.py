"""Fixtures of the metrics tests."""

from __future__ import annotations

import pytest

from tests.metrics.statsd_listener import StatsdListener


@pytest.fixture
def listener():
    """A StatsD server on loopback for one test."""
    server = StatsdListener()
    yield server
    server.close()
