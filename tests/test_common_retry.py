"""Retry bounds are declared once (engine/common/retry.py) and every retry loop reads them there."""

from __future__ import annotations

import pytest

from airflow_upsert_provider.engine.common import retry
from airflow_upsert_provider.engine.frontier import observations
from airflow_upsert_provider.engine.maintenance import checkpoint, compaction
from airflow_upsert_provider.engine.store import streams
from airflow_upsert_provider.engine.write import writer
from airflow_upsert_provider.notifications import frontier as notifications


def test_named_policies_keep_their_bounds() -> None:
    assert (retry.OUTCOME_UNKNOWN_APPEND.max_attempts, retry.OUTCOME_UNKNOWN_APPEND.base_seconds,
            retry.OUTCOME_UNKNOWN_APPEND.max_wait_seconds) == (4, 0.5, 5.0)
    assert retry.RESTAGE.retries == 3
    assert retry.CAS_CONTENTION.max_attempts == 5
    assert (retry.PAGE_DELIVERY.max_attempts, retry.PAGE_DELIVERY.base_seconds,
            retry.PAGE_DELIVERY.max_wait_seconds) == (6, 1.0, 30.0)


def test_every_retry_loop_takes_its_bounds_from_the_policies() -> None:
    assert writer.APPEND_RETRIES == retry.OUTCOME_UNKNOWN_APPEND.retries
    assert writer.APPEND_RETRY_DELAY_SECONDS == retry.OUTCOME_UNKNOWN_APPEND.base_seconds
    assert writer.APPEND_RETRY_MAX_DELAY_SECONDS == retry.OUTCOME_UNKNOWN_APPEND.max_wait_seconds
    assert writer.MAX_RESTAGES == retry.RESTAGE.retries
    for module_bound in (compaction.MAX_ATTEMPTS, checkpoint.MAX_ATTEMPTS, streams.MAX_ATTEMPTS,
                         observations.MAX_CAS_ATTEMPTS):
        assert module_bound == retry.CAS_CONTENTION.max_attempts
    assert notifications.DEFAULT_RETRY is retry.PAGE_DELIVERY
    assert notifications.RetryPolicy is retry.RetryPolicy


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"max_attempts": 0}, "max_attempts must be an integer >= 1, got 0"),
    ({"base_seconds": -1}, "base_seconds must be a number >= 0, got -1"),
    ({"max_wait_seconds": "5"}, "max_wait_seconds must be a number >= 0, got '5'"),
])
def test_a_policy_refuses_bounds_that_cannot_work(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        retry.RetryPolicy(**kwargs)


def test_the_connect_client_policy_is_spark_s_backoff_bounded_to_about_a_minute() -> None:
    from airflow_upsert_provider.engine.spark import server

    policy = retry.SPARK_CONNECT_CLIENT
    assert (server.CLIENT_RETRIES, server.CLIENT_MAX_BACKOFF_MS) == (policy.retries, 30_000) == (6, 30_000)
    waits = [min(policy.base_seconds * policy.multiplier ** n, policy.max_wait_seconds) for n in range(policy.retries)]
    assert round(sum(waits), 2) == 47.05
