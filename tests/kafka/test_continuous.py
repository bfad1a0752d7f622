"""Continuous mode on a Kafka shard (engine/write/continuous.py) against the mock cluster.

Batches run back to back in one Spark session while the next slice is prefetched; the table
equals an oracle computed from what was produced. Prefetched slices are keyed by (epoch,
binding): one fetched before a seek is dropped for that reason and read again (the #596 race,
driven step by step through an injected scheduler: no sleeps), and a writer killed while it
prefetches leaves nothing a retry cannot converge from.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any, Callable

import pytest
from confluent_kafka import TopicPartition

from airflow_upsert_provider.engine.lifecycle import recovery
from airflow_upsert_provider.engine.store import streams
from airflow_upsert_provider.engine.config import ShardConfig
from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.engine.write.continuous import DROP_BELOW_UPPER, DROP_EPOCH, SlicePrefetcher, run_continuous
from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.engine.lifecycle.group_offsets import group_consumer
from airflow_upsert_provider.engine.table.shard import Shard
from airflow_upsert_provider.engine.sources.kafka import KafkaConfig
from airflow_upsert_provider.engine.sources.kafka_options import KafkaShardOptions
from airflow_upsert_provider.engine.write.writer import COMMITTED, NOTHING_TO_DO, Writer
from airflow_upsert_provider.sample_data import sample_schema_json
from tests.conftest import REPO_ROOT
from tests.kafka.conftest import MOCK_PARTITIONS, produce_changes
from tests.helpers import table

SECRET = "c0nt-Pa55-77e1"


def client_config(bootstrap: str) -> KafkaConfig:
    return KafkaConfig.from_dict({"bootstrap.servers": bootstrap, "sasl.username": "u", "sasl.password": SECRET})


class Changes:
    """Change records over the mock topic's partitions, and the table they must leave.

    Key k lives in partition k % 4; every change carries a higher ``updated_at`` than the
    last, so the latest change of a key is unambiguous; every seventh change deletes."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.clock = 0
        self.latest: dict[int, dict[str, Any]] = {}

    def produce(self, count: int, keys: int = 23) -> None:
        records = []
        for _ in range(count):
            self.clock += 1
            key = (self.clock * 7) % keys
            change = {"id": key, "name": f"n{self.clock}", "amount": float(self.clock), "updated_at": self.clock,
                      "deleted": self.clock % 7 == 0}
            self.latest[key] = change
            records.append((key % MOCK_PARTITIONS, str(key), change))
        produce_changes(self.bootstrap, self.topic, records)

    def oracle(self) -> dict[tuple, dict[str, Any]]:
        return {(k,): {c: v for c, v in change.items() if c != "deleted"}
                for k, change in self.latest.items() if not change["deleted"]}


def kafka_shard(consensus, blob, topic: str, bootstrap: str, *, max_records: int, shard_id: str = "events") -> Shard:
    config = ShardConfig(source=f"kafka:{topic}", keys=("id",), schema=sample_schema_json(), order_by="updated_at",
                         delete_marker="deleted", buckets=2,
                         extra=KafkaShardOptions(max_records_per_batch=max_records).to_extra())
    return Shard.create(consensus, blob, shard_id, config, kafka_config=client_config(bootstrap))


class Scheduler:
    """Runs prefetch jobs only when the test says so."""

    def __init__(self) -> None:
        self.jobs: list[Callable[[], None]] = []

    def submit(self, job: Callable[[], None]) -> None:
        self.jobs.append(job)

    def run_all(self) -> int:
        ran = 0
        while self.jobs:
            self.jobs.pop(0)()
            ran += 1
        return ran


class FakeTime:
    """A clock that moves only when the loop sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def contiguous_ranges(shard: Shard) -> dict[str, list[tuple[int, int]]]:
    """Each partition's bound ranges in ts order, asserted gap- and overlap-free."""
    per_partition: dict[str, list[tuple[int, int]]] = {}
    for ts in range(shard.state().upper):
        for partition, rng in shard.binding(ts).ranges.items():
            chain = per_partition.setdefault(partition, [])
            if chain:
                assert rng["from"] == chain[-1][1], (partition, ts, rng, chain[-1])
            chain.append((rng["from"], rng["to"]))
    return per_partition


def group_offsets(shard: Shard) -> dict[str, int]:
    consumer = group_consumer(shard.source, shard.group_id)
    try:
        found = consumer.committed([TopicPartition(shard.source.topic, p) for p in range(MOCK_PARTITIONS)], timeout=10)
        return {str(tp.partition): tp.offset for tp in found}
    finally:
        consumer.close()


def recover(shard: Shard) -> int:
    """A recovery in the only order the engine accepts: begin, seek (the group to the shard's
    bound offsets at its upper), resume. Returns the new epoch."""
    began = streams.begin_recovery(shard.consensus, shard.shard_id, "test", "recovery")
    recovery.seek(shard, epoch=began.state.epoch, actor="test")
    streams.resume_after_recovery(shard.consensus, shard.shard_id, began.state.epoch, "test")
    return began.state.epoch


# -- no broker needed ------------------------------------------------------------------------


def test_a_directory_shard_runs_continuously_without_a_prefetcher_and_bad_durations_are_refused(
    sqlite_url, blob, tmp_path
):
    from tests.helpers import make_shard

    consensus = open_consensus(sqlite_url)
    try:
        shard = make_shard(consensus, blob, tmp_path)  # an empty landing directory
        with pytest.raises(ConfigurationError, match="does not read Kafka"):
            SlicePrefetcher(shard, lambda: None)
        writer = Writer(shard, "w", spark_factory=lambda: pytest.fail("an idle source needs no Spark"))
        for bad in (0, -1, "10", True):
            with pytest.raises(ConfigurationError) as refused:
                run_continuous(writer, duration_seconds=bad)
            assert refused.value.details["field"] == "duration"
        fake = FakeTime()
        seen = []
        report = run_continuous(writer, duration_seconds=3.5, idle_wait_seconds=1.0, clock=fake.clock,
                                sleep=fake.sleep, on_result=seen.append)
        # Four idle polls within the duration (the last sleep cut to what was left), reported once.
        assert fake.sleeps == [1.0, 1.0, 1.0, 0.5]
        assert [r.outcome for r in report.results] == [NOTHING_TO_DO] and seen == report.results
        assert report.stopped_because is None and writer.prefetched is None and writer.on_staged is None
    finally:
        consensus.dispose()


# -- on the mock cluster -----------------------------------------------------------------------


def test_continuous_run_with_prefetch_equals_the_oracle(spark, sqlite_url, blob, kafka_bootstrap, kafka_topic):
    changes = Changes(kafka_bootstrap, kafka_topic)
    changes.produce(90)
    consensus = open_consensus(sqlite_url)
    try:
        shard = kafka_shard(consensus, blob, kafka_topic, kafka_bootstrap, max_records=25)
        writer = Writer(shard, "continuous", spark_factory=lambda: spark)
        prefetcher = SlicePrefetcher(shard, lambda: spark)  # a background thread, as in production
        fake = FakeTime()
        produced_more = []

        def on_result(result) -> None:
            # New records arrive while the run goes on: it picks them up without a restart.
            if result.outcome == NOTHING_TO_DO and not produced_more:
                produced_more.append(True)
                changes.produce(40)

        report = run_continuous(writer, duration_seconds=5, prefetcher=prefetcher, on_result=on_result,
                                clock=fake.clock, sleep=fake.sleep)
        prefetcher.close()
        committed = [r for r in report.results if r.outcome == COMMITTED]
        # 90 records at <= 25 per batch, then 40 more.
        assert len(committed) >= 6 and produced_more
        assert sum(r.rows_in for r in committed) == 130
        assert table(shard) == changes.oracle()
        high = {str(p): h for p, h in shard.source.high_watermarks().items()}
        assert {p: chain[-1][1] for p, chain in contiguous_ranges(shard).items()} == high
        # Batches after the first staged the slice fetched while the one before committed.
        assert len(prefetcher.consumed) >= len(committed) - 2
        assert {d.reason for d in prefetcher.dropped} <= {DROP_BELOW_UPPER, "closed"}
        assert group_offsets(shard) == high
    finally:
        consensus.dispose()


def test_a_prefetched_slice_is_consumed_for_its_binding_and_one_from_an_earlier_epoch_is_dropped(
    spark, sqlite_url, blob, kafka_bootstrap, kafka_topic, monkeypatch, caplog
):
    changes = Changes(kafka_bootstrap, kafka_topic)
    changes.produce(40)
    consensus = open_consensus(sqlite_url)
    try:
        shard = kafka_shard(consensus, blob, kafka_topic, kafka_bootstrap, max_records=20)
        reads: list[dict] = []
        read_slice = shard.source.read_slice
        monkeypatch.setattr(shard.source, "read_slice", lambda s, ranges: reads.append(dict(ranges)) or read_slice(s, ranges))
        writer = Writer(shard, "w", spark_factory=lambda: spark)
        writer.start()
        scheduler = Scheduler()
        prefetcher = SlicePrefetcher(shard, lambda: spark, submit=scheduler.submit)
        writer.prefetched = prefetcher.take

        # Batch 0 fetched ahead in the writer's epoch: the stage takes it, reading nothing itself.
        binding0 = shard.mint_binding(0, minted_by="w")
        assert prefetcher.fetch(writer.epoch, binding0) and not prefetcher.fetch(writer.epoch, binding0)
        assert scheduler.run_all() == 1
        first = writer.step()
        assert first.outcome == COMMITTED and first.rows_in == 20 and reads == []
        assert [k.ts for k in prefetcher.consumed] == [0] and not prefetcher.dropped

        # Batch 1 fetched, then a recovery's seek: the slice is of the epoch before it, dropped
        # for that reason and read again.
        binding1 = shard.mint_binding(1, minted_by="w")
        before = writer.epoch
        assert prefetcher.fetch(before, binding1)
        scheduler.run_all()
        recover(shard)
        writer.start()
        assert writer.epoch > before
        second = writer.step()
        assert second.outcome == COMMITTED and second.rows_in == 20
        assert reads == [{int(p): (r["from"], r["to"]) for p, r in binding1.ranges.items() if r["to"] > r["from"]}]
        assert [(d.key.ts, d.key.epoch, d.reason) for d in prefetcher.dropped] == [(1, before, DROP_EPOCH)]
        assert "a seek happened in between" in prefetcher.dropped[0].message
        assert [k.ts for k in prefetcher.consumed] == [0] and prefetcher.held() == []

        # A fetch the scheduler never started is not waited for: the stage reads the slice.
        changes.produce(8)
        binding2 = shard.mint_binding(2, minted_by="w")
        prefetcher.fetch(writer.epoch, binding2)
        assert prefetcher.take(writer.epoch, binding2) is None and prefetcher.held() == []
        scheduler.run_all()  # the cancelled job does nothing
        assert prefetcher.held() == [] and [k.ts for k in prefetcher.consumed] == [0]
        prefetcher.close()

        # A fetch that fails hands the stage nothing and says why (its message scrubbed).
        def no_session():
            raise RuntimeError(f"no session for {SECRET}")

        failing = SlicePrefetcher(shard, no_session, submit=scheduler.submit)
        with caplog.at_level(logging.INFO, logger="airflow_upsert_provider.engine.write.continuous"):
            failing.fetch(writer.epoch, binding2)
            scheduler.run_all()
            assert failing.take(writer.epoch, binding2) is None
        assert "prefetch of batch 2 (epoch" in caplog.text and "failed (RuntimeError: no session for ***)" in caplog.text
        assert SECRET not in caplog.text
        failing.close()
        assert writer.run(until_caught_up=True).results[0].rows_in == 8
        assert table(shard) == changes.oracle()
    finally:
        consensus.dispose()


def test_the_596_race_a_prefetch_across_a_seek_is_dropped_and_every_offset_is_processed_once(
    spark, consensus, blob, kafka_bootstrap, kafka_topic
):
    """The #596 race: records fetched into a buffer around a recovery's seek were cleared by a
    resume, never acknowledged, and the group's offsets stuck behind the gap forever. Here
    the slice of binding(1) is fetched after the seek under the epoch before it; the resumed
    writer drops it for its epoch, reads binding(1) again, and the group reaches the end."""
    changes = Changes(kafka_bootstrap, kafka_topic)
    changes.produce(100)
    shard = kafka_shard(consensus, blob, kafka_topic, kafka_bootstrap, max_records=30)
    writer = Writer(shard, "w", spark_factory=lambda: spark)
    scheduler = Scheduler()
    prefetcher = SlicePrefetcher(shard, lambda: spark, submit=scheduler.submit)
    fake = FakeTime()
    recovered: dict[str, Any] = {}

    def recover_after_first_commit(result) -> None:
        if result.outcome != COMMITTED or recovered:
            return
        # binding(1) was minted and its fetch queued while batch 0 committed.
        assert [job for job in scheduler.jobs] and shard.binding(1) is not None
        began = streams.begin_recovery(consensus, shard.shard_id, "test", "the #596 race")
        sought = recovery.seek(shard, epoch=began.state.epoch, actor="test")
        assert sought.group["verified"]
        upper, position = sought.upper, sought.position
        # The prefetch runs now: after the seek, keyed by the epoch before it.
        assert scheduler.run_all() == 1
        assert [(k.ts, k.epoch) for k in prefetcher.held()] == [(1, writer.epoch)]
        streams.resume_after_recovery(consensus, shard.shard_id, began.state.epoch, "test")
        recovered.update(epoch=began.state.epoch, upper=upper, position=position)

    first = run_continuous(writer, duration_seconds=60, prefetcher=prefetcher, on_result=recover_after_first_commit,
                           clock=fake.clock, sleep=fake.sleep)
    assert [r.outcome for r in first.results] == [COMMITTED]
    assert "epoch" in first.stopped_because and recovered["upper"] == 1

    # Resume the same writer and prefetcher; now every prefetch runs as soon as it is queued.
    second = run_continuous(writer, duration_seconds=5, prefetcher=prefetcher,
                            on_result=lambda result: scheduler.run_all(), clock=fake.clock, sleep=fake.sleep)
    prefetcher.close()
    assert writer.epoch == recovered["epoch"] and second.stopped_because is None
    dropped = [(d.key.ts, d.reason) for d in prefetcher.dropped if d.reason == DROP_EPOCH]
    assert dropped == [(1, DROP_EPOCH)]
    # Batches 2.. staged the slices prefetched in the new epoch; batch 1 read its slice again.
    assert {k.ts for k in prefetcher.consumed if k.epoch == recovered["epoch"]} >= {2}
    assert 1 not in {k.ts for k in prefetcher.consumed}

    committed = [r for r in second.results if r.outcome == COMMITTED]
    high = {str(p): h for p, h in shard.source.high_watermarks().items()}
    seek_point = sum(recovered["position"].values())
    # Every offset at or above the seek point processed exactly once, in contiguous ranges.
    assert sum(r.rows_in for r in committed) == sum(high.values()) - seek_point
    assert sum(sum(r["count"] for r in shard.binding(r_.ts).ranges.values()) for r_ in committed) \
        == sum(high.values()) - seek_point
    assert {p: chain[-1][1] for p, chain in contiguous_ranges(shard).items()} == high
    assert table(shard) == changes.oracle()
    # The group's committed offsets follow the frontier to the high watermark.
    assert group_offsets(shard) == high


KILLED_WRITER = textwrap.dedent(
    """\
    import json, sys, threading
    from airflow_upsert_provider.engine.blob.files import open_blob
    from airflow_upsert_provider.engine.store.registry import open_consensus
    from airflow_upsert_provider.engine.write.continuous import SlicePrefetcher, run_continuous
    from airflow_upsert_provider.engine.table.shard import Shard
    from airflow_upsert_provider.engine.sources.kafka import KafkaConfig
    from airflow_upsert_provider.engine.spark.session import get_spark
    from airflow_upsert_provider.engine.write.writer import Writer

    url, blob_root, config_file, hook_file = sys.argv[1:5]
    with open(config_file) as handle:
        config = KafkaConfig.from_dict(json.load(handle))
    shard = Shard.open(open_consensus(url), open_blob(blob_root), "events", kafka_config=config)
    spark = get_spark("local[1]", app_name="killed-writer")
    writer = Writer(shard, "killed-writer", spark_factory=lambda: spark)

    def fetching_session():
        # The prefetch has started (its entry is marked running): say so, then hang in it,
        # so the writer waits for this slice when its turn comes and is killed mid-prefetch.
        with open(hook_file, "w") as handle:
            handle.write("prefetch started")
        threading.Event().wait()

    prefetcher = SlicePrefetcher(shard, fetching_session)
    run_continuous(writer, duration_seconds=60, prefetcher=prefetcher)
    """
)


def test_a_writer_killed_mid_prefetch_in_continuous_mode_is_converged_by_a_retry(
    spark, sqlite_url, blob, kafka_bootstrap, kafka_topic, tmp_path
):
    changes = Changes(kafka_bootstrap, kafka_topic)
    changes.produce(80)
    consensus = open_consensus(sqlite_url)
    try:
        shard = kafka_shard(consensus, blob, kafka_topic, kafka_bootstrap, max_records=30)
        config_file = tmp_path / "kafka.json"
        config_file.write_text(json.dumps(dict(client_config(kafka_bootstrap).properties)))
        hook_file = tmp_path / "prefetch-started"
        env = dict(os.environ, PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
        output = open(tmp_path / "writer.log", "w")  # a file: a full pipe would stall the writer
        proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, sqlite_url, blob.root, str(config_file),
                                 str(hook_file)], env=env, cwd=REPO_ROOT, start_new_session=True,
                                stdout=output, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 180
            while not hook_file.exists():
                assert proc.poll() is None, \
                    f"the writer ended before prefetching:\n{(tmp_path / 'writer.log').read_text()[-4000:]}"
                assert time.monotonic() < deadline, "the writer never started a prefetch"
                time.sleep(0.05)
        finally:
            # Its own process group: the Spark JVM it started goes with it.
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
            output.close()
        assert proc.returncode == -signal.SIGKILL
        # It had bound batch 1 (the one prefetched) before it died; batch 1 never committed.
        assert shard.binding(1) is not None and shard.state().upper <= 1

        retry = Writer(shard, "retry", spark_factory=lambda: spark)
        report = retry.run(until_caught_up=True)
        assert report.results[-1].outcome == NOTHING_TO_DO
        high = {str(p): h for p, h in shard.source.high_watermarks().items()}
        assert {p: chain[-1][1] for p, chain in contiguous_ranges(shard).items()} == high
        assert sum(r.rows_in for r in shard_batches(shard)) == 80
        assert table(shard) == changes.oracle()
    finally:
        consensus.dispose()


class _Rows:
    def __init__(self, rows_in: int) -> None:
        self.rows_in = rows_in


def shard_batches(shard: Shard) -> list[_Rows]:
    """Each committed batch's records read, as its commit recorded them."""
    return [_Rows(int(b.stats["rows_in"])) for b in shard.batches()]
