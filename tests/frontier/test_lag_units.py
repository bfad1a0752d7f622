"""The lag carries its source's unit (records for Kafka, segment files for a directory), and
every text that shows it says the unit: the rules' reasons, the page, the Slack message, the
sensor's failure block, ``upsertctl`` lines and the upsert operator's batch line. Pure: no
store, no Spark, no broker."""

from __future__ import annotations

import json
from typing import Any

import pytest

from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.engine.frontier.alerts import AlertState, advance_alert
from airflow_upsert_provider.engine.frontier.model import Evaluation, FrontierStatus, Observation, StallSettings
from airflow_upsert_provider.engine.frontier.pages import page_event
from airflow_upsert_provider.engine.frontier.rules import evaluate
from airflow_upsert_provider.engine.sources.directory import DirectorySource
from airflow_upsert_provider.engine.sources.kafka import KafkaSource
from airflow_upsert_provider.engine.sources.lag import format_lag, format_pending
from airflow_upsert_provider.engine.table.shard import ShardStatus

NOW = 1_800_000_000.0


def test_the_unit_comes_from_the_source_kind(tmp_path) -> None:
    assert DirectorySource(str(tmp_path), "jsonl").lag_unit == "segments"
    assert DirectorySource(str(tmp_path), "parquet").lag_unit == "segments"
    assert KafkaSource("orders", None).lag_unit == "records"


def test_a_directory_status_counts_segment_files_not_the_distance_between_their_numbers() -> None:
    # Files 0, 10, 20, 30 in two partitions, none bound: 8 files pending, 62 offsets apart.
    status = ShardStatus(shard="orders", upper=0, since=0, seqno=0, high_watermark={"p0": 31, "p1": 31},
                         bound={}, rows=None, pending_segments=8, lag_unit="segments")
    assert sum(status.lag_offsets.values()) == 62
    assert (status.lag, status.lag_unit) == (8, "segments")
    source = status.to_dict()["source"]
    assert (source["lag"], source["lag_unit"], source["lag_offsets"]) == (8, "segments", {"p0": 31, "p1": 31})


@pytest.mark.parametrize("amount, unit, text", [
    (75_000, "records", "75,000 records"),
    (1, "records", "1 record"),
    (12, "segments", "12 segments"),
    (1, "segments", "1 segment"),
    (0, "segments", "0 segments"),
    (240, "offsets", "240 offsets"),
    (None, "records", "unknown"),
])
def test_format_lag(amount: int | None, unit: str, text: str) -> None:
    assert format_lag(amount, unit) == text


@pytest.mark.parametrize("amount, unit, seconds, text", [
    (12, "segments", 160.0, "12 segments pending, the oldest for 2m40s"),
    (75_000, "records", 9.6, "75,000 records pending, the oldest for 10s"),
    (3, "records", None, "3 records pending"),
    (0, "segments", None, "nothing pending"),
    (None, None, None, "lag unknown"),
])
def test_format_pending(amount: int | None, unit: str | None, seconds: float | None, text: str) -> None:
    assert format_pending(amount, unit, seconds) == text


def obs(t: float, upper: int, lag: int, unit: str = "segments", **overrides: Any) -> Observation:
    fields: dict[str, Any] = dict(
        shard_id="orders", observed_at=t, upper=upper, last_commit_at=NOW - 7200, high_watermark={"p0": 100},
        bound={"p0": 10}, stream_status="READY", stream_changed_at=0.0, lag=lag, lag_unit=unit,
        lag_seconds=None, observer="sensor:s")
    fields.update(overrides)
    return Observation(**fields)


def test_an_observation_keeps_its_unit_and_reads_rows_recorded_before_units() -> None:
    o = obs(NOW, 3, 12, lag_seconds=160.0)
    stored = json.loads(json.dumps(o.to_dict()))
    assert (stored["lag"], stored["lag_unit"]) == (12, "segments") and "lag_records" not in stored
    assert Observation.from_dict(stored) == o
    # A row written before the unit was kept counted the distance between offsets.
    legacy = {k: v for k, v in stored.items() if k not in ("lag", "lag_unit")} | {"lag_records": 240}
    old = Observation.from_dict(legacy)
    assert (old.lag, old.lag_unit) == (240, "offsets")
    with pytest.raises(ConfigurationError, match="lag_unit must be one of records, segments, offsets") as bad:
        Observation.from_dict({**stored, "lag_unit": "files"})
    assert bad.value.details["field"] == "lag_unit"
    with pytest.raises(ConfigurationError, match="field 'lag_unit' is missing"):
        Observation.from_dict({k: v for k, v in stored.items() if k != "lag_unit"})


def stalled_directory() -> Evaluation:
    """A directory shard: upper 3 unmoved for 10 minutes, 12 segment files pending, the oldest
    for 2m40s more than the stall."""
    window = [obs(NOW - 600 + 60 * i, 3, 12, lag_seconds=760.0 + 60 * i - 600) for i in range(11)]
    window = [obs(NOW - 660, 3, 0)] + window
    return evaluate("orders", window, StallSettings(), NOW, AlertState("orders"))


def test_the_rules_and_the_page_say_the_unit_and_the_wait_to_the_second() -> None:
    e = stalled_directory()
    assert e.status is FrontierStatus.STALLED, e.rule
    assert (e.lag, e.lag_unit, e.lag_seconds) == (12, "segments", 760.0)
    assert e.reasons[0].endswith("with 12 segments pending, the oldest waiting 12m40s"), e.reasons
    event = page_event(e, AlertState("orders"), "trigger", StallSettings())
    assert event["summary"] == "STALLED: orders stuck 10m, +12 segments / 12m40s behind"
    details = event["custom_details"]
    assert (details["lag"], details["lag_unit"], details["lag_seconds"]) == (12, "segments", 760.0)
    assert "lag_records" not in details
    round_trip = Evaluation.from_dict(json.loads(json.dumps(e.to_dict())))
    assert (round_trip.lag, round_trip.lag_unit) == (12, "segments")


def test_an_evaluation_made_before_units_reads_as_offsets() -> None:
    d = stalled_directory().to_dict()
    del d["lag"], d["lag_unit"]
    e = Evaluation.from_dict({**d, "lag_records": 240})
    assert (e.lag, e.lag_unit) == (240, "offsets")
    assert "+240 offsets" in page_event(e, AlertState("orders"), "trigger", StallSettings())["summary"]


def test_a_lag_trend_compares_one_unit_only() -> None:
    # The upper moves every minute; rows recorded before the upgrade counted offsets (thousands),
    # the newer ones count segments (a few, not growing): no trend across the two.
    settings = StallSettings()
    def at(t: float, upper: int, lag: int, unit: str = "segments") -> Observation:
        return obs(t, upper, lag, unit, last_commit_at=t - 5)

    rows = [at(NOW - 600 + 60 * i, 10 + i, 2000 + 500 * i, "offsets") for i in range(6)]
    rows += [at(NOW - 240 + 60 * i, 16 + i, 5 - i % 2) for i in range(5)]
    e = evaluate("orders", rows, settings, NOW, AlertState("orders"))
    assert e.status is FrontierStatus.OK, e.rule
    # The same window with the offset rows rising as segments: LAGGING, in segments.
    growing = rows[:6] + [at(NOW - 240 + 60 * i, 16 + i, 5 + 3 * i) for i in range(5)]
    e = evaluate("orders", growing, settings, NOW, AlertState("orders"))
    assert e.status is FrontierStatus.LAGGING, e.rule
    assert "over 5 samples" in e.rule
    assert any(r.endswith("from 5 to 17 segments") for r in e.reasons), e.reasons


def test_the_slack_message_and_the_sensor_block_say_the_unit() -> None:
    from airflow_upsert_provider.notifications.frontier import slack_message
    from airflow_upsert_provider.sensors.frontier_rounds import describe_breach

    e = stalled_directory()
    state, _ = advance_alert(AlertState("orders"), e, StallSettings(consecutive_breaches=1))
    text = slack_message(page_event(e, state, "trigger", StallSettings()))["text"]
    assert "• lag: `12 segments pending, the oldest for 12m40s`" in text
    assert "• stuck: `10m00s`" in text
    assert "lag records" not in text and "lag seconds" not in text
    block = describe_breach(e.to_dict())
    assert "\n  behind: 12 segments pending, the oldest for 12m40s\n" in block


def test_upsertctl_and_the_operator_lines_say_the_unit() -> None:
    from airflow_upsert_provider.cli.frontier import _observation_line
    from airflow_upsert_provider.operators.upsert import batch_line

    line = _observation_line(obs(NOW, 3, 12, lag_seconds=160.0).to_dict())
    assert line.endswith(": upper 3, last commit 2027-01-15T06:00:00+00:00, 12 segments pending, "
                         "the oldest for 2m40s, stream READY"), line
    batch = {"ts": 4, "outcome": "committed", "rows_in": 120, "rows_out": 118, "rejected": 0, "seconds": 2.4,
             "lag_offsets": {"p0": 150, "p1": 90}, "lag": 15, "lag_unit": "segments", "timings": {}}
    assert batch_line(batch) == "batch ts=4 committed: rows in 120, out 118, rejected 0, lag 15 segments, 2.4s"


def test_the_lag_kept_per_partition_is_the_largest_ones_and_a_count_of_the_rest() -> None:
    """Issue 34 item 4: an observation keeps at most MAX_PARTITIONS_KEPT partitions, those with
    the most lag, and counts the others; nothing is lost from the total. A seeded sweep over
    partition counts and lag shapes (ties, zeros, one partition holding everything)."""
    import random

    from airflow_upsert_provider.engine.frontier.model import MAX_PARTITIONS_KEPT, partition_lag_summary

    rng = random.Random(4)
    for n in list(range(0, 45)) + [200, 1000]:
        for shape in ("random", "ties", "zeros", "one"):
            lags = {"random": lambda i: rng.randint(0, 50), "ties": lambda i: 7, "zeros": lambda i: 0,
                    "one": lambda i: 99 if i == n // 2 else 0}[shape]
            pending = {f"p{i:04d}": lags(i) for i in range(n)}
            summary = partition_lag_summary(pending)
            top = summary["top"]
            assert len(top) == min(n, MAX_PARTITIONS_KEPT) and summary["others"] == n - len(top)
            assert sum(e["lag"] for e in top) + summary["others_lag"] == sum(pending.values())
            # Most lag first, ties by partition; no partition left out holds more than one kept.
            assert [(-e["lag"], e["partition"]) for e in top] == sorted((-e["lag"], e["partition"]) for e in top)
            kept = {e["partition"] for e in top}
            assert all(pending[e["partition"]] == e["lag"] for e in top)
            if top:
                assert all(lag <= top[-1]["lag"] for p, lag in pending.items() if p not in kept)
            # It survives the store: JSON (with sorted keys, as rows are written) and back.
            stored = json.loads(json.dumps(obs(NOW, 0, 0, partition_lag=summary).to_dict(), sort_keys=True))
            assert Observation.from_dict(stored).partition_lag == summary


@pytest.mark.parametrize("bad", [
    [], {"top": 3, "others": 0, "others_lag": 0}, {"top": [{"partition": "p0"}], "others": 0, "others_lag": 0},
    {"top": [{"partition": "p0", "lag": -1}], "others": 0, "others_lag": 0},
    {"top": [], "others": -2, "others_lag": 0}, {"top": [], "others": 0},
    {"top": [{"partition": "p0", "lag": "many"}], "others": 0, "others_lag": 0},
])
def test_a_damaged_lag_per_partition_is_refused_naming_the_field(bad: Any) -> None:
    stored = dict(obs(NOW, 0, 0).to_dict(), partition_lag=bad)
    with pytest.raises(ConfigurationError, match="Observation.partition_lag must be") as refused:
        Observation.from_dict(stored)
    assert refused.value.details["field"] == "partition_lag"
    # A row recorded before it was kept has none.
    stored.pop("partition_lag")
    assert Observation.from_dict(stored).partition_lag is None


def test_the_lag_per_partition_reads_in_the_shards_unit() -> None:
    from airflow_upsert_provider.engine.frontier.model import partition_lag_summary, partition_lag_text

    two = partition_lag_summary({"p0": 3, "p1": 1})
    assert partition_lag_text(two, "segments") == "p0 3 segments, p1 1 segment"
    many = partition_lag_summary({f"{i}": 100 - i for i in range(23)})
    assert partition_lag_text(many, "records").endswith("; 3 more partitions: 237 records")
    assert partition_lag_text(partition_lag_summary({}), "segments") == "no partition"
