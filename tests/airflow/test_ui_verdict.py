"""One verdict: the shard page judges a shard with the settings its monitor evaluated with.

The monitor is ``FrontierStallSensor`` run in this process (one round each, ``watch_seconds=0``)
with settings far from the rules' defaults; the page is its FastAPI app, in process, on the same
store. A shard whose writer commits every five minutes is judged alike by both, also minutes
after the monitor's round (the defaults' stale limit is two minutes); a stalled shard's open
page is on the page with when it opened, when it was sent and who evaluated last.
"""

from __future__ import annotations

import time

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_upsert_provider.engine.blob.files import open_blob
from airflow_upsert_provider.engine.frontier import observations
from airflow_upsert_provider.engine.frontier.alerts import DEFAULT_SETTINGS_NOTE
from airflow_upsert_provider.engine.frontier.model import StallSettings
from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.plugins.ui import list_shards
from airflow_upsert_provider.sensors.frontier import FrontierStallSensor
from tests.airflow.test_frontier_sensor import SPEC, commit_next, conn_env, sensor_context, upsert_env
from tests.airflow.test_frontier_sensor import pager  # noqa: F401 - the fixture
from tests.helpers import make_shard

# The monitor DAG's settings for writers every five minutes: none is the rules' default.
MONITOR = dict(cadence_seconds=300, stall_multiplier=3, min_stall_seconds=900, window_seconds=3600,
               consecutive_breaches=2)
# A stall is seen fast: stalled after max(3 x 10 s, 60 s) = 60 s, one breach pages.
QUICK = dict(cadence_seconds=10, stall_multiplier=3, min_stall_seconds=60, window_seconds=1800,
             consecutive_breaches=1)


def _sensor(shard: str, settings: dict, clock: float, **kwargs) -> FrontierStallSensor:
    task = FrontierStallSensor(task_id="watch", shard=shard, watch_seconds=0, poke_interval=1, **settings, **kwargs)
    task.clock = lambda: clock
    return task


@pytest.fixture
def store(tmp_path, monkeypatch, pager):  # noqa: F811 - the fixture imported above
    url, blob = f"sqlite:///{tmp_path / 'consensus.db'}", open_blob(str(tmp_path / "blob"))
    blob.ensure_root()
    for name, value in {**conn_env(pager), **upsert_env(url, blob.root)}.items():
        monkeypatch.setenv(name, value)
    consensus = open_consensus(url)
    yield consensus, blob
    consensus.dispose()


def test_the_page_and_the_monitor_agree_on_a_shard_written_on_schedule(store, tmp_path):
    consensus, blob = store
    shard = make_shard(consensus, blob, tmp_path, spec=SPEC, shard_id="orders", max_files_per_batch=2)
    now = time.time()
    # The writer runs every five minutes and commits a batch each time, recording what it saw.
    for i in range(4):
        commit_next(shard)
        observations.record_observation(consensus, observations.observe(
            shard, observer=f"writer:run{i}", writer_outcome="committed", now=now - 300 * (4 - i)))
    assert shard.state().upper == 4

    monitor = _sensor("orders", MONITOR, now).execute(sensor_context("scheduled__1"))
    assert monitor["status"] in ("OK", "IDLE"), monitor

    # Looked at when the monitor evaluated, and minutes later (the writer's next run not due yet).
    rows = {later: list_shards(now=now + later)["shards"][0] for later in (0, 200, 500)}
    assert {later: row["frontier"]["status"] for later, row in rows.items()} == dict.fromkeys(rows, monitor["status"])
    row = rows[200]
    frontier = row["frontier"]
    assert (frontier["judged_with"], frontier["note"]) == ("monitor", None)
    # The thresholds shown are the monitor's, not the rules' defaults.
    assert frontier["thresholds"] == StallSettings(**MONITOR).thresholds()
    assert frontier["thresholds"]["stale_after_seconds"] == 600 != StallSettings().stale_limit_seconds
    assert row["monitor"]["evaluated_by"] == "sensor:monitor/scheduled__1/watch"
    assert row["monitor"]["last_evaluated_at"] == now and row["monitor"]["last_status"] == monitor["status"]
    assert row["monitor"]["firing"] is False and row["monitor"]["last_sent_at"] is None


def test_the_page_shows_the_monitors_open_page_and_a_shard_no_monitor_judged_says_so(store, tmp_path, pager):  # noqa: F811
    consensus, blob = store
    stuck = make_shard(consensus, blob, tmp_path, spec=SPEC, shard_id="stuck", max_files_per_batch=2)
    make_shard(consensus, blob, tmp_path, shard_id="unwatched")
    now = time.time()
    observations.record_observation(consensus, observations.observe(
        stuck, observer="writer:w", writer_outcome="nothing_to_do", now=now - 400))

    sent_before = time.time()
    with pytest.raises(AirflowFailException, match="frontier STALLED"):
        _sensor("stuck", QUICK, now, pagerduty_events_conn_id="pagerduty_test",
                namespace="test").execute(sensor_context("scheduled__7"))
    assert [e["event_action"] for e in pager.events()] == ["trigger"]

    rows = {r["shard"]: r for r in list_shards(now=now + 30)["shards"]}
    page = rows["stuck"]
    assert page["frontier"]["status"] == "STALLED" and page["frontier"]["judged_with"] == "monitor"
    assert page["frontier"]["thresholds"]["stall_seconds"] == 60
    monitor = page["monitor"]
    assert (monitor["firing"], monitor["firing_status"], monitor["pages_sent"]) == (True, "STALLED", 1)
    assert monitor["incident_started_at"] == now and monitor["last_evaluated_at"] == now
    assert sent_before <= monitor["last_sent_at"] <= time.time() and monitor["pages_pending"] == 0
    assert monitor["evaluated_by"] == "sensor:monitor/scheduled__7/watch"

    unwatched = rows["unwatched"]
    assert unwatched["monitor"] is None
    assert (unwatched["frontier"]["judged_with"], unwatched["frontier"]["note"]) == ("defaults", DEFAULT_SETTINGS_NOTE)
    assert unwatched["frontier"]["thresholds"] == StallSettings().thresholds()


def test_a_page_no_channel_took_is_not_counted_as_sent_and_the_page_says_why(store, tmp_path):
    """A monitor without a PagerDuty or Slack connection decides the page and only logs it: the
    shard page shows none sent and why, not a page sent."""
    consensus, blob = store
    stuck = make_shard(consensus, blob, tmp_path, spec=SPEC, shard_id="stuck", max_files_per_batch=2)
    now = time.time()
    observations.record_observation(consensus, observations.observe(
        stuck, observer="writer:w", writer_outcome="nothing_to_do", now=now - 400))
    with pytest.raises(AirflowFailException, match="frontier STALLED"):
        _sensor("stuck", QUICK, now, namespace="test").execute(sensor_context("scheduled__8"))

    monitor = {r["shard"]: r for r in list_shards(now=now + 30)["shards"]}["stuck"]["monitor"]
    assert (monitor["firing"], monitor["pages_sent"], monitor["last_sent_at"]) == (True, 0, None)
    assert "no PagerDuty or Slack connection is configured" in monitor["unsent_reason"]
    assert monitor["pages_pending"] == 0 and monitor["pages_dropped"] == 0


def test_the_page_shows_the_lag_of_each_partition_in_segments_as_the_monitor_observed_it(store, tmp_path):
    """Issue 34 item 4: a directory shard with two partitions, observed by the monitor's round;
    the page's lag per partition is in segments (the files not bound yet, not the distance
    between file numbers), the chart's points as before."""
    import shutil

    from airflow_upsert_provider.plugins.ui import shard_observations

    consensus, blob = store
    shard = make_shard(consensus, blob, tmp_path, spec=SPEC, shard_id="orders", max_files_per_batch=2)
    commit_next(shard)  # offset 0 of both partitions bound; 10, 20, 30 pending in each
    p1 = tmp_path / "landing" / "p1"
    shutil.copy(p1 / "30.jsonl", p1 / ".40.jsonl.tmp")
    (p1 / ".40.jsonl.tmp").rename(p1 / "40.jsonl")  # one more lands in p1, renamed into place
    now = time.time()
    _sensor("orders", MONITOR, now).execute(sensor_context("scheduled__1"))

    data = shard_observations("upsert_default", "orders", now=now + 1)
    assert data["partitions"] == [{"partition": "p0", "high_watermark": 31, "bound": 1, "lag": 3},
                                  {"partition": "p1", "high_watermark": 41, "bound": 1, "lag": 4}]
    assert data["partition_lag"] == {"top": [{"partition": "p1", "lag": 4}, {"partition": "p0", "lag": 3}],
                                     "others": 0, "others_lag": 0}
    [point] = data["points"]
    assert (point["lag"], point["lag_unit"], point["high_watermark"], point["bound"]) == (7, "segments", 72, 2)
    assert set(point) == {"t", "upper", "high_watermark", "bound", "lag", "lag_unit", "observer"}
