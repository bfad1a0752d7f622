"""The one mapping from the engine's errors to Airflow's exceptions, used by every operator
and sensor: in process (:func:`to_airflow_error`) and from a submitted Spark job's result
(:func:`error_from_result`)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, NoReturn

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_upsert_provider.engine import errors as engine_errors
from airflow_upsert_provider.engine.errors import (
    BadInputError,
    ConfigurationError,
    IntegrityError,
    OutcomeUnknown,
    SourceSegmentsMissing,
    StreamFenced,
    StreamNotWritable,
    TransitionRefused,
    UpsertError,
)

if TYPE_CHECKING:
    from airflow_upsert_provider.hooks.upsert import UpsertShardHook


class DesignedFailure(AirflowFailException):
    """A failure the project designed, not a fault: a page sent or still open for a stalled
    frontier, a commit fenced by a stop or a recovery, a stream that refuses a run or a
    transition (a stop superseded by another, a recovery step out of order). Its message
    says all there is (a short block, one fact a line), so it is raised without its cause
    and with its traceback cut to the operator (:func:`short_traceback`)."""


def short_traceback(error: DesignedFailure) -> DesignedFailure:
    """``error`` without the frames it was raised through: raised again from the operator's
    ``execute``, its traceback starts there."""
    return error.with_traceback(None)


def raise_from(error: AirflowException, cause: BaseException) -> NoReturn:
    """Raise the mapped ``error``: a designed failure without its cause (the message holds
    it) and with a short traceback; anything else chained to ``cause``, whose traceback may
    be what explains it."""
    if isinstance(error, DesignedFailure):
        raise short_traceback(error) from None
    raise error from cause


def to_airflow_error(exc: UpsertError, hook: UpsertShardHook | None = None) -> AirflowException:
    """The engine's error as Airflow understands it, decided by ``exc.retryable``.

    Retryable errors (the operation may have happened and running it again is safe, e.g. a
    commit whose outcome is unknown; or nothing happened and the cause may pass, e.g. an
    unreachable consensus store) raise ``AirflowException``: Airflow retries within the
    task's ``retries``, and the next try recognises its token or finds the store back.
    Determinate failures (bad data, a violated invariant, a configuration error, a full disk,
    a stream that is stopped or recovering, a refused stream transition) raise
    ``AirflowFailException``: a retry cannot fix them. A stream's refusal keeps the engine's
    message, which names the status, who set it, when and why. An unknown shard names the
    closest shard of ``hook``'s store (:meth:`UpsertShardHook.with_closest_shard`).
    """
    if hook is not None:
        exc = hook.with_closest_shard(exc)
    message = exc.message
    if exc.retryable:
        return AirflowException(f"{message} (retryable)")
    if isinstance(exc, StreamFenced):
        return DesignedFailure(f"stream fenced{_fenced_by(exc.details)}: {message}")
    if isinstance(exc, (StreamNotWritable, TransitionRefused)):
        return DesignedFailure(f"stream refused: {message}")
    if isinstance(exc, SourceSegmentsMissing):
        return AirflowFailException(f"source segments missing: {message}")
    if isinstance(exc, BadInputError):
        records = exc.details.get("records") or []
        listed = "".join(f"\n  {json.dumps(r, default=str)}" for r in records[:5])
        return AirflowFailException(f"bad input, nothing committed: {message}{listed}")
    if isinstance(exc, IntegrityError):
        return AirflowFailException(f"integrity violation: {message}")
    if isinstance(exc, ConfigurationError):
        return AirflowFailException(f"configuration error: {message}")
    return AirflowFailException(message)


def _fenced_by(details: dict[str, Any]) -> str:
    """Which transition fenced a commit, as the engine decided it (``fenced_by``)."""
    transition = details.get("fenced_by")
    if transition == "recovery":
        return f" by a recovery (epoch {details.get('epoch')})"
    if transition == "stop":
        return " by a stop"
    return ""


_ERRORS_BY_EXIT_CODE: dict[int, type[UpsertError]] = {
    2: ConfigurationError, 3: BadInputError, 4: IntegrityError, 5: OutcomeUnknown,
    6: StreamNotWritable, 7: TransitionRefused,
}

# Every engine error by class name: a job's result names the class it raised.
_ERRORS_BY_NAME: dict[str, type[UpsertError]] = {
    name: cls for name, cls in vars(engine_errors).items()
    if isinstance(cls, type) and issubclass(cls, UpsertError)
}


def _error_class(result: dict[str, Any]) -> type[UpsertError] | None:
    """The engine error class a job's result reports: the class it names when that class
    has the reported exit code (e.g. StreamFenced, exit 6), else the exit code's class."""
    exit_code = result.get("exit_code")
    named = _ERRORS_BY_NAME.get(str(result.get("error")))
    if named is not None and named.exit_code == exit_code:
        return named
    return _ERRORS_BY_EXIT_CODE.get(exit_code)


def error_from_result(result: dict[str, Any]) -> AirflowException:
    """The Airflow error for a failed packaged job, from the error class and exit code and
    the ``retryable`` flag it reported."""
    details = {
        k: v for k, v in result.items()
        if k not in ("ok", "exit_code", "error", "message", "driver_seconds", "retryable")
    }
    message = f"{result.get('error')}: {result.get('message')}"
    cls = _error_class(result)
    if cls is None:
        return AirflowException(f"the Spark job failed: {message}")
    error = cls(message, **details)
    error.retryable = bool(result.get("retryable", cls.retryable))
    return to_airflow_error(error)
