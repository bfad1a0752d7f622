"""The records of the frontier rules: what they read and what they decide.

``Observation`` is a shard's frontier seen at one instant, ``StallSettings`` the thresholds the
rules compare against, ``Evaluation`` what the rules decided (a ``FrontierStatus``, the rule,
its reasons and numbers); each with its JSON form and the validation of a stored one. The rules
themselves are in ``engine/frontier/rules.py``.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

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

# The window when none is given (longer when the stall threshold needs it).
DEFAULT_WINDOW_SECONDS = 900.0

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


# An observation keeps the lag of this many partitions, those with the most; the rest are
# counted (how many, and their lag in all), so that a row stays small for any source.
MAX_PARTITIONS_KEPT = 20


def partition_lag_summary(pending: Mapping[str, int], limit: int = MAX_PARTITIONS_KEPT) -> dict[str, Any]:
    """What an observation keeps of the lag per partition (in the shard's lag unit):
    ``{"top": [{"partition", "lag"}, ...], "others": n, "others_lag": m}``: the ``limit``
    partitions with the most lag, most first (ties by partition), and how many the others are
    and what they hold together."""
    if limit < 0:
        raise ConfigurationError(f"limit must be >= 0 (got {limit!r})", field="limit")
    ranked = sorted(pending.items(), key=lambda item: (-item[1], item[0]))
    rest = ranked[limit:]
    return {"top": [{"partition": p, "lag": n} for p, n in ranked[:limit]],
            "others": len(rest), "others_lag": sum(n for _, n in rest)}


def partition_lag_text(summary: Mapping[str, Any], unit: str) -> str:
    """The lag per partition as ``upsertctl`` and logs say it: ``p0 4 segments, p1 1 segment;
    3 more partitions: 7 segments``."""
    text = ", ".join(f"{e['partition']} {format_lag(e['lag'], unit)}" for e in summary["top"]) or "no partition"
    if summary["others"]:
        text += (f"; {summary['others']} more partition{'s' if summary['others'] != 1 else ''}: "
                 f"{format_lag(summary['others_lag'], unit)}")
    return text


def _partition_lag_of(value: Any, owner: str) -> dict[str, Any] | None:
    """A stored ``partition_lag`` validated (None: recorded before it was kept, or a source
    without partitions to tell)."""
    if value is None:
        return None
    problem = "must be {top: [{partition, lag}], others, others_lag} with counts >= 0"
    try:
        top = [{"partition": str(e["partition"]), "lag": int(e["lag"])} for e in value["top"]]
        summary = {"top": top, "others": int(value["others"]), "others_lag": int(value["others_lag"])}
    except (TypeError, KeyError, ValueError):
        raise _field_error(owner, "partition_lag", problem, value) from None
    if any(e["lag"] < 0 for e in top) or summary["others"] < 0 or summary["others_lag"] < 0:
        raise _field_error(owner, "partition_lag", problem, value)
    return summary


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
    # The lag per partition, in lag_unit (partition_lag_summary); None in rows recorded before it.
    partition_lag: dict | None = None

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
            "partition_lag": self.partition_lag,
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
                partition_lag=_partition_lag_of(d.get("partition_lag"), owner),
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
    # The newest observation's lag per partition (Observation.partition_lag).
    partition_lag: dict | None = None

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
            "partition_lag": self.partition_lag,
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
                partition_lag=_partition_lag_of(d.get("partition_lag"), "Evaluation"),
            )
        except (TypeError, ValueError) as e:
            raise ConfigurationError(f"Evaluation: unreadable evaluation: {e}", field="evaluation") from e
