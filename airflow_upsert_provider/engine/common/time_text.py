"""Durations and timestamps as people write and read them, in one place (with pendulum):
``--for 5m`` and ``continuous_for="1h30m"`` are parsed here, and every duration and timestamp a
log line, a page, ``upsertctl`` or the UI shows is formatted here, timestamps in UTC with their
offset."""

from __future__ import annotations

import math
import re

import pendulum

from airflow_upsert_provider.engine.errors import ConfigurationError

DURATION_PATTERN = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?")

# pendulum's Duration is a timedelta: longer durations (about 2.7 million years) are counted
# without it rather than refused.
_LONGEST = int(pendulum.Duration.max.total_seconds())


def parse_duration(text: str, *, field: str = "duration") -> float:
    """Seconds from ``90``, ``90s``, ``10m``, ``1h30m`` or ``1.5h``; positive and finite."""
    text = str(text)
    shown = repr(text) if len(text) <= 40 else f"of {len(text)} characters"
    cleaned = text.strip().lower()
    match = DURATION_PATTERN.fullmatch(cleaned) if cleaned else None
    if match is None or not any(match.groups()):
        raise ConfigurationError(f"{field}: {shown} is not a duration (seconds, or e.g. 90s, 10m, 1h30m)", field=field)
    # Floats, not a pendulum Duration: a long run of digits is still a (finite) number of seconds.
    hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    total = hours * 3600 + minutes * 60 + seconds
    if total <= 0:
        raise ConfigurationError(f"{field}: {shown} must be longer than zero", field=field)
    if not math.isfinite(total):
        # Enough digits make float() infinite: a run that would never end by itself.
        raise ConfigurationError(f"{field}: the duration {shown} is too long to be finite", field=field)
    return total


def _parts(seconds: float) -> tuple[int, int, int, int]:
    """(days, hours, minutes, seconds) of a non-negative duration rounded to the second."""
    whole = max(0, int(round(seconds)))
    if whole > _LONGEST:
        days, rest = divmod(whole, 86400)
        return (days, *_parts(rest)[1:])
    duration = pendulum.duration(seconds=whole)
    return duration.in_days(), duration.hours, duration.minutes, duration.remaining_seconds


def format_duration(seconds: float | None) -> str:
    """A duration as an on-call engineer reads it, to its two largest units: 45s, 14m, 2h05m,
    3d04h."""
    if seconds is None:
        return "unknown"
    days, hours, minutes, secs = _parts(seconds)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m"
    return f"{secs}s"


def format_duration_to_the_second(seconds: float | None) -> str:
    """A duration to the second, in hours at most: 45s, 2m40s, 26h02m05s (a page's stuck time)."""
    if seconds is None:
        return "unknown"
    days, hours, minutes, secs = _parts(seconds)
    hours += days * 24
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def format_seconds(seconds: float | None) -> str:
    """A measured time as a log line shows it: to the tenth below a minute (0.4s, 12.3s),
    to the second above (2m40s, 1h02m05s)."""
    if seconds is None:
        return "unknown"
    if seconds < 59.95:
        return f"{max(0.0, seconds):.1f}s"
    return format_duration_to_the_second(seconds)


def format_timestamp(at: float | None, *, zulu: bool = False, missing: str | None = "never") -> str | None:
    """A Unix time as an ISO 8601 UTC timestamp to the second, ``2026-11-25T23:55:54+00:00``
    (``...Z`` with ``zulu``); ``missing`` for no time."""
    if at is None:
        return missing
    text = pendulum.from_timestamp(at, tz="UTC").isoformat(timespec="seconds")
    return text.replace("+00:00", "Z") if zulu else text
