"""What counting the fields a batch's records carry and the shard's schema does not name costs.

A JSON Lines batch of ``--rows`` sample change records (one field the schema does not name on
every line, as after an upstream column was added) is counted, warm in one process, ``--repeat``
times each (medians):

  driver count    ``jsonl_field_counts_on_driver``: what a batch of up to 64 MB pays, in the
                  process that decides the batch's read path anyway
  spark count     the Spark aggregation over the lines' keys: what a bigger batch pays
  driver scan     ``simple_jsonl`` over the same bytes: the decision scan every such batch
                  already pays (the baseline)
  spark scan      ``spark.read.text(...).count()``: the cheapest Spark job over the same files,
                  the floor of a second job per batch

The ratios are to ``driver scan`` and ``spark scan``, measured in the same run.

A Kafka batch counts its fields where the executors parse its messages (``map_messages``), so
its cost is measured there, on the same records as message values in slice batches of 10,000
(what ``read_range`` yields), for each envelope:

  kafka <envelope> map     ``map_messages`` without counting: what every Kafka batch pays
  kafka <envelope> count   ``map_messages`` counting the fields ``known`` does not name

(CPU seconds of this process, the two alternated, medians of ``--repeat``.)

The whole batch adds one ``collect_list`` of a row per slice batch to the metrics its Spark job
already observes.

    .venv/bin/python bench/bench_unknown_fields.py                 # 100k records
    .venv/bin/python bench/bench_unknown_fields.py --rows 1000000
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from airflow_upsert_provider.engine.sources import Segment  # noqa: E402
from airflow_upsert_provider.engine.spark.session import get_spark  # noqa: E402
from airflow_upsert_provider.engine.write import records as R  # noqa: E402
from airflow_upsert_provider.sample_data import SampleSpec, generate  # noqa: E402
from tests.helpers import sample_config  # noqa: E402


def median_seconds(step, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def field_totals(counts: list[tuple[str, int, str]]) -> list[tuple[str, int]]:
    """The counts (one per field and file) summed per field."""
    totals: dict[str, int] = {}
    for field, records, _ in counts:
        totals[field] = totals.get(field, 0) + records
    return sorted(totals.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000, help="change records in the batch")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each step (median reported)")
    args = parser.parse_args()

    landing = tempfile.mkdtemp(prefix="bench-unknown-fields-")
    generate(landing, SampleSpec(records=args.rows, keys=max(1, args.rows // 2), partitions=2,
                                 segments_per_partition=2, seed=34))
    segments = []
    for partition in sorted(os.listdir(landing)):
        for name in sorted(os.listdir(os.path.join(landing, partition))):
            path = os.path.join(landing, partition, name)
            # Every record carries a field the schema does not name.
            with open(path, "rb") as handle:
                lines = [line[:-1] + b', "email": "x@example.com"}' for line in handle.read().splitlines() if line]
            with open(path, "wb") as handle:
                handle.write(b"\n".join(lines) + b"\n")
            segments.append(Segment(int(name.split(".")[0]), partition, path))
    size = sum(os.path.getsize(s.path) for s in segments)
    config = sample_config(landing)
    spark = get_spark("local[*]", app_name="bench-unknown-fields")
    paths = [s.path for s in segments]

    # One of each first: the JVM's first job and the files' first read are not what is measured.
    on_driver = R.jsonl_field_counts_on_driver(config, segments)
    on_spark = R._jsonl_field_counts_spark(spark, config, segments)
    assert field_totals(on_driver) == field_totals(on_spark) == [("email", args.rows)], (on_driver, on_spark)
    spark.read.text(paths).count()

    figures = {
        "driver count": median_seconds(lambda: R.jsonl_field_counts_on_driver(config, segments), args.repeat),
        "spark count": median_seconds(lambda: R._jsonl_field_counts_spark(spark, config, segments), args.repeat),
        "driver scan": median_seconds(lambda: [R.simple_jsonl(R._read(p)) for p in paths], args.repeat),
        "spark scan": median_seconds(lambda: spark.read.text(paths).count(), args.repeat),
    }
    print(f"{args.rows:,} records, {size / 1e6:.1f} MB in {len(segments)} segments; medians of {args.repeat}, warm")
    print(f"{'step':<14} {'seconds':>8} {'/ driver scan':>14} {'/ spark scan':>13}")
    for step, seconds in figures.items():
        print(f"{step:<14} {seconds:>8.3f} {seconds / figures['driver scan']:>13.1f}x "
              f"{seconds / figures['spark scan']:>12.2f}x")
    kafka = kafka_figures(segments, config, args.repeat)
    for step, seconds in kafka.items():
        base = kafka[step.replace(" count", " map")]
        print(f"{step:<22} {seconds:>8.3f}" + (f"  {seconds / base - 1:+.1%} over map" if step.endswith("count") else ""))
    print(json.dumps({"rows": args.rows, "bytes": size, "seconds": {**figures, **kafka}}))


def kafka_figures(segments, config, repeat: int) -> dict[str, float]:
    """Medians of ``map_messages`` over the segments' lines as Kafka message values, without
    and with counting, for both envelopes."""
    import pyarrow as pa

    from airflow_upsert_provider.engine.sources.kafka import MAX_BATCH
    from airflow_upsert_provider.engine.write.kafka_records import map_messages

    values = [line for s in segments for line in R._read(s.path).decode().splitlines() if line]
    known = tuple(config.column_names())
    figures: dict[str, float] = {}
    for envelope in ("json", "debezium"):
        texts = values if envelope == "json" else [
            '{"op":"u","before":null,"after":' + v + ',"source":{"lsn":' + str(i) + "}}" for i, v in enumerate(values)]
        batches = [
            pa.RecordBatch.from_pydict({
                "partition": pa.array([0] * len(chunk), pa.int32()),
                "offset": pa.array(range(start, start + len(chunk)), pa.int64()),
                "key": pa.array([None] * len(chunk), pa.string()),
                "value": pa.array(chunk, pa.string()),
            })
            for start in range(0, len(texts), MAX_BATCH) for chunk in [texts[start:start + MAX_BATCH]]
        ]

        def mapped(counting: bool) -> None:
            for batch in batches:
                map_messages(batch, topic="bench", keys=tuple(config.keys), envelope=envelope,
                             known=known if counting else None)

        counted = [map_messages(b, topic="bench", keys=tuple(config.keys), envelope=envelope,
                                known=known).column("_unknown")[0].as_py() for b in batches]
        assert sum(e["records"] for entries in counted for e in entries) == len(texts), counted[:1]
        # Alternated, in this process's CPU seconds: on a shared machine the load drifts
        # between two series run one after the other, and wall time counts other processes.
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(repeat):
            for counting in (False, True):
                started = time.process_time()
                mapped(counting)
                times[counting].append(time.process_time() - started)
        figures[f"kafka {envelope} map"] = statistics.median(times[False])
        figures[f"kafka {envelope} count"] = statistics.median(times[True])
    return figures


if __name__ == "__main__":
    main()
