"""Operators map engine errors on ``retryable``: a retry where it is safe and may help
(``AirflowException``), a failure without retry otherwise (``AirflowFailException``), with
the engine's message, in process and from a submitted job's result alike. A stream that is
stopped or recovering, a fenced commit and a refused transition fail without retry, naming
the status, who set it and when (and for a fenced commit, the transition that fenced it)."""

from __future__ import annotations

import inspect

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_upsert_provider.engine import errors
from airflow_upsert_provider.engine.store.stream_rules import (
    Status,
    StreamState,
    decide_resume,
    fence,
    fenced_by,
    refuse_start,
)
from airflow_upsert_provider.operators.errors import DesignedFailure, error_from_result, to_airflow_error

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
    mapped = error_from_result(result)
    assert f"{cls.__name__}: lost the store" in str(mapped)
    assert (type(mapped) is AirflowException) == cls.retryable
    assert isinstance(mapped, AirflowFailException) != cls.retryable


def test_a_job_that_crashed_without_an_engine_error_is_retried():
    mapped = error_from_result({"ok": False, "exit_code": 1, "error": "Py4JError", "message": "gateway gone"})
    assert type(mapped) is AirflowException and str(mapped) == "the Spark job failed: Py4JError: gateway gone"


STOPPED = StreamState("orders", Status.STOPPED, 2, 0, changed_by="airflow:ops:manual__1:stop:try1",
                      changed_at=1_795_000_000.0, reason="source migration")
RECOVERING = StreamState("orders", Status.RECOVERING, 3, 1_795_000_100_000, changed_by="upsertctl:alice",
                         changed_at=1_795_000_100.0, reason="store replaced")


def _not_ready(state: StreamState) -> errors.StreamNotReady:
    return errors.StreamNotReady(f"{refuse_start(state)}; a run starts no batch until it is READY", **state.to_dict())


def _fenced(state: StreamState, writer_epoch: int) -> errors.StreamFenced:
    return errors.StreamFenced(f"commit of batch 4 of shard 'orders' fenced: {fence(state, writer_epoch)}",
                               ts=4, writer_epoch=writer_epoch, fenced_by=fenced_by(state, writer_epoch),
                               **state.to_dict())


def test_a_stream_that_refuses_fails_without_retry_with_who_set_it_and_when():
    mapped = to_airflow_error(_not_ready(STOPPED))
    assert type(mapped) is DesignedFailure and isinstance(mapped, AirflowFailException)
    assert str(mapped) == (
        "stream refused: shard 'orders' is not READY: the stream is STOPPED (epoch 0), set by "
        "airflow:ops:manual__1:stop:try1 at 2026-11-18T11:06:40+00:00: source migration; a run starts no "
        "batch until it is READY"
    )
    refusal = decide_resume(RECOVERING, "airflow:ops:manual__1:resume:try1", 1_795_000_200.0).refusal
    mapped = to_airflow_error(errors.TransitionRefused(refusal, **RECOVERING.to_dict()))
    assert type(mapped) is DesignedFailure
    assert str(mapped) == (
        "stream refused: resume of shard 'orders' refused: a recovery is open: use recover resume after "
        "recover seek; the stream is RECOVERING (epoch 1795000100000), set by upsertctl:alice at "
        "2026-11-18T11:08:20+00:00: store replaced"
    )
    missing = errors.SourceSegmentsMissing("segment /landing/p0/7.jsonl is missing", missing=[])
    assert str(to_airflow_error(missing)) == "source segments missing: segment /landing/p0/7.jsonl is missing"


def test_a_fenced_commit_names_the_transition_that_fenced_it():
    by_stop = to_airflow_error(_fenced(STOPPED, 0))
    assert type(by_stop) is DesignedFailure and isinstance(by_stop, AirflowFailException)
    assert str(by_stop).startswith("stream fenced by a stop: commit of batch 4 of shard 'orders' fenced: the "
                                   "stream is STOPPED (epoch 0), set by airflow:ops:manual__1:stop:try1 at ")
    by_recovery = to_airflow_error(_fenced(RECOVERING, 0))
    assert str(by_recovery).startswith("stream fenced by a recovery (epoch 1795000100000): commit of batch 4")
    # A recovery that began and ended while the writer worked: READY again, in a later epoch.
    resumed = StreamState("orders", Status.READY, 5, 1_795_000_100_000, changed_by="upsertctl:alice",
                          changed_at=1_795_000_300.0)
    assert str(to_airflow_error(_fenced(resumed, 0))).startswith(
        "stream fenced by a recovery (epoch 1795000100000): commit of batch 4 of shard 'orders' fenced: a "
        "recovery began after this writer started (writer epoch 0, stream READY (epoch 1795000100000)"
    )


@pytest.mark.parametrize(
    "error, prefix",
    [
        (_not_ready(STOPPED), "stream refused: StreamNotReady: shard 'orders' is not READY: the stream is STOPPED"),
        (_fenced(STOPPED, 0), "stream fenced by a stop: StreamFenced: commit of batch 4"),
        (_fenced(RECOVERING, 0), "stream fenced by a recovery (epoch 1795000100000): StreamFenced: commit of batch 4"),
        (errors.TransitionRefused("resume of shard 'orders' refused", **RECOVERING.to_dict()),
         "stream refused: TransitionRefused: resume of shard 'orders' refused"),
    ],
    ids=["not-ready", "fenced-by-stop", "fenced-by-recovery", "transition-refused"],
)
def test_a_submitted_jobs_stream_refusal_maps_to_its_own_class(error, prefix):
    # Exit 6 and 7, as spark_job writes them: the class name and the stream state in details.
    result = {"ok": False, "exit_code": error.exit_code, **error.to_dict(), "driver_seconds": 0.4}
    assert result["exit_code"] in (6, 7)
    mapped = error_from_result(result)
    assert type(mapped) is DesignedFailure
    assert str(mapped).startswith(prefix)
    # A class the operator does not know by name still maps by its exit code, without retry.
    unknown = error_from_result({**result, "error": "StreamGone"})
    assert type(unknown) is DesignedFailure and str(unknown).startswith("stream refused: StreamGone: ")
