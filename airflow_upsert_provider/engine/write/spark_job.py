"""The packaged Spark application of `submit` mode: ``spark-submit spark_job.py ARGS``.

It runs :meth:`Writer.run` inside the spark-submit driver and writes a JSON result (the run
report, or the error with its exit code) to ``--result-file``, then exits with the engine's
exit code. The consensus URL (which may hold a password) is read from the file named by
``--consensus-url-file`` (the submitting task writes it readable only by its user and removes
it afterwards), or else from the environment (``UPSERT_CONSENSUS_URL``), so that a password
never appears on a command line. A Kafka shard's client config (it may hold ``sasl.password``)
comes the same way, from the file named by ``--kafka-config-file``. ``--continuous-for
SECONDS`` runs continuous mode (engine/write/continuous.py). No Airflow imports: the engine runs
here alone.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Sequence

from airflow_upsert_provider.engine.common.atomic_file import write_atomically

CONSENSUS_URL_ENV = "UPSERT_CONSENSUS_URL"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="spark_job", description="Run micro-batches of one shard.")
    parser.add_argument("--shard", required=True)
    parser.add_argument("--writer-id", required=True)
    parser.add_argument("--blob-root", required=True)
    parser.add_argument("--result-file", required=True, help="where the JSON result is written")
    parser.add_argument(
        "--consensus-url-file", default=None,
        help=f"file holding the consensus URL (default: the {CONSENSUS_URL_ENV} environment variable)",
    )
    parser.add_argument("--max-batches", type=int, default=1)
    parser.add_argument("--until-caught-up", action="store_true")
    parser.add_argument("--max-files-per-batch", type=int, default=None)
    parser.add_argument("--on-bad-record", choices=("fail", "quarantine"), default="fail")
    parser.add_argument(
        "--kafka-config-file", default=None,
        help="JSON file of the Kafka client config of a Kafka shard (written private by the submitting task)",
    )
    parser.add_argument(
        "--continuous-for", type=float, default=None, metavar="SECONDS",
        help="run batches back to back for this long (continuous mode); overrides --max-batches",
    )
    return parser


def _session_from_submit():
    """The session spark-submit configured (master, resources); the engine's defaults fill
    only what the submit left unset."""
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    from airflow_upsert_provider.engine.spark.session import DEFAULT_CONF

    submitted = SparkConf()
    builder = SparkSession.builder
    for key, value in DEFAULT_CONF.items():
        # The driver's memory is fixed once its JVM runs.
        if key != "spark.driver.memory" and not submitted.contains(key):
            builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("UPSERT_SPARK_LOG_LEVEL", "ERROR"))
    return spark


def consensus_url(path: str | None) -> str:
    """The consensus URL from ``path``, or from the environment when no path is given."""
    from airflow_upsert_provider.engine.errors import ConfigurationError

    if path is None:
        url = os.environ.get(CONSENSUS_URL_ENV, "")
        if not url:
            raise ConfigurationError(
                f"no --consensus-url-file and {CONSENSUS_URL_ENV} is not set in the driver's environment",
                field="consensus",
            )
        return url
    try:
        with open(path, encoding="utf-8") as handle:
            url = handle.read().strip()
    except OSError as exc:
        raise ConfigurationError(
            f"cannot read the consensus URL file {path}: {exc.strerror}", field="consensus"
        ) from None
    if not url:
        raise ConfigurationError(f"the consensus URL file {path} is empty", field="consensus")
    return url


def run(args: argparse.Namespace) -> dict[str, Any]:
    from airflow_upsert_provider.engine.blob.files import open_blob
    from airflow_upsert_provider.engine.store.registry import open_consensus
    from airflow_upsert_provider.engine.table.shard import Shard
    from airflow_upsert_provider.engine.write.writer import Writer

    consensus = open_consensus(consensus_url(args.consensus_url_file))
    blob = open_blob(args.blob_root)
    blob.check_root()
    kafka_config = None
    if args.kafka_config_file:
        from airflow_upsert_provider.engine.sources.kafka_options import load_kafka_config

        kafka_config = load_kafka_config(args.kafka_config_file)
    shard = Shard.open(consensus, blob, args.shard, kafka_config=kafka_config)
    spark_seconds: list[float] = []
    session: list[Any] = []

    def spark_factory():
        if not session:
            started = time.monotonic()
            session.append(_session_from_submit())
            spark_seconds.append(time.monotonic() - started)
        return session[0]

    writer = Writer(
        shard,
        args.writer_id,
        spark_factory=spark_factory,
        on_bad_record=args.on_bad_record,
        max_files_per_batch=args.max_files_per_batch,
    )
    try:
        if args.continuous_for is not None:
            from airflow_upsert_provider.engine.write.continuous import run_continuous

            report = run_continuous(writer, duration_seconds=args.continuous_for)
        else:
            report = writer.run(
                max_batches=None if args.until_caught_up else args.max_batches,
                until_caught_up=args.until_caught_up,
            )
    finally:
        consensus.dispose()
    return {**report.to_dict(), "spark_start_seconds": round(sum(spark_seconds), 3)}


def main(argv: Sequence[str] | None = None) -> int:
    from airflow_upsert_provider.engine.errors import UpsertError, first_line

    args = build_parser().parse_args(argv)
    started = time.monotonic()
    exit_code = 0
    try:
        result: dict[str, Any] = {"ok": True, **run(args)}
    except UpsertError as exc:
        exit_code = exc.exit_code
        result = {"ok": False, "exit_code": exc.exit_code, **exc.to_dict()}
    except Exception as exc:  # reported to the operator, which fails the task with it
        exit_code = 1
        result = {"ok": False, "exit_code": 1, "error": type(exc).__name__, "message": first_line(exc)}
    result["driver_seconds"] = round(time.monotonic() - started, 3)
    directory = os.path.dirname(os.path.abspath(args.result_file))
    os.makedirs(directory, exist_ok=True)
    write_atomically(args.result_file, json.dumps(result, default=str), durable=False)
    print(f"upsert spark_job: {'ok' if result['ok'] else result.get('error')} (exit {exit_code})", flush=True)
    return exit_code


if __name__ == "__main__":
    sys.exit(main())
