"""The frontier-stall decisions of engine/frontier (rules, alerts, pages, blind) as pure functions
(invariant 15).

Windows of observations go in; the status, the rule, whether it pages and how loudly come
out. No store, no Spark: the store shell and the sensor have their own tests."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.engine.common.time_text import format_duration
from airflow_upsert_provider.engine.frontier.alerts import AlertState, advance_alert
from airflow_upsert_provider.engine.frontier.model import Evaluation, FrontierStatus, Observation, StallSettings
from airflow_upsert_provider.engine.frontier.pages import dedup_key, page_event
from airflow_upsert_provider.engine.frontier.rules import evaluate
from airflow_upsert_provider.engine.store.stream_rules import Status

NOW = 1_800_000_000.0
SHARD = "orders"
SENSOR = "sensor:upsert_frontier_monitor/scheduled__1/watch"
WRITER = "writer:w1"
SETTINGS = StallSettings()  # window 900s, cadence 60s, stall after max(3 x 60s, 300s) = 300s, stale after 120s


def obs(t: float, upper: int, bound: int, hw: int, **overrides: Any) -> Observation:
    """One observation of a one-partition source: lag from the high watermark and the bound."""
    fields: dict[str, Any] = dict(
        shard_id=SHARD, observed_at=t, upper=upper, last_commit_at=None,
        high_watermark={"p0": hw}, bound={"p0": bound}, stream_status="READY", stream_changed_at=0.0,
        lag=max(0, hw - bound), lag_unit="records", lag_seconds=None, observer=SENSOR,
    )
    fields.update(overrides)
    return Observation(**fields)


def series(rows: list[tuple], *, step: float = 60.0, end: float = NOW, commit_before: float = 3600.0,
           **common: Any) -> list[Observation]:
    """Observations every ``step`` seconds ending at ``end``; a row is (upper, bound, hw) or
    (upper, bound, hw, {overrides}). The upper's commit time is ``commit_before`` seconds
    before the first sample, or 5 seconds before the sample where it moved."""
    start = end - step * (len(rows) - 1)
    out: list[Observation] = []
    committed_at = start - commit_before
    for i, row in enumerate(rows):
        upper, bound, hw = row[:3]
        t = start + i * step
        if out and upper != out[-1].upper:
            committed_at = t - 5
        fields = {"last_commit_at": committed_at, **common, **(row[3] if len(row) > 3 else {})}
        out.append(obs(t, upper, bound, hw, **fields))
    return out


def fresh() -> AlertState:
    return AlertState(SHARD)


# --- windows ----------------------------------------------------------------------------------

# The #36860 shape: the upper stays at 42 for the whole window while the source grows.
STUCK_GROWING = series([(42, 1000, 1000 + 400 * (i + 1)) for i in range(15)])

# Burrow #290: one sample inside the stall reads zero lag (a survey glitch); the stall is still there.
ZERO_LAG_INSIDE = series([(42, 1000, 1000 + 400 * (i + 1), {"lag": 0} if i == 7 else {})
                          for i in range(15)])
ZERO_LAG_NEWEST = series([(42, 1000, 1000 + 400 * (i + 1), {"lag": 0} if i == 14 else {})
                          for i in range(15)])

# A slow consumer: the upper advances every minute, the lag grows over the window, one dip in the middle.
SLOW_LAGS = [100, 200, 300, 400, 500, 600, 700, 20, 900, 1000, 1100, 1200, 1300, 1400, 1500]
SLOW_CONSUMER = series([(10 + i, 1000 * i, 1000 * i + lag) for i, lag in enumerate(SLOW_LAGS)])

# A healthy writer seen at random phases: the lag rises between batches and drops at each commit.
SAWTOOTH_LAGS = [0, 120, 30, 110, 10, 130, 0, 90, 40, 120, 5, 100, 60, 20, 110]
HEALTHY = series([(10 + i, 1000 * i, 1000 * i + lag) for i, lag in enumerate(SAWTOOTH_LAGS)])

# Nothing new in the source for hours; the upper is at the high watermark.
IDLE_FOR_HOURS = series([(42, 1000, 1000)] * 15, commit_before=4 * 3600)


def resumed_after_idle(grew_seconds_ago: float, *, dated: bool = True) -> list[Observation]:
    """Idle for hours, then the source grows ``grew_seconds_ago`` before NOW; the upper has not moved.
    ``dated``: the observations carry lag_seconds (age of the first unbound segment)."""
    grew_at = NOW - grew_seconds_ago
    rows = []
    for i in range(15):
        t = NOW - 60 * (14 - i)
        if t < grew_at:
            rows.append((42, 1000, 1000))
        else:
            extra = {"lag_seconds": t - grew_at} if dated else {}
            rows.append((42, 1000, 1000 + 10 * int(t - grew_at) + 10, extra))
    return series(rows, commit_before=4 * 3600)


def stopped(status: str, held_seconds: float) -> list[Observation]:
    """A stream STOPPED (or RECOVERING) for ``held_seconds``, its upper stuck while the source grows."""
    return series([(42, 1000, 1000 + 400 * i) for i in range(15)],
                  stream_status=status, stream_changed_at=NOW - held_seconds)


def writers_idle(outcome: str = "nothing_to_do") -> list[Observation]:
    """STUCK_GROWING where every other sample is a writer reporting a step that committed nothing."""
    return [replace(o, observer=WRITER, writer_outcome=outcome) if i % 2 else o
            for i, o in enumerate(STUCK_GROWING)]


REWOUND_UPPER_IN_WINDOW = series([(50, 5000, 5000)] * 7 + [(40, 4000, 5000)] * 8)

CASES: dict[str, tuple[list[Observation], dict[str, Any]]] = {
    # name: (window, evaluate kwargs) -> expectation in EXPECTED
    "stalled, source growing": (STUCK_GROWING, {}),
    "burrow 290: zero-lag sample inside the stall": (ZERO_LAG_INSIDE, {}),
    "zero-lag newest sample inside the stall": (ZERO_LAG_NEWEST, {}),
    "slow consumer": (SLOW_CONSUMER, {}),
    "slow consumer, page_on_lagging": (SLOW_CONSUMER, {"settings": StallSettings(page_on_lagging=True)}),
    "healthy saw-tooth": (HEALTHY, {}),
    "lag seconds above the objective": (
        series([(10 + i, 1000 * i, 1000 * i + 50, {"lag_seconds": 700.0}) for i in range(15)]),
        {"settings": StallSettings(lag_seconds_objective=600)}),
    "idle for hours": (IDLE_FOR_HOURS, {}),
    "stopped": (stopped("STOPPED", 7200), {}),
    "stopped as a Status enum": (stopped(Status.STOPPED, 7200), {}),
    "stopped within max_stopped_seconds": (stopped("STOPPED", 600),
                                           {"settings": StallSettings(max_stopped_seconds=3600)}),
    "stopped beyond max_stopped_seconds": (stopped("STOPPED", 7200),
                                           {"settings": StallSettings(max_stopped_seconds=3600)}),
    "recovering": (stopped("RECOVERING", 7200), {}),
    "recovering beyond max_stopped_seconds": (stopped("RECOVERING", 7200),
                                              {"settings": StallSettings(max_stopped_seconds=3600)}),
    "stopping stream stuck (the stop never finalized)": (stopped("STOPPING", 7200), {}),
    "stopped with stale observations": ([replace(o, observed_at=o.observed_at - 300) for o in stopped("STOPPED", 9000)],
                                        {}),
    "resumed after idle, grew 130s ago": (resumed_after_idle(130), {}),
    "resumed after idle, grew 130s ago, undated": (resumed_after_idle(130, dated=False), {}),
    "resumed after idle, grew 400s ago": (resumed_after_idle(400), {}),
    "resumed after idle, grew 400s ago, undated": (resumed_after_idle(400, dated=False), {}),
    "upper rewound below the state's maximum": (series([(40, 4000, 5000)] * 15),
                                                {"state": replace(fresh(), max_upper=50)}),
    "upper rewound inside the window": (REWOUND_UPPER_IN_WINDOW, {}),
    "upper regained its maximum": (series([(40 + i, 4000 + 100 * i, 6000) for i in range(15)]),
                                   {"state": replace(fresh(), max_upper=50)}),
    "source reset": (series([(40, 50, 100)] * 15), {"state": replace(fresh(), max_high_watermark={"p0": 5000})}),
    "source not yet back at its maximum": (series([(40, 4000, 4999)] * 15),
                                           {"state": replace(fresh(), max_high_watermark={"p0": 5000})}),
    "source back at its maximum": (series([(40, 5000, 5000)] * 15),
                                   {"state": replace(fresh(), max_high_watermark={"p0": 5000})}),
    "rewound and stuck": (STUCK_GROWING, {"state": replace(fresh(), max_upper=60)}),
    "stale: newest too old": (STUCK_GROWING[:-3], {}),
    "stale beats rewound": (STUCK_GROWING[:-3], {"state": replace(fresh(), max_upper=60)}),
    "stale: custom limit": (STUCK_GROWING[:-1], {"settings": StallSettings(stale_after_seconds=30)}),
    "stale: one sample only": (STUCK_GROWING[-1:], {}),
    "stale: no sample": ([], {}),
    "stale: samples older than the window ignored": (series([(42, 1000, 1000)] * 5, end=NOW - 1000) + STUCK_GROWING[-1:],
                                                     {}),
    "not found": ([], {"shard_exists": False}),
    "writers running, committing nothing": (writers_idle(), {}),
}

# name: (status, breach, severity, phrase in the rule, phrase in the reasons)
EXPECTED: dict[str, tuple[FrontierStatus, bool, str | None, str, str]] = {
    "stalled, source growing": (FrontierStatus.STALLED, True, "critical", "stalled: source grew, upper unmoved for 14m",
                                "no writer observed"),
    "burrow 290: zero-lag sample inside the stall": (FrontierStatus.STALLED, True, "critical", "unmoved for 14m",
                                                     "zero-lag sample(s) inside the stall ignored"),
    "zero-lag newest sample inside the stall": (FrontierStatus.STALLED, True, "critical", "unmoved for 14m",
                                                "zero-lag"),
    "slow consumer": (FrontierStatus.LAGGING, False, None, "lag trend", "grew over the window from 100 to 1,500"),
    "slow consumer, page_on_lagging": (FrontierStatus.LAGGING, True, "warning", "lag trend", "from 100 to 1,500"),
    "healthy saw-tooth": (FrontierStatus.OK, False, None, "ok", "upper 24"),
    "lag seconds above the objective": (FrontierStatus.LAGGING, False, None, "objective 600s", "waits 11m"),
    "idle for hours": (FrontierStatus.IDLE, False, None, "idle", "high watermark"),
    "stopped": (FrontierStatus.STOPPED, False, None, "never pages", "STOPPED since"),
    "stopped as a Status enum": (FrontierStatus.STOPPED, False, None, "never pages", "STOPPED since"),
    "stopped within max_stopped_seconds": (FrontierStatus.STOPPED, False, None, "10m <= max_stopped_seconds", "10m"),
    "stopped beyond max_stopped_seconds": (FrontierStatus.STOPPED, True, "warning",
                                           "stopped too long: 2h00m > max_stopped_seconds 3600s", "resume"),
    "recovering": (FrontierStatus.RECOVERING, False, None, "never pages", "RECOVERING since"),
    "recovering beyond max_stopped_seconds": (FrontierStatus.RECOVERING, True, "warning", "recovering too long",
                                              "finish the recovery"),
    "stopping stream stuck (the stop never finalized)": (FrontierStatus.STALLED, True, "critical", "stalled",
                                                         "has not moved"),
    "stopped with stale observations": (FrontierStatus.STOPPED, False, None, "stopped", "STOPPED"),
    "resumed after idle, grew 130s ago": (FrontierStatus.OK, False, None, "pending for 2m10s", "records pending at this upper for 2m10s"),
    "resumed after idle, grew 130s ago, undated": (FrontierStatus.OK, False, None, "pending for", "records pending at this upper for"),
    "resumed after idle, grew 400s ago": (FrontierStatus.STALLED, True, "critical", "unmoved for 6m", "the oldest waiting 6m40s"),
    "resumed after idle, grew 400s ago, undated": (FrontierStatus.STALLED, True, "critical", "unmoved for 6m",
                                                   "has not moved for 6m"),
    "upper rewound below the state's maximum": (FrontierStatus.REWOUND, True, "critical", "upper 40 < 50",
                                                "integrity alarm"),
    "upper rewound inside the window": (FrontierStatus.REWOUND, True, "critical", "upper 40 < 50", "integrity alarm"),
    "upper regained its maximum": (FrontierStatus.OK, False, None, "ok", "upper 54"),
    "source reset": (FrontierStatus.REWOUND, True, "critical", "high watermark of p0", "source reset"),
    "source not yet back at its maximum": (FrontierStatus.REWOUND, True, "critical", "high watermark", "source reset"),
    "source back at its maximum": (FrontierStatus.IDLE, False, None, "idle", "high watermark"),
    "rewound and stuck": (FrontierStatus.REWOUND, True, "critical", "upper 42 < 60", "integrity alarm"),
    "stale: newest too old": (FrontierStatus.STALE, True, "critical", "newest observation 3m old > 120s", "3m old"),
    "stale beats rewound": (FrontierStatus.STALE, True, "critical", "stale", "nothing is observing"),
    "stale: custom limit": (FrontierStatus.STALE, True, "critical", "> 30s", "1m old"),
    "stale: one sample only": (FrontierStatus.STALE, True, "critical", "1 observation in the window", "a trend needs two"),
    "stale: no sample": (FrontierStatus.STALE, True, "critical", "no observation", "nothing observes it"),
    "stale: samples older than the window ignored": (FrontierStatus.STALE, True, "critical", "1 observation",
                                                     "only one observation"),
    "not found": (FrontierStatus.NOT_FOUND, False, None, "not found", "does not exist"),
    "writers running, committing nothing": (FrontierStatus.STALLED, True, "critical", "stalled",
                                            "writers running and committing nothing: writer:w1 reported nothing_to_do x7"),
}


def run(window: list[Observation], settings: StallSettings = SETTINGS, state: AlertState | None = None,
        now: float = NOW, shard_exists: bool = True) -> Evaluation:
    return evaluate(SHARD, window, settings, now, state or fresh(), shard_exists=shard_exists)


@pytest.mark.parametrize("name", list(CASES))
def test_status_rule_breach_severity(name: str) -> None:
    window, kwargs = CASES[name]
    status, breach, severity, rule_phrase, reason_phrase = EXPECTED[name]
    e = run(window, **kwargs)
    assert (e.status, e.breach, e.severity) == (status, breach, severity), (e.rule, e.reasons)
    assert rule_phrase in e.rule, e.rule
    assert any(reason_phrase in r for r in e.reasons), e.reasons
    assert e.shard_id == SHARD and e.evaluated_at == NOW
    json.dumps(e.to_dict())  # the evaluation travels as JSON (XCom, pages, CLI)


def test_every_case_has_an_expectation() -> None:
    assert set(CASES) == set(EXPECTED)


def test_stalled_numbers_are_what_the_page_needs() -> None:
    e = run(STUCK_GROWING)
    assert e.upper == 42
    assert e.stuck_seconds == 840  # from the first sample that saw records pending
    assert (e.lag, e.lag_unit) == (6000, "records")
    assert e.last_advance_at == NOW - 840 - 3600
    assert e.writers_running is False
    assert e.window == {"start": NOW - 900, "end": NOW, "samples": 15, "seconds": 900.0,
                        "first_sample_at": NOW - 840, "last_sample_at": NOW}
    assert e.thresholds["stall_seconds"] == 300 and e.thresholds["stall_started_at"] == NOW - 840


def test_writers_running_vs_no_writer_observed() -> None:
    running = run(writers_idle())
    silent = run(STUCK_GROWING)
    assert running.writers_running is True and silent.writers_running is False
    assert not any("no writer observed" in r for r in running.reasons)
    assert not any("writers running" in r for r in silent.reasons)
    # A writer seen only before the window's stall began is not "running"; the reason says when it was last seen.
    early = [replace(o, observer=WRITER, writer_outcome="committed") if i == 0 else o
             for i, o in enumerate(resumed_after_idle(400))]
    e = run(early)
    assert e.status is FrontierStatus.STALLED and e.writers_running is False
    assert any("last writer observation 14m before the newest, by writer:w1" in r for r in e.reasons), e.reasons


def test_resume_after_idle_counts_from_when_the_source_grew() -> None:
    # Burrow #303/#338: the upper last moved 4 hours ago, but it had no reason to move while idle.
    for grew, status in [(60, FrontierStatus.OK), (299, FrontierStatus.OK), (300, FrontierStatus.STALLED),
                         (480, FrontierStatus.STALLED)]:
        e = run(resumed_after_idle(grew))
        assert e.status is status, (grew, e.rule)
        if status is FrontierStatus.STALLED:
            assert e.stuck_seconds == pytest.approx(grew)


def test_stall_threshold_follows_the_settings() -> None:
    # max(k * cadence, min_stall): with cadence 300s the threshold is 900s, so 14m is not yet a stall.
    slow_cadence = StallSettings(cadence_seconds=300, window_seconds=1800)
    assert run(STUCK_GROWING, slow_cadence).status is FrontierStatus.OK
    quick = StallSettings(cadence_seconds=10, min_stall_seconds=0, stall_multiplier=2)
    window = series([(42, 1000, 1000 + 10 * i) for i in range(5)], step=7)  # pending for 28s >= 20s
    e = run(window, quick)
    assert e.status is FrontierStatus.STALLED and "max(2 x 10s, 0s) = 20s" in e.rule


@pytest.mark.parametrize("settings", [
    StallSettings(stale_after_seconds=30),
    StallSettings(max_stopped_seconds=60),
])
def test_order_stopped_before_stale_and_stall(settings: StallSettings) -> None:
    # A stream stopped by a human whose upper is stuck is STOPPED, never STALLED; whatever the settings.
    e = run(stopped("STOPPED", 30), settings)
    assert e.status is FrontierStatus.STOPPED and not e.breach


# --- alerting ---------------------------------------------------------------------------------

STALLED_EVAL = run(STUCK_GROWING)
OK_EVAL = run(HEALTHY)
T, R, N = "trigger", "resolve", None


@pytest.mark.parametrize("sequence, consecutive, actions", [
    # fires only after two consecutive breaching evaluations, once per incident
    ("OSSSSO", 2, [N, N, T, N, N, R]),
    # a breach interrupted before the second evaluation never pages
    ("SOSOSO", 2, [N] * 6),
    # a new incident after a resolve triggers again
    ("SSOSSS", 2, [N, T, R, N, T, N]),
    ("SOS", 1, [T, R, T]),
    ("SSSS", 3, [N, N, T, N]),
])
def test_advance_alert_sequences(sequence: str, consecutive: int, actions: list[str | None]) -> None:
    settings = StallSettings(consecutive_breaches=consecutive)
    state = fresh()
    got = []
    for i, letter in enumerate(sequence):
        e = replace(STALLED_EVAL if letter == "S" else OK_EVAL, evaluated_at=NOW + 60 * i)
        state, action = advance_alert(state, e, settings)
        got.append(action)
        # the state is persisted as JSON between evaluations
        state = AlertState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert got == actions
    assert state.pages_sent == 0  # counted when a page reaches a channel (settle_pages), not when decided


def test_alert_state_fields_through_an_incident() -> None:
    state, action = advance_alert(fresh(), replace(STALLED_EVAL, evaluated_at=NOW), SETTINGS)
    assert action is None and state.consecutive_breaches == 1 and state.incident_started_at == NOW
    state, action = advance_alert(state, replace(STALLED_EVAL, evaluated_at=NOW + 60), SETTINGS)
    assert action == "trigger"
    assert (state.firing, state.firing_status, state.incident_started_at, state.pages_sent) == (True, "STALLED", NOW, 0)
    assert (state.last_status, state.last_evaluated_at, state.max_upper) == ("STALLED", NOW + 60, 42)
    assert state.max_high_watermark == {"p0": 7000}
    state, action = advance_alert(state, replace(OK_EVAL, evaluated_at=NOW + 120), SETTINGS)
    assert action == "resolve"
    assert (state.firing, state.firing_status, state.incident_started_at, state.consecutive_breaches) == \
           (False, None, None, 0)
    assert state.max_upper == 42  # OK_EVAL's uppers are lower: maxima never go down
    assert AlertState.from_dict(state.to_dict()) == state


def test_rewound_stays_until_the_maximum_is_regained() -> None:
    state = fresh()
    state, _ = advance_alert(state, run(series([(50, 5000, 5000)] * 15)), SETTINGS)
    assert state.max_upper == 50
    # the observations of upper 50 have left the window; only the persisted state remembers them
    state = AlertState.from_dict(json.loads(json.dumps(state.to_dict())))
    actions = []
    for rows in ([(40, 4000, 5000)] * 15, [(45, 4500, 5000)] * 15, [(50, 5000, 5000)] * 15):
        e = run(series(rows), state=state)
        state, action = advance_alert(state, e, SETTINGS)
        actions.append((e.status, action))
    assert actions == [(FrontierStatus.REWOUND, None), (FrontierStatus.REWOUND, "trigger"),
                       (FrontierStatus.IDLE, "resolve")]


def test_advance_alert_refuses_another_shards_evaluation() -> None:
    with pytest.raises(ConfigurationError) as err:
        advance_alert(AlertState("payments"), STALLED_EVAL, SETTINGS)
    assert err.value.details["field"] == "shard_id"


# --- pages ------------------------------------------------------------------------------------

def test_dedup_key_is_stable_per_shard() -> None:
    keys = {dedup_key(SHARD, "prod")}
    keys.add(dedup_key(run(STUCK_GROWING).shard_id, "prod"))
    keys.add(dedup_key(run(HEALTHY, now=NOW).shard_id, "prod"))
    assert keys == {"airflow-upsert/prod/orders"}
    assert dedup_key(SHARD) != dedup_key(SHARD, "prod") != dedup_key("payments", "prod")
    long_key = dedup_key("s" * 400, "prod")
    assert len(long_key) <= 255 and long_key == dedup_key("s" * 400, "prod") != dedup_key("s" * 399 + "t", "prod")


def stalled_14m_behind_5210() -> Evaluation:
    window = series([(42, 1000, 1000 + 5210 - 14 + i) for i in range(15)])
    return run(window)


def test_page_event_trigger() -> None:
    e = stalled_14m_behind_5210()
    state, action = advance_alert(advance_alert(fresh(), e, SETTINGS)[0], e, SETTINGS)
    assert action == "trigger"
    event = page_event(e, state, action, SETTINGS, namespace="prod",
                       links=[{"href": "http://airflow/dags/x", "text": "writer DAG"}], run_ids=["scheduled__1"])
    assert event["summary"] == "STALLED: orders stuck 14m, +5,210 records behind"
    assert (event["action"], event["severity"], event["source"], event["component"], event["group"]) == \
           ("trigger", "critical", "airflow-upsert-provider", SHARD, "prod")
    assert event["dedup_key"] == dedup_key(SHARD, "prod")
    assert event["links"] == [{"href": "http://airflow/dags/x", "text": "writer DAG"}]
    details = event["custom_details"]
    assert {"shard", "status", "rule", "reasons", "upper", "last_advance", "stuck_seconds", "lag",
            "lag_unit", "lag_seconds", "window", "thresholds", "consecutive_breaches", "writers_running",
            "run_ids"} <= set(details)
    assert (details["shard"], details["status"], details["upper"], details["stuck_seconds"], details["lag"],
            details["lag_unit"]) == (SHARD, "STALLED", 42, 840, 5210, "records")
    assert details["last_advance"] == "2027-01-15T06:46:00+00:00"  # NOW (08:00:00) - 840 - 3600
    assert details["consecutive_breaches"] == 2 and details["run_ids"] == ["scheduled__1"]
    assert details["writers_running"] is False and details["thresholds"]["stall_seconds"] == 300
    assert details["rule"] == e.rule and details["reasons"] == list(e.reasons)
    json.dumps(event)


def test_page_event_summary_carries_lag_seconds_when_measured() -> None:
    e = run(resumed_after_idle(480))
    event = page_event(e, fresh(), "trigger", SETTINGS)
    assert event["summary"] == f"STALLED: orders stuck 8m, +{e.lag:,} records / 8m00s behind"
    assert event["group"] is None


def test_page_event_resolve_has_the_same_key() -> None:
    settings = StallSettings(consecutive_breaches=1)
    state, action = advance_alert(fresh(), STALLED_EVAL, settings)
    trigger = page_event(STALLED_EVAL, state, action, settings, namespace="prod")
    moving = run(series([(40 + i, 1000 * i, 1000 * i) for i in range(3)]))
    state, action = advance_alert(state, moving, settings)
    assert action == "resolve"
    resolve = page_event(moving, state, action, settings, namespace="prod")
    assert resolve["dedup_key"] == trigger["dedup_key"]
    assert resolve["summary"] == "RESOLVED: orders frontier moving again (upper 42)"
    assert resolve["action"] == "resolve"


def test_page_event_summary_is_bounded() -> None:
    shard = "x" * 3000
    e = replace(STALLED_EVAL, shard_id=shard)
    event = page_event(e, AlertState(shard), "trigger", SETTINGS)
    assert len(event["summary"]) < 1024 and event["summary"].startswith("STALLED: xxx")


@pytest.mark.parametrize("window, state, phrase", [
    (series([(40, 4000, 5000)] * 15), replace(fresh(), max_upper=50), "REWOUND: orders upper 40, maximum seen 50"),
    (STUCK_GROWING[:-3], fresh(), "STALE: orders not observed"),
    (stopped("STOPPED", 7200), fresh(), "STOPPED: orders stopped for 2h00m (upper 42)"),
])
def test_page_event_summaries(window: list[Observation], state: AlertState, phrase: str) -> None:
    settings = StallSettings(max_stopped_seconds=3600)
    e = run(window, settings, state)
    assert e.breach
    assert page_event(e, state, "trigger", settings)["summary"].startswith(phrase)


def test_page_event_refuses_an_unknown_action() -> None:
    with pytest.raises(ConfigurationError) as err:
        page_event(STALLED_EVAL, fresh(), "acknowledge", SETTINGS)
    assert err.value.details["field"] == "action"


# --- settings and serialization ---------------------------------------------------------------

@pytest.mark.parametrize("kwargs, field", [
    ({"window_seconds": 0}, "window_seconds"),
    ({"window_seconds": -5}, "window_seconds"),
    ({"window_seconds": 120}, "window_seconds"),  # shorter than the 300s stall threshold
    ({"cadence_seconds": 0}, "cadence_seconds"),
    ({"cadence_seconds": float("nan")}, "cadence_seconds"),
    ({"cadence_seconds": "60"}, "cadence_seconds"),
    ({"stall_multiplier": -1}, "stall_multiplier"),
    ({"min_stall_seconds": -1}, "min_stall_seconds"),
    ({"stale_after_seconds": 0}, "stale_after_seconds"),
    ({"lag_seconds_objective": -1}, "lag_seconds_objective"),
    ({"max_stopped_seconds": float("inf")}, "max_stopped_seconds"),
    ({"page_on_lagging": "yes"}, "page_on_lagging"),
    ({"consecutive_breaches": 0}, "consecutive_breaches"),
    ({"consecutive_breaches": 1.5}, "consecutive_breaches"),
    ({"consecutive_breaches": True}, "consecutive_breaches"),
])
def test_settings_errors_name_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        StallSettings(**kwargs)
    assert err.value.details["field"] == field
    assert field in str(err.value)


def test_settings_round_trip_and_unknown_field() -> None:
    s = StallSettings(window_seconds=600, cadence_seconds=5, min_stall_seconds=10, page_on_lagging=True)
    assert StallSettings.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    with pytest.raises(ConfigurationError) as err:
        StallSettings.from_dict({"windows_seconds": 60})
    assert err.value.details["field"] == "windows_seconds"


def test_observation_round_trip() -> None:
    o = obs(NOW, 42, 1000, 1500, stream_status=Status.STOPPING, lag_seconds=12.5, observer=WRITER,
            writer_outcome="nothing_to_do", last_commit_at=NOW - 30)
    d = json.loads(json.dumps(o.to_dict()))
    assert d["stream_status"] == "STOPPING"
    back = Observation.from_dict(d)
    assert back == replace(o, stream_status="STOPPING")
    missing = {k: v for k, v in d.items() if k != "upper"}
    with pytest.raises(ConfigurationError) as err:
        Observation.from_dict(missing)
    assert err.value.details["field"] == "upper"


def test_evaluation_round_trip() -> None:
    e = run(STUCK_GROWING)
    assert Evaluation.from_dict(json.loads(json.dumps(e.to_dict()))) == e


def test_a_window_of_another_shard_is_refused() -> None:
    with pytest.raises(ConfigurationError) as err:
        evaluate("payments", STUCK_GROWING, SETTINGS, NOW, AlertState("payments"))
    assert err.value.details["field"] == "window"


@pytest.mark.parametrize("seconds, text", [(None, "unknown"), (0, "0s"), (59.4, "59s"), (840, "14m"),
                                           (7500, "2h05m"), (3 * 86400 + 4 * 3600, "3d04h")])
def test_format_duration(seconds: float | None, text: str) -> None:
    assert format_duration(seconds) == text


# --- edges ------------------------------------------------------------------------------------

def test_a_race_between_observers_is_not_a_rewind_a_lasting_one_is() -> None:
    # A writer's observation stamped 2s before the sensor's read the store after a commit the
    # sensor's read missed: 43 then 42. One evaluation later the lower upper has lasted: REWOUND.
    window = series([(42, 4200, 4200)] * 14) + [obs(NOW - 2, 43, 4300, 4300, observer=WRITER, writer_outcome="committed")]
    window.append(obs(NOW, 42, 4200, 4300))
    window.sort(key=lambda o: o.observed_at)
    first = run(window)
    assert first.status is not FrontierStatus.REWOUND, first.rule
    state, action = advance_alert(fresh(), first, SETTINGS)
    assert state.max_upper == 43 and action is None
    later = window + [obs(NOW + 60, 42, 4200, 4300)]
    second = run(later, state=state, now=NOW + 60)
    assert second.status is FrontierStatus.REWOUND and "upper 42 < 43" in second.rule


def test_stuck_time_counts_from_the_last_commit_when_records_were_left_pending() -> None:
    # The upper moved 6 minutes ago but left records behind (their oldest landed 20 minutes ago):
    # stuck since the commit, not since the records landed.
    rows = [(41, 900, 2000, {"lag_seconds": 600.0 + 60 * i}) for i in range(8)]
    rows += [(42, 1000, 2000 + 10 * i, {"lag_seconds": 1200.0 - 60 * (6 - i)}) for i in range(7)]
    e = run(series(rows))
    assert e.status is FrontierStatus.STALLED
    assert e.last_advance_at == NOW - 360 - 5 and e.stuck_seconds == 365


def test_two_partitions_the_reset_one_is_named() -> None:
    both = {"p0": 9000, "p1": 20}
    window = [replace(o, high_watermark=both, bound=both) for o in series([(42, 1000, 1000)] * 15)]
    e = run(window, state=replace(fresh(), max_high_watermark={"p0": 8000, "p1": 500}))
    assert e.status is FrontierStatus.REWOUND
    assert "high watermark of p1 below maximum" in e.rule
    assert [r for r in e.reasons if "source reset" in r] == [
        "source reset: partition p1 high watermark is 20, below 500 seen before (the source was truncated or recreated)"]


def test_a_long_window_is_judged_quickly_and_the_same_way() -> None:
    import time

    lags = [100 + 3 * i if i % 50 else 0 for i in range(3000)]
    window = series([(10 + i, 10 * i, 10 * i + lag) for i, lag in enumerate(lags)], step=1.0)
    started = time.perf_counter()
    e = run(window, StallSettings(window_seconds=3600))
    assert time.perf_counter() - started < 1.0
    assert e.status is FrontierStatus.LAGGING


@pytest.mark.parametrize("after, shard_exists, summary", [
    (stopped("STOPPED", 60), True, "RESOLVED: orders no longer breaching, now STOPPED (upper 42)"),
    ([], False, "RESOLVED: orders no longer exists"),
])
def test_resolve_when_a_human_stops_the_stream_or_the_shard_is_gone(
        after: list[Observation], shard_exists: bool, summary: str) -> None:
    settings = StallSettings(consecutive_breaches=1)
    state, action = advance_alert(fresh(), STALLED_EVAL, settings)
    assert action == "trigger"
    e = run(after, shard_exists=shard_exists)
    state, action = advance_alert(state, e, settings)
    assert action == "resolve"
    event = page_event(e, state, action, settings)
    assert event["summary"] == summary and event["dedup_key"] == dedup_key(SHARD)


# --- no false pages: a resumed stop, a segment with an old mtime; a writer that fails -------------


def test_stall_time_starts_at_the_resume_not_while_the_stream_was_stopped() -> None:
    # Stopped for an hour with records pending, resumed 19 s before NOW; the stall threshold is 20 s.
    settings = StallSettings(cadence_seconds=5, stall_multiplier=4, min_stall_seconds=20, window_seconds=900)
    resumed_at = NOW - 19
    rows = []
    for i in range(15):
        t = NOW - 60 * (14 - i) if i < 14 else NOW
        ready = t >= resumed_at
        rows.append((42, 1000, 1000 + 50 * (i + 1),
                     {"stream_status": "READY" if ready else "STOPPED",
                      "stream_changed_at": resumed_at if ready else NOW - 3600}))
    window = series(rows, commit_before=7200)
    window[-1] = replace(window[-1], observed_at=NOW)
    e = evaluate(SHARD, window, settings, NOW, fresh())
    assert e.status is FrontierStatus.OK and not e.breach, e.rule
    assert "pending for 19s" in e.rule
    # Still unmoved 21 s after the resume: a stall, counted from the resume.
    later = window + [replace(window[-1], observed_at=resumed_at + 21)]
    e = evaluate(SHARD, later, settings, resumed_at + 21, fresh())
    assert e.status is FrontierStatus.STALLED and e.stuck_seconds == pytest.approx(21)
    assert e.thresholds["stall_started_at"] == resumed_at


def test_a_segment_with_an_old_mtime_is_not_stalled_at_the_first_look() -> None:
    # A segment moved in with `cp -p`: it claims to have landed a day ago. The first two looks
    # see it pending; nothing says it was there before the first of them.
    first, second = NOW - 60, NOW
    day = 86400.0
    window = [obs(first, 42, 1000, 1500, lag_seconds=day, last_commit_at=NOW - 2 * day),
              obs(second, 42, 1000, 1500, lag_seconds=day + 60, last_commit_at=NOW - 2 * day)]
    e = evaluate(SHARD, window, SETTINGS, NOW, fresh())
    assert e.status is FrontierStatus.OK and not e.breach, e.rule
    assert "pending for 1m00s" in e.rule
    # It counts from the first look that saw it: stalled 300 s after that look.
    later = window + [obs(first + 300, 42, 1000, 1500, lag_seconds=day + 300, last_commit_at=NOW - 2 * day)]
    e = evaluate(SHARD, later, SETTINGS, first + 300, fresh())
    assert e.status is FrontierStatus.STALLED and e.stuck_seconds == pytest.approx(300)
    # After a look that saw nothing pending, an old mtime is no earlier than the first look that saw it.
    clean = [obs(first - 60, 42, 1000, 1000, last_commit_at=NOW - 2 * day)] + window
    e = evaluate(SHARD, clean, SETTINGS, NOW, fresh())
    assert e.status is FrontierStatus.OK and "pending for 1m00s" in e.rule


def test_the_commit_that_set_the_upper_is_not_a_writer_committing_nothing() -> None:
    rows = [(41, 900, 900)] + [(42, 1000, 1000 + 100 * i) for i in range(1, 15)]
    window = series(rows, commit_before=600)
    # The writer's own commit of batch 41 (upper 41 -> 42) is observed right after it.
    window[1] = replace(window[1], observer=WRITER, writer_outcome="committed")
    e = run(window)
    assert e.status is FrontierStatus.STALLED, e.rule
    assert e.writers_running is False
    assert not any("committing nothing" in r for r in e.reasons), e.reasons
    assert any(r.startswith("no writer observed since the stall began") for r in e.reasons), e.reasons


def test_a_writer_failing_on_every_run_is_named_with_its_error_class() -> None:
    window = [replace(o, observer=WRITER, writer_outcome="failed:SparkUnavailable") if i % 2 else o
              for i, o in enumerate(STUCK_GROWING)]
    e = run(window)
    assert e.status is FrontierStatus.STALLED and e.writers_running is True
    failing = [r for r in e.reasons if r.startswith("writer failing: SparkUnavailable")]
    assert failing and "(7 failed run(s) since the stall began" in failing[0] and "writer:w1" in failing[0], e.reasons
    assert not any("no writer observed" in r or "committing nothing" in r for r in e.reasons), e.reasons
    assert page_event(e, fresh(), "trigger", SETTINGS)["custom_details"]["reasons"][1].startswith("writer failing:")


def test_the_outbox_leases_a_page_until_it_is_delivered_or_released() -> None:
    from airflow_upsert_provider.engine.frontier.alerts import (
        MAX_OUTBOX,
        OUTBOX_LEASE_SECONDS,
        enqueue_page,
        settle_pages,
        take_pages,
    )

    event = page_event(run(STUCK_GROWING), fresh(), "trigger", SETTINGS)
    state, _ = enqueue_page(fresh(), event, "p1")
    # Due at once; taken with a lease; not due again while it runs.
    state, taken = take_pages(state, NOW)
    assert [(p["id"], p["leased_until"], p["event"], p["taken"]) for p in taken] == \
        [("p1", NOW + OUTBOX_LEASE_SECONDS, event, True)]
    assert take_pages(state, NOW + OUTBOX_LEASE_SECONDS - 1) == (state, ())
    # The taker died: after the lease the next round takes it.
    later, again = take_pages(state, NOW + OUTBOX_LEASE_SECONDS)
    assert [p["id"] for p in again] == ["p1"]
    # A failed delivery releases it (due at once); a delivered one leaves the outbox.
    released = settle_pages(later, released=["p1"])
    assert [p["id"] for p in take_pages(released, NOW + OUTBOX_LEASE_SECONDS + 1)[1]] == ["p1"]
    assert settle_pages(later, delivered=["p1"]).outbox == ()
    # It survives the store: the alert state round-trips through JSON with its outbox.
    assert AlertState.from_dict(json.loads(json.dumps(later.to_dict()))) == later
    # Bounded: the oldest pages go first, counted and returned for the log.
    many = fresh()
    for i in range(MAX_OUTBOX + 3):
        many, dropped = enqueue_page(many, {**event, "dedup_key": f"k{i}"}, f"p{i}")
    assert [p["id"] for p in many.outbox] == [f"p{i}" for i in range(3, MAX_OUTBOX + 3)]
    assert [p["id"] for p in dropped] == ["p2"] and many.outbox_dropped == 3


def test_a_blind_monitor_pages_once_after_the_limit_under_its_own_key_and_resolves() -> None:
    from airflow_upsert_provider.engine.frontier.blind import MONITOR_KEY, BlindState, advance_blind, blind_page_event

    down = "ConsensusUnavailable: cannot reach consensus store"
    state, actions = BlindState(), []
    for t in (0, 100, 200, 299, 300, 400):
        state, action = advance_blind(state, NOW + t, down, 300)
        actions.append(action)
    assert actions == [None, None, None, None, "trigger", None]
    assert (state.since, state.paged, state.error) == (NOW, True, down)
    page = blind_page_event(state, "trigger", NOW + 400, namespace="prod", shard_id="orders", limit_seconds=300)
    assert page["dedup_key"] == dedup_key("orders" + MONITOR_KEY, "prod") != dedup_key("orders", "prod")
    assert blind_page_event(state, "trigger", NOW + 600, namespace="prod")["dedup_key"] == dedup_key(MONITOR_KEY, "prod")
    assert page["summary"] == f"MONITOR BLIND: cannot evaluate shard orders for 6m: {down}"
    assert (page["severity"], page["custom_details"]["failing_seconds"]) == ("critical", 400)
    back, action = advance_blind(state, NOW + 500, None, 300)
    assert (back, action) == (BlindState(), "resolve")
    # Failures shorter than the limit, then a success: nothing to page, nothing to resolve.
    brief, _ = advance_blind(BlindState(), NOW, down, 300)
    assert advance_blind(brief, NOW + 10, None, 300) == (BlindState(), None)


def test_the_record_of_a_sent_monitor_page_is_named_apart_for_every_namespace_and_shard() -> None:
    """Issue 34 item 3: the name of the record kept outside the store (an Airflow Variable, which
    a task reaches by URL path) is a safe path part, at most 250 characters, and one per
    namespace and shard: over a grid of names with every unsafe kind of character, no two meet."""
    import random

    from airflow_upsert_provider.engine.frontier.blind import MAX_RECORD_KEY_CHARS, blind_record_key

    assert blind_record_key("prod", "orders") == "airflow-upsert-monitor-blind:prod:orders"
    assert blind_record_key("", "orders") == "airflow-upsert-monitor-blind::orders"
    assert blind_record_key("a:b", "c") != blind_record_key("a", "b:c")
    rng = random.Random(34)
    parts = ["", "a", "b", "a.b", "a-b", "a_b", "x" * 64, "y" * 128, "a#b", "a?b", "a%41", "a/b", "a b", "ünï",
             "a:b", "a_b_", "a__b"]
    parts += ["".join(rng.choice("ab.#/?%: _-é") for _ in range(rng.randint(1, 12))) for _ in range(40)]
    seen: dict[str, tuple[str, str]] = {}
    for namespace in parts:
        for shard in parts:
            if not shard:
                continue
            key = blind_record_key(namespace, shard)
            assert len(key) <= MAX_RECORD_KEY_CHARS and key.startswith("airflow-upsert-monitor-blind:"), key
            assert all(c.isascii() and (c.isalnum() or c in "_.:-") for c in key), key
            assert seen.setdefault(key, (namespace, shard)) == (namespace, shard), (key, seen[key], namespace, shard)


def test_a_recorded_monitor_page_reads_back_and_a_damaged_record_still_resolves() -> None:
    from airflow_upsert_provider.engine.frontier.blind import (
        BlindState,
        blind_page_event,
        blind_record,
        parse_blind_record,
        resolves_blind_page,
    )

    sent = BlindState(since=NOW, paged=True, error="ConsensusUnavailable: read-only")
    assert parse_blind_record(blind_record(sent), "Airflow Variable 'k'") == (sent, None)
    for damaged in ("", "{", "[]", '{"paged": true}', '{"since": "yesterday"}', '{"since": 1, "error": 5}', None):
        state, problem = parse_blind_record(damaged, "Airflow Variable 'k'")
        # Taken as sent: a resolve nobody needed is harmless, a page left open is not.
        assert state.paged is True and state.error == "unreadable record"
        assert problem.startswith("Airflow Variable 'k': not a monitor page record"), problem
    resolve = {"event": blind_page_event(sent, "resolve", NOW + 60, namespace="prod", shard_id="orders")}
    trigger = {"event": blind_page_event(sent, "trigger", NOW + 60, namespace="prod", shard_id="orders")}
    assert resolves_blind_page([trigger, resolve], "prod", "orders")
    assert not resolves_blind_page([trigger], "prod", "orders")
    assert not resolves_blind_page([resolve], "prod", "orders2") and not resolves_blind_page([resolve], "", "orders")
