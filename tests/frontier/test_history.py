"""Retention of observations, stream history and alert rows (engine/frontier/history.py)."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa

from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.engine.frontier import observations
from airflow_upsert_provider.engine.frontier.history import (
    DAY,
    HistoryPrune,
    HistoryRetention,
    HistoryRows,
    plan_prune,
    prune_history,
)
from airflow_upsert_provider.engine.frontier.alerts import AlertState
from airflow_upsert_provider.engine.frontier.model import FrontierStatus
from airflow_upsert_provider.engine.frontier.rules import evaluate
from airflow_upsert_provider.engine.store import streams
from airflow_upsert_provider.engine.store.streams import stream_history_table
from tests.frontier.test_observations import STALL, obs, record_stall

NOW = 1_000 * DAY


# -- the decision (pure) --------------------------------------------------------------------


def test_plan_keeps_the_newest_observation_the_current_stream_row_and_open_incidents():
    old, recent = NOW - 2 * DAY, NOW - 3600.0
    rows = HistoryRows(
        observations=[(1, "a", old), (2, "a", old + 1), (3, "gone", old), (4, "b", recent)],
        newest_observation={"a": 2},
        stream_history=[(10, "a", 1, NOW - 100 * DAY), (11, "a", 2, NOW - 95 * DAY), (12, "a", 3, NOW - DAY),
                        (13, "c", 7, NOW - 200 * DAY)],
        stream_versions={"a": 2, "c": 7},
        orphan_alerts=[
            ("quiet", 3, AlertState("quiet", last_evaluated_at=NOW - 91 * DAY)),
            ("never", 1, AlertState("never")),
            ("recent", 1, AlertState("recent", last_evaluated_at=NOW - 89 * DAY)),
            ("firing", 2, AlertState("firing", firing=True, last_evaluated_at=NOW - 300 * DAY)),
            ("unsent", 2, AlertState("unsent", last_evaluated_at=NOW - 300 * DAY,
                                     outbox=({"id": "x", "leased_until": 0.0, "event": {}},))),
        ],
    )
    plan = plan_prune(rows, HistoryRetention(), NOW)
    # a's newest observation stays (the shard exists), gone's goes (it does not: no newest).
    assert plan == HistoryPrune(observation_ids=(1, 3), stream_history_ids=(10,),
                                alerts=(("quiet", 3), ("never", 1)))
    assert plan.counts() == {"observations": 2, "stream_history": 1, "alerts": 2}


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf"), True, "7d"])
def test_retention_settings_are_positive_finite_seconds(value):
    with pytest.raises(ConfigurationError, match="HistoryRetention.alerts_seconds must be a positive") as info:
        HistoryRetention(alerts_seconds=value)
    assert info.value.details["field"] == "alerts_seconds"


# -- the sweep on a real store ------------------------------------------------------------------


def _count(consensus, table, **where) -> int:
    query = sa.select(sa.func.count()).select_from(table)
    for name, value in where.items():
        query = query.where(table.c[name] == value)
    return int(consensus.read_in_snapshot(lambda conn: conn.execute(query).scalar()))


def test_prune_deletes_old_rows_in_chunks_and_keeps_what_the_rules_need(consensus):
    consensus.create_shard("a", "{}")
    # Real transitions (stamped with the clock): READY -> STOPPING -> STOPPED -> READY.
    streams.stop(consensus, "a", "me")
    streams.finalize_stop(consensus, streams.read_stream(consensus, "a"), "me")
    streams.resume(consensus, "a", "me")
    current = streams.read_stream(consensus, "a")
    assert _count(consensus, stream_history_table, shard_id="a") == 3
    now = time.time() + 100 * DAY
    for i in range(23):  # a: one an hour, two days before now; "gone" is no shard
        observations.record_observation(consensus, obs("a", now - 2 * DAY + 3600.0 * i / 2))
    for i in range(4):
        observations.record_observation(consensus, obs("gone", now - 3 * DAY + i))
    observations.record_observation(consensus, obs("a-recent", now - 60.0))
    for shard_id, state in [("gone", AlertState("gone", last_evaluated_at=now - 91 * DAY)),
                            ("gone-firing", AlertState("gone-firing", firing=True, last_evaluated_at=now - 91 * DAY)),
                            ("a", AlertState("a", max_upper=5, last_evaluated_at=now - 91 * DAY))]:
        assert observations.save_alert_state(consensus, state, 0)

    deleted = prune_history(consensus, now=now, chunk=5)

    assert deleted == {"observations": 22 + 4, "stream_history": 2, "alerts": 1}
    newest = observations.observation_window(consensus, "a", 0.0)
    assert [o.observed_at for o in newest] == [now - 2 * DAY + 3600.0 * 22 / 2]
    assert observations.observation_count(consensus, "gone") == 0
    assert observations.observation_count(consensus, "a-recent") == 1
    [kept] = streams.stream_history(consensus, "a")
    assert (kept["version"], kept["to"]) == (current.version, "READY")
    assert observations.load_alert_state(consensus, "gone")[1] == 0
    assert observations.load_alert_state(consensus, "gone-firing")[0].firing
    assert observations.load_alert_state(consensus, "a")[0].max_upper == 5
    # Nothing left to prune: a second sweep deletes nothing.
    assert prune_history(consensus, now=now, chunk=5) == {"observations": 0, "stream_history": 0, "alerts": 0}


def test_a_sweep_bounded_by_its_chunks_goes_on_in_the_next_call(consensus):
    now = time.time()
    for i in range(12):
        observations.record_observation(consensus, obs(f"gone{i:02d}", now - 2 * DAY))
    assert prune_history(consensus, now=now, chunk=5, max_chunks=2)["observations"] == 10
    assert prune_history(consensus, now=now, chunk=5, max_chunks=2)["observations"] == 2


def test_the_rules_give_the_same_verdicts_after_a_prune(consensus, blob):
    """Prune, then evaluate: a firing incident is neither paged again (no false page) nor
    resolved (no lost incident), and a gone shard's firing page is still resolved."""
    consensus.create_shard("orders", "{}")
    now = time.time()
    # A stall that pages, and two days old history (recorded late, by a slow observer: the
    # prune of each insert leaves it).
    record_stall(consensus, "orders", now - 60.0)
    for i in range(10):
        observations.record_observation(consensus, obs("orders", now - 2 * DAY - 600.0 + 60.0 * i, upper=3, hw=3))
    fired = observations.evaluate_shard(consensus, blob, "orders", STALL, observer="sensor:1", now=now - 60.0,
                                        observe_first=False)
    assert fired.action == "trigger"
    assert observations.save_alert_state(consensus, AlertState("gone", firing=True, firing_status="STALLED",
                                                               last_evaluated_at=now - 100 * DAY), 0)
    state, _ = observations.load_alert_state(consensus, "orders")
    window_before = observations.observation_window(consensus, "orders", now - STALL.window_seconds, now)
    before = evaluate("orders", window_before, STALL, now, state)

    deleted = prune_history(consensus, HistoryRetention(observations_seconds=DAY), now=now)
    assert deleted["observations"] == 10

    window_after = observations.observation_window(consensus, "orders", now - STALL.window_seconds, now)
    assert window_after == window_before
    assert evaluate("orders", window_after, STALL, now, observations.load_alert_state(consensus, "orders")[0]) \
        == before
    again = observations.evaluate_shard(consensus, blob, "orders", STALL, observer="sensor:1", now=now,
                                        observe_first=False)
    assert (again.evaluation.status, again.action, again.state.firing) == (FrontierStatus.STALLED, None, True)
    gone = observations.evaluate_shard(consensus, blob, "gone", STALL, observer="sensor:1", now=now)
    assert (gone.evaluation.status, gone.action) == (FrontierStatus.NOT_FOUND, "resolve")


def test_upsertctl_frontier_prune(tmp_path, monkeypatch, capsys):
    import json

    from airflow_upsert_provider.engine.store.registry import open_consensus
    from tests.helpers import run_cli

    url = f"sqlite:///{tmp_path / 'c.db'}"
    monkeypatch.setenv("UPSERT_CONSENSUS_URL", url)
    monkeypatch.setenv("UPSERT_BLOB_ROOT", str(tmp_path / "blob"))
    store = open_consensus(url)
    now = time.time()
    for at in (now - 7200.0, now - 7100.0, now - 60.0):
        observations.record_observation(store, obs("gone", at))
    store.dispose()
    code, out, err = run_cli(capsys, "frontier", "prune", "--keep-observations", "1h", "--json")
    assert code == 0, err
    assert json.loads(out) == {"deleted": {"observations": 2, "stream_history": 0, "alerts": 0}}
    code, out, err = run_cli(capsys, "frontier", "prune", "--keep-alerts", "0")
    assert code == 2 and "--keep-alerts" in err and "must be longer than zero" in err
