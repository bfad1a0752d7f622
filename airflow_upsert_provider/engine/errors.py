"""Errors of the engine, each with the exit code `upsertctl` documents for it."""

from __future__ import annotations

from typing import Any


class UpsertError(Exception):
    """Base class. ``exit_code`` is what `upsertctl` exits with."""

    exit_code = 1

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_dict(self) -> dict[str, Any]:
        return {"error": type(self).__name__, "message": self.message, **self.details}


class ConfigurationError(UpsertError):
    """Bad usage or configuration: unknown shard, unreachable store, bad option (exit 2)."""

    exit_code = 2


class ShardNotFound(ConfigurationError):
    pass


class ShardExists(ConfigurationError):
    pass


class ConsensusUnavailable(ConfigurationError):
    """The consensus store cannot be reached; nothing was changed."""


class BadInputError(UpsertError):
    """Bad source data. Nothing was committed (exit 3).

    ``details["records"]`` lists the offending records: file, line (or row), field, reason.
    """

    exit_code = 3


class IntegrityError(UpsertError):
    """A shard invariant would be violated or is found violated (exit 4)."""

    exit_code = 4


class CommitOutcomeUnknown(UpsertError):
    """The commit may or may not have landed (connection lost). Staged files are kept;
    retrying with the same token reports ``already_committed`` if it did land (exit 5)."""

    exit_code = 5
