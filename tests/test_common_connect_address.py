"""Spark Connect addresses are read and written in one place (engine/common/connect_address.py)."""

from __future__ import annotations

import pytest

from airflow_upsert_provider.engine.common import connect_address
from airflow_upsert_provider.engine.common.connect_address import (
    display_remote,
    named_session_id,
    parse_endpoint,
    parse_remote,
    with_session_id,
)
from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.engine.spark import server, session


def test_the_server_and_the_session_use_the_one_parser() -> None:
    assert server.parse_remote is parse_remote and server.display_remote is display_remote
    assert session.with_session_id is with_session_id and session.named_session_id is named_session_id
    assert server.DEFAULT_PORT == connect_address.DEFAULT_PORT == 15002


def test_an_address_is_shown_without_its_parameters() -> None:
    assert display_remote("sc://h:1/;token=secret;session_id=S") == "sc://h:1"
    assert display_remote("sc://[::1]:15002/;token=secret") == "sc://[::1]:15002"
    assert display_remote("http://h:1/;token=secret") == "sc://?"
    assert parse_remote("sc://h") == ("h", 15002)


def test_a_malformed_address_names_the_remote_option_without_its_token() -> None:
    with pytest.raises(ConfigurationError) as err:
        parse_remote("sc://h:port;token=secret")
    assert err.value.details["field"] == "remote"
    assert "secret" not in str(err.value)


def test_the_session_parameter_is_read_and_replaced_keeping_the_others() -> None:
    assert named_session_id("sc://h:1/;token=t;session_id=S") == "S"
    assert named_session_id("sc://h:1") is None and named_session_id("sc://h:1/;session_id=") is None
    assert with_session_id("sc://h:1/;session_id=old;token=t", "N") == "sc://h:1/;token=t;session_id=N"


def test_an_endpoint_splits_into_host_and_port() -> None:
    assert parse_endpoint("[::1]:15002") == ("::1", "15002")
    assert parse_endpoint("h") == ("h", "")
    assert parse_endpoint("h", default_port=15002) == ("h", "15002")
