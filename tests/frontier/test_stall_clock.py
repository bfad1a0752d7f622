"""Stall time is never capped by the window (issue 34 item 1): the stall clock carried in the
alert state, or dated by the look before the window, as pure properties over cadences, windows,
stall lengths and observation spacings."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.engine.frontier.alerts import AlertState, advance_alert
from airflow_upsert_provider.engine.frontier.model import FrontierStatus, Observation, StallSettings
from airflow_upsert_provider.engine.frontier.rules import evaluate

SHARD = "orders"
STALL_AT = 1_800_000_000.0  # when the first record of the stall lands (the true stall start)


def look(t: float, upper: int, lag: int, *, last_commit_at: float, lag_seconds: float | None) -> Observation:
    return Observation(shard_id=SHARD, observed_at=t, upper=upper, last_commit_at=last_commit_at,
                       high_watermark={"p0": 100 * upper + lag}, bound={"p0": 100 * upper},
                       stream_status="READY", stream_changed_at=0.0, lag=lag, lag_unit="segments",
                       lag_seconds=lag_seconds, observer="sensor:monitor")


def history(settings: StallSettings, stall_seconds: float, spacing: float, phase: float) -> list[Observation]:
    """Looks every ``spacing`` seconds from well before the window: a healthy writer (the upper
    moves at every look, nothing pending), then from STALL_AT records pending and the upper stuck;
    the last look is ``stall_seconds`` after STALL_AT."""
    end = STALL_AT + stall_seconds
    t = STALL_AT - phase - spacing * int((2 * settings.window_seconds + 3 * spacing) // spacing)
    out: list[Observation] = []
    upper = 10
    last_commit = t - 1
    while t < STALL_AT:
        out.append(look(t, upper, 0, last_commit_at=t - 1, lag_seconds=None))
        last_commit = t - 1
        upper += 1
        t += spacing
    upper -= 1
    lag = 1
    while t < end:
        out.append(look(t, upper, lag, last_commit_at=last_commit, lag_seconds=t - STALL_AT))
        lag += 1
        t += spacing
    out.append(look(end, upper, lag, last_commit_at=last_commit, lag_seconds=end - STALL_AT))
    return out


def grid() -> list[tuple[StallSettings, float]]:
    """(settings, spacing): cadences, multipliers, minimum stalls, windows (the minimum, the
    default, longer) and spacings up to the stale limit."""
    out = []
    for cadence in (5.0, 60.0, 300.0, 900.0):
        for multiplier, min_stall in ((3.0, 300.0), (1.0, 0.0), (2.0, 600.0)):
            base = StallSettings(cadence_seconds=cadence, stall_multiplier=multiplier, min_stall_seconds=min_stall)
            for window in sorted({base.minimum_window_seconds, base.window_seconds, 3 * base.minimum_window_seconds}):
                settings = replace(base, window_seconds=window)
                limit = settings.stale_limit_seconds
                for spacing in sorted({max(min(cadence, limit), limit / 4), limit}):
                    out.append((settings, spacing))
    return out


def stall_lengths(settings: StallSettings, rng: random.Random) -> list[float]:
    threshold = settings.stall_seconds
    fixed = [threshold * k for k in (0.5, 1.0, 3.0, 8.0)] + [threshold - 1, threshold + 1]
    return [max(1.0, round(s)) for s in fixed + [rng.uniform(1, 10 * threshold) for _ in range(2)]]


def test_the_three_hour_stall_on_a_five_minute_cadence_is_stalled() -> None:
    # The report's case: cadence 300 s, the default window; the writer stopped 3 hours ago, the
    # oldest segment waits 3h20m. The window alone saw at most its own length of stuck time.
    with pytest.raises(ConfigurationError, match="window_seconds must cover .* plus a margin") as err:
        StallSettings(cadence_seconds=300, window_seconds=900)
    assert err.value.details["field"] == "window_seconds"
    settings = StallSettings(cadence_seconds=300)
    assert settings.window_seconds == 900 + 600  # threshold 900 s + the stale limit 600 s
    looks = history(settings, 3 * 3600, 300, phase=100)
    looks = [replace(o, lag_seconds=o.lag_seconds + 1200) if o.lag else o for o in looks]  # oldest waits 3h20m
    now = looks[-1].observed_at
    e = evaluate(SHARD, looks, settings, now, AlertState(SHARD))
    assert e.status is FrontierStatus.STALLED and e.breach, (e.rule, e.reasons)
    # Dated by the look before the window, no earlier than the last commit (101 s before STALL_AT).
    assert e.stuck_seconds == pytest.approx(3 * 3600 + 101)
    assert "dated before the window" in e.reasons[0]


@pytest.mark.parametrize(("settings", "spacing"), grid(), ids=lambda v: repr(v)[:60])
def test_every_stall_longer_than_the_threshold_is_stalled_and_no_shorter_one(settings, spacing) -> None:
    rng = random.Random(f"{settings.to_dict()}-{spacing}")
    threshold = settings.stall_seconds
    for stall in stall_lengths(settings, rng):
        phase = float(rng.randrange(1, int(spacing) + 1))
        looks = history(settings, stall, spacing, phase)
        now = looks[-1].observed_at
        # A fresh evaluator (a monitor's first round, the shard page): the store gives it the
        # window and the look before it.
        e = evaluate(SHARD, looks, settings, now, AlertState(SHARD))
        assert (e.status is FrontierStatus.STALLED) == (stall >= threshold), (stall, threshold, e.rule)
        if stall >= threshold:
            assert e.stuck_seconds == pytest.approx(stall)
        # A monitor evaluating every few looks from a window before the stall, carrying its alert
        # state, shown only the window.
        state = AlertState(SHARD)
        step = rng.randrange(1, 4)
        first = next(i for i, o in enumerate(looks) if o.observed_at >= STALL_AT - settings.window_seconds)
        for i in list(range(first, len(looks) - 1, step)) + [len(looks) - 1]:
            t = looks[i].observed_at
            window = [o for o in looks[:i + 1] if o.observed_at >= t - settings.window_seconds]
            e = evaluate(SHARD, window, settings, t, state)
            stuck = t - STALL_AT
            assert (e.status is FrontierStatus.STALLED) == (stuck >= threshold), (stuck, threshold, e.rule)
            state, _ = advance_alert(state, e, settings)


def test_the_clock_survives_a_stale_round_and_restarts_when_the_upper_moves() -> None:
    settings = StallSettings()
    looks = history(settings, 1200, 60, phase=30)
    now = looks[-1].observed_at
    state, _ = advance_alert(AlertState(SHARD), evaluate(SHARD, looks, settings, now, AlertState(SHARD)), settings)
    assert (state.stall_upper, state.pending_since) == (looks[-1].upper, STALL_AT)
    # Nothing observed for a while: STALE, the clock is kept.
    stale = evaluate(SHARD, [], settings, now + 2000, state)
    assert stale.status is FrontierStatus.STALE
    kept, _ = advance_alert(state, stale, settings)
    assert (kept.stall_upper, kept.pending_since) == (state.stall_upper, STALL_AT)
    # The upper moved and nothing is pending: the clock at the new upper is clear.
    moved = [look(now + 2000 + 60 * i, looks[-1].upper + 1, 0, last_commit_at=now + 1990, lag_seconds=None)
             for i in range(3)]
    e = evaluate(SHARD, moved, settings, moved[-1].observed_at, kept)
    cleared, _ = advance_alert(kept, e, settings)
    assert (cleared.stall_upper, cleared.pending_since) == (looks[-1].upper + 1, None)
    assert AlertState.from_dict(cleared.to_dict()) == cleared


def test_an_open_page_is_named_while_no_one_observes_and_the_reason_has_no_moving_date() -> None:
    # N3: between monitor runs the verdict is STALE (nothing new is known) but says which page
    # is still open; N10: with no observation at all the reason names no moving window start.
    settings = StallSettings()
    state = replace(AlertState(SHARD), firing=True, firing_status="STALLED", incident_started_at=STALL_AT + 400,
                    last_status="STALLED", last_evaluated_at=STALL_AT + 900)
    looks = history(settings, 900, 60, phase=30)
    e = evaluate(SHARD, looks, settings, looks[-1].observed_at + 780, state)
    assert e.status is FrontierStatus.STALE
    assert e.reasons[0].startswith("the STALLED page opened at 2027-01-15T08:06:40+00:00 is still open")
    texts = {evaluate(SHARD, [], settings, t, AlertState(SHARD)).reasons[0] for t in (STALL_AT, STALL_AT + 97)}
    assert texts == {f"no observation of shard {SHARD!r} in the last 15m: nothing observes it"}


def test_durations_say_when_they_were_measured() -> None:
    # N11: a duration measured at the newest look says "as of" that look.
    settings = StallSettings()
    looks = history(settings, 1200, 60, phase=30)
    e = evaluate(SHARD, looks, settings, looks[-1].observed_at + 60, AlertState(SHARD))
    assert e.status is FrontierStatus.STALLED
    assert "has not moved for 20m as of 2027-01-15T08:20:00+00:00" in e.reasons[0]
    ok = evaluate(SHARD, history(settings, 120, 60, phase=30), settings, STALL_AT + 120, AlertState(SHARD))
    assert "stall clock: segments pending at this upper for 2m00s as of 2027-01-15T08:02:00+00:00" in ok.reasons[1]
