"""Benchmark of the Kafka source, with its baselines measured in the same run.

    .venv/bin/python bench/bench_kafka.py            # 20 x 100k batches, 1M-message read, 5M-row recovery
    .venv/bin/python bench/bench_kafka.py --quick    # 20 x 20k batches, 200k-message read, 500k-row recovery

A librdkafka mock cluster owned by this process (``test.mock.num.brokers``; topics are
auto-created with 4 partitions) serves every part; it outlives the ``upsertctl`` processes
started against it. Change records are JSON values keyed by ``id`` (message key = the id,
partition = id mod 4, so one key's changes stay in one partition in order), 2% tombstones.
The mock cluster keeps only 5 MiB per partition (about 55k of these records): a feeder thread
produces one batch at a time, at most two batches ahead of the shard's frontier.

1. Consecutive batches of ``--batch`` records (the shard's ``max_records_per_batch``):
   (a) continuous mode: ``upsertctl run-batch --continuous`` in one fresh process (JVM start
       included), and ``run_continuous`` in this process after a warm-up (warm figure);
   (b) one batch per process: ``upsertctl run-batch --max-batches 1`` in a fresh process per
       batch, as one Airflow task per batch pays it.
   records/s, per-batch latency p50/p90, and continuous over one-per-process (target >= 3x).
2. Read throughput over the same messages (topics of 200k): ``KafkaSource.read_slice`` (the
   Python data source on the executors) written to Spark's ``noop`` sink, against a plain
   confluent-kafka consume loop in one process (assign, ``consume(n)``, decode key and value).
3. Recovery of a shard of ``--recovery-rows`` rows: written as one committed run (batch 0;
   the mock cluster cannot hold millions of messages), then two batches from Kafka;
   checkpoint, then restore (into a new shard id) + seek + resume, as fresh ``upsertctl``
   processes and as the engine calls in this process (target < 15 s).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# The Python data source and mapInArrow run on Python workers: they need this venv (pyarrow,
# confluent-kafka), not whatever python3 is first on PATH.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from airflow_upsert_provider.engine.blob.files import open_blob  # noqa: E402
from airflow_upsert_provider.engine.config import ShardConfig  # noqa: E402
from airflow_upsert_provider.engine.store.registry import open_consensus  # noqa: E402
from airflow_upsert_provider.engine.table.shard import Shard  # noqa: E402
from airflow_upsert_provider.engine.sources.kafka import KafkaConfig, KafkaSource  # noqa: E402
from airflow_upsert_provider.engine.sources.kafka_options import KafkaShardOptions  # noqa: E402

PARTITIONS = 4  # what the mock cluster creates every topic with
UPSERTCTL = os.path.join(os.path.dirname(sys.executable), "upsertctl")


# -- the cluster and its data -------------------------------------------------------------------


def start_cluster():
    """A mock cluster living in this process as long as the returned client does."""
    from confluent_kafka import Producer

    owner = Producer({"test.mock.num.brokers": 1})
    brokers = owner.list_topics(timeout=10).brokers.values()
    return owner, ",".join(f"{b.host}:{b.port}" for b in brokers)


# librdkafka's mock cluster keeps at most 5 MiB (and 100,000 message sets) per partition,
# hard-coded (rdkafka_mock.c: mpart->max_size): older message sets are deleted, like
# retention. About 55k of these records fit per partition, so data is produced a batch or two
# ahead of the shard (Feeder), never all at once.
MESSAGES_PER_SET = 1000  # small message sets: the cap deletes whole sets


class Producing:
    """Change records, ``per_partition`` per partition per call of :meth:`chunk`: ids of
    partition p are p mod 4 (one key, one partition, as a keyed producer does), random below
    ``keys`` with ``delete_ratio`` tombstones, or (``keys=None``) each id once, no deletes."""

    def __init__(self, bootstrap: str, topic: str, *, keys: int | None, seed: int, delete_ratio: float = 0.02) -> None:
        from confluent_kafka import Producer

        self.topic = topic
        self.keys = keys
        self.delete_ratio = delete_ratio
        self.rng = random.Random(seed)
        self.seq = 0
        self.seconds = 0.0
        self.producer = Producer({
            "bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": MESSAGES_PER_SET,
            "queue.buffering.max.messages": 1_000_000, "queue.buffering.max.kbytes": 1_048_576,
        })

    def chunk(self, per_partition: int) -> None:
        started = time.perf_counter()
        producer, rng, keys = self.producer, self.rng, self.keys
        for _ in range(per_partition):
            for partition in range(PARTITIONS):
                seq = self.seq
                self.seq += 1
                if keys is None:
                    key = seq * PARTITIONS + partition
                    value = f'{{"id":{key},"name":"n{key}","amount":{(seq % 10000) / 100},"updated_at":{seq}}}'
                elif rng.random() < self.delete_ratio:
                    key, value = rng.randrange(keys // PARTITIONS) * PARTITIONS + partition, None
                else:
                    key = rng.randrange(keys // PARTITIONS) * PARTITIONS + partition
                    value = f'{{"id":{key},"name":"n{key}-{seq}","amount":{(seq % 10000) / 100},"updated_at":{seq}}}'
                while True:
                    try:
                        producer.produce(self.topic, value=value, key=str(key), partition=partition)
                        break
                    except BufferError:
                        producer.poll(0.05)
            if seq % 20000 < PARTITIONS:
                producer.poll(0)
        assert producer.flush(300) == 0, f"topic {self.topic}: messages left undelivered"
        self.seconds += time.perf_counter() - started


class Feeder(threading.Thread):
    """Produces ``batches`` chunks of one batch each, at most ``ahead`` batches beyond the
    shard's bound offsets at its upper (read from consensus), so that nothing a batch will
    read is deleted by the mock cluster's size cap."""

    def __init__(self, env: "Env", producing: Producing, shard_id: str, batches: int, per_partition: int,
                 ahead: int = 2) -> None:
        super().__init__(daemon=True, name=f"feeder-{shard_id}")
        self.env, self.producing, self.shard_id = env, producing, shard_id
        self.batches, self.per_partition, self.ahead = batches, per_partition, ahead
        self.produced = 1  # kafka_shard produced the first
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def run(self) -> None:
        consensus = open_consensus(self.env.url)
        try:
            shard = Shard.open(consensus, self.env.blob, self.shard_id)
            while self.produced < self.batches and not self._halt.is_set():
                bound = shard.bound_offsets(shard.state().upper)
                low = min(int(bound.get(str(p), 0)) for p in range(PARTITIONS))
                if self.produced * self.per_partition - low < self.ahead * self.per_partition:
                    self.producing.chunk(self.per_partition)
                    self.produced += 1
                else:
                    time.sleep(0.02)
        except BaseException as exc:  # noqa: BLE001 - reported by the benchmark
            self.error = exc
        finally:
            consensus.dispose()

    def stop(self) -> None:
        self._halt.set()
        self.join(60)
        if self.error is not None:
            raise self.error


def kafka_shard(env: "Env", shard_id: str, topic: str, batch: int, *, keys: int | None, seed: int) -> tuple[Shard, Producing]:
    """The topic's first chunk (so that it exists), then the shard, reading from offset 0."""
    producing = Producing(env.bootstrap, topic, keys=keys, seed=seed)
    producing.chunk(batch // PARTITIONS)
    shard = create_shard(env, shard_id, topic, batch)
    return shard, producing


def schema_json() -> str:
    from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

    return StructType([
        StructField("id", LongType()), StructField("name", StringType()),
        StructField("amount", DoubleType()), StructField("updated_at", LongType()),
    ]).json()


def create_shard(env: "Env", shard_id: str, topic: str, batch: int) -> Shard:
    # No order column: within a key the Kafka offset orders (one key, one partition).
    config = ShardConfig(source=f"kafka:{topic}", keys=("id",), schema=schema_json(), buckets=8,
                         extra=KafkaShardOptions(max_records_per_batch=batch).to_extra())
    return Shard.create(env.consensus, env.blob, shard_id, config, kafka_config=env.config)


class Env:
    def __init__(self, work: str, bootstrap: str) -> None:
        self.work = work
        self.bootstrap = bootstrap
        self.config = KafkaConfig.from_dict({"bootstrap.servers": bootstrap})
        self.config_file = os.path.join(work, "kafka.json")
        with open(self.config_file, "w") as handle:
            json.dump({"bootstrap.servers": bootstrap}, handle)
        self.url = f"sqlite:///{work}/consensus.db"
        self.consensus = open_consensus(self.url)
        self.blob = open_blob(f"{work}/blob")
        self.blob.ensure_root()
        self.environ = {
            **os.environ, "UPSERT_CONSENSUS_URL": self.url, "UPSERT_BLOB_ROOT": self.blob.root,
            "UPSERT_KAFKA_CONFIG": self.config_file, "SPARK_LOCAL_IP": "127.0.0.1", "PYTHONUNBUFFERED": "1",
            "PYSPARK_PYTHON": sys.executable,
        }

    def upsertctl(self, *args: str) -> tuple[float, str]:
        started = time.perf_counter()
        done = subprocess.run([UPSERTCTL, *args], env=self.environ, capture_output=True, text=True)
        seconds = time.perf_counter() - started
        if done.returncode != 0:
            raise RuntimeError(f"upsertctl {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
        return seconds, done.stdout


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def summary(records: int, total_s: float, latencies: list[float]) -> dict:
    return {"records": records, "seconds": total_s, "records_per_s": records / total_s,
            "batch_p50_s": statistics.median(latencies), "batch_p90_s": percentile(latencies, 0.9),
            "latencies_s": latencies}


# -- 1. consecutive batches ---------------------------------------------------------------------


def one_batch_per_process(env: Env, batches: int, batch: int, keys: int) -> dict:
    shard, producing = kafka_shard(env, "per_process", "per-process", batch, keys=keys, seed=11)
    walls, steps = [], []
    for n in range(batches):
        if n:
            producing.chunk(batch // PARTITIONS)  # not timed: the next batch's records
        seconds, out = env.upsertctl("run-batch", shard.shard_id, "--max-batches", "1", "--json")
        report = json.loads(out)
        assert report["committed"] == 1 and report["batches"][0]["rows_in"] == batch, report
        walls.append(seconds)
        steps.append(report["batches"][0]["seconds"])
        print(f"  one batch per process: batch {n + 1}/{batches} {seconds:.2f}s (step {steps[-1]:.2f}s)", flush=True)
    assert shard.state().upper == batches
    out = summary(batches * batch, sum(walls), walls)
    out["step_p50_s"] = statistics.median(steps)
    return out


def continuous_fresh_process(env: Env, batches: int, batch: int, keys: int) -> dict:
    """``upsertctl run-batch --continuous`` from process start until the last batch's line;
    then the stream is stopped, which the run sees between batches, and it exits."""
    from airflow_upsert_provider.engine.store import streams

    shard, producing = kafka_shard(env, "continuous_fresh", "continuous-fresh", batch, keys=keys, seed=12)
    feeder = Feeder(env, producing, shard.shard_id, batches, batch // PARTITIONS)
    feeder.start()
    started = time.perf_counter()
    process = subprocess.Popen([UPSERTCTL, "run-batch", shard.shard_id, "--continuous", "--for", "3600s"],
                               env=env.environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    commits, steps = [], []
    try:
        for line in process.stdout:
            if line.startswith("batch ts=") and " committed:" in line:
                commits.append(time.perf_counter() - started)
                steps.append(float(re.search(r"rejected \d+, ([0-9.]+)s;", line).group(1)))
                if len(commits) == batches:
                    break
        streams.stop(env.consensus, shard.shard_id, "bench", "benchmark done")
        _, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.terminate()
            process.wait(30)
        feeder.stop()
    assert len(commits) == batches, f"continuous run ended after {len(commits)} batches: {err[-3000:]}"
    assert shard.state().upper == batches
    assert all(b.ranges[p]["count"] == batch // PARTITIONS for b in map(shard.binding, range(batches)) for p in b.ranges)
    intervals = [commits[0]] + [b - a for a, b in zip(commits, commits[1:])]
    out = summary(batches * batch, commits[-1], intervals)
    out.update(first_batch_s=commits[0], warm_interval_p50_s=statistics.median(intervals[1:]),
               step_p50_s=statistics.median(steps), step_p90_s=percentile(steps, 0.9))
    return out


def continuous_in_process(env: Env, spark, batches: int, batch: int, keys: int, *, prefetch: bool, name: str) -> dict:
    """``run_continuous`` in this process, Spark warm; it ends after ``batches`` results (its
    clock jumps past the deadline), so the figure is batches back to back, no idle poll."""
    from airflow_upsert_provider.engine.write.continuous import run_continuous
    from airflow_upsert_provider.engine.write.writer import Writer

    shard, producing = kafka_shard(env, f"continuous_{name}", f"continuous-{name}", batch, keys=keys, seed=13)
    feeder = Feeder(env, producing, shard.shard_id, batches, batch // PARTITIONS)
    feeder.start()
    # Two batches ahead before the clock starts, as in the fresh-process run.
    while feeder.produced < min(2, batches) and feeder.is_alive():
        time.sleep(0.02)
    writer = Writer(shard, f"bench-{name}", spark_factory=lambda: spark)
    done: list[float] = []

    def on_result(result) -> None:
        if result.outcome == "committed":
            done.append(time.perf_counter())

    def clock() -> float:
        return float("inf") if len(done) >= batches else time.monotonic()

    started = time.perf_counter()
    try:
        run_continuous(writer, duration_seconds=3600, on_result=on_result, prefetch=prefetch, clock=clock)
    finally:
        feeder.stop()
    assert len(done) == batches and shard.state().upper == batches, (len(done), shard.state().upper)
    marks = [started] + done
    intervals = [b - a for a, b in zip(marks, marks[1:])]
    return summary(batches * batch, done[-1] - started, intervals)


# -- 2. read throughput -------------------------------------------------------------------------


def read_throughput(env: Env, spark, count: int, rounds: int) -> dict:
    """``count`` messages in topics of at most 200k (50k per partition: what the mock cluster
    holds), read as one DataFrame (a union of one slice per topic) and by one consume loop."""
    from functools import reduce

    from confluent_kafka import TopicPartition

    from airflow_upsert_provider.engine.sources.kafka import open_consumer

    per_topic = 50_000 * PARTITIONS
    sources, slices = [], []
    for n in range((count + per_topic - 1) // per_topic):
        size = min(per_topic, count - n * per_topic)
        producing = Producing(env.bootstrap, f"read-{n}", keys=None, seed=21 + n)
        producing.chunk(size // PARTITIONS)
        source = KafkaSource(f"read-{n}", env.config)
        marks = source.watermarks()
        assert all(low == 0 for low, _ in marks.values()), f"the mock cluster dropped messages: {marks}"
        sources.append(source)
        slices.append({p: (low, high) for p, (low, high) in marks.items()})
    count = sum(h - lo for ranges in slices for lo, h in ranges.values())

    def data_source() -> int:
        frames = [src.read_slice(spark, ranges) for src, ranges in zip(sources, slices)]
        reduce(lambda a, b: a.unionByName(b), frames).write.format("noop").mode("overwrite").save()
        return count

    def consume_loop() -> int:
        seen = 0
        consumer = open_consumer(env.config)
        try:
            for src, ranges in zip(sources, slices):
                for partition, (start, end) in ranges.items():
                    consumer.assign([TopicPartition(src.topic, partition, start)])
                    position = start
                    while position < end:
                        for message in consumer.consume(min(end - position, 10_000), 1.0):
                            if message.error() is not None:
                                continue
                            key, value = message.key(), message.value()
                            key is None or key.decode()
                            value is None or value.decode()
                            message.timestamp()
                            position = message.offset() + 1
                            seen += 1
        finally:
            consumer.close()
        return seen

    # Warm-up, not measured: the Python workers start, the data source is planned once.
    sources[0].read_slice(spark, {p: (lo, min(hi, lo + 1000)) for p, (lo, hi) in slices[0].items()}).count()
    spark_s, loop_s = [], []
    for r in range(rounds):
        # Alternate which goes first, so drift falls on both alike.
        order = [("source", data_source, spark_s), ("loop", consume_loop, loop_s)]
        for _name, fn, into in (order if r % 2 == 0 else order[::-1]):
            started = time.perf_counter()
            assert fn() == count
            into.append(time.perf_counter() - started)
        print(f"  read round {r + 1}: data source {spark_s[-1]:.2f}s, consume loop {loop_s[-1]:.2f}s", flush=True)
    for source in sources:
        source.close()
    s, c = statistics.median(spark_s), statistics.median(loop_s)
    return {"messages": count, "topics": len(sources), "data_source_s": s, "consume_loop_s": c,
            "data_source_per_s": count / s, "consume_loop_per_s": count / c,
            "data_source_over_loop": (count / s) / (count / c),
            "data_source_all_s": spark_s, "consume_loop_all_s": loop_s}


# -- 3. recovery --------------------------------------------------------------------------------


def build_base(spark, shard: Shard, rows: int) -> None:
    """Batch 0: ``rows`` keys written as one committed run (as bench_upsert builds its
    tables), binding no offsets: the mock cluster cannot hold millions of messages."""
    from pyspark.sql import functions as F

    from airflow_upsert_provider.engine.store.records import BatchRecord, Binding
    from airflow_upsert_provider.engine.table.runs import bucket_column, write_bucketed

    base = spark.range(rows).select(
        (F.col("id") * PARTITIONS + 1_000_000_000).alias("id"),  # never an id the topic produces
        F.concat(F.lit("base-"), F.col("id").cast("string")).alias("name"),
        (F.col("id") * 0.5).alias("amount"),
        F.lit(0).cast("long").alias("updated_at"),
    )
    run_rows = base.select("*", F.lit(False).alias("_deleted"), F.lit(0).cast("long").alias("_ts"),
                           bucket_column(shard.config).alias("_bucket"))
    run_dir = shard.run_dir(0, "bench-base", "0")
    run = write_bucketed(run_rows, shard.config, shard.blob, run_dir)
    shard.consensus.mint_binding(shard.shard_id, Binding(0, {}), "bench")
    record = BatchRecord(0, "bench-base", "base", run, {})
    assert shard.compare_and_append(0, 1, record).outcome.value == "committed"


def recovery(env: Env, spark, rows: int, kafka_batches: int, batch: int) -> dict:
    from airflow_upsert_provider.engine.maintenance import checkpoint as ckpt
    from airflow_upsert_provider.engine.lifecycle import recovery as rec
    from airflow_upsert_provider.engine.store import streams
    from airflow_upsert_provider.engine.write.writer import Writer

    shard, producing = kafka_shard(env, "recovery", "recovery", batch, keys=None, seed=31)
    started = time.perf_counter()
    build_base(spark, shard, rows)
    base_s = time.perf_counter() - started
    writer = Writer(shard, "bench-recovery-build", spark_factory=lambda: spark)
    started = time.perf_counter()
    for n in range(kafka_batches):
        if n:
            producing.chunk(batch // PARTITIONS)
        assert writer.run(max_batches=1).results[0].outcome == "committed"
    kafka_s = time.perf_counter() - started
    upper = shard.state().upper
    total = rows + kafka_batches * batch
    assert upper == 1 + kafka_batches and shard.read(spark).count() == total
    producing.chunk(250)  # 1000 records the restored shard reads after its resume
    entry = ckpt.create_checkpoint(shard)
    print(f"  recovery: {total:,} rows ({rows:,} written as batch 0 in {base_s:.1f}s, {kafka_batches} batches of "
          f"{batch:,} from Kafka in {kafka_s:.1f}s), checkpoint {entry.id}: {entry.files} files, "
          f"{entry.bytes / 2**20:.0f} MiB", flush=True)

    fresh = {}
    fresh["restore"], _ = env.upsertctl("checkpoint", "restore", shard.shard_id, entry.id, "--as", "restored_cli")
    fresh["seek"], _ = env.upsertctl("recover", "seek", "restored_cli")
    fresh["resume"], _ = env.upsertctl("recover", "resume", "restored_cli")
    fresh["total"] = fresh["restore"] + fresh["seek"] + fresh["resume"]

    engine = {}
    started = time.perf_counter()
    ckpt.restore_checkpoint(env.consensus, env.blob, shard.shard_id, entry.id, target_shard_id="restored_engine",
                            actor="bench")
    engine["restore"] = time.perf_counter() - started
    started = time.perf_counter()
    restored = Shard.open(env.consensus, env.blob, "restored_engine", kafka_config=env.config)
    seek = rec.seek(restored, actor="bench")
    engine["seek"] = time.perf_counter() - started
    started = time.perf_counter()
    streams.resume_after_recovery(env.consensus, "restored_engine", None, "bench")
    engine["resume"] = time.perf_counter() - started
    engine["total"] = engine["restore"] + engine["seek"] + engine["resume"]
    assert seek.group is not None and seek.group["verified"]
    assert seek.group["positions"] == shard.bound_offsets(upper), (seek.group, shard.bound_offsets(upper))
    # The restored shard reads on from its frontier: the 1000 records produced after the build.
    started = time.perf_counter()
    Writer(restored, "bench-after-resume", spark_factory=lambda: spark).run(until_caught_up=True)
    catch_up_s = time.perf_counter() - started
    assert restored.read(spark).count() == total + 1000
    return {"rows": total, "base_rows": rows, "kafka_batches": kafka_batches, "base_s": base_s, "kafka_s": kafka_s,
            "checkpoint_files": entry.files, "checkpoint_bytes": entry.bytes, "fresh_process_s": fresh,
            "in_process_s": engine, "first_batch_after_resume_s": catch_up_s}


# -- main ---------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    parser.add_argument("--batches", type=int, default=20, help="consecutive batches in part 1")
    parser.add_argument("--batch", type=int, help="records per batch in part 1 (default 100k; quick 20k)")
    parser.add_argument("--read", type=int, help="messages read in part 2 (default 1M; quick 200k)")
    parser.add_argument("--read-rounds", type=int, default=3)
    parser.add_argument("--recovery-rows", type=int, help="rows of the recovered shard (default 5M; quick 500k)")
    parser.add_argument("--compare-prefetch", action="store_true",
                        help="part 1 also runs the warm continuous mode without prefetch")
    parser.add_argument("--parts", default="1,2,3", help="which parts to run, e.g. 1,3")
    parser.add_argument("--out", default=os.path.join(REPO, "bench", "results", "kafka.json"))
    args = parser.parse_args()
    batch = args.batch or (20_000 if args.quick else 100_000)
    read_count = args.read or (200_000 if args.quick else 1_000_000)
    recovery_rows = args.recovery_rows or (500_000 if args.quick else 5_000_000)
    parts = {int(p) for p in args.parts.split(",")}
    keys = batch * 5  # updates of keys seen before, new keys, and deletes in every batch

    from airflow_upsert_provider.engine.spark.session import get_spark

    owner, bootstrap = start_cluster()
    work = tempfile.mkdtemp(prefix="kafka-bench-")
    env = Env(work, bootstrap)
    spark = None
    results: dict = {"batch": batch, "batches": args.batches, "cores": os.cpu_count()}
    try:
        print(f"mock cluster at {bootstrap}; {os.cpu_count()} cores; work dir {work}", flush=True)
        if 1 in parts:
            print(f"[1] {args.batches} batches of {batch:,} records", flush=True)
            results["per_process"] = one_batch_per_process(env, args.batches, batch, keys)
            results["continuous_fresh"] = continuous_fresh_process(env, args.batches, batch, keys)
            print(f"  continuous, fresh process: {results['continuous_fresh']['seconds']:.1f}s", flush=True)
        if parts & {1, 2, 3}:
            spark = get_spark("local[*]", app_name="kafka-bench", conf={"spark.driver.memory": "6g"})
            results["spark"] = spark.version
        if 1 in parts:
            continuous_in_process(env, spark, 3, batch, keys, prefetch=True, name="warmup")
            results["continuous_warm"] = continuous_in_process(env, spark, args.batches, batch, keys, prefetch=True,
                                                               name="warm")
            print(f"  continuous, warm, in process: {results['continuous_warm']['seconds']:.1f}s", flush=True)
            if args.compare_prefetch:
                results["continuous_warm_no_prefetch"] = continuous_in_process(
                    env, spark, args.batches, batch, keys, prefetch=False, name="warm_noprefetch")
        if 2 in parts:
            print(f"[2] read throughput over {read_count:,} messages", flush=True)
            results["read"] = read_throughput(env, spark, read_count, args.read_rounds)
        if 3 in parts:
            print(f"[3] recovery of a {recovery_rows:,}-row shard", flush=True)
            results["recovery"] = recovery(env, spark, recovery_rows, 2, batch)
    finally:
        if spark is not None:
            spark.stop()
        env.consensus.dispose()
        shutil.rmtree(work, ignore_errors=True)
        del owner

    print()
    if "per_process" in results:
        pp, cf, cw = (results[k] for k in ("per_process", "continuous_fresh", "continuous_warm"))
        results["ratios"] = {"continuous_fresh_over_per_process": cf["records_per_s"] / pp["records_per_s"],
                             "continuous_warm_over_per_process": cw["records_per_s"] / pp["records_per_s"]}
        print(f"| {args.batches} batches of {batch:,} | total (s) | records/s | batch p50 (s) | batch p90 (s) | vs one per process |")
        print("|---|---:|---:|---:|---:|---:|")
        rows = [("one batch per process (`run-batch --max-batches 1` x N)", pp),
                ("continuous, one fresh process (`--continuous`, JVM start included)", cf),
                ("continuous, warm, in process (`run_continuous`, prefetch)", cw)]
        if "continuous_warm_no_prefetch" in results:
            rows.append(("continuous, warm, in process, no prefetch", results["continuous_warm_no_prefetch"]))
        for label, r in rows:
            print(f"| {label} | {r['seconds']:.1f} | {r['records_per_s']:,.0f} | {r['batch_p50_s']:.2f} | "
                  f"{r['batch_p90_s']:.2f} | {r['records_per_s'] / pp['records_per_s']:.2f}x |")
        print(f"\nper-process batch latency is the process's wall time (its own step: p50 {pp['step_p50_s']:.2f}s); "
              f"continuous latency is the time between commits (fresh: first batch {cf['first_batch_s']:.1f}s "
              f"after start, then p50 {cf['warm_interval_p50_s']:.2f}s; step p50 {cf['step_p50_s']:.2f}s)")
        print(f"continuous (fresh process) / one per process: "
              f"{results['ratios']['continuous_fresh_over_per_process']:.2f}x (target >= 3x)")
    if "read" in results:
        r = results["read"]
        print(f"\nread {r['messages']:,} messages: Python data source {r['data_source_s']:.2f}s "
              f"({r['data_source_per_s']:,.0f}/s), plain consume loop {r['consume_loop_s']:.2f}s "
              f"({r['consume_loop_per_s']:,.0f}/s): data source / loop {r['data_source_over_loop']:.2f}x")
    if "recovery" in results:
        r = results["recovery"]
        print(f"\nrecovery of {r['rows']:,} rows ({r['checkpoint_files']} files); first batch after the resume "
              f"{r['first_batch_after_resume_s']:.2f}s (in process):")
        print("| | restore (s) | seek (s) | resume (s) | total (s) |")
        print("|---|---:|---:|---:|---:|")
        for label, t in (("fresh `upsertctl` processes", r["fresh_process_s"]), ("engine calls, in process", r["in_process_s"])):
            print(f"| {label} | {t['restore']:.2f} | {t['seek']:.2f} | {t['resume']:.2f} | {t['total']:.2f} |")
        print(f"target < 15 s: {'met' if r['fresh_process_s']['total'] < 15 else 'NOT met'} (fresh processes)")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as handle:
        json.dump(results, handle, indent=2)
    print(f"\nresults: {args.out}")


if __name__ == "__main__":
    main()
