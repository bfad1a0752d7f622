"""What a batch that adds a column costs, against the same batch without the new field.

    .venv/bin/python bench/bench_schema.py                          # 200k records, 3 pairs
    .venv/bin/python bench/bench_schema.py --rows 1000000 --kafka-rows 20000

Under the shard's default policy ``add_columns`` (docs/schema.md), for each source:

- ``jsonl``: one directory batch of ``--rows`` sample change records in 8 JSON Lines
  segments, every record carrying one field the schema does not name (``email``), against the
  same records without it;
- ``parquet``: the same records as 8 Parquet files, with an extra ``email`` column against
  without;
- ``kafka``: ``--kafka-rows`` Debezium change events (JsonConverter, schemas on) in a topic of
  librdkafka's mock cluster owned by this process, whose events carry an optional ``rank``
  field (int16) against a topic whose events do not. The mock cluster keeps at most 5 MiB per
  partition (bench_kafka.py), about 4,800 of these events: 19,000 in its 4 partitions.

Each side runs on a fresh copy of its prepared store (the shard initialised, nothing
committed), so every sample does the same one batch: warm (``Writer.run`` in this process, one
Spark session) and as fresh processes (``upsertctl run-batch --max-batches 1``), pairs
interleaved with the first side alternating. Per source and mode: the median seconds and CPU
seconds (warm: this process and every process below it, the JVM and its Python workers; for a
fresh process, what ``getrusage`` gives for the command: its Python process, not the JVM it
starts, which it does not wait for) of each side, the ratio of the medians, the CPU pair ratios, and the
target (1.2x) met or missed. Each sample checks the batch committed all its records and that
the column was added (or not).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from bench_observability import fresh_store, sides, timed  # noqa: E402

from airflow_upsert_provider.sample_data import SAMPLE_SCHEMA_DDL, SampleSpec, generate  # noqa: E402

VENV_BIN = os.path.dirname(sys.executable)
UPSERTCTL = os.path.join(VENV_BIN, "upsertctl")
TARGET = 1.2
SEGMENTS = 8  # 2 partitions x 4 segments
NEW_FIELD = {"jsonl": "email", "parquet": "email", "kafka": "rank"}
KAFKA_PARTITIONS = 4  # what the mock cluster creates every topic with


def tree_cpu() -> dict[int, float]:
    """CPU seconds used so far by this process and each live process below it (with the
    children each waited for), per process id."""
    import psutil

    me = psutil.Process()
    used: dict[int, float] = {}
    for process in [me, *me.children(recursive=True)]:
        try:
            t = process.cpu_times()
        except psutil.Error:  # ended between the listing and the read
            continue
        used[process.pid] = t.user + t.system + t.children_user + t.children_system
    return used


def cpu_since(before: dict[int, float]) -> float:
    """CPU seconds the process tree used since ``before`` (:func:`tree_cpu`): a process that
    ended meanwhile is not counted (Spark's Python workers outlive a job; an undercount, never
    a negative figure)."""
    return sum(max(0.0, used - before.get(pid, 0.0)) for pid, used in tree_cpu().items())


# -- prepared stores ----------------------------------------------------------------------------


def directory_template(work: str, source_format: str, rows: int, adds: bool) -> str:
    """A store with the shard ``orders`` initialised (by ``upsertctl init``) on a landing
    directory of ``rows`` sample records, with or without the new field."""
    template = os.path.join(work, f"{source_format}-{'adds' if adds else 'plain'}")
    landing = os.path.join(template, "landing")
    generate(landing, SampleSpec(records=rows, keys=max(1, rows // 2), partitions=2,
                                 segments_per_partition=SEGMENTS // 2, seed=36))
    for partition in sorted(os.listdir(landing)):
        for name in sorted(os.listdir(os.path.join(landing, partition))):
            path = os.path.join(landing, partition, name)
            if adds:
                with open(path, "rb") as handle:
                    lines = [line[:-1] + b', "email": "x@example.com"}' for line in handle.read().splitlines() if line]
                with open(path, "wb") as handle:
                    handle.write(b"\n".join(lines) + b"\n")
            if source_format == "parquet":
                to_parquet(path, adds)
    env = dict(os.environ, PYTHONPATH=REPO)
    timed([UPSERTCTL, "--consensus", f"sqlite:///{template}/consensus.db", "--blob-root", f"{template}/blob",
           "init", "orders", "--source", f"dir:{landing}", "--format", source_format, "--key", "id",
           "--order-by", "updated_at", "--delete-marker", "deleted", "--schema", SAMPLE_SCHEMA_DDL,
           "--max-files-per-batch", str(SEGMENTS)], env)
    return template


def to_parquet(path: str, adds: bool) -> None:
    """The JSON Lines segment ``path`` as a Parquet file beside it (its column types those of
    the sample schema, so that only the extra column differs), the segment removed."""
    import pyarrow as pa
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    types = {"id": pa.int64(), "name": pa.string(), "amount": pa.float64(), "updated_at": pa.int64(),
             "deleted": pa.bool_(), "email": pa.string()}
    table = pj.read_json(path, parse_options=pj.ParseOptions(explicit_schema=pa.schema(types.items())))
    # An explicit schema's fields are columns even where no line carries them.
    table = table.select([name for name in types if name != "email" or adds])
    pq.write_table(table, path[: -len(".jsonl")] + ".parquet")
    os.remove(path)


def debezium_event(seq: int, adds: bool) -> str:
    """One Debezium change event as the JsonConverter sends it with schemas on; with ``adds``,
    its row (schema and value) carries the optional int16 ``rank``."""
    fields = [{"type": "int64", "optional": False, "field": "id"},
              {"type": "string", "optional": True, "field": "name"},
              {"type": "float64", "optional": True, "field": "amount"}]
    after = {"id": seq, "name": f"n{seq}", "amount": (seq % 10000) / 100}
    if adds:
        fields.append({"type": "int16", "optional": True, "field": "rank"})
        after["rank"] = seq % 100
    row = {"type": "struct", "optional": True, "name": "db.public.orders.Value", "fields": fields}
    schema = {"type": "struct", "name": "db.public.orders.Envelope", "fields": [
        {**row, "field": "before"}, {**row, "field": "after"},
        {"type": "struct", "optional": False, "field": "source",
         "fields": [{"type": "int64", "optional": True, "field": "lsn"}]},
        {"type": "string", "optional": False, "field": "op"}]}
    return json.dumps({"schema": schema, "payload": {"op": "c", "before": None, "after": after, "source": {"lsn": seq}}})


def kafka_template(work: str, bootstrap: str, rows: int, adds: bool) -> str:
    """A topic of ``rows`` Debezium events (ids distinct, spread over the partitions) and a
    store with the shard ``orders`` reading it from offset 0, one batch of all of them."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    from airflow_upsert_provider.engine.blob.files import open_blob
    from airflow_upsert_provider.engine.config import ShardConfig
    from airflow_upsert_provider.engine.sources.kafka import KafkaConfig
    from airflow_upsert_provider.engine.sources.kafka_options import KafkaShardOptions
    from airflow_upsert_provider.engine.store.registry import open_consensus
    from airflow_upsert_provider.engine.table.shard import Shard

    topic = f"orders-{'adds' if adds else 'plain'}"
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 500})
    for seq in range(rows):
        while True:
            try:
                producer.produce(topic, key=str(seq), value=debezium_event(seq, adds), partition=seq % KAFKA_PARTITIONS)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(300) == 0, f"topic {topic}: messages left undelivered"
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-schema"})
    try:
        marks = [consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in range(KAFKA_PARTITIONS)]
    finally:
        consumer.close()
    # The mock cluster drops the oldest message sets beyond 5 MiB per partition.
    assert all(low == 0 for low, _ in marks) and sum(high for _, high in marks) == rows, \
        f"topic {topic}: the mock cluster kept {marks} of {rows} messages: use fewer --kafka-rows"
    template = os.path.join(work, f"kafka-{'adds' if adds else 'plain'}")
    os.makedirs(template)
    consensus = open_consensus(f"sqlite:///{template}/consensus.db")
    blob = open_blob(f"{template}/blob")
    blob.ensure_root()
    schema = json.dumps({"type": "struct", "fields": [
        {"name": name, "type": kind, "nullable": True, "metadata": {}}
        for name, kind in (("id", "long"), ("name", "string"), ("amount", "double"))]})
    config = ShardConfig(source=f"kafka:{topic}", keys=("id",), schema=schema, buckets=8,
                         extra=KafkaShardOptions(max_records_per_batch=rows, envelope="debezium").to_extra())
    Shard.create(consensus, blob, "orders", config, kafka_config=KafkaConfig.from_dict({"bootstrap.servers": bootstrap}))
    consensus.dispose()
    return template


# -- one sample ---------------------------------------------------------------------------------


def check(store: str, report: dict, rows: int, field: str, adds: bool) -> None:
    """The batch committed all ``rows`` records, and the schema gained ``field`` iff ``adds``."""
    from airflow_upsert_provider.engine.blob.files import open_blob
    from airflow_upsert_provider.engine.store.registry import open_consensus
    from airflow_upsert_provider.engine.table.shard import Shard

    batch = report["batches"][0]
    assert report["committed"] == 1 and batch["rows_in"] == rows and batch["rejected"] == 0, report
    consensus = open_consensus(f"sqlite:///{store}/consensus.db")
    try:
        columns = Shard.open(consensus, open_blob(f"{store}/blob"), "orders").config.column_names()
    finally:
        consensus.dispose()
    assert (field in columns) == adds, (field, columns)


def warm_sample(spark, store: str, kafka_config=None) -> tuple[dict, float, float]:
    """One batch by ``Writer.run`` in this process: its report, wall and CPU seconds."""
    from airflow_upsert_provider.engine.blob.files import open_blob
    from airflow_upsert_provider.engine.store.registry import open_consensus
    from airflow_upsert_provider.engine.table.shard import Shard
    from airflow_upsert_provider.engine.write.writer import Writer

    consensus = open_consensus(f"sqlite:///{store}/consensus.db")
    try:
        shard = Shard.open(consensus, open_blob(f"{store}/blob"), "orders", kafka_config=kafka_config)
        cpu = tree_cpu()
        started = time.perf_counter()
        report = Writer(shard, "bench-schema", spark_factory=lambda: spark).run(max_batches=1).to_dict()
        return report, time.perf_counter() - started, cpu_since(cpu)
    finally:
        consensus.dispose()


def fresh_sample(store: str, environ: dict[str, str]) -> tuple[dict, float, float]:
    """One batch by ``upsertctl run-batch --max-batches 1`` in a fresh process."""
    cpu: list[float] = []
    out = os.path.join(store, "report.json")
    argv = [UPSERTCTL, "--consensus", f"sqlite:///{store}/consensus.db", "--blob-root", f"{store}/blob",
            "run-batch", "orders", "--max-batches", "1", "--json"]
    seconds = timed(["sh", "-c", '"$@" > "$0"', out, *argv], environ, cpu=cpu)
    with open(out) as handle:
        return json.loads(handle.read()), seconds, cpu[0]


# -- a source's pairs ---------------------------------------------------------------------------


def pairs_of(name: str, templates: dict[bool, str], rows: int, pairs: int, work: str, sample) -> dict:
    """``pairs`` interleaved (adds, plain) samples, each on a fresh copy of its side's store."""
    walls: dict[bool, list[float]] = {True: [], False: []}
    cpus: dict[bool, list[float]] = {True: [], False: []}
    timings: dict[bool, list[dict]] = {True: [], False: []}
    for pair in range(pairs):
        for adds, _ in sides(pair, walls[True], walls[False]):
            store = fresh_store(templates[adds], os.path.join(work, "sample"))
            report, seconds, cpu = sample(store)
            check(store, report, rows, NEW_FIELD[name.split()[0]], adds)
            walls[adds].append(seconds)
            cpus[adds].append(cpu)
            timings[adds].append(report["batches"][0].get("timings", {}))
            print(f"  {name} pair {pair + 1}/{pairs} {'adds' if adds else 'plain'}: {seconds:.2f} s, "
                  f"CPU {cpu:.2f} s", flush=True)
    on, off = statistics.median(walls[True]), statistics.median(walls[False])
    cpu_ratios = sorted(a / b for a, b in zip(cpus[True], cpus[False]))
    figures = {
        "rows": rows, "adds_seconds": walls[True], "plain_seconds": walls[False],
        "adds_median": round(on, 3), "plain_median": round(off, 3), "ratio": round(on / off, 3),
        "adds_cpu": [round(c, 2) for c in cpus[True]], "plain_cpu": [round(c, 2) for c in cpus[False]],
        "adds_cpu_median": round(statistics.median(cpus[True]), 2),
        "plain_cpu_median": round(statistics.median(cpus[False]), 2),
        "cpu_pair_ratio_median": round(statistics.median(cpu_ratios), 3),
        "adds_timings": median_timings(timings[True]), "plain_timings": median_timings(timings[False]),
        "target_met": on / off <= TARGET, "load_average": [round(x, 1) for x in os.getloadavg()],
    }
    print(f"{name}: adds a column {on:.2f} s (CPU {figures['adds_cpu_median']:.2f} s), plain {off:.2f} s "
          f"(CPU {figures['plain_cpu_median']:.2f} s): {on / off:.2f}x wall, CPU pair ratio "
          f"{figures['cpu_pair_ratio_median']:.2f}x ({cpu_ratios[0]:.2f}-{cpu_ratios[-1]:.2f}); target {TARGET}x "
          f"{'met' if figures['target_met'] else 'missed'}; step timings adds {figures['adds_timings']}, "
          f"plain {figures['plain_timings']}; load average {figures['load_average']}", flush=True)
    print(json.dumps({name: figures}), flush=True)
    return figures


def median_timings(samples: list[dict]) -> dict[str, float]:
    keys = sorted({k for s in samples for k in s})
    return {k: round(statistics.median(s.get(k, 0.0) for s in samples), 2) for k in keys}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000, help="records of the directory batches")
    parser.add_argument("--kafka-rows", type=int, default=16_000, help="events of the Kafka batch (at most ~19,000)")
    parser.add_argument("--pairs", type=int, default=3, help="warm (adds, plain) pairs per source")
    parser.add_argument("--fresh-pairs", type=int, default=2, help="fresh-process pairs per source (0: skip)")
    parser.add_argument("--sources", default="jsonl,parquet,kafka", help="comma-separated: jsonl, parquet, kafka")
    args = parser.parse_args()
    sources = args.sources.split(",")
    work = tempfile.mkdtemp(prefix="bench-schema-")
    print(f"{os.cpu_count()} cores; load average {os.getloadavg()}; work dir {work}", flush=True)
    try:
        from airflow_upsert_provider.engine.spark.session import get_spark

        templates = {fmt: {adds: directory_template(work, fmt, args.rows, adds) for adds in (True, False)}
                     for fmt in ("jsonl", "parquet") if fmt in sources}
        environ = dict(os.environ, PYTHONPATH=REPO, SPARK_LOCAL_IP="127.0.0.1")
        owner = kafka_config = None
        if "kafka" in sources:
            from airflow_upsert_provider.engine.sources.kafka import KafkaConfig

            from confluent_kafka import Producer

            owner = Producer({"test.mock.num.brokers": 1})  # the mock cluster lives as long as this client
            bootstrap = ",".join(f"{b.host}:{b.port}" for b in owner.list_topics(timeout=10).brokers.values())
            templates["kafka"] = {adds: kafka_template(work, bootstrap, args.kafka_rows, adds) for adds in (True, False)}
            with open(os.path.join(work, "kafka.json"), "w") as handle:
                json.dump({"bootstrap.servers": bootstrap}, handle)
            environ["UPSERT_KAFKA_CONFIG"] = os.path.join(work, "kafka.json")
            kafka_config = KafkaConfig.from_dict({"bootstrap.servers": bootstrap})
        spark = get_spark("local[*]", app_name="bench-schema")
        for name in sources:
            rows = args.kafka_rows if name == "kafka" else args.rows
            # One batch first: the JVM's first jobs and the files' first read are not what is measured.
            warm_sample(spark, fresh_store(templates[name][False], os.path.join(work, "sample")), kafka_config)
            pairs_of(f"{name} warm", templates[name], rows, args.pairs, work,
                     lambda store: warm_sample(spark, store, kafka_config))
        spark.stop()
        if args.fresh_pairs:
            for name in sources:
                rows = args.kafka_rows if name == "kafka" else args.rows
                pairs_of(f"{name} fresh", templates[name], rows, args.fresh_pairs, work,
                         lambda store: fresh_sample(store, environ))
        del owner
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
