"""The ``upstream`` field of frontier observations (a Kafka shard's consumer group against its
frontier): it round-trips, rows recorded before it existed still read, its alert or read error
shows among an evaluation's reasons without changing the status, and an observation is never
lost to a group that cannot be read."""

from __future__ import annotations

import json
from dataclasses import replace

from airflow_upsert_provider.engine.frontier import observations
from airflow_upsert_provider.engine.frontier.model import FrontierStatus, Observation, StallSettings
from airflow_upsert_provider.engine.frontier.rules import evaluate
from airflow_upsert_provider.engine.table.shard import ShardStatus
from tests.frontier.test_rules import NOW, SHARD, fresh, obs, series

ALERTING = {
    "group": "upsert-orders", "topic": "changes", "committed": {"0": 10}, "acknowledged": {"0": 30},
    "behind": {"0": 20}, "gap_since": NOW - 3600.0, "gap_seconds": 3600.0, "gap_alert_seconds": 300.0,
    "alert": True,
}
SECRET = "up5tream-Pa55-0c4d"


def test_upstream_round_trips_and_old_rows_read_without_it() -> None:
    o = obs(NOW, 42, 1000, 1500, upstream=ALERTING)
    back = Observation.from_dict(json.loads(json.dumps(o.to_dict())))
    assert back == o and back.upstream == ALERTING
    old_row = {k: v for k, v in obs(NOW, 42, 1000, 1500).to_dict().items() if k != "upstream"}
    assert Observation.from_dict(old_row).upstream is None
    assert Observation.from_dict({**old_row, "upstream": None}).upstream is None


def test_a_group_alert_or_read_error_is_a_reason_and_never_changes_the_status() -> None:
    window = series([(5, 50, 50)] * 6)  # idle: nothing pending
    plain = evaluate(SHARD, window, StallSettings(), NOW, fresh())
    assert plain.status is FrontierStatus.IDLE

    alerting = evaluate(SHARD, window[:-1] + [replace(window[-1], upstream=ALERTING)], StallSettings(), NOW, fresh())
    assert (alerting.status, alerting.breach, alerting.rule) == (plain.status, plain.breach, plain.rule)
    assert alerting.reasons[:len(plain.reasons)] == plain.reasons
    extra = alerting.reasons[len(plain.reasons):]
    assert len(extra) == 1
    assert all(part in extra[0] for part in ("'upsert-orders'", "1h00m", "partition 0 20 behind"))

    quiet = evaluate(SHARD, window[:-1] + [replace(window[-1], upstream={**ALERTING, "alert": False})],
                     StallSettings(), NOW, fresh())
    assert quiet.reasons == plain.reasons

    unreadable = evaluate(SHARD, window[:-1] + [replace(window[-1], upstream={"error": "KafkaUnavailable: timed out"})],
                          StallSettings(), NOW, fresh())
    assert unreadable.reasons[-1] == "the consumer group's offsets could not be read: KafkaUnavailable: timed out"


class UnreadableKafkaShard:
    """A Kafka shard whose group cannot be read (its store read fails, quoting a secret)."""

    shard_id = "orders"
    is_kafka = True
    group_id = "upsert-orders"

    def __init__(self, consensus) -> None:
        from airflow_upsert_provider.engine.sources.kafka import KafkaConfig, KafkaSource

        self.consensus = consensus
        self.source = KafkaSource("changes", KafkaConfig.from_dict(
            {"bootstrap.servers": "127.0.0.1:1", "sasl.password": SECRET}))

    def state(self):
        return self.consensus.get_shard(self.shard_id)

    def bound_offsets(self, upper: int) -> dict[str, int]:
        raise RuntimeError(f"login failed with password {SECRET}")


def test_an_unreadable_group_is_recorded_as_an_error_not_a_lost_observation(consensus) -> None:
    consensus.create_shard("orders", "{}")
    shard = UnreadableKafkaShard(consensus)
    status = ShardStatus(shard="orders", upper=0, since=0, seqno=0, high_watermark={"0": 4}, bound={}, rows=None,
                         pending_segments=0, stream={"status": "READY", "changed_at": 0.0})
    seen = observations.observe(shard, observer="test", now=NOW, status=status)  # type: ignore[arg-type]
    assert seen.upstream == {"error": "RuntimeError: login failed with password ***"}
    observations.record_observation(consensus, seen)
    assert [o.upstream for o in observations.observation_window(consensus, "orders", NOW - 1)] == [seen.upstream]
