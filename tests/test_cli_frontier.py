"""`upsertctl frontier observe | status`: JSON shapes, human lines and exit codes
(docs/frontier.md). No Spark: shards are made in a SQLite store and their batches committed
with empty runs, which is all an observation looks at."""

from __future__ import annotations

import time

import pytest

from airflow_upsert_provider.engine.frontier import observations
from airflow_upsert_provider.engine.frontier.model import Observation
from airflow_upsert_provider.sample_data import SampleSpec
from tests.helpers import batch, cli_store, make_shard
from tests.helpers import run_cli as run
from tests.helpers import run_cli_json as cli

SPEC = SampleSpec(records=160, keys=40, partitions=2, segments_per_partition=4, seed=5)


@pytest.fixture
def store(tmp_path, monkeypatch, sqlite_url):
    """Two shards, ``a`` (one batch committed) and ``b``, in a store `upsertctl` also uses."""
    consensus, blob = cli_store(tmp_path, monkeypatch, sqlite_url)
    a = make_shard(consensus, blob, tmp_path, spec=SPEC, shard_id="a", max_files_per_batch=2)
    make_shard(consensus, blob, tmp_path, spec=SPEC, shard_id="b", max_files_per_batch=2)
    assert a.mint_binding(0, minted_by="test") is not None
    a.compare_and_append(0, 1, batch(0), epoch=0)
    yield consensus
    consensus.dispose()


def test_observe_every_shard_or_the_named_ones(store, capsys):
    code, out, err = cli(capsys, "frontier", "observe")
    assert (code, err) == (0, "")
    assert [o["shard_id"] for o in out["observations"]] == ["a", "b"]
    a = out["observations"][0]
    assert set(a) == set(Observation.__dataclass_fields__)
    # Files 10, 20 and 30 of both partitions are pending: 6 segments (60 offsets apart).
    assert (a["upper"], a["bound"], a["high_watermark"], a["lag"], a["lag_unit"]) == \
        (1, {"p0": 1, "p1": 1}, {"p0": 31, "p1": 31}, 6, "segments")
    assert a["observer"].startswith("upsertctl:") and a["writer_outcome"] is None
    assert a["stream_status"] == "READY" and a["lag_seconds"] >= 0
    # Recorded, and read back as printed.
    assert [o.to_dict() for o in observations.observation_window(store, "a", 0.0)] == [a]

    code, out, _ = cli(capsys, "frontier", "observe", "b")
    assert code == 0 and [o["shard_id"] for o in out["observations"]] == ["b"]
    assert [observations.observation_count(store, s) for s in ("a", "b")] == [1, 2]

    code, out, err = run(capsys, "frontier", "observe", "a")
    assert code == 0
    assert out.startswith("shard a: upper 1, last commit ") and ", 6 segments pending, the oldest for " in out
    assert out.rstrip().endswith("1 observation(s) recorded")


def test_observe_an_unknown_shard_records_nothing_exit_2(store, capsys):
    code, out, err = cli(capsys, "frontier", "observe", "a", "nope")
    assert code == 2
    assert out["error"] == "ShardNotFound" and "'nope'" in out["message"]
    assert "unknown shard 'nope'" in err
    assert observations.observation_count(store, "a") == 0


def test_status_shape_and_that_it_pages_nobody(store, capsys):
    code, out, err = cli(capsys, "frontier", "status", "a", "--window", "600", "--cadence", "10",
                         "--min-stall", "60")
    assert (code, err) == (0, "")
    assert set(out) == {"shard", "status", "action", "evaluation", "state", "observation", "observe_error",
                        "judged_with", "note", "page"}
    assert (out["judged_with"], out["note"], out["page"]) == ("command line", None, "pages after 2 breaching "
                                                                                   "evaluations in a row")
    assert out["shard"] == "a" and out["action"] is None
    ev = out["evaluation"]
    # One observation is no trend: STALE, with the rule and the numbers it compared.
    assert out["status"] == ev["status"] == "STALE"
    assert ev["rule"].startswith("stale: 1 observation") and ev["reasons"]
    assert ev["window"]["samples"] == 1 and ev["window"]["seconds"] == 600.0
    assert ev["thresholds"]["cadence_seconds"] == 10.0 and ev["thresholds"]["stall_seconds"] == 60.0
    assert (ev["upper"], ev["lag"], ev["lag_unit"], ev["breach"]) == (1, 6, "segments", True)
    assert out["observation"]["upper"] == 1
    # A look by hand records its observation but writes no alert state: it neither counts as
    # a breaching evaluation nor takes a page away from the sensor.
    assert observations.observation_count(store, "a") == 1
    assert observations.load_alert_state(store, "a")[1] == 0

    code, out, _ = cli(capsys, "frontier", "status", "a", "--no-observe")
    assert code == 0 and out["observation"] is None and out["evaluation"]["window"]["samples"] == 1
    assert observations.observation_count(store, "a") == 1


def test_status_shows_the_lag_of_each_partition_of_a_directory_source_in_segments(store, tmp_path, capsys):
    """Issue 34 item 4: an observation records the lag of each partition in segments (not the
    distance between file numbers), and `frontier status` shows it, as JSON and as text, also
    from a recorded observation alone."""
    import shutil

    # Shard a bound offset 0 of both partitions; p0 has 10, 20, 30 pending, and one more segment
    # lands in p1 (renamed into place, as a producer does): 3 and 4 segments.
    landing = tmp_path / "landing"
    shutil.copy(landing / "p1" / "30.jsonl", landing / "p1" / ".40.jsonl.tmp")
    (landing / "p1" / ".40.jsonl.tmp").rename(landing / "p1" / "40.jsonl")
    code, out, err = cli(capsys, "frontier", "status", "a")
    assert (code, err) == (0, "")
    expected = {"top": [{"partition": "p1", "lag": 4}, {"partition": "p0", "lag": 3}], "others": 0, "others_lag": 0}
    assert out["observation"]["partition_lag"] == expected
    assert (out["evaluation"]["partition_lag"], out["evaluation"]["lag"], out["evaluation"]["lag_unit"]) == \
        (expected, 7, "segments")
    # The offsets are 41 and 31 apart from the bound ones: not what is pending.
    assert out["observation"]["high_watermark"] == {"p0": 31, "p1": 41}
    [recorded] = observations.observation_window(store, "a", 0.0)
    assert recorded.partition_lag == expected

    code, out, err = run(capsys, "frontier", "status", "a", "--no-observe")
    assert (code, err) == (0, "")
    assert "lag per partition: p1 4 segments, p0 3 segments" in out.splitlines(), out


def test_status_of_a_stall_by_hand(store, capsys):
    now = time.time()
    for i in range(10):
        observations.record_observation(store, Observation(
            shard_id="b", observed_at=now - 540 + 60 * i, upper=0, last_commit_at=None,
            high_watermark={"p0": 21 + i}, bound={}, stream_status="READY", stream_changed_at=0.0,
            lag=21 + i, lag_unit="records", lag_seconds=None, observer="writer:w1", writer_outcome="nothing_to_do"))
    code, out, err = run(capsys, "frontier", "status", "b", "--no-observe")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    # No monitor evaluated it: the rules' defaults, and the page would go at the second breach.
    assert lines[0] == "shard b: STALLED (critical, pages after 2 breaching evaluations in a row)"
    assert "judged with: no monitor has evaluated this shard yet: judged with the default thresholds" in lines
    assert lines[1].startswith("rule: stalled: source grew, upper unmoved for ")
    assert any("writers running and committing nothing: writer:w1" in line for line in lines)
    assert any(line.startswith("upper: 0, last advance never, stuck ") for line in lines)
    assert any(line.startswith("window: 10 observation(s) from ") and line.endswith(" (15m00s looked at)")
               for line in lines), lines
    assert "lag: 30 records pending" in lines

    code, out, _ = cli(capsys, "frontier", "status", "b", "--no-observe")
    assert out["status"] == "STALLED" and out["evaluation"]["writers_running"] is True
    assert out["evaluation"]["stuck_seconds"] >= 300


def test_status_of_an_unknown_shard_is_not_found_exit_2(store, capsys):
    code, out, err = cli(capsys, "frontier", "status", "nope")
    assert code == 2
    assert out["status"] == "NOT_FOUND" and out["evaluation"]["status"] == "NOT_FOUND"
    assert out["observation"] is None and out["action"] is None
    assert "unknown shard 'nope'" in err
    assert observations.load_alert_state(store, "nope")[1] == 0

    code, out, err = run(capsys, "frontier", "status", "nope")
    assert code == 2 and out.startswith("shard nope: NOT_FOUND")


@pytest.mark.parametrize(("argv", "field"), [
    (("--consecutive-breaches", "0"), "consecutive_breaches"),
    (("--cadence", "-5"), "cadence_seconds"),
    (("--window", "60"), "window_seconds"),  # shorter than the default stall threshold
])
def test_bad_settings_name_the_field_exit_2(store, capsys, argv, field):
    code, out, err = cli(capsys, "frontier", "status", "a", *argv)
    assert code == 2
    assert out["error"] == "ConfigurationError" and out["field"] == field
    assert field in out["message"]
    assert observations.observation_count(store, "a") == 0


def test_status_judges_with_the_monitors_settings_unless_told_otherwise(store, capsys):
    """Issue 34 item 4: records pending for 9 minutes under a monitor with a 5-minute cadence
    (stalled after 15m) are OK for the monitor, the page and upsertctl alike."""
    from airflow_upsert_provider.engine.frontier.alerts import AlertState
    from airflow_upsert_provider.engine.frontier.model import StallSettings

    monitor = StallSettings(cadence_seconds=300, min_stall_seconds=900, window_seconds=3600)
    now = time.time()
    assert observations.save_alert_state(store, AlertState(
        "b", settings=monitor.to_dict(), evaluated_by="sensor:monitor/r1/watch", last_evaluated_at=now - 60,
        last_status="OK", unsent_reason="no PagerDuty or Slack connection is configured"), 0)
    for i in range(11):
        observations.record_observation(store, Observation(
            shard_id="b", observed_at=now - 600 + 60 * i, upper=0, last_commit_at=None,
            high_watermark={"p0": 21 + i}, bound={}, stream_status="READY", stream_changed_at=0.0,
            lag=0 if i == 0 else 21 + i, lag_unit="segments", lag_seconds=None, observer="writer:w1",
            writer_outcome="nothing_to_do"))
    code, out, err = run(capsys, "frontier", "status", "b", "--no-observe")
    lines = out.splitlines()
    assert (code, lines[0]) == (0, "shard b: OK"), out
    assert any("stalled only after 15m" in line for line in lines)
    assert "judged with: the monitor's settings (last evaluation by sensor:monitor/r1/watch)" in lines
    assert "pages sent: none (no PagerDuty or Slack connection is configured)" in lines
    # Thresholds given here replace the monitor's.
    code, out, _ = cli(capsys, "frontier", "status", "b", "--no-observe", "--cadence", "60")
    assert (out["status"], out["judged_with"], out["page"]) == \
        ("STALLED", "command line", "pages after 2 breaching evaluations in a row")
