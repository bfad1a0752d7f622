"""The metrics a shard reports (engine/common/metrics.py), as pure functions: every outcome,
lag case and frontier status, and the line format a StatsD collector reads."""

from __future__ import annotations

import itertools
import random

import pytest

from airflow_upsert_provider.engine.common import metrics
from airflow_upsert_provider.engine.common.metrics import COUNT, GAUGE, TIMING, Metric
from airflow_upsert_provider.engine.frontier.model import FrontierStatus

OUTCOMES = ("committed", "already_committed", "already_persisted", "nothing_to_do")


def by_name(found: list[Metric]) -> dict[str, Metric]:
    names = [m.name for m in found]
    assert len(names) == len(set(names)), names
    return {m.name: m for m in found}


def test_a_committed_batch_reports_its_outcome_duration_rows_rejects_bytes_upper_and_lag():
    result = {"ts": 4, "outcome": "committed", "rows_in": 120, "rows_out": 100, "rejected": 3,
              "bytes_written": 4567, "seconds": 1.2345, "upper": 5, "lag": 2, "lag_unit": "segments",
              "lag_seconds": 12.5}
    got = by_name(metrics.batch_metrics("orders", result))
    assert got == {
        "upsert.batch.outcome": Metric("upsert.batch.outcome", 1, {"shard": "orders", "outcome": "committed"}, COUNT),
        "upsert.batch.duration": Metric("upsert.batch.duration", 1234.5, {"shard": "orders", "outcome": "committed"},
                                        TIMING),
        "upsert.batch.rows_in": Metric("upsert.batch.rows_in", 120, {"shard": "orders"}, COUNT),
        "upsert.batch.rows_out": Metric("upsert.batch.rows_out", 100, {"shard": "orders"}, COUNT),
        "upsert.batch.rejects": Metric("upsert.batch.rejects", 3, {"shard": "orders"}, COUNT),
        "upsert.batch.bytes_written": Metric("upsert.batch.bytes_written", 4567, {"shard": "orders"}, COUNT),
        "upsert.upper": Metric("upsert.upper", 5, {"shard": "orders"}, GAUGE),
        "upsert.lag": Metric("upsert.lag", 2, {"shard": "orders", "unit": "segments"}, GAUGE),
        "upsert.lag_seconds": Metric("upsert.lag_seconds", 12.5, {"shard": "orders"}, GAUGE),
    }


# Nothing pending has no age (ShardStatus.lag_seconds_at gives None): lag 0 with seconds is no state.
LAG_CASES = [(lag, age) for lag in (None, 0, 7) for age in (None, 0.0, 3.25) if not (lag == 0 and age)]


@pytest.mark.parametrize("outcome", OUTCOMES)
@pytest.mark.parametrize(("lag", "lag_seconds"), LAG_CASES)
def test_every_outcome_and_lag_case(outcome, lag, lag_seconds):
    result = {"outcome": outcome, "rows_in": 5, "rows_out": 4, "rejected": 1, "bytes_written": 9, "seconds": 0.5,
              "upper": 3, "lag": lag, "lag_unit": "offsets", "lag_seconds": lag_seconds}
    got = by_name(metrics.batch_metrics("s.1", result))
    assert got["upsert.batch.outcome"].tags == {"shard": "s.1", "outcome": outcome}
    assert got["upsert.batch.duration"].value == 500.0
    counted = {"upsert.batch.rows_in", "upsert.batch.rows_out", "upsert.batch.rejects", "upsert.batch.bytes_written"}
    # A step that found nothing to do counted nothing: no zero rows sent as if a batch ran.
    assert (counted <= set(got)) == (outcome != "nothing_to_do")
    assert ("upsert.lag" in got) == (lag is not None)
    if lag is None:
        assert "upsert.lag_seconds" not in got
    elif lag_seconds is not None:
        assert got["upsert.lag_seconds"].value == lag_seconds
    elif lag == 0:
        assert got["upsert.lag_seconds"].value == 0  # nothing pending: no wait
    else:
        assert "upsert.lag_seconds" not in got  # pending, its age not known (Kafka): not invented


def test_an_unknown_outcome_is_counted_with_its_duration_and_no_upper():
    got = by_name(metrics.outcome_unknown_metrics("orders", 2.0))
    assert set(got) == {"upsert.batch.outcome", "upsert.batch.duration", "upsert.batch.rows_in",
                        "upsert.batch.rows_out", "upsert.batch.rejects", "upsert.batch.bytes_written"}
    assert got["upsert.batch.outcome"].tags["outcome"] == "outcome_unknown"
    assert got["upsert.batch.duration"].value == 2000.0
    assert all(got[n].value == 0 for n in set(got) - {"upsert.batch.outcome", "upsert.batch.duration"})


@pytest.mark.parametrize("operation", metrics.MAINTENANCE_OPERATIONS)
def test_maintenance_durations_in_milliseconds(operation):
    (metric,) = metrics.maintenance_metrics("orders", operation, 0.25)
    assert metric == Metric(f"upsert.{operation}.duration", 250.0, {"shard": "orders"}, TIMING)


def test_an_unknown_maintenance_operation_is_refused_naming_it():
    with pytest.raises(ValueError, match="'vacuum'"):
        metrics.maintenance_metrics("orders", "vacuum", 1.0)


def test_every_frontier_status_has_its_own_code():
    assert set(metrics.FRONTIER_STATUS_CODES) == {s.value for s in FrontierStatus}
    assert len(set(metrics.FRONTIER_STATUS_CODES.values())) == len(FrontierStatus)


@pytest.mark.parametrize("status", [s.value for s in FrontierStatus])
def test_frontier_metrics_of_every_status(status):
    evaluation = {"shard_id": "orders", "status": status, "breach": status == "STALLED", "stuck_seconds": 600.0,
                  "upper": 9, "lag": 3, "lag_unit": "segments", "lag_seconds": 700.0}
    got = by_name(metrics.frontier_metrics(evaluation))
    assert got["upsert.frontier.status"] == Metric(
        "upsert.frontier.status", metrics.FRONTIER_STATUS_CODES[status], {"shard": "orders", "status": status})
    assert got["upsert.frontier.breach"].value == (1 if status == "STALLED" else 0)
    assert got["upsert.frontier.stuck_seconds"].value == 600.0
    assert got["upsert.lag_seconds"].value == 700.0
    assert got["upsert.lag"].tags == {"shard": "orders", "unit": "segments"}


def test_a_frontier_evaluation_of_an_unknown_shard_sends_no_upper_or_lag():
    got = by_name(metrics.frontier_metrics({"shard_id": "gone", "status": "NOT_FOUND", "breach": False,
                                            "stuck_seconds": None, "upper": None, "lag": None}))
    assert set(got) == {"upsert.frontier.status", "upsert.frontier.breach"}


def test_tag_values_never_carry_a_statsd_or_influx_separator():
    rng = random.Random(37)
    alphabet = "ab.-_/,=:|# \n\té"
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
        value = metrics.tag_value(text)
        assert value and not set(value) & set(",=:|# \n\té"), (text, value)
        if text and not set(text) & set(",=:|# \n\té"):
            assert value == text  # a safe value is sent as it is


def test_the_influx_name_puts_sorted_tags_after_the_name():
    metric = Metric("upsert.lag", 2, {"unit": "segments", "shard": "orders"})
    assert metrics.influx_name(metric) == "upsert.lag,shard=orders,unit=segments"


def test_send_quietly_sends_nothing_without_a_sink_and_survives_a_failing_one(caplog):
    sent = []

    class Sink:
        def send(self, batch):
            sent.append(list(batch))

    class Down:
        def send(self, batch):
            raise OSError("network unreachable\nsecond line")

    batch = metrics.live_runs_metrics("orders", 4)
    metrics.send_quietly(None, batch)
    metrics.send_quietly(Sink(), [])
    assert sent == []
    metrics.send_quietly(Sink(), batch)
    assert sent == [[Metric("upsert.live_runs", 4, {"shard": "orders"}, GAUGE)]]
    metrics.send_quietly(Down(), batch)
    assert "metrics not sent (OSError: network unreachable)" in caplog.text


def test_every_metric_kind_is_known():
    samples = itertools.chain(
        metrics.batch_metrics("a", {"outcome": "committed", "seconds": 1, "upper": 1, "lag": 1, "lag_unit": "x"}),
        metrics.maintenance_metrics("a", "gc", 1), metrics.live_runs_metrics("a", 1),
        metrics.frontier_metrics({"shard_id": "a", "status": "OK", "upper": 1, "lag": 0, "lag_unit": "x"}),
    )
    assert {m.kind for m in samples} <= set(metrics.KINDS)
