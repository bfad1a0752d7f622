"""Frontier-stall rules as pure decisions (invariant 15: a stalled frontier is never silent).

A shard's frontier is watched through *observations*: at one instant, the shard's upper, the
source's high watermark and the offsets bound at the upper, the lag, the stream status, who
looked. ``evaluate`` takes the observations of a time window and says what state the
frontier is in and which rule decided; ``advance_alert`` turns a series of evaluations into
page actions (trigger once per incident, resolve when it is over); ``page_event`` says what a
page carries. Nothing here touches a store, Spark or Airflow: the store shell
(``engine/frontier/observations.py``) records observations and keeps the alert state, the sensor
sends the pages.

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

import enum
import hashlib
import math
from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping, Sequence

from airflow_upsert_provider.engine.common.retry import PAGE_DELIVERY, RetryPolicy
from airflow_upsert_provider.engine.common.time_text import (
    format_duration,
    format_duration_to_the_second,
    format_timestamp,
)
from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.engine.sources.lag import LAG_UNITS, OFFSETS, format_lag


class FrontierStatus(str, enum.Enum):
    NOT_FOUND = "NOT_FOUND"
    STOPPED = "STOPPED"
    RECOVERING = "RECOVERING"
    STALE = "STALE"
    REWOUND = "REWOUND"
    STALLED = "STALLED"
    LAGGING = "LAGGING"
    IDLE = "IDLE"
    OK = "OK"


CRITICAL = "critical"
WARNING = "warning"

# The Events API limits a summary to 1024 characters and a dedup key to 255.
MAX_SUMMARY_CHARS = 1023
MAX_DEDUP_KEY_CHARS = 255

# LAGGING by trend needs this many samples: with fewer, a healthy writer's saw-tooth lag
# (it rises between batches, drops at each commit) would look like a trend by chance.
LAGGING_MIN_SAMPLES = 4
# ... and this Kendall rank correlation of lag against time (1: every later sample above every
# earlier one). A rank statistic over all pairs, so one dip cannot clear a real trend and a
# saw-tooth (about 0) never makes one.
LAGGING_MIN_TREND = 0.5

# The window when none is given (longer when the stall threshold needs it).
DEFAULT_WINDOW_SECONDS = 900.0

# A higher upper or high watermark seen less than this before the newest observation is taken
# for a race between observers, not a rewind (see evaluate).
REWIND_RACE_SECONDS = 10.0
# The lag trend is judged on at most this many samples, evenly spread over the window: the
# rank statistic is quadratic in the number of samples.
TREND_MAX_SAMPLES = 200

PAGE_SOURCE = "airflow-upsert-provider"
DEDUP_PREFIX = "airflow-upsert"

WRITER_OBSERVER_PREFIX = "writer:"
# Outcomes of writer steps that brought the upper to where the step left it (its own commit, its
# own commit found on a retry, a peer's commit of the same batch); anything else committed nothing.
ADVANCING_OUTCOMES = frozenset({"committed", "already_committed", "already_persisted"})
# A writer step that raised is recorded with the outcome "failed:<error class>".
FAILED_OUTCOME_PREFIX = "failed:"


def failed_outcome(exc: BaseException) -> str:
    """The writer outcome recorded for a step that raised ``exc``."""
    return FAILED_OUTCOME_PREFIX + type(exc).__name__


def _value(x: Any) -> Any:
    """A str enum (a stream Status) as its plain value, anything else unchanged."""
    return x.value if isinstance(x, enum.Enum) else x


def _field_error(owner: str, name: str, problem: str, value: Any) -> ConfigurationError:
    return ConfigurationError(f"{owner}.{name} {problem} (got {value!r})", field=name, value=repr(value))


def _require(d: Mapping[str, Any], owner: str, name: str) -> Any:
    if name not in d:
        raise ConfigurationError(f"{owner}: field {name!r} is missing", field=name)
    return d[name]


def _lag_of(d: Mapping[str, Any], owner: str) -> tuple[int, str]:
    """(lag, unit) of a stored observation; a row recorded before the unit was kept has only
    ``lag_records``, which counted the distance between offsets."""
    if "lag" in d:
        unit = str(_require(d, owner, "lag_unit"))
        if unit not in LAG_UNITS:
            raise ConfigurationError(f"{owner}: lag_unit must be one of {', '.join(LAG_UNITS)} (got {unit!r})",
                                     field="lag_unit")
        return int(d["lag"]), unit
    return int(_require(d, owner, "lag_records")), OFFSETS


@dataclass(frozen=True)
class Observation:
    """The frontier of one shard as seen at one instant."""

    shard_id: str
    observed_at: float              # unix seconds
    upper: int
    last_commit_at: float | None    # committed_at of batch upper-1 (None: nothing committed)
    high_watermark: dict[str, int]  # per partition: one past the highest offset present in the source
    bound: dict[str, int]           # per partition: offsets bound at the upper (binding(upper-1).to)
    stream_status: str              # READY / STOPPING / STOPPED / RECOVERING
    stream_changed_at: float        # when the stream status was last set (0.0: never)
    # What is pending at observed_at, in lag_unit (engine/sources/lag.py): the records after the
    # offsets bound (Kafka), the segment files not bound yet (directory); "offsets" in rows
    # recorded before the unit was kept (the distance between offsets).
    lag: int
    lag_unit: str
    # Age at observed_at of the oldest record not yet committed (directory source: landing time
    # of the first unbound segment); None: nothing pending.
    lag_seconds: float | None
    observer: str                   # "writer:<id>", "sensor:<dag/run/task>", "upsertctl:<host>:<pid>"
    writer_outcome: str | None = None  # writer observations: the step's outcome (committed, nothing_to_do, ...)
    # Kafka shards: the consumer group against the shard's frontier (group_offsets.group_status:
    # group, committed, acknowledged, behind, gap_since, gap_seconds, alert), or {"error": ...}
    # when the group could not be read. None for other sources, and in rows recorded before it.
    upstream: dict | None = None

    @property
    def is_writer(self) -> bool:
        return self.observer.startswith(WRITER_OBSERVER_PREFIX)

    def to_dict(self) -> dict[str, Any]:
        return {
            "shard_id": self.shard_id,
            "observed_at": self.observed_at,
            "upper": self.upper,
            "last_commit_at": self.last_commit_at,
            "high_watermark": dict(self.high_watermark),
            "bound": dict(self.bound),
            "stream_status": _value(self.stream_status),
            "stream_changed_at": self.stream_changed_at,
            "lag": self.lag,
            "lag_unit": self.lag_unit,
            "lag_seconds": self.lag_seconds,
            "observer": self.observer,
            "writer_outcome": self.writer_outcome,
            "upstream": None if self.upstream is None else dict(self.upstream),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Observation":
        owner = "Observation"
        try:
            last_commit_at = d.get("last_commit_at")
            lag_seconds = d.get("lag_seconds")
            lag, lag_unit = _lag_of(d, owner)
            return cls(
                shard_id=str(_require(d, owner, "shard_id")),
                observed_at=float(_require(d, owner, "observed_at")),
                upper=int(_require(d, owner, "upper")),
                last_commit_at=None if last_commit_at is None else float(last_commit_at),
                high_watermark={str(k): int(v) for k, v in (d.get("high_watermark") or {}).items()},
                bound={str(k): int(v) for k, v in (d.get("bound") or {}).items()},
                stream_status=str(_value(_require(d, owner, "stream_status"))),
                stream_changed_at=float(d.get("stream_changed_at") or 0.0),
                lag=lag,
                lag_unit=lag_unit,
                lag_seconds=None if lag_seconds is None else float(lag_seconds),
                observer=str(_require(d, owner, "observer")),
                writer_outcome=d.get("writer_outcome"),
                upstream=None if d.get("upstream") is None else dict(d["upstream"]),
            )
        except (TypeError, ValueError, AttributeError) as e:
            raise ConfigurationError(f"{owner}: unreadable observation: {e}", field="observation") from e


@dataclass(frozen=True)
class StallSettings:
    """The thresholds of the rules. Every number is in seconds unless its name says otherwise."""

    # Observations looked at (None: DEFAULT_WINDOW_SECONDS, or the shortest window that leaves
    # its margin over the stall threshold if that is longer; see minimum_window_seconds).
    window_seconds: float | None = None
    cadence_seconds: float = 60.0        # how often batches are expected (the micro-batch schedule)
    stall_multiplier: float = 3.0        # stalled after max(k * cadence, min_stall) without the upper moving while the source grew
    min_stall_seconds: float = 300.0
    stale_after_seconds: float | None = None  # newest observation older than this -> STALE (None: max(2 * cadence, 120))
    lag_seconds_objective: float | None = None  # LAGGING when lag_seconds is above it
    page_on_lagging: bool = False
    max_stopped_seconds: float | None = None    # STOPPED / RECOVERING longer than this pages (None: never)
    consecutive_breaches: int = 2        # fire only after this many consecutive breaching evaluations

    def __post_init__(self) -> None:
        def number(name: str, *, optional: bool = False, zero_ok: bool = False) -> None:
            value = getattr(self, name)
            if value is None and optional:
                return
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise _field_error("StallSettings", name, "must be a finite number of seconds"
                                   + (" or None" if optional else ""), value)
            if value < 0 or (value == 0 and not zero_ok):
                raise _field_error("StallSettings", name, "must be " + ("zero or more" if zero_ok else "positive"),
                                   value)

        number("cadence_seconds")
        number("stall_multiplier")
        number("min_stall_seconds", zero_ok=True)
        number("stale_after_seconds", optional=True)
        number("lag_seconds_objective", optional=True)
        number("max_stopped_seconds", optional=True, zero_ok=True)
        if not isinstance(self.page_on_lagging, bool):
            raise _field_error("StallSettings", "page_on_lagging", "must be true or false", self.page_on_lagging)
        if isinstance(self.consecutive_breaches, bool) or not isinstance(self.consecutive_breaches, int) \
                or self.consecutive_breaches < 1:
            raise _field_error("StallSettings", "consecutive_breaches", "must be an integer of at least 1",
                               self.consecutive_breaches)
        if self.window_seconds is None:
            object.__setattr__(self, "window_seconds", max(DEFAULT_WINDOW_SECONDS, self.minimum_window_seconds))
        number("window_seconds")
        # The window must hold the last look before a stall of threshold length began, so that a
        # monitor with no earlier evaluation dates it inside the window: a margin of the widest
        # gap between looks the rules accept (the stale limit) over the threshold. Longer stalls
        # are dated by the alert state or the look before the window (see evaluate).
        if self.window_seconds < self.minimum_window_seconds:
            raise _field_error("StallSettings", "window_seconds",
                               f"must cover the stall threshold max({self.stall_multiplier:g} x "
                               f"{self.cadence_seconds:g}s, {self.min_stall_seconds:g}s) = {self.stall_seconds:g}s "
                               f"plus a margin of the stale limit {self.stale_limit_seconds:g}s: at least "
                               f"{self.minimum_window_seconds:g}s (leave it unset for that)",
                               self.window_seconds)

    @property
    def stall_seconds(self) -> float:
        """How long the upper may stay unmoved while records are pending."""
        return max(self.stall_multiplier * self.cadence_seconds, self.min_stall_seconds)

    @property
    def minimum_window_seconds(self) -> float:
        """The shortest valid window: the stall threshold plus the stale limit."""
        return self.stall_seconds + self.stale_limit_seconds

    @property
    def stale_limit_seconds(self) -> float:
        """How old the newest observation may be."""
        if self.stale_after_seconds is not None:
            return float(self.stale_after_seconds)
        return max(2 * self.cadence_seconds, 120.0)

    def thresholds(self) -> dict[str, Any]:
        """The numbers the rules compare against, for evaluations and pages."""
        return {
            "stall_seconds": self.stall_seconds,
            "stall_multiplier": self.stall_multiplier,
            "cadence_seconds": self.cadence_seconds,
            "min_stall_seconds": self.min_stall_seconds,
            "stale_after_seconds": self.stale_limit_seconds,
            "lag_seconds_objective": self.lag_seconds_objective,
            "page_on_lagging": self.page_on_lagging,
            "max_stopped_seconds": self.max_stopped_seconds,
            "window_seconds": self.window_seconds,
            "consecutive_breaches": self.consecutive_breaches,
        }

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "StallSettings":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigurationError(f"StallSettings: unknown field {unknown[0]!r}", field=unknown[0])
        return cls(**dict(d))


@dataclass(frozen=True)
class AlertState:
    """The evaluation state of one shard across evaluations; persisted as JSON in consensus."""

    shard_id: str
    consecutive_breaches: int = 0
    firing: bool = False                 # a page was triggered and not resolved yet
    firing_status: str | None = None
    incident_started_at: float | None = None
    max_upper: int = -1                  # highest upper ever observed (REWOUND stays until regained)
    max_high_watermark: dict[str, int] = field(default_factory=dict)
    last_status: str | None = None
    last_evaluated_at: float | None = None
    pages_sent: int = 0                  # triggers that reached a channel (see settle_pages)
    # Pages decided and not yet confirmed delivered, oldest first: {"id", "leased_until",
    # "event"} (see enqueue_page / take_pages). Saved with the decision that made them, so a
    # worker that dies before sending leaves them for the next round.
    outbox: tuple[dict, ...] = ()
    outbox_dropped: int = 0              # pages dropped from a full outbox, never delivered
    # The settings (StallSettings.to_dict) of the evaluation that saved this state and who made
    # it (its observer): the shard page judges with them, so that it and the monitor agree.
    # None in rows written before they were kept.
    settings: dict | None = None
    evaluated_by: str | None = None
    last_sent_at: float | None = None    # when a page of this shard was last delivered
    # Why the latest pages settled reached no channel (no PagerDuty or Slack connection is
    # configured: they were only logged); None once a page reaches one.
    unsent_reason: str | None = None
    # The stall clock carried across evaluations, so that stall time is never capped by the
    # window: the upper the last judging evaluation saw, and since when records were pending
    # at it (None: nothing pending). The upper never moves back, so while it stays at
    # stall_upper those records are still pending.
    stall_upper: int | None = None
    pending_since: float | None = None
    # The monitor's own page for this shard (BlindState as a dict) while it is open.
    blind: dict | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "shard_id": self.shard_id,
            "consecutive_breaches": self.consecutive_breaches,
            "firing": self.firing,
            "firing_status": self.firing_status,
            "incident_started_at": self.incident_started_at,
            "max_upper": self.max_upper,
            "max_high_watermark": dict(self.max_high_watermark),
            "last_status": self.last_status,
            "last_evaluated_at": self.last_evaluated_at,
            "pages_sent": self.pages_sent,
            "outbox": [dict(entry) for entry in self.outbox],
            "outbox_dropped": self.outbox_dropped,
            "settings": None if self.settings is None else dict(self.settings),
            "evaluated_by": self.evaluated_by,
            "last_sent_at": self.last_sent_at,
            "unsent_reason": self.unsent_reason,
            "stall_upper": self.stall_upper,
            "pending_since": self.pending_since,
            "blind": None if self.blind is None else dict(self.blind),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "AlertState":
        owner = "AlertState"
        try:
            started = d.get("incident_started_at")
            evaluated = d.get("last_evaluated_at")
            sent = d.get("last_sent_at")
            return cls(
                shard_id=str(_require(d, owner, "shard_id")),
                consecutive_breaches=int(d.get("consecutive_breaches", 0)),
                firing=bool(d.get("firing", False)),
                firing_status=d.get("firing_status"),
                incident_started_at=None if started is None else float(started),
                max_upper=int(d.get("max_upper", -1)),
                max_high_watermark={str(k): int(v) for k, v in (d.get("max_high_watermark") or {}).items()},
                last_status=d.get("last_status"),
                last_evaluated_at=None if evaluated is None else float(evaluated),
                pages_sent=int(d.get("pages_sent", 0)),
                outbox=tuple(_outbox_entry(entry) for entry in d.get("outbox") or ()),
                outbox_dropped=int(d.get("outbox_dropped", 0)),
                settings=None if d.get("settings") is None else dict(d["settings"]),
                evaluated_by=d.get("evaluated_by"),
                last_sent_at=None if sent is None else float(sent),
                unsent_reason=d.get("unsent_reason"),
                stall_upper=None if d.get("stall_upper") is None else int(d["stall_upper"]),
                pending_since=None if d.get("pending_since") is None else float(d["pending_since"]),
                blind=None if d.get("blind") is None else dict(d["blind"]),
            )
        except (TypeError, ValueError, AttributeError, KeyError) as e:
            raise ConfigurationError(f"{owner}: unreadable alert state: {e}", field="alert_state") from e


DEFAULT_SETTINGS_NOTE = "no monitor has evaluated this shard yet: judged with the default thresholds"


def judging_settings(state: AlertState) -> tuple[StallSettings, str | None]:
    """The settings to judge a shard with outside an evaluation round (the shard page): those
    its monitor last evaluated with (kept in its alert state), so that both reach one verdict;
    the rules' defaults, with a note saying so, for a shard no monitor has evaluated or whose
    recorded settings cannot be read. Fields a newer version recorded are left out."""
    if state.settings is None:
        return StallSettings(), DEFAULT_SETTINGS_NOTE
    known = {f.name for f in fields(StallSettings)}
    try:
        return StallSettings.from_dict({k: v for k, v in state.settings.items() if k in known}), None
    except (ConfigurationError, TypeError) as e:
        return StallSettings(), f"the monitor's recorded settings cannot be read ({e}): judged with the default thresholds"


def _outbox_entry(entry: Mapping[str, Any]) -> dict[str, Any]:
    return {"id": str(entry["id"]), "leased_until": float(entry.get("leased_until") or 0.0),
            "event": dict(entry["event"]), "delivered": [str(c) for c in entry.get("delivered") or ()],
            "taken": bool(entry.get("taken", entry.get("leased_until"))),
            # Rows written before it was kept: a resolve followed an open incident.
            "open_before": bool(entry.get("open_before", entry["event"].get("action") == "resolve"))}


@dataclass(frozen=True)
class Evaluation:
    """What the rules decided about one shard at ``evaluated_at``."""

    shard_id: str
    status: FrontierStatus
    rule: str                      # the rule that decided, with its numbers
    reasons: tuple[str, ...]       # human sentences, most important first
    evaluated_at: float
    upper: int | None
    last_advance_at: float | None  # when the upper was last seen to move (or last_commit_at)
    stuck_seconds: float | None
    lag: int | None                # the newest observation's, in lag_unit
    lag_unit: str | None
    lag_seconds: float | None
    window: dict                   # {"start", "end", "samples", "seconds", "first_sample_at", "last_sample_at"}
    writers_running: bool | None   # STALLED: were writers observed running (committing nothing) since it stalled?
    breach: bool                   # this status pages
    severity: str | None           # "critical" / "warning" when it pages, None otherwise
    thresholds: dict               # the numbers the rule compared against
    # The highest upper and high watermarks known to this evaluation (the state's and the
    # window's): advance_alert keeps them so that REWOUND stays until they are regained.
    max_upper: int | None = None
    max_high_watermark: dict = field(default_factory=dict)
    # The stall clock this evaluation judged with (see AlertState.stall_upper); stall_upper
    # None: the rules decided before looking at it (STOPPED, STALE, REWOUND, NOT_FOUND).
    stall_upper: int | None = None
    pending_since: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "shard_id": self.shard_id,
            "status": self.status.value,
            "rule": self.rule,
            "reasons": list(self.reasons),
            "evaluated_at": self.evaluated_at,
            "upper": self.upper,
            "last_advance_at": self.last_advance_at,
            "stuck_seconds": self.stuck_seconds,
            "lag": self.lag,
            "lag_unit": self.lag_unit,
            "lag_seconds": self.lag_seconds,
            "window": dict(self.window),
            "writers_running": self.writers_running,
            "breach": self.breach,
            "severity": self.severity,
            "thresholds": dict(self.thresholds),
            "max_upper": self.max_upper,
            "max_high_watermark": dict(self.max_high_watermark),
            "stall_upper": self.stall_upper,
            "pending_since": self.pending_since,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Evaluation":
        try:
            return cls(
                shard_id=str(_require(d, "Evaluation", "shard_id")),
                status=FrontierStatus(_require(d, "Evaluation", "status")),
                rule=str(d.get("rule", "")),
                reasons=tuple(d.get("reasons") or ()),
                evaluated_at=float(_require(d, "Evaluation", "evaluated_at")),
                upper=d.get("upper"),
                last_advance_at=d.get("last_advance_at"),
                stuck_seconds=d.get("stuck_seconds"),
                # An evaluation made before the unit was kept counted offsets.
                lag=d["lag"] if "lag" in d else d.get("lag_records"),
                lag_unit=d.get("lag_unit") if "lag" in d else (None if d.get("lag_records") is None else OFFSETS),
                lag_seconds=d.get("lag_seconds"),
                window=dict(d.get("window") or {}),
                writers_running=d.get("writers_running"),
                breach=bool(d.get("breach", False)),
                severity=d.get("severity"),
                thresholds=dict(d.get("thresholds") or {}),
                max_upper=d.get("max_upper"),
                max_high_watermark=dict(d.get("max_high_watermark") or {}),
                stall_upper=d.get("stall_upper"),
                pending_since=d.get("pending_since"),
            )
        except (TypeError, ValueError) as e:
            raise ConfigurationError(f"Evaluation: unreadable evaluation: {e}", field="evaluation") from e


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


# ---------------------------------------------------------------------------------------------
# Alerting


def advance_alert(state: AlertState, evaluation: Evaluation,
                  settings: StallSettings) -> tuple[AlertState, str | None]:
    """The alert state after ``evaluation`` and the page action it calls for.

    "trigger": the breach reached ``settings.consecutive_breaches`` consecutive evaluations and
    no page is firing; "resolve": a page is firing and this evaluation does not breach; None
    otherwise (a breach that persists does not page twice)."""
    if evaluation.shard_id != state.shard_id:
        raise ConfigurationError(f"the evaluation of shard {evaluation.shard_id!r} cannot advance the alert state "
                                 f"of shard {state.shard_id!r}", field="shard_id")
    max_upper = state.max_upper
    candidates = [u for u in (evaluation.max_upper, evaluation.upper) if u is not None]
    if candidates:
        max_upper = max([max_upper] + candidates)
    max_hw = dict(state.max_high_watermark)
    for p, hw in (evaluation.max_high_watermark or {}).items():
        if hw > max_hw.get(p, -1):
            max_hw[p] = hw
    common = dict(max_upper=max_upper, max_high_watermark=max_hw, last_status=evaluation.status.value,
                  last_evaluated_at=evaluation.evaluated_at, settings=settings.to_dict())
    if evaluation.stall_upper is not None:
        # An evaluation that did not reach the stall clock (STALE: nothing seen) leaves it as it was.
        common.update(stall_upper=evaluation.stall_upper, pending_since=evaluation.pending_since)

    if evaluation.breach:
        streak = state.consecutive_breaches + 1
        started = state.incident_started_at if state.incident_started_at is not None else evaluation.evaluated_at
        if not state.firing and streak >= settings.consecutive_breaches:
            return replace(state, consecutive_breaches=streak, firing=True, firing_status=evaluation.status.value,
                           incident_started_at=started, **common), "trigger"
        return replace(state, consecutive_breaches=streak, incident_started_at=started, **common), None

    new = replace(state, consecutive_breaches=0, firing=False, firing_status=None, incident_started_at=None,
                  **common)
    return new, ("resolve" if state.firing else None)


def dedup_key(shard_id: str, namespace: str = "") -> str:
    """The page key of a shard: stable across statuses and time, so one incident is one page."""
    key = f"{DEDUP_PREFIX}/{namespace}/{shard_id}"
    if len(key) > MAX_DEDUP_KEY_CHARS:
        digest = hashlib.sha256(key.encode()).hexdigest()[:16]
        key = key[:MAX_DEDUP_KEY_CHARS - 17] + "#" + digest
    return key


_SEVERITY_OF = {
    FrontierStatus.STALLED.value: CRITICAL,
    FrontierStatus.REWOUND.value: CRITICAL,
    FrontierStatus.STALE.value: CRITICAL,
    FrontierStatus.LAGGING.value: WARNING,
    FrontierStatus.STOPPED.value: WARNING,
    FrontierStatus.RECOVERING.value: WARNING,
}


def _summary(evaluation: Evaluation, action: str) -> str:
    e = evaluation
    shard = e.shard_id
    if action == "resolve":
        if e.status in (FrontierStatus.OK, FrontierStatus.LAGGING, FrontierStatus.IDLE):
            return f"RESOLVED: {shard} frontier moving again (upper {e.upper})"
        if e.status is FrontierStatus.NOT_FOUND:
            return f"RESOLVED: {shard} no longer exists"
        return f"RESOLVED: {shard} no longer breaching, now {e.status.value} (upper {e.upper})"
    behind = f"+{format_lag(e.lag, e.lag_unit or OFFSETS)}" if e.lag is not None else "lag unknown"
    if e.lag_seconds is not None:
        behind += f" / {format_duration_to_the_second(e.lag_seconds)}"
    if e.status is FrontierStatus.STALLED:
        return f"STALLED: {shard} stuck {format_duration(e.stuck_seconds)}, {behind} behind"
    if e.status is FrontierStatus.LAGGING:
        return f"LAGGING: {shard} {behind} behind and growing (upper {e.upper})"
    if e.status is FrontierStatus.REWOUND:
        return f"REWOUND: {shard} upper {e.upper}, maximum seen {e.max_upper}: {e.reasons[0] if e.reasons else ''}"
    if e.status is FrontierStatus.STALE:
        return f"STALE: {shard} not observed: {e.reasons[0] if e.reasons else e.rule}"
    if e.status in (FrontierStatus.STOPPED, FrontierStatus.RECOVERING):
        return f"{e.status.value}: {shard} {e.status.value.lower()} for {format_duration(e.stuck_seconds)} (upper {e.upper})"
    return f"{e.status.value}: {shard} (upper {e.upper})"


def page_event(evaluation: Evaluation, state: AlertState, action: str, settings: StallSettings, *,
               namespace: str = "", links: Sequence[dict] = (), run_ids: Sequence[str] = ()) -> dict[str, Any]:
    """What a page says, in the fields of an Events API v2 event. ``state`` is the alert state
    after ``advance_alert``."""
    if action not in ("trigger", "resolve"):
        raise ConfigurationError(f"page action must be 'trigger' or 'resolve' (got {action!r})", field="action")
    summary = _summary(evaluation, action)
    if len(summary) > MAX_SUMMARY_CHARS:
        summary = summary[:MAX_SUMMARY_CHARS - 1] + "…"
    if action == "trigger":
        severity = evaluation.severity or _SEVERITY_OF.get(evaluation.status.value, WARNING)
    else:
        # A resolve closes what the trigger opened; the severity of what was firing, if known.
        severity = _SEVERITY_OF.get(state.firing_status or "", "info")
    return {
        "action": action,
        "dedup_key": dedup_key(evaluation.shard_id, namespace),
        "summary": summary,
        "severity": severity,
        "source": PAGE_SOURCE,
        "component": evaluation.shard_id,
        "group": namespace or None,
        "timestamp": _iso(evaluation.evaluated_at),
        "custom_details": {
            "shard": evaluation.shard_id,
            "status": evaluation.status.value,
            "rule": evaluation.rule,
            "reasons": list(evaluation.reasons),
            "upper": evaluation.upper,
            "last_advance": _iso(evaluation.last_advance_at),
            "stuck_seconds": evaluation.stuck_seconds,
            "lag": evaluation.lag,
            "lag_unit": evaluation.lag_unit,
            "lag_seconds": evaluation.lag_seconds,
            "window": dict(evaluation.window),
            "thresholds": dict(evaluation.thresholds),
            "consecutive_breaches": state.consecutive_breaches,
            "writers_running": evaluation.writers_running,
            "run_ids": list(run_ids),
            "incident_started_at": _iso(state.incident_started_at),
        },
        "links": list(links),
    }


# ---------------------------------------------------------------------------------------------
# The outbox: a page is decided, saved, then sent


# Every HTTP request of a page's delivery is cut after this long (the senders pass it on).
PAGE_REQUEST_TIMEOUT_SECONDS = 10.0
# The channels a page may go to (PagerDuty, then Slack).
PAGE_CHANNELS = 2


def max_delivery_seconds(policy: RetryPolicy = PAGE_DELIVERY, *, channels: int = PAGE_CHANNELS,
                         request_timeout: float = PAGE_REQUEST_TIMEOUT_SECONDS) -> float:
    """The longest one page's delivery can last: on every channel every attempt times out and
    every wait between attempts is the longest allowed (a Retry-After is capped at it too)."""
    return channels * (policy.max_attempts * request_timeout + (policy.max_attempts - 1) * policy.max_wait_seconds)


# How long the round that took a page from the outbox owns its delivery before another round
# may take it: longer than one bounded delivery, so that a live sender is never overtaken.
OUTBOX_LEASE_SECONDS = max_delivery_seconds() + 60.0
# An outbox never grows beyond this many pages (the oldest go first, counted in the state's
# outbox_dropped and logged): a channel that refuses every page must not grow the row without bound.
MAX_OUTBOX = 20


def _key(entry: Mapping[str, Any]) -> Any:
    return entry["event"].get("dedup_key")


def enqueue_page(state: AlertState, event: Mapping[str, Any], page_id: str,
                 now: float = 0.0) -> tuple[AlertState, tuple[dict, ...]]:
    """``state`` with ``event`` added to its outbox, due at once, and the pages dropped to make
    room (oldest first, beyond MAX_OUTBOX; counted in ``outbox_dropped``).

    A newer event supersedes the older pages of its dedup key that no channel confirmed and
    that no live round is delivering (lease run out at ``now``): receivers see only the newest.
    A resolve is dropped too when no receiver can hold an open incident of its key (the
    trigger it supersedes was never taken by a round, and nothing before it was open): nobody
    was paged, nothing to resolve. Otherwise it is sent alone, never after a stale trigger.
    Pages that reached a channel are never superseded: they go to the others first, in order.
    Each page records whether receivers may hold an open incident before it (``open_before``)."""
    key = event.get("dedup_key")
    # The newest pages of this key back to the first that reached a channel or is being delivered.
    gone: list[int] = []
    for i in reversed(range(len(state.outbox))):
        entry = state.outbox[i]
        if _key(entry) != key:
            continue
        if entry.get("delivered") or entry.get("leased_until", 0.0) > now:
            break
        gone.insert(0, i)
    superseded = [state.outbox[i] for i in gone]
    outbox = [entry for i, entry in enumerate(state.outbox) if i not in gone]
    if superseded:
        # What receivers held before the first superseded page, or what a taken trigger may have opened.
        open_before = superseded[0]["open_before"] or any(
            entry.get("taken") and entry["event"].get("action") == "trigger" for entry in superseded)
    else:
        kept = [entry for entry in outbox if _key(entry) == key]
        # After the pages still to go; with none, a resolve closes what a delivered trigger opened.
        open_before = (kept[-1]["event"].get("action") == "trigger") if kept else event.get("action") == "resolve"
    if open_before or event.get("action") != "resolve":
        outbox.append({"id": page_id, "leased_until": 0.0, "event": dict(event), "delivered": [], "taken": False,
                       "open_before": open_before})
    dropped = tuple(outbox[:-MAX_OUTBOX]) if len(outbox) > MAX_OUTBOX else ()
    return replace(state, outbox=tuple(outbox[len(dropped):]),
                   outbox_dropped=state.outbox_dropped + len(dropped)), dropped


def take_pages(state: AlertState, now: float,
               lease_seconds: float = OUTBOX_LEASE_SECONDS) -> tuple[AlertState, tuple[dict, ...]]:
    """The pages of the outbox that are due at ``now``, at most one per dedup key, the oldest:
    a page is never sent before an older one of its key was delivered (a resolve never
    overtakes its trigger). Due: new, or its taker's lease ran out (it died, or could not
    deliver). They are leased to the caller until ``now + lease_seconds``; whoever saves the
    returned state by compare-and-set owns their delivery."""
    taken: list[dict] = []
    outbox: list[dict] = []
    seen: set = set()
    for entry in state.outbox:
        key = _key(entry)
        if key not in seen:
            seen.add(key)
            if entry.get("leased_until", 0.0) <= now:
                entry = {**entry, "leased_until": now + lease_seconds, "taken": True}
                taken.append(entry)
        outbox.append(entry)
    if not taken:
        return state, ()
    return replace(state, outbox=tuple(outbox)), tuple(taken)


def settle_pages(state: AlertState, delivered: Sequence[str] = (), released: Sequence[str] = (),
                 sent_at: float | None = None, *, reached: Mapping[str, Sequence[str]] | None = None,
                 unsent_reason: str | None = None) -> AlertState:
    """``state`` without the ``delivered`` pages, and with the ``released`` ones due again at
    once (their delivery failed: the next round sends them), each remembering the channels it
    ``reached`` (page id -> channels) so that no channel gets it twice. ``sent_at``: when the
    delivered pages reached a channel (None: they were only logged, ``unsent_reason`` says why,
    or nothing was delivered). Only triggers that reached a channel count in ``pages_sent``."""
    reached = reached or {}

    def release(entry: dict) -> dict:
        channels = list(entry.get("delivered") or [])
        channels += [c for c in reached.get(entry["id"], ()) if c not in channels]
        return {**entry, "leased_until": 0.0, "delivered": channels}

    outbox = tuple(release(entry) if entry["id"] in released else entry
                   for entry in state.outbox if entry["id"] not in delivered)
    done = [entry for entry in state.outbox if entry["id"] in delivered]
    if not done:
        return replace(state, outbox=outbox)
    if sent_at is None:
        return replace(state, outbox=outbox, unsent_reason=unsent_reason or state.unsent_reason)
    triggers = sum(1 for entry in done if entry["event"].get("action") == "trigger")
    return replace(state, outbox=outbox, last_sent_at=sent_at, pages_sent=state.pages_sent + triggers,
                   unsent_reason=None)


# ---------------------------------------------------------------------------------------------
# A monitor that cannot evaluate: its own page


# The dedup key's last part for the monitor itself: '#' is in no shard id, so the monitor's
# incident never merges with a shard's.
MONITOR_KEY = "#monitor"


def blind_dedup_key(namespace: str = "", shard_id: str | None = None) -> str:
    """The key of a monitor's own page: one per namespace and shard (a sensor watches one shard,
    and one recovering sensor must not resolve another's page); without a shard, the monitor's
    page for all of its shards (the store cannot even be listed)."""
    return dedup_key(f"{shard_id}{MONITOR_KEY}" if shard_id else MONITOR_KEY, namespace)


@dataclass(frozen=True)
class BlindState:
    """How long a monitor has been unable to evaluate, and whether it paged for it. Kept by
    the evaluator in its process (the store may be what is down), and, once its page was sent,
    in the shard's alert state (``AlertState.blind``) when the store takes it: a later run that
    evaluates again resolves it."""

    since: float | None = None   # the first failed evaluation of the current run of failures
    paged: bool = False
    error: str | None = None      # the latest failure


def advance_blind(state: BlindState, now: float, error: str | None,
                  limit_seconds: float) -> tuple[BlindState, str | None]:
    """The state after one evaluation attempt (``error``: why it failed; None: it worked) and
    the page action it calls for: "trigger" once failures have lasted ``limit_seconds``,
    "resolve" at the first evaluation that works after such a page."""
    if error is None:
        return BlindState(), ("resolve" if state.paged else None)
    since = state.since if state.since is not None else now
    if not state.paged and now - since >= limit_seconds:
        return BlindState(since, True, error), "trigger"
    return BlindState(since, state.paged, error), None


def blind_page_event(state: BlindState, action: str, now: float, *, namespace: str = "",
                     shard_id: str | None = None, limit_seconds: float | None = None) -> dict[str, Any]:
    """The page of a monitor that cannot evaluate (``action`` "trigger") or can again
    ("resolve"), under the monitor's own dedup key."""
    if action not in ("trigger", "resolve"):
        raise ConfigurationError(f"page action must be 'trigger' or 'resolve' (got {action!r})", field="action")
    seconds = None if state.since is None else now - state.since
    what = f"shard {shard_id}" if shard_id else "its shards"
    if action == "trigger":
        summary = (f"MONITOR BLIND: cannot evaluate {what} for {format_duration(seconds)}: "
                   f"{state.error or 'unknown error'}")
    else:
        summary = f"RESOLVED: the frontier monitor evaluates {what} again"
    if len(summary) > MAX_SUMMARY_CHARS:
        summary = summary[:MAX_SUMMARY_CHARS - 1] + "…"
    return {
        "action": action,
        "dedup_key": blind_dedup_key(namespace, shard_id),
        "summary": summary,
        "severity": CRITICAL if action == "trigger" else "info",
        "source": PAGE_SOURCE,
        "component": MONITOR_KEY,
        "group": namespace or None,
        "timestamp": _iso(now),
        "custom_details": {
            "shard": shard_id,
            "status": "MONITOR_BLIND" if action == "trigger" else "MONITOR_OK",
            "error": state.error,
            "failing_since": _iso(state.since),
            "failing_seconds": seconds,
            "limit_seconds": limit_seconds,
            "reasons": [f"every evaluation since {_iso(state.since)} failed: {state.error}: no stall of "
                        f"{what} can be seen, so none can page"] if action == "trigger" else [],
        },
        "links": [],
    }
