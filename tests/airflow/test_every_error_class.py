"""Every engine error class, wherever the package defines it, against both mappings:
`upsertctl` exits with the code docs/errors.md documents for it and prints its message, and
an operator or sensor raises a retrying ``AirflowException`` for a retryable class and an
``AirflowFailException`` for any other, in process and from a submitted job's result alike.

The classes are found by walking ``UpsertError``'s subclasses after importing every module
of the package: a new class fails here until its documented exit code is added below."""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException

import airflow_upsert_provider
from airflow_upsert_provider import cli
from airflow_upsert_provider.engine.errors import UpsertError
from airflow_upsert_provider.operators.errors import error_from_result, to_airflow_error

# class -> (exit code, retryable), as docs/errors.md documents them.
DOCUMENTED: dict[str, tuple[int, bool]] = {
    "UpsertError": (1, False),
    "ConfigurationError": (2, False),
    "ShardNotFound": (2, False),
    "ShardExists": (2, False),
    "SchemaChangeRefused": (2, False),
    "SchemaVersionConflict": (2, True),
    "SchemaVersionMismatch": (2, False),
    "ConsensusUnavailable": (2, True),
    "BlobUnavailable": (2, True),
    "BlobWriteFailed": (2, False),
    "CommitRefused": (2, True),
    "StagingLost": (2, True),
    "PlanningOutdated": (2, True),
    "ReadOutdated": (2, True),
    "KafkaUnavailable": (2, True),
    "SparkUnavailable": (2, True),
    "BadInputError": (3, False),
    "BatchSchemaRefused": (3, False),
    "IntegrityError": (4, False),
    "SourceSegmentsMissing": (4, False),
    "KafkaSliceUnavailable": (4, False),
    "CheckpointCorrupt": (4, False),
    "CommittedFileBad": (4, False),
    "BlobOwnedElsewhere": (4, False),
    "OutcomeUnknown": (5, True),
    "CommitOutcomeUnknown": (5, True),
    "ConsensusOutcomeUnknown": (5, True),
    "StreamNotWritable": (6, False),
    "StreamNotReady": (6, False),
    "StreamFenced": (6, False),
    "TransitionRefused": (7, False),
    "StopSuperseded": (7, False),
}

ERRORS_MD = Path(__file__).resolve().parents[2] / "docs" / "errors.md"


def _subclasses(cls: type) -> Iterator[type]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def every_error_class() -> list[type[UpsertError]]:
    # Every module imported first: a class defined anywhere in the package is then walked.
    for module in pkgutil.walk_packages(airflow_upsert_provider.__path__, f"{airflow_upsert_provider.__name__}."):
        if not module.name.endswith("__main__"):
            importlib.import_module(module.name)
    found = {UpsertError, *_subclasses(UpsertError)}
    return sorted(found, key=lambda cls: cls.__name__)


ERROR_CLASSES = every_error_class()


def test_every_error_class_has_a_documented_exit_code_and_each_code_is_in_errors_md():
    assert sorted(cls.__name__ for cls in ERROR_CLASSES) == sorted(DOCUMENTED)
    documented_codes = {int(code) for code in re.findall(r"^\| (\d+) \|", ERRORS_MD.read_text(), re.MULTILINE)}
    assert {code for code, _ in DOCUMENTED.values()} <= documented_codes


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda cls: cls.__name__)
def test_upsertctl_exits_with_the_documented_code_and_prints_the_error(cls, monkeypatch, capsys):
    exit_code, retryable = DOCUMENTED[cls.__name__]

    def failing(ctx, args):
        raise cls("the step failed", shard="orders")

    # A command that opens no store: the error is all that happens.
    monkeypatch.setitem(cli.COMMANDS, "spark-archive", failing)
    assert cli.main(["spark-archive", "status", "--json"]) == exit_code
    out, err = capsys.readouterr()
    assert json.loads(out) == {"error": cls.__name__, "message": "the step failed", "retryable": retryable,
                               "shard": "orders"}
    assert err == "upsertctl: the step failed\n"


@pytest.mark.parametrize("cls", ERROR_CLASSES, ids=lambda cls: cls.__name__)
def test_operators_raise_the_documented_airflow_exception(cls):
    _, retryable = DOCUMENTED[cls.__name__]
    error = cls("the step failed", shard="orders")
    # In process, and from the result a submitted job writes for the same error.
    job_result = {"ok": False, "exit_code": cls.exit_code, **error.to_dict(), "driver_seconds": 0.1}
    for mapped in (to_airflow_error(error), error_from_result(job_result)):
        assert "the step failed" in str(mapped)
        if retryable:
            assert type(mapped) is AirflowException
        else:
            assert isinstance(mapped, AirflowFailException)
