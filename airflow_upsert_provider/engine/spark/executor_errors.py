"""The executor-error transport: how an engine error raised where Spark runs Python (a data
source reader or writer on an executor) reaches the driver in its own class.

Spark reports a failed Python task to the driver as its own error, whose message quotes the
Python exception's text; :class:`ExecutorError` puts the engine error's class, message and
details in that text, and :func:`carried_error` reads them back. Used by the Kafka slice reader
and by run I/O, which both sit above this layer."""

from __future__ import annotations

import base64
import json
import re

from airflow_upsert_provider.engine.errors import UpsertError, exception_chain

# An engine error raised on an executor reaches the driver as a Spark error whose message
# quotes the Python exception's text; this marker carries its class and details in that text.
CARRIED_MARK = "upsert-error:"
_CARRIED = re.compile(r"\[" + re.escape(CARRIED_MARK) + r"([A-Za-z0-9_=-]+)\]")


class ExecutorError(Exception):
    """An engine error raised where Spark runs Python (an executor's data source reader), in a
    form that survives the trip to the driver: its text ends with the error's class, message
    and details, encoded, which :func:`carried_error` decodes back into the engine's error."""

    def __init__(self, error: UpsertError) -> None:
        payload = json.dumps({"error": type(error).__name__, "message": error.message, "details": error.details},
                             default=str)
        encoded = base64.urlsafe_b64encode(payload.encode("utf-8")).decode("ascii")
        super().__init__(f"{type(error).__name__}: {error.message} [{CARRIED_MARK}{encoded}]")


def carried_error(exc: BaseException) -> UpsertError | None:
    """The engine error an :class:`ExecutorError` carried inside ``exc`` (a Spark error on the
    driver, or its causes), rebuilt in its class with its message and details; None when
    ``exc`` carries none. Only classes of engine/errors.py are rebuilt."""
    from airflow_upsert_provider.engine import errors

    for current in exception_chain(exc):
        try:
            text = str(current)
        except Exception:  # a Java error whose JVM is gone cannot describe itself
            text = ""
        for encoded in reversed(_CARRIED.findall(text)):
            try:
                carried = json.loads(base64.urlsafe_b64decode(encoded.encode("ascii")))
                cls = getattr(errors, carried["error"], None)
                if isinstance(cls, type) and issubclass(cls, UpsertError):
                    return cls(str(carried["message"]), **dict(carried.get("details") or {}))
            except (ValueError, TypeError, KeyError):
                continue  # a mark cut short by a truncated message: try the next one
    return None
