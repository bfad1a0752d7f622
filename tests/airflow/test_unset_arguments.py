"""Whether a templated optional argument was left unset is decided in one place
(operators/arguments.py), for every operator and sensor."""

from __future__ import annotations

import pytest

from airflow_upsert_provider.operators.arguments import is_templated, is_unset, optional_text
from airflow_upsert_provider.operators.lifecycle import ResumeStreamOperator
from airflow_upsert_provider.operators.upsert import MicroBatchUpsertOperator
from airflow_upsert_provider.sensors.frontier import FrontierStallSensor


@pytest.mark.parametrize(("value", "unset"), [(None, True), ("", True), ("None", True), (" None ", True),
                                              ("  ", True), ("none", False), ("kafka_default", False),
                                              (0, False), ("latest", False)])
def test_what_a_template_renders_for_an_unset_value(value, unset):
    assert is_unset(value) is unset
    assert optional_text(value) == (None if unset else str(value))


def test_a_template_is_known_only_when_the_task_runs():
    assert is_templated("{{ params.shard }}") and not is_templated("orders") and not is_templated(None)
    templated = MicroBatchUpsertOperator(task_id="t1", shard="{{ params.shard }}")
    literal = MicroBatchUpsertOperator(task_id="t2", shard="orders")
    assert templated.outlets == [] and len(literal.outlets) == 1


def test_operators_and_sensors_read_unset_values_alike():
    assert ResumeStreamOperator(task_id="r1", shard="orders", reason="None").reason_text == ""
    assert ResumeStreamOperator(task_id="r2", shard="orders", reason="back up").reason_text == "back up"
    sensor = FrontierStallSensor(task_id="s", shard="orders")
    assert sensor._optional(" None ") is None and sensor._optional("pd") == "pd"
