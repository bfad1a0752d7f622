"""Durations and timestamps, parsed and formatted in one place (engine/common/time_text.py)."""

from __future__ import annotations

import pytest

from airflow_upsert_provider.cli import output
from airflow_upsert_provider.engine.common.time_text import (
    format_duration,
    format_duration_to_the_second,
    format_timestamp,
    parse_duration,
)
from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.engine.frontier import rules
from airflow_upsert_provider.sensors import frontier_rounds

AT = 1764115200.4  # 2025-11-26T00:00:00.4Z


@pytest.mark.parametrize("seconds, text", [(None, "unknown"), (0, "0s"), (59.4, "59s"), (160, "2m40s"),
                                           (3725, "1h02m05s"), (2 * 86400 + 5, "48h00m05s")])
def test_a_duration_to_the_second(seconds: float | None, text: str) -> None:
    assert format_duration_to_the_second(seconds) == text


def test_durations_beyond_pendulums_range_are_still_formatted() -> None:
    assert format_duration(1e15) == "11574074074d01h"
    assert format_duration_to_the_second(1e15) == "277777777777h46m40s"


def test_a_timestamp_is_utc_with_its_offset() -> None:
    assert format_timestamp(AT) == "2025-11-26T00:00:00+00:00"
    assert format_timestamp(AT, zulu=True) == "2025-11-26T00:00:00Z"
    assert format_timestamp(None) == "never"
    assert format_timestamp(None, missing=None) is None


def test_every_caller_formats_through_the_one_module() -> None:
    assert rules.format_duration is format_duration
    assert rules._iso(AT) == output.iso(AT) == "2025-11-26T00:00:00+00:00"
    assert rules._iso(None) is None and output.iso(None) == "never"
    assert frontier_rounds._iso(AT) == "2025-11-26T00:00:00Z" and frontier_rounds._iso(None) == "never"


def test_a_page_shows_the_stuck_time_to_the_second() -> None:
    text = frontier_rounds.describe_breach({"shard_id": "orders", "status": "STALLED", "upper": 7,
                                             "stuck_seconds": 160, "last_advance_at": AT})
    assert "stuck since 2025-11-26T00:00:00Z (2m40s; last advance 2025-11-26T00:00:00Z)" in text


def test_a_duration_names_its_field_when_it_is_not_one() -> None:
    assert parse_duration("1h30m") == 5400.0
    with pytest.raises(ConfigurationError, match="--for: '5x' is not a duration") as err:
        parse_duration("5x", field="--for")
    assert err.value.details["field"] == "--for"


def test_a_measured_time_reads_to_the_tenth_then_to_the_second() -> None:
    from airflow_upsert_provider.engine.common.time_text import format_seconds

    assert [format_seconds(s) for s in (0.04, 1.234, 59.94, 59.96, 160.4, 3725, None)] == [
        "0.0s", "1.2s", "59.9s", "1m00s", "2m40s", "1h02m05s", "unknown"]
