"""Operators map engine errors on ``retryable``: a retry where it is safe and may help
(``AirflowException``), a failure without retry otherwise (``AirflowFailException``), with
the engine's message, in process and from a submitted job's result alike."""

from __future__ import annotations

import inspect

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_upsert_provider.engine import errors
from airflow_upsert_provider.operators.upsert import _error_from_result, to_airflow_error

ENGINE_ERRORS = sorted(
    (cls for _, cls in inspect.getmembers(errors, inspect.isclass) if issubclass(cls, errors.UpsertError)),
    key=lambda cls: cls.__name__,
)


@pytest.mark.parametrize("cls", ENGINE_ERRORS, ids=lambda cls: cls.__name__)
def test_every_engine_error_maps_on_retryable(cls):
    mapped = to_airflow_error(cls("the store said no", shard="orders"))
    assert "the store said no" in str(mapped)
    if cls.retryable:
        assert type(mapped) is AirflowException and str(mapped) == "the store said no (retryable)"
    else:
        assert isinstance(mapped, AirflowFailException)


def test_retryable_and_determinate_errors_exist_on_both_sides():
    assert {cls.retryable for cls in ENGINE_ERRORS} == {True, False}
    assert errors.CommitOutcomeUnknown.retryable and errors.ConsensusUnavailable.retryable
    assert not errors.ConfigurationError.retryable and not errors.BadInputError.retryable


def test_messages_of_determinate_errors_are_kept():
    bad = errors.BadInputError("2 bad records", records=[{"file": "p0/1.jsonl", "line": 3, "reason": "not JSON"}])
    assert str(to_airflow_error(bad)) == (
        'bad input, nothing committed: 2 bad records\n  {"file": "p0/1.jsonl", "line": 3, "reason": "not JSON"}'
    )
    assert str(to_airflow_error(errors.IntegrityError("catalog is empty"))) == "integrity violation: catalog is empty"
    assert str(to_airflow_error(errors.ShardNotFound("unknown shard 'x'"))) == "configuration error: unknown shard 'x'"


@pytest.mark.parametrize("cls", [c for c in ENGINE_ERRORS if c.exit_code != 1], ids=lambda cls: cls.__name__)
def test_a_submitted_jobs_result_maps_like_the_error_itself(cls):
    # What spark_job writes for the error: its to_dict() and its exit code.
    result = {"ok": False, "exit_code": cls.exit_code, **cls("lost the store", ts=4).to_dict(), "driver_seconds": 1.0}
    mapped = _error_from_result(result)
    assert f"{cls.__name__}: lost the store" in str(mapped)
    assert (type(mapped) is AirflowException) == cls.retryable
    assert isinstance(mapped, AirflowFailException) != cls.retryable


def test_a_job_that_crashed_without_an_engine_error_is_retried():
    mapped = _error_from_result({"ok": False, "exit_code": 1, "error": "Py4JError", "message": "gateway gone"})
    assert type(mapped) is AirflowException and str(mapped) == "the Spark job failed: Py4JError: gateway gone"
