"""Operator arguments that arrive as templated strings are read strictly: what they say, or a
failure without retry that names the argument and the value. Never a silent default."""

from __future__ import annotations

import datetime

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_upsert_provider.operators.arguments import parse_bool, parse_choice, parse_int, parse_seconds
from airflow_upsert_provider.operators.upsert import MicroBatchUpsertOperator


@pytest.mark.parametrize(
    ("value", "expected"),
    [(True, True), (False, False), ("true", True), ("False", False), (" TRUE ", True), ("yes", True),
     ("no", False), ("on", True), ("off", False), ("1", True), ("0", False), (1, True), (0, False)],
)
def test_booleans_read_what_they_say(value, expected):
    assert parse_bool(value, "dry_run") is expected


@pytest.mark.parametrize("value", ["treu", "", "None", None, "2", 2, "flase", "y", 0.5, [], "true!"])
def test_anything_else_is_not_a_boolean(value):
    with pytest.raises(AirflowFailException) as raised:
        parse_bool(value, "dry_run")
    assert str(raised.value) == f"dry_run must be true or false, got {value!r}"


@pytest.mark.parametrize(("value", "expected"), [(3, 3), ("3", 3), (" 12 ", 12), (4.0, 4), (None, None),
                                                 ("", None), ("None", None)])
def test_integers(value, expected):
    assert parse_int(value, "max_batches") == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [("3x", "max_batches must be an integer, got '3x'"), ("2.5", "max_batches must be an integer, got '2.5'"),
     (2.5, "max_batches must be an integer, got 2.5"), (True, "max_batches must be an integer, got True"),
     ("0", "max_batches must be >= 1, got 0"), (-4, "max_batches must be >= 1, got -4"),
     ({"n": 1}, "max_batches must be an integer, got {'n': 1}")],
)
def test_bad_integers_fail_naming_argument_and_value(value, message):
    with pytest.raises(AirflowFailException) as raised:
        parse_int(value, "max_batches")
    assert str(raised.value) == message


def test_required_integer_refuses_unset():
    with pytest.raises(AirflowFailException, match="since is required"):
        parse_int("", "since", optional=False)


@pytest.mark.parametrize(("value", "expected"), [(0, 0.0), ("60", 60.0), ("1.5", 1.5),
                                                 (datetime.timedelta(minutes=2), 120.0), (None, None)])
def test_seconds(value, expected):
    assert parse_seconds(value, "grace_seconds") == expected


@pytest.mark.parametrize(("value", "message"), [
    ("six hours", "grace_seconds must be a number of seconds, got 'six hours'"),
    ("nan", "grace_seconds must be a number of seconds, got 'nan'"),
    (float("inf"), "grace_seconds must be a number of seconds, got inf"),
    (True, "grace_seconds must be a number of seconds, got True"),
    ("-1", "grace_seconds cannot be negative, got -1"),
])
def test_bad_seconds(value, message):
    with pytest.raises(AirflowFailException) as raised:
        parse_seconds(value, "grace_seconds")
    assert str(raised.value) == message


def test_choices_are_exact():
    assert parse_choice("submit", "spark_mode", ("in_process", "submit")) == "submit"
    for value in ("Submit", " submit", "sumbit", None):
        with pytest.raises(AirflowFailException, match=r"spark_mode must be one of in_process, submit; got"):
            parse_choice(value, "spark_mode", ("in_process", "submit"))


@pytest.mark.parametrize(
    ("arguments", "message"),
    [({"until_caught_up": "treu"}, "until_caught_up must be true or false, got 'treu'"),
     ({"max_batches": "ten"}, "max_batches must be an integer, got 'ten'"),
     ({"max_files_per_batch": "0"}, "max_files_per_batch must be >= 1, got 0"),
     ({"on_bad_record": "quarantaine"}, "on_bad_record must be one of fail, quarantine; got 'quarantaine'"),
     ({"spark_mode": "sumbit"}, "spark_mode must be one of in_process, submit, connect; got 'sumbit'")],
)
def test_upsert_operator_refuses_bad_arguments_before_touching_the_store(arguments, message, monkeypatch):
    # A connection that cannot be opened: the arguments must fail first.
    monkeypatch.setenv("AIRFLOW_CONN_UPSERT_DEFAULT", '{"conn_type": "upsert", "extra": {"blob_root": "/nonexistent"}}')

    class TaskInstance:
        dag_id, run_id, task_id, map_index, try_number = "d", "r", "t", -1, 1

    operator = MicroBatchUpsertOperator(task_id="upsert", shard="orders", **arguments)
    with pytest.raises(AirflowFailException) as raised:
        operator.execute({"ti": TaskInstance()})
    assert str(raised.value) == message
