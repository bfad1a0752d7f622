"""The alert state keeps the settings its monitor evaluated with and when a page was last sent;
rows written before these fields were kept still load (pure: no store)."""

from __future__ import annotations

from airflow_upsert_provider.engine.frontier.alerts import (
    DEFAULT_SETTINGS_NOTE,
    AlertState,
    advance_alert,
    enqueue_page,
    judging_settings,
    settle_pages,
)
from airflow_upsert_provider.engine.frontier.model import Evaluation, FrontierStatus, StallSettings

MONITOR = StallSettings(cadence_seconds=300, min_stall_seconds=900, window_seconds=3600)


def _evaluation(status: FrontierStatus = FrontierStatus.OK, breach: bool = False) -> Evaluation:
    return Evaluation(shard_id="orders", status=status, rule="r", reasons=(), evaluated_at=1000.0, upper=3,
                      last_advance_at=990.0, stuck_seconds=None, lag=0, lag_unit=None, lag_seconds=None, window={},
                      writers_running=None, breach=breach, severity=None, thresholds={})


def test_advancing_keeps_the_settings_evaluated_with_and_the_page_reads_them_back():
    state, _ = advance_alert(AlertState("orders"), _evaluation(), MONITOR)
    assert state.settings == MONITOR.to_dict()
    stored = AlertState.from_dict(state.to_dict())
    assert stored == state
    assert judging_settings(stored) == (MONITOR, None)


def test_a_row_written_before_the_settings_were_kept_loads_and_is_judged_with_the_defaults_saying_so():
    old_row = {"shard_id": "orders", "consecutive_breaches": 1, "firing": True, "firing_status": "STALLED",
               "incident_started_at": 900.0, "max_upper": 3, "max_high_watermark": {"p0": 10},
               "last_status": "STALLED", "last_evaluated_at": 950.0, "pages_sent": 1, "outbox": []}
    state = AlertState.from_dict(old_row)
    assert (state.settings, state.evaluated_by, state.last_sent_at) == (None, None, None)
    assert state.firing and state.incident_started_at == 900.0
    assert judging_settings(state) == (StallSettings(), DEFAULT_SETTINGS_NOTE)


def test_settings_a_newer_version_recorded_are_read_without_its_new_fields_and_unreadable_ones_fall_back():
    newer = AlertState("orders", settings={**MONITOR.to_dict(), "a_later_field": 7})
    assert judging_settings(newer) == (MONITOR, None)
    broken = AlertState("orders", settings={**MONITOR.to_dict(), "window_seconds": 10})
    settings, note = judging_settings(broken)
    assert settings == StallSettings() and "window_seconds" in note and "default thresholds" in note


def test_a_delivery_to_a_channel_records_when_a_page_was_last_sent():
    state, _ = enqueue_page(AlertState("orders"), {"action": "trigger"}, "p1")
    assert settle_pages(state, delivered=["p1"]).last_sent_at is None  # only logged: not sent
    assert settle_pages(state, released=["p1"], sent_at=50.0).last_sent_at is None  # not delivered
    sent = settle_pages(state, delivered=["p1"], sent_at=50.0)
    assert (sent.last_sent_at, sent.outbox) == (50.0, ())
    assert settle_pages(sent, delivered=["p1"], sent_at=60.0).last_sent_at == 50.0  # nothing new delivered


def test_pages_sent_counts_only_triggers_that_reached_a_channel_and_says_why_none_did():
    state, _ = enqueue_page(AlertState("orders"), {"action": "trigger", "dedup_key": "k"}, "p1")
    logged = settle_pages(state, delivered=["p1"], unsent_reason="no PagerDuty or Slack connection is configured")
    assert (logged.pages_sent, logged.last_sent_at, logged.unsent_reason) == \
        (0, None, "no PagerDuty or Slack connection is configured")
    failed = settle_pages(state, released=["p1"], sent_at=50.0)
    assert (failed.pages_sent, failed.last_sent_at) == (0, None)
    sent = settle_pages(state, delivered=["p1"], sent_at=50.0)
    assert (sent.pages_sent, sent.last_sent_at, sent.unsent_reason) == (1, 50.0, None)
    resolve, _ = enqueue_page(sent, {"action": "resolve", "dedup_key": "k"}, "p2")
    assert settle_pages(resolve, delivered=["p2"], sent_at=60.0).pages_sent == 1  # a resolve is not a page
    assert AlertState.from_dict(logged.to_dict()) == logged
