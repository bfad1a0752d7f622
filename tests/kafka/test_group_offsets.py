"""Consumer-group offsets of a Kafka shard (engine/lifecycle/group_offsets.py) against the mock cluster:
only the contiguous acknowledged end is committed, a failing group commit never raises and is
retried, a gap that lasts is an alert (an ERROR line and the status), and a restarted process
dates the gap from consensus. What the group holds is always read back from the cluster."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from airflow_upsert_provider.engine.store.consensus import Consensus
from airflow_upsert_provider.engine.store.records import BatchRecord, Binding
from airflow_upsert_provider.engine.lifecycle.group_offsets import (
    GroupCommitter,
    describe_alert,
    group_behind_since,
    group_consumer,
    group_status,
)
from airflow_upsert_provider.engine.sources.kafka import KafkaConfig, KafkaSource
from tests.kafka.conftest import produce_changes

EPOCH = 1_700_000_000_000
SECRET = "gr0up-Pa55-9d1e"
LOG = "airflow_upsert_provider.engine.lifecycle.group_offsets"


class Clock:
    """A clock the test moves."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FlakyCommit:
    """Stands in for the broker's commit: fails while ``failing``, else commits for real
    through ``consumer`` (so the cluster holds what a working commit would leave)."""

    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer
        self.failing = False
        self.calls: list[dict[int, int]] = []

    def __call__(self, offsets: list[TopicPartition]) -> None:
        self.calls.append({tp.partition: tp.offset for tp in offsets})
        if self.failing:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT,
                                            f"commit timed out (sasl.password={SECRET} rejected)"))
        self.consumer.commit(offsets=offsets, asynchronous=False)


class KafkaShard:
    """The part of a Kafka shard group_offsets reads, on a real consensus store."""

    def __init__(self, consensus: Consensus, shard_id: str, source: KafkaSource, group_id: str) -> None:
        self.consensus = consensus
        self.shard_id = shard_id
        self.source = source
        self.group_id = group_id
        self.is_kafka = True

    def state(self):
        return self.consensus.get_shard(self.shard_id)

    def binding(self, ts: int) -> Binding | None:
        return self.consensus.get_binding(self.shard_id, ts)

    def bound_offsets(self, upper: int) -> dict[str, int]:
        binding = self.binding(upper - 1) if upper > 0 else None
        return binding.to_offsets() if binding else {}


def config(bootstrap: str) -> KafkaConfig:
    return KafkaConfig.from_dict({"bootstrap.servers": bootstrap, "sasl.password": SECRET})


def new_group() -> str:
    return f"upsert-test-{uuid.uuid4().hex[:8]}"


def group_offsets(source: KafkaSource, group: str, partitions: list[int]) -> dict[int, int]:
    """What the cluster holds for ``group`` (-1001: nothing committed)."""
    consumer = group_consumer(source, group)
    try:
        return {tp.partition: tp.offset for tp in consumer.committed(
            [TopicPartition(source.topic, p) for p in partitions], timeout=10)}
    finally:
        consumer.close()


def commit_batches(consensus: Consensus, shard_id: str, tos: list[dict[str, int]]) -> list[BatchRecord]:
    """Mint and commit one batch per entry of ``tos`` (each partition's ``to``), contiguous
    from 0; returns the committed batch rows (with their committed_at)."""
    consensus.create_shard(shard_id, "{}")
    previous: dict[str, int] = {}
    for ts, to in enumerate(tos):
        ranges = {p: {"from": previous.get(p, 0), "to": t, "count": t - previous.get(p, 0)} for p, t in to.items()}
        consensus.mint_binding(shard_id, Binding(ts, ranges), "w")
        record = BatchRecord(ts=ts, writer_id="w", token=f"t{ts}", run={"path": f"x/{ts}", "files": [], "rows": 0},
                             stats={})
        assert consensus.compare_and_append(shard_id, ts, ts + 1, record).upper == ts + 1
        previous = dict(to)
    return consensus.batches(shard_id)


def r(lo: int, hi: int) -> dict[str, int]:
    return {"from": lo, "to": hi, "count": hi - lo}


def test_contiguity_through_the_committer(kafka_bootstrap: str, kafka_topic: str) -> None:
    produce_changes(kafka_bootstrap, kafka_topic, [(0, f"k{n}", {"id": n}) for n in range(20)])
    group = new_group()
    with KafkaSource(kafka_topic, config(kafka_bootstrap)) as source, \
            GroupCommitter(source, group, "orders", clock=Clock(1000.0)) as committer:
        started = committer.start(EPOCH, {"0": 10})
        assert started.committed == {"0": 10}
        assert group_offsets(source, group, [0]) == {0: 10}

        first = committer.acknowledge(EPOCH, {"0": r(11, 12)})
        second = committer.acknowledge(EPOCH, {"0": r(12, 13)})
        assert (first.committed, second.committed) == ({}, {})
        assert group_offsets(source, group, [0]) == {0: 10}

        closing = committer.acknowledge(EPOCH, {"0": r(10, 11)})
        assert closing.committed == {"0": 13}
        assert group_offsets(source, group, [0]) == {0: 13}

        # An earlier epoch's acknowledgement (fetched before a seek) never counts, nor does
        # one below the committed offset: neither can fake contiguity past 13.
        stale = committer.acknowledge(EPOCH - 1, {"0": r(13, 18)})
        below = committer.acknowledge(EPOCH, {"0": r(5, 13)})
        assert (stale.committed, stale.ignored) == ({}, {"0": "earlier-epoch"})
        assert (below.committed, below.ignored) == ({}, {"0": "below-committed"})
        after_stale = committer.acknowledge(EPOCH, {"0": r(14, 18)})
        assert after_stale.committed == {}
        assert group_offsets(source, group, [0]) == {0: 13}
        assert committer.status()["ack_gaps"][0]["first_acknowledged"] == 14

        # A partition no earlier binding named starts at its first range.
        grown = committer.acknowledge(EPOCH, {"0": r(13, 14), "1": r(0, 3)})
        assert grown.committed == {"0": 18, "1": 3}
        assert group_offsets(source, group, [0, 1]) == {0: 18, 1: 3}
        assert committer.status()["behind"] == {}


def test_failing_group_commits_alert_and_recover(kafka_bootstrap: str, kafka_topic: str,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    produce_changes(kafka_bootstrap, kafka_topic, [(p, f"k{n}", {"id": n}) for p in (0, 1) for n in range(40)])
    group = new_group()
    clock = Clock(5000.0)
    with KafkaSource(kafka_topic, config(kafka_bootstrap)) as source:
        real = group_consumer(source, group)
        flaky = FlakyCommit(real)
        committer = GroupCommitter(source, group, "orders", gap_alert_seconds=300, clock=clock, commit=flaky)
        assert committer.start(EPOCH, {"0": 0, "1": 0}).failed is None
        committer.acknowledge(EPOCH, {"0": r(0, 5), "1": r(0, 5)})
        assert group_offsets(source, group, [0, 1]) == {0: 5, 1: 5}

        flaky.failing = True
        caplog.set_level(logging.WARNING, logger=LOG)
        for n in range(1, 4):
            clock.now += 100
            result = committer.acknowledge(EPOCH, {"0": r(5 * n, 5 * n + 5), "1": r(5 * n, 5 * n + 5)})
            assert result.committed == {} and result.failed is not None and SECRET not in result.failed
            assert "commit timed out" in result.failed
        # Every failure was retried with the whole contiguous end, and nothing moved upstream.
        assert flaky.calls[-3:] == [{0: 10, 1: 10}, {0: 15, 1: 15}, {0: 20, 1: 20}]
        assert group_offsets(source, group, [0, 1]) == {0: 5, 1: 5}
        status = committer.status()
        assert status["behind"] == {"0": 15, "1": 15}
        assert (status["gap_since"], status["gap_seconds"], status["alert"]) == (5100.0, 200.0, False)
        assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
        warnings = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.WARNING]
        assert len(warnings) == 3 and all(group in w and "failed" in w for w in warnings)

        clock.now += 150  # 350 s behind: past gap_alert_seconds
        assert committer.status()["alert"] is True
        result = committer.acknowledge(EPOCH, {"0": r(20, 25), "1": r(20, 25)})
        assert result.alert is True
        errors = [rec.getMessage() for rec in caplog.records if rec.levelno >= logging.ERROR]
        assert len(errors) == 1
        assert all(part in errors[0] for part in (group, kafka_topic, "partition 0 at 5", "partition 1 at 5",
                                                  "shard at 25", "350s"))
        assert all(SECRET not in rec.getMessage() for rec in caplog.records)

        flaky.failing = False
        clock.now += 10
        healed = committer.acknowledge(EPOCH, {"0": r(25, 30), "1": r(25, 30)})
        assert healed.committed == {"0": 30, "1": 30} and healed.failed is None and healed.alert is False
        assert group_offsets(source, group, [0, 1]) == {0: 30, 1: 30}
        status = committer.status()
        assert (status["behind"], status["gap_since"], status["alert"]) == ({}, None, False)
        committer.close()
        real.close()


def test_a_restart_while_group_commits_fail_dates_the_gap_from_consensus(
        kafka_bootstrap: str, kafka_topic: str, consensus: Consensus, caplog: pytest.LogCaptureFixture) -> None:
    produce_changes(kafka_bootstrap, kafka_topic, [(p, f"k{n}", {"id": n}) for p in (0, 1) for n in range(30)])
    batches = commit_batches(consensus, "orders", [
        {"0": 5, "1": 5}, {"0": 10, "1": 10}, {"0": 10, "1": 15}, {"0": 20, "1": 20}, {"0": 30, "1": 30},
    ])
    group = new_group()
    with KafkaSource(kafka_topic, config(kafka_bootstrap)) as source:
        shard = KafkaShard(consensus, "orders", source, group)
        setter = group_consumer(source, group)
        # The process before the restart got the group to batch 1's end; then commits failed.
        setter.commit(offsets=[TopicPartition(kafka_topic, 0, 10), TopicPartition(kafka_topic, 1, 10)],
                      asynchronous=False)
        flaky = FlakyCommit(setter)
        flaky.failing = True
        # Batch 2 moved partition 1 past the group: the gap dates from its commit.
        since = batches[2].committed_at
        clock = Clock(since + 301)
        caplog.set_level(logging.WARNING, logger=LOG)
        restarted = GroupCommitter.for_shard(shard, gap_alert_seconds=300, clock=clock, commit=flaky)
        positions = shard.bound_offsets(shard.state().upper)
        started = restarted.start(EPOCH, positions)
        assert started.failed is not None and started.alert is True
        status = restarted.status()
        assert status["committed"] == {"0": 10, "1": 10}
        assert status["acknowledged"] == {"0": 30, "1": 30}
        assert status["behind"] == {"0": 20, "1": 20}
        assert status["gap_since"] == pytest.approx(since)
        errors = [rec.getMessage() for rec in caplog.records if rec.levelno >= logging.ERROR]
        assert len(errors) == 1 and group in errors[0] and "301s" in errors[0]

        one_shot = group_status(shard, gap_alert_seconds=300, now=since + 301)
        assert {k: one_shot[k] for k in ("group", "committed", "acknowledged", "behind", "alert")} == {
            "group": group, "committed": {"0": 10, "1": 10}, "acknowledged": {"0": 30, "1": 30},
            "behind": {"0": 20, "1": 20}, "alert": True}
        assert one_shot["gap_since"] == pytest.approx(since)
        assert one_shot["gap_seconds"] == pytest.approx(301)

        # Commits work again: the restarted committer resumes at the shard's frontier, not
        # at the group's stale offset, and its first commit closes the whole gap.
        flaky.failing = False
        assert restarted.flush().committed == {"0": 30, "1": 30}
        assert group_offsets(source, group, [0, 1]) == {0: 30, 1: 30}
        assert group_status(shard, now=since + 400)["behind"] == {}
        restarted.close()
        setter.close()


def test_group_behind_since_finds_the_first_batch_past_the_group(consensus: Consensus) -> None:
    tos = [{"0": 3, "1": 0}, {"0": 3, "1": 4}, {"0": 3, "1": 4}, {"0": 9, "1": 4}, {"0": 9, "1": 8},
           {"0": 12, "1": 8}, {"0": 12, "1": 8}]
    batches = commit_batches(consensus, "s", tos)
    shard = KafkaShard(consensus, "s", source=None, group_id="g")  # type: ignore[arg-type]
    assert group_behind_since(shard, {"0": 12, "1": 8}) is None
    assert group_behind_since(shard, {"0": 99, "1": 99}) is None  # ahead is not behind
    assert group_behind_since(shard, {}) == batches[0].committed_at
    for ts in range(1, len(tos)):
        # A group at batch ts-1's end is behind from the first later batch that moved.
        group = tos[ts - 1]
        first = next(t for t in range(ts, len(tos)) if any(tos[t][p] > group[p] for p in group)) \
            if any(tos[-1][p] > group[p] for p in group) else None
        expected = None if first is None else batches[first].committed_at
        assert group_behind_since(shard, group) == expected, ts
    # A partition the group never committed counts from 0.
    assert group_behind_since(shard, {"0": 12}) == batches[1].committed_at
    empty = KafkaShard(consensus, "empty", source=None, group_id="g")  # type: ignore[arg-type]
    consensus.create_shard("empty", "{}")
    assert group_behind_since(empty, {}) is None


def test_bad_settings_are_refused_naming_the_field(kafka_bootstrap: str, kafka_topic: str) -> None:
    from airflow_upsert_provider.engine.errors import ConfigurationError

    source = KafkaSource(kafka_topic, config(kafka_bootstrap))
    with pytest.raises(ConfigurationError) as caught:
        GroupCommitter(source, "g", "orders", gap_alert_seconds=-1)
    assert caught.value.details["field"] == "gap_alert_seconds"
    with pytest.raises(ConfigurationError) as caught:
        GroupCommitter(source, " ", "orders")
    assert caught.value.details["field"] == "group_id"
    committer = GroupCommitter(source, "g", "orders")
    with pytest.raises(ValueError, match="before start"):
        committer.acknowledge(EPOCH, {"0": r(0, 1)})


def test_observations_of_a_kafka_shard_carry_its_group(kafka_bootstrap: str, kafka_topic: str,
                                                      consensus: Consensus) -> None:
    from airflow_upsert_provider.engine.frontier import observations
    from airflow_upsert_provider.engine.table.shard import ShardStatus

    produce_changes(kafka_bootstrap, kafka_topic, [(0, f"k{n}", {"id": n}) for n in range(8)])
    batches = commit_batches(consensus, "orders", [{"0": 3}, {"0": 8}])
    group = new_group()
    with KafkaSource(kafka_topic, config(kafka_bootstrap)) as source:
        setter = group_consumer(source, group)
        setter.commit(offsets=[TopicPartition(kafka_topic, 0, 3)], asynchronous=False)
        setter.close()
        shard = KafkaShard(consensus, "orders", source, group)
        status = ShardStatus(shard="orders", upper=2, since=0, seqno=2, high_watermark={"0": 8}, bound={"0": 8},
                             rows=None, pending_segments=0, stream={"status": "READY", "changed_at": 0.0})
        at = batches[1].committed_at + 600
        seen = observations.observe(shard, observer="test", now=at, status=status)  # type: ignore[arg-type]
    assert seen.upstream is not None
    assert {k: seen.upstream[k] for k in ("group", "committed", "acknowledged", "behind", "alert")} == {
        "group": group, "committed": {"0": 3}, "acknowledged": {"0": 8}, "behind": {"0": 5}, "alert": True}
    assert seen.upstream["gap_since"] == pytest.approx(batches[1].committed_at)
    observations.record_observation(consensus, seen)
    assert observations.observation_window(consensus, "orders", at - 1)[0].upstream == seen.upstream



class PeerCommits(KafkaShard):
    """A shard whose first state() read is from before a peer writer committed its last
    batch (and told the group): every later read sees the new upper."""

    def __init__(self, *args: Any, stale_upper: int) -> None:
        super().__init__(*args)
        self.stale_upper = stale_upper
        self.reads = 0

    def state(self):
        self.reads += 1
        record = super().state()
        return record if self.reads > 1 else type(record)(**{**record.__dict__, "upper": self.stale_upper})


def test_a_group_ahead_of_the_shard_is_an_alert_and_the_seek_sets_it_back(
        kafka_bootstrap: str, kafka_topic: str, consensus: Consensus, caplog: pytest.LogCaptureFixture) -> None:
    """A writer still running against the store a restore replaced keeps committing the group
    past the restored shard's frontier: lag tools show records as processed that the shard has
    not read. That is an alert at once (the status, observations, the writer's ERROR line),
    and the recovery's seek sets the group back."""
    from airflow_upsert_provider.engine.frontier import rules as frontier
    from airflow_upsert_provider.engine.frontier import observations
    from airflow_upsert_provider.engine.lifecycle.kafka_recovery import seek_group
    from airflow_upsert_provider.engine.table.shard import ShardStatus

    produce_changes(kafka_bootstrap, kafka_topic,
                    [(p, f"k{p}-{n}", {"id": n}) for p, count in ((0, 900), (1, 20), (2, 4)) for n in range(count)])
    commit_batches(consensus, "orders", [{"0": 50, "1": 5}, {"0": 100, "1": 10}])
    group = new_group()
    with KafkaSource(kafka_topic, config(kafka_bootstrap)) as source:
        shard = KafkaShard(consensus, "orders", source, group)
        old_writer = group_consumer(source, group)
        old_writer.commit(offsets=[TopicPartition(kafka_topic, 0, 900), TopicPartition(kafka_topic, 1, 10),
                                   TopicPartition(kafka_topic, 2, 4)], asynchronous=False)
        old_writer.close()

        status = group_status(shard, now=1000.0)
        # Partition 2 was never bound: the shard reads it on from its low watermark, 0.
        assert status["ahead"] == {"0": 800, "2": 4}
        assert status["behind"] == {} and status["alert"] is True
        described = describe_alert(status)
        assert "is ahead of the shard's frontier" in described and "partition 0 at 900 (shard at 100, 800 ahead)" in described
        assert "804 records" in described and "recover seek" in described

        # Observations carry it, and the frontier's reasons say it.
        shard_status = ShardStatus(shard="orders", upper=2, since=0, seqno=2, high_watermark={"0": 900}, bound={"0": 100},
                                   rows=None, pending_segments=0, stream={"status": "READY", "changed_at": 0.0})
        seen = observations.observe(shard, observer="test", now=1000.0, status=shard_status)  # type: ignore[arg-type]
        observations_text = frontier.upstream_reasons(seen)
        assert len(observations_text) == 1 and "partition 0 800 ahead" in observations_text[0]
        assert "804 records" in observations_text[0]

        # A writer of the restored store starting now says so (ERROR) and leaves the group alone.
        caplog.set_level(logging.WARNING, logger=LOG)
        committer = GroupCommitter.for_shard(shard, clock=Clock(1000.0))
        started = committer.start(EPOCH, shard.bound_offsets(2))
        assert started.committed == {} and started.alert is True
        assert committer.status()["ahead"] == {"0": 800}
        errors = [rec.getMessage() for rec in caplog.records if rec.levelno >= logging.ERROR]
        assert len(errors) == 1 and "800 ahead" in errors[0] and SECRET not in errors[0]
        committer.close()

        # The seek sets the group back to the shard's frontier, read back from the cluster.
        sought = seek_group(source, group, shard.bound_offsets(2))
        assert sought["positions"] == {"0": 100, "1": 10, "2": 0, "3": 0}
        assert group_offsets(source, group, [0, 1, 2]) == {0: 100, 1: 10, 2: 0}
        after = group_status(shard, now=1001.0)
        assert (after["ahead"], after["behind"], after["alert"]) == ({}, {}, False)


def test_a_peer_writer_committing_between_the_reads_is_no_alert(
        kafka_bootstrap: str, kafka_topic: str, consensus: Consensus) -> None:
    produce_changes(kafka_bootstrap, kafka_topic, [(0, f"k{n}", {"id": n}) for n in range(20)])
    commit_batches(consensus, "orders", [{"0": 10}, {"0": 20}])
    group = new_group()
    with KafkaSource(kafka_topic, config(kafka_bootstrap)) as source:
        setter = group_consumer(source, group)
        setter.commit(offsets=[TopicPartition(kafka_topic, 0, 20)], asynchronous=False)  # the peer told the group
        setter.close()
        # The upper read first (1) predates the peer's commit of batch 1: the group at 20 is
        # ahead of that, not of the shard.
        status = group_status(PeerCommits(consensus, "orders", source, group, stale_upper=1), now=1000.0)
        assert (status["ahead"], status["alert"]) == ({}, False)
        committer = GroupCommitter.for_shard(KafkaShard(consensus, "orders", source, group), clock=Clock(1000.0))
        started = committer.start(EPOCH, {"0": 10})  # positions read before the peer's commit
        assert started.alert is False and committer.status()["ahead"] == {}
        committer.close()
