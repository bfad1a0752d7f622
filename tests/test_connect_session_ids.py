"""The shared Spark Connect session's id and the address parameters that name a session:
pure functions, no server."""

from __future__ import annotations

import uuid

from airflow_upsert_provider.engine.spark import (
    SHARED_SESSION_WINDOW_SECONDS,
    named_session_id,
    shared_session_id,
    with_session_id,
)


def test_one_shared_session_per_window():
    start = 1_800_000_000 - 1_800_000_000 % SHARED_SESSION_WINDOW_SECONDS
    inside = {shared_session_id(start + s) for s in (0, 1, SHARED_SESSION_WINDOW_SECONDS - 1)}
    assert len(inside) == 1
    following = shared_session_id(start + SHARED_SESSION_WINDOW_SECONDS)
    assert following not in inside
    # Spark's client accepts only a UUID of version 4 as a session id.
    assert uuid.UUID(following).version == 4 and str(uuid.UUID(following)) == following


def test_the_session_named_by_an_address():
    assert named_session_id("sc://h:15002") is None
    assert named_session_id("sc://h:15002/;token=t") is None
    assert named_session_id("sc://h:15002/;session_id=") is None
    assert named_session_id("sc://h:15002/;token=t;session_id=abc") == "abc"


def test_naming_a_session_keeps_the_other_parameters():
    assert with_session_id("sc://h:1", "S") == "sc://h:1/;session_id=S"
    assert with_session_id("sc://h:1/", "S") == "sc://h:1/;session_id=S"
    assert with_session_id("sc://h:1/;token=t;session_id=old", "S") == "sc://h:1/;token=t;session_id=S"
    assert with_session_id("sc://[::1]:1/;token=t", "S") == "sc://[::1]:1/;token=t;session_id=S"
    assert named_session_id(with_session_id("sc://h:1/;token=t", "S")) == "S"
