"""Strict parsing of operator arguments that may arrive as templated strings.

A rendered template is a string unless the DAG renders native objects, so ``"false"``,
``"8"`` or ``"3600"`` must be read as what they say, and anything else must fail the task
without retry, naming the argument and the value. Nothing falls back to a default: a typo
such as ``dry_run="treu"`` must never turn a dry run into real deletions.
"""

from __future__ import annotations

import math
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

_TRUE = frozenset({"true", "yes", "on", "1"})
_FALSE = frozenset({"false", "no", "off", "0"})
# What a template renders for an unset optional value.
_UNSET = (None, "", "None")


def is_unset(value: Any) -> bool:
    """Whether an optional (templated) argument was left unset: ``None``, or what a template
    renders for one ("", "None", blanks). Every operator and sensor asks this here."""
    return isinstance(value, str) and value.strip() in _UNSET or value is None


def optional_text(value: Any) -> str | None:
    """An optional (templated) string argument: ``None`` when unset, else its text."""
    return None if is_unset(value) else str(value)


def is_templated(value: Any) -> bool:
    """Whether an argument is still a Jinja template (known only when the task runs)."""
    return "{{" in str(value)


def parse_bool(value: Any, name: str) -> bool:
    """``True``/``False``, or one of true/false, yes/no, on/off, 1/0 (any case)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE:
            return True
        if word in _FALSE:
            return False
    raise AirflowFailException(f"{name} must be true or false, got {value!r}")


def parse_int(value: Any, name: str, *, minimum: int = 1, optional: bool = True) -> int | None:
    """An integer >= ``minimum``; ``None`` when unset and ``optional``."""
    if is_unset(value):
        if optional:
            return None
        raise AirflowFailException(f"{name} is required, got {value!r}")
    number: int | None = None
    if isinstance(value, bool):
        number = None  # True is not 1 here: it is a mistake in the DAG
    elif isinstance(value, int):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    elif isinstance(value, str):
        try:
            number = int(value.strip())
        except ValueError:
            number = None
    if number is None:
        raise AirflowFailException(f"{name} must be an integer, got {value!r}")
    if number < minimum:
        raise AirflowFailException(f"{name} must be >= {minimum}, got {number}")
    return number


def parse_seconds(value: Any, name: str) -> float | None:
    """A finite, non-negative number of seconds (a number, a numeric string or a
    ``timedelta``); ``None`` when unset."""
    if is_unset(value):
        return None
    if hasattr(value, "total_seconds"):
        value = value.total_seconds()
    seconds: float | None = None
    if isinstance(value, bool):
        seconds = None
    elif isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        try:
            seconds = float(value.strip())
        except ValueError:
            seconds = None
    if seconds is None or not math.isfinite(seconds):
        raise AirflowFailException(f"{name} must be a number of seconds, got {value!r}")
    if seconds < 0:
        raise AirflowFailException(f"{name} cannot be negative, got {seconds:g}")
    return seconds


def parse_choice(value: Any, name: str, choices: tuple[str, ...]) -> str:
    """One of ``choices``, exactly."""
    if isinstance(value, str) and value in choices:
        return value
    raise AirflowFailException(f"{name} must be one of {', '.join(choices)}; got {value!r}")


def parse_duration(value: Any, name: str) -> float | None:
    """A positive, finite duration in seconds: a number of seconds, a numeric string, a
    ``timedelta``, or a string such as ``"90s"``, ``"10m"``, ``"1h30m"`` (read by the engine's
    :func:`~airflow_upsert_provider.engine.common.time_text.parse_duration`, as ``upsertctl --for`` is);
    ``None`` when unset."""
    from airflow_upsert_provider.engine.common.time_text import parse_duration as engine_duration
    from airflow_upsert_provider.engine.errors import ConfigurationError

    if is_unset(value):
        return None
    seconds: float | None = None
    if isinstance(value, str):
        try:
            seconds = engine_duration(value, field=name)
        except ConfigurationError:
            raise AirflowFailException(
                f"{name} must be a duration (seconds, or like 90s, 10m, 1h30m), got {value!r}"
            ) from None
    else:
        try:
            seconds = parse_seconds(value, name)
        except AirflowFailException:
            raise AirflowFailException(
                f"{name} must be a duration (seconds, or like 90s, 10m, 1h30m), got {value!r}"
            ) from None
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        raise AirflowFailException(f"{name} must be a duration above zero, got {value!r}")
    return seconds
