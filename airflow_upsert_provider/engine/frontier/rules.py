"""Frontier-stall rules as pure decisions (invariant 15: a stalled frontier is never silent).

A shard's frontier is watched through *observations* (``engine/frontier/model.py``): at one
instant, the shard's upper, the source's high watermark and the offsets bound at the upper, the
lag, the stream status, who looked. ``evaluate`` takes the observations of a time window and says
what state the frontier is in and which rule decided. What follows a decision lives beside it:
``engine/frontier/alerts.py`` turns a series of evaluations into page actions and keeps them in
the alert state's outbox, ``engine/frontier/pages.py`` says what a page carries,
``engine/frontier/blind.py`` pages for a monitor that cannot evaluate. Nothing here touches a
store, Spark or Airflow: the store shell (``engine/frontier/observations.py``) records
observations and keeps the alert state, the sensor sends the pages.

Rules, in the order they are tried (the first that applies decides):

    NOT_FOUND   the shard does not exist                                   never pages
    STOPPED     the newest observation's stream is STOPPED                 pages (warning) only beyond max_stopped_seconds
    RECOVERING  the newest observation's stream is RECOVERING              likewise
    STALE       newest observation too old, or fewer than two samples      pages (critical): nothing is extrapolated
    REWOUND     upper or a source high watermark below the maximum seen    pages (critical) until the maximum is regained
    STALLED     the source grew and the upper has not moved for
                max(stall_multiplier x cadence, min_stall) since it grew   pages (critical)
    LAGGING     the upper moves but the lag trends up over the window,
                or lag_seconds is above the objective                      pages (warning) only with page_on_lagging
    IDLE        no new source records, the upper at the high watermark     never pages
    OK

A STOPPING stream goes through the rules like a READY one: a stop lets the batch in hand
finish, so a stop that never finalizes while records pend is a stall like any other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

from airflow_upsert_provider.engine.common.time_text import (
    format_duration,
    format_duration_to_the_second,
    format_timestamp,
)
from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.engine.frontier.model import (
    ADVANCING_OUTCOMES,
    CRITICAL,
    FAILED_OUTCOME_PREFIX,
    WARNING,
    Evaluation,
    FrontierStatus,
    Observation,
    StallSettings,
    _value,
)
from airflow_upsert_provider.engine.sources.lag import format_lag

if TYPE_CHECKING:
    from airflow_upsert_provider.engine.frontier.alerts import AlertState


# LAGGING by trend needs this many samples: with fewer, a healthy writer's saw-tooth lag
# (it rises between batches, drops at each commit) would look like a trend by chance.
LAGGING_MIN_SAMPLES = 4
# ... and this Kendall rank correlation of lag against time (1: every later sample above every
# earlier one). A rank statistic over all pairs, so one dip cannot clear a real trend and a
# saw-tooth (about 0) never makes one.
LAGGING_MIN_TREND = 0.5

# A higher upper or high watermark seen less than this before the newest observation is taken
# for a race between observers, not a rewind (see evaluate).
REWIND_RACE_SECONDS = 10.0
# The lag trend is judged on at most this many samples, evenly spread over the window: the
# rank statistic is quadratic in the number of samples.
TREND_MAX_SAMPLES = 200


# ---------------------------------------------------------------------------------------------
# Formatting


def _iso(t: float | None) -> str | None:
    return format_timestamp(t, missing=None)


def _lag_text(obs: Observation) -> str:
    return format_lag(obs.lag, obs.lag_unit)


def _stall_formula(settings: StallSettings) -> str:
    return f"max({settings.stall_multiplier:g} x {settings.cadence_seconds:g}s, {settings.min_stall_seconds:g}s)"


# ---------------------------------------------------------------------------------------------
# The rules


def _kendall_trend(values: Sequence[float]) -> float:
    """Kendall's rank correlation of ``values`` with their order, in [-1, 1]."""
    if len(values) > TREND_MAX_SAMPLES:
        last = len(values) - 1
        values = [values[round(i * last / (TREND_MAX_SAMPLES - 1))] for i in range(TREND_MAX_SAMPLES)]
    n = len(values)
    pairs = n * (n - 1) // 2
    if pairs == 0:
        return 0.0
    score = 0
    for i in range(n):
        for j in range(i + 1, n):
            score += (values[j] > values[i]) - (values[j] < values[i])
    return score / pairs


def _writer_summary(samples: Sequence[Observation]) -> tuple[list[str], dict[str, int], dict[str, int]]:
    """The writers whose steps committed nothing among ``samples``, what they reported (outcome:
    count), and of that the failures (error class: count). A step that brought the upper to the
    current one (the commit that set it) is progress, not "committing nothing"."""
    idle = [o for o in samples if o.is_writer and (o.writer_outcome or "unknown") not in ADVANCING_OUTCOMES]
    writers = sorted({o.observer for o in idle})
    outcomes: dict[str, int] = {}
    failures: dict[str, int] = {}
    for o in idle:
        key = o.writer_outcome or "unknown"
        outcomes[key] = outcomes.get(key, 0) + 1
        if key.startswith(FAILED_OUTCOME_PREFIX):
            error = key[len(FAILED_OUTCOME_PREFIX):] or "unknown error"
            failures[error] = failures.get(error, 0) + 1
    return writers, outcomes, failures


def upstream_reasons(obs: Observation | None) -> list[str]:
    """Sentences about a Kafka shard's consumer group in ``obs``: its alert (behind the
    shard's frontier longer than allowed) or why it could not be read; none otherwise."""
    upstream = obs.upstream if obs is not None else None
    if not upstream:
        return []
    if upstream.get("error"):
        return [f"the consumer group's offsets could not be read: {upstream['error']}"]
    if not upstream.get("alert"):
        return []
    reasons = []
    behind = upstream.get("behind") or {}
    # The group may be behind on one partition for less than the alert time and ahead on another.
    behind_too_long = (upstream.get("gap_seconds") or 0) > (upstream.get("gap_alert_seconds") or 0)
    if behind and (behind_too_long or "ahead" not in upstream):
        listed = ", ".join(f"partition {p} {n:,} behind" for p, n in sorted(behind.items()))
        reasons.append(f"consumer group {upstream.get('group')!r} is behind the shard's frontier for "
                       f"{format_duration(upstream.get('gap_seconds'))} (since {_iso(upstream.get('gap_since'))}): "
                       f"{listed}; lag tools show it further behind than the shard is")
    ahead = upstream.get("ahead") or {}
    if ahead:
        listed = ", ".join(f"partition {p} {n:,} ahead" for p, n in sorted(ahead.items()))
        reasons.append(f"consumer group {upstream.get('group')!r} is ahead of the shard's frontier: {listed}; lag "
                       f"tools count {sum(ahead.values()):,} records as processed that the shard has not read: stop "
                       "whatever else commits to the group (a writer of another store), then 'upsertctl recover seek'")
    return reasons


def evaluate(shard_id: str, window: Sequence[Observation], settings: StallSettings, now: float,
             state: AlertState, *, shard_exists: bool = True, unobservable: str | None = None) -> Evaluation:
    """The frontier status of ``shard_id`` from the observations of the window ending at ``now``.

    ``window`` may hold observations older than ``now - settings.window_seconds``: they are
    not judged, but the newest of them (the look before the window) dates a stall that began
    before the window. ``state`` gives the maxima seen by earlier evaluations (REWOUND) and
    the stall clock they carried (a stall longer than the window). ``unobservable``:
    why the evaluator could not observe the shard itself; it is the first reason given (the
    rules judge what others recorded, and with nothing recorded the shard is STALE)."""
    for o in window:
        if o.shard_id != shard_id:
            raise ConfigurationError(f"an observation of shard {o.shard_id!r} is in the window of shard {shard_id!r}",
                                     field="window")
    start = now - settings.window_seconds
    samples = sorted((o for o in window if o.observed_at >= start), key=lambda o: o.observed_at)
    before = max((o for o in window if o.observed_at < start), key=lambda o: o.observed_at, default=None)
    # The stall clock, once the rules reach it (see AlertState.stall_upper).
    clock: dict[str, Any] = {}
    thresholds = settings.thresholds()
    window_info: dict[str, Any] = {
        "start": start,
        "end": now,
        "samples": len(samples),
        "seconds": settings.window_seconds,
        "first_sample_at": samples[0].observed_at if samples else None,
        "last_sample_at": samples[-1].observed_at if samples else None,
    }
    newest = samples[-1] if samples else None

    # The maxima known so far, including this window: a rewind within the window counts too.
    max_upper = max([state.max_upper] + [o.upper for o in samples])
    max_hw = dict(state.max_high_watermark)
    for o in samples:
        for p, hw in o.high_watermark.items():
            if hw > max_hw.get(p, -1):
                max_hw[p] = hw

    def result(status: FrontierStatus, rule: str, reasons: Sequence[str], *, breach: bool = False,
               severity: str | None = None, last_advance_at: float | None = None,
               stuck_seconds: float | None = None, writers_running: bool | None = None,
               extra_thresholds: Mapping[str, Any] | None = None) -> Evaluation:
        return Evaluation(
            shard_id=shard_id,
            status=status,
            rule=rule,
            # The group's gap does not change the frontier's status (the shard is not behind),
            # but an on-call engineer reading the evaluation must see it.
            reasons=(((f"not observable: {unobservable}",) if unobservable and shard_exists else ())
                     + tuple(reasons) + tuple(upstream_reasons(newest))),
            evaluated_at=now,
            upper=newest.upper if newest else None,
            last_advance_at=last_advance_at,
            stuck_seconds=stuck_seconds,
            lag=newest.lag if newest else None,
            lag_unit=newest.lag_unit if newest else None,
            lag_seconds=newest.lag_seconds if newest else None,
            window=window_info,
            writers_running=writers_running,
            breach=breach,
            severity=severity if breach else None,
            thresholds={**thresholds, **(extra_thresholds or {})},
            max_upper=max_upper if max_upper >= 0 else None,
            max_high_watermark=max_hw,
            stall_upper=clock.get("upper"),
            pending_since=clock.get("pending_since"),
            partition_lag=newest.partition_lag if newest else None,
        )

    # NOT_FOUND: nothing to watch; the shard's absence is a configuration matter, not a stall.
    if not shard_exists:
        return result(FrontierStatus.NOT_FOUND, "not found: the shard does not exist",
                      [f"shard {shard_id!r} does not exist in the consensus store"])

    # STOPPED / RECOVERING: a human stopped the stream or a recovery is open; the upper is meant
    # to stand still. Shown, paged only when it lasts beyond max_stopped_seconds.
    if newest is not None and str(_value(newest.stream_status)) in ("STOPPED", "RECOVERING"):
        status = FrontierStatus(str(_value(newest.stream_status)))
        since = newest.stream_changed_at or None
        held = (newest.observed_at - since) if since else None
        limit = settings.max_stopped_seconds
        too_long = limit is not None and held is not None and held > limit
        word = status.value.lower()
        reasons = [f"the stream is {status.value} since {_iso(since) or 'an unknown time'}"
                   f" ({format_duration(held)} as of {_iso(newest.observed_at)})" if held is not None
                   else f"the stream is {status.value}"]
        if too_long:
            rule = f"{word} too long: {format_duration(held)} > max_stopped_seconds {limit:g}s"
            reasons.append(f"{word} longer than {format_duration(limit)}: someone has to resume it or finish the recovery")
        elif limit is None:
            rule = f"{word}: the stream is {status.value}; never pages (max_stopped_seconds not set)"
        else:
            rule = f"{word}: the stream is {status.value} for {format_duration(held)} <= max_stopped_seconds {limit:g}s"
        reasons.append(f"upper {newest.upper}, {_lag_text(newest)} pending")
        return result(status, rule, reasons, breach=too_long, severity=WARNING, stuck_seconds=held,
                      last_advance_at=newest.last_commit_at)

    # STALE: without fresh observations nothing is known; never extrapolate from one sample.
    limit = settings.stale_limit_seconds
    if newest is None or len(samples) < 2 or now - newest.observed_at > limit:
        if newest is None:
            # A stable fact, not the window's start (it moves with every evaluation).
            rule = f"stale: no observation in the last {format_duration(settings.window_seconds)}"
            reasons = [f"no observation of shard {shard_id!r} in the last {format_duration(settings.window_seconds)}"
                       + (f" (newest before that at {_iso(before.observed_at)}, by {before.observer})"
                          if before is not None else "") + ": nothing observes it"]
            age = None
        elif now - newest.observed_at > limit:
            age = now - newest.observed_at
            rule = f"stale: newest observation {format_duration(age)} old > {limit:g}s"
            reasons = [f"the newest observation is {format_duration(age)} old (at {_iso(newest.observed_at)}, "
                       f"by {newest.observer}): nothing is observing the shard"]
        else:
            age = now - newest.observed_at
            rule = "stale: 1 observation in the window, at least 2 needed"
            reasons = [f"only one observation in the last {format_duration(settings.window_seconds)} "
                       f"(at {_iso(newest.observed_at)}, by {newest.observer}): a trend needs two"]
        if state.firing and state.firing_status not in (None, FrontierStatus.STALE.value):
            # The incident's page is open: nothing newer says it is over or still going (a
            # monitor between runs). Say what was paged, not only that no one looks.
            reasons.insert(0, f"the {state.firing_status} page opened at {_iso(state.incident_started_at)} is still "
                              f"open (last judged {state.last_status} at {_iso(state.last_evaluated_at)}); no newer "
                              f"observation confirms or clears it")
        return result(FrontierStatus.STALE, rule, reasons, breach=True, severity=CRITICAL,
                      last_advance_at=newest.last_commit_at if newest else None,
                      extra_thresholds={"newest_age_seconds": age})

    # REWOUND: the upper never decreases (invariant 1) and a source only grows; either going
    # down is an alarm that stays until the previous maximum is regained.
    # Samples taken moments before the newest may have read the store or the source later than
    # it (observers stamp and read in their own order, on their own clocks): a higher value
    # there is a race, not a rewind. It counts once it is REWIND_RACE_SECONDS older; the state's
    # maxima (earlier evaluations) count at once.
    settled = [o for o in samples if o.observed_at < newest.observed_at - REWIND_RACE_SECONDS]
    ref_upper = max([state.max_upper] + [o.upper for o in settled])
    ref_hw = dict(state.max_high_watermark)
    for o in settled:
        for p, hw in o.high_watermark.items():
            if hw > ref_hw.get(p, -1):
                ref_hw[p] = hw
    rewinds = []
    kinds = []
    if newest.upper < ref_upper:
        kinds.append(f"upper {newest.upper} < {ref_upper}")
        rewinds.append(f"integrity alarm: the upper is {newest.upper}, below {ref_upper} seen before "
                       f"(an upper never decreases: committed batches are missing from the shard)")
    lower = [p for p in sorted(newest.high_watermark) if newest.high_watermark[p] < ref_hw.get(p, -1)]
    for p in lower:
        rewinds.append(f"source reset: partition {p} high watermark is {newest.high_watermark[p]}, "
                       f"below {ref_hw[p]} seen before (the source was truncated or recreated)")
    if lower:
        kinds.append(f"high watermark of {', '.join(lower)} below maximum")
    if rewinds:
        return result(FrontierStatus.REWOUND, "rewound: " + "; ".join(kinds) + " (stays until regained)",
                      rewinds + ["REWOUND stays until the previous maximum is regained"],
                      breach=True, severity=CRITICAL, last_advance_at=newest.last_commit_at,
                      extra_thresholds={"max_upper": ref_upper, "max_high_watermark": ref_hw})

    # The run of samples at the current upper, and when the upper moved to it.
    suffix_start = len(samples) - 1
    while suffix_start > 0 and samples[suffix_start - 1].upper == newest.upper:
        suffix_start -= 1
    at_upper = samples[suffix_start:]
    advanced_in_window = any(samples[i].upper != samples[i - 1].upper for i in range(1, len(samples)))
    if newest.last_commit_at is not None:
        last_advance_at: float | None = newest.last_commit_at
    elif suffix_start > 0:
        last_advance_at = at_upper[0].observed_at
    else:
        last_advance_at = None

    # When did records become pending at this upper? From when an observation first saw them:
    # the first sample of the run of pending samples that reaches the first pending sample at
    # this upper (a later zero-lag sample cannot undo that: the bound has not moved, so the
    # records are still there). A segment's landing time (lag_seconds) may date it earlier only
    # between the last look that saw nothing pending and the first that did: a file moved or
    # copied with its old mtime (mv, cp -p, rsync -a, tar) says nothing of when it arrived.
    pending_since: float | None = None
    first_seen: int | None = None
    first_pending = next((suffix_start + i for i, o in enumerate(at_upper) if o.lag > 0), None)
    if first_pending is not None:
        first_seen = first_pending
        while first_seen > 0 and samples[first_seen - 1].lag > 0:
            first_seen -= 1
        seen = samples[first_seen]
        pending_since = seen.observed_at
        # The look before it: in the window, or the look before the window.
        previous = samples[first_seen - 1] if first_seen > 0 else before
        if previous is not None and previous.lag == 0 and seen.lag_seconds is not None:
            dated = seen.observed_at - seen.lag_seconds
            if previous.observed_at < dated:
                pending_since = dated
    hw_grew = any(
        o.high_watermark.get(p, 0) > prev.high_watermark.get(p, 0)
        for prev, o in zip(at_upper, at_upper[1:]) for p in o.high_watermark
    )
    if pending_since is None and hw_grew:
        pending_since = next(o.observed_at for prev, o in zip(at_upper, at_upper[1:])
                             if any(o.high_watermark.get(p, 0) > prev.high_watermark.get(p, 0)
                                    for p in o.high_watermark))
    # Records pending since the window's first sample may have been pending long before: the
    # window alone would cap stall time at its length. An earlier evaluation that saw them
    # pending at this upper dates them (the upper never moves back, so they are still there);
    # without one, the look before the window, when it saw records pending at this upper, dates
    # them from its own lag (not later than that look).
    carried = False
    if first_seen == 0 and suffix_start == 0:
        if state.stall_upper == newest.upper and state.pending_since is not None:
            carried = state.pending_since < pending_since
            pending_since = min(pending_since, state.pending_since)
        elif before is not None and before.upper == newest.upper and before.lag > 0:
            carried = True
            pending_since = min(pending_since, before.observed_at - (before.lag_seconds or 0.0))
    clock.update(upper=newest.upper, pending_since=pending_since)

    # Stuck time starts at the latest of: when records became pending, the last advance, and
    # when the stream last became READY (a resume): time spent STOPPED or RECOVERING is a
    # person's doing, never stall time.
    ready_since = max((o.stream_changed_at for o in samples if str(_value(o.stream_status)) == "READY"),
                      default=0.0)
    stall_start: float | None = None
    if pending_since is not None:
        stall_start = max(t for t in (pending_since, last_advance_at, ready_since) if t is not None)

    # STALLED: the source grew and the upper has not moved since, for longer than the stall
    # threshold. Stuck time counts from when the source grew, not from the last advance: an
    # upper has no reason to move while its source is idle.
    stall_seconds = settings.stall_seconds
    if stall_start is not None:
        stuck = newest.observed_at - stall_start
        if stuck >= stall_seconds:
            in_stall = [o for o in at_upper if o.observed_at >= stall_start]
            writers, outcomes, failures = _writer_summary(in_stall)
            reasons = [f"upper {newest.upper} has not moved for {format_duration(stuck)} as of "
                       f"{_iso(newest.observed_at)} (since {_iso(stall_start)}"
                       + (", dated before the window" if carried and stall_start < start else "")
                       + f") with {_lag_text(newest)} pending"
                       + (f", the oldest waiting {format_duration_to_the_second(newest.lag_seconds)}"
                          if newest.lag_seconds is not None else "")]
            if failures:
                reasons.append(f"writer failing: {', '.join(sorted(failures))} ({sum(failures.values())} failed "
                               f"run(s) since the stall began, by {', '.join(writers)})")
            if writers and len(failures) < len(outcomes):
                listed = ", ".join(f"{k} x{v}" for k, v in sorted(outcomes.items()))
                reasons.append(f"writers running and committing nothing: {', '.join(writers)} reported {listed} "
                               f"since the stall began")
            elif not writers:
                last_writer = next((o for o in reversed(samples) if o.is_writer), None)
                reasons.append("no writer observed since the stall began"
                               + (f" (last writer observation {format_duration(newest.observed_at - last_writer.observed_at)}"
                                  f" before the newest, by {last_writer.observer})" if last_writer
                                  else " (none in the window): is the writer's DAG running?"))
            zero = [o for o in in_stall if o.lag == 0]
            if zero:
                reasons.append(f"{len(zero)} zero-lag sample(s) inside the stall ignored: the upper did not move, "
                               f"so the pending records are still there")
            return result(FrontierStatus.STALLED,
                          f"stalled: source grew, upper unmoved for {format_duration(stuck)} >= "
                          f"{_stall_formula(settings)} = {stall_seconds:g}s",
                          reasons, breach=True, severity=CRITICAL, last_advance_at=last_advance_at,
                          stuck_seconds=stuck, writers_running=bool(writers),
                          extra_thresholds={"stall_started_at": stall_start})

    # LAGGING: the upper moves but not fast enough. Judged on the trend over the whole window,
    # not pair by pair, so one dip does not clear it.
    # Lags in one unit only: rows recorded before the unit was kept counted offsets.
    lags = [o.lag for o in samples if o.lag_unit == newest.lag_unit]
    trend = _kendall_trend(lags)
    lag_trend = (advanced_in_window and len(lags) >= LAGGING_MIN_SAMPLES and lags[-1] > lags[0]
                 and trend >= LAGGING_MIN_TREND)
    objective = settings.lag_seconds_objective
    over_objective = objective is not None and newest.lag_seconds is not None and newest.lag_seconds > objective
    if lag_trend or over_objective:
        reasons = []
        rules = []
        if lag_trend:
            rules.append(f"lag trend {trend:+.2f} >= {LAGGING_MIN_TREND} over {len(lags)} samples")
            reasons.append(f"the upper moves (now {newest.upper}) but the lag grew over the window from "
                           f"{lags[0]:,} to {format_lag(lags[-1], newest.lag_unit)}")
        if over_objective:
            rules.append(f"lag {format_duration_to_the_second(newest.lag_seconds)} > objective {objective:g}s")
            reasons.append(f"the oldest pending record waits {format_duration_to_the_second(newest.lag_seconds)}, "
                           f"above the objective of {format_duration(objective)}")
        if not settings.page_on_lagging:
            reasons.append("LAGGING does not page (page_on_lagging is off)")
        return result(FrontierStatus.LAGGING, "lagging: " + "; ".join(rules), reasons,
                      breach=settings.page_on_lagging, severity=WARNING, last_advance_at=last_advance_at,
                      extra_thresholds={"lag_trend": trend, "lag_min_trend": LAGGING_MIN_TREND})

    # IDLE: nothing new in the source and the upper at its high watermark.
    if newest.lag == 0 and pending_since is None and not advanced_in_window:
        return result(FrontierStatus.IDLE, "idle: no new source records, upper at the high watermark",
                      [f"upper {newest.upper} is at the source's high watermark; nothing new in "
                       f"{format_duration(newest.observed_at - samples[0].observed_at)}"],
                      last_advance_at=last_advance_at)

    reasons = [f"upper {newest.upper}, {_lag_text(newest)} pending"]
    rule = "ok: the upper follows the source"
    if stall_start is not None:
        waited = format_duration_to_the_second(newest.observed_at - stall_start)
        rule = f"ok: pending for {waited} < {_stall_formula(settings)} = {stall_seconds:g}s"
        reasons.append(f"stall clock: {newest.lag_unit} pending at this upper for {waited} as of "
                       f"{_iso(newest.observed_at)}; stalled only after {format_duration(stall_seconds)}")
    return result(FrontierStatus.OK, rule, reasons, last_advance_at=last_advance_at)
