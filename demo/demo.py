"""`make demo`: the Airflow experience end to end on the embedded defaults.

Sets up a temporary Airflow home (.demo/airflow), the `upsert_default` and `spark_default`
connections, sample change data (200k records over 50k keys, with deletes, in 4 partitions)
and the shard; runs the example DAG `upsert_microbatch` with `airflow dags test` and keeps its
task log in the Airflow home's logs folder, where the UI reads it; prints the shard's status,
a few rows and where to look. Then more changes land and two writers run on
the same shard at once: both converge (one commits each batch, the other reports
`already_persisted`).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)

from airflow_upsert_provider.engine.config import DEFAULT_BUCKETS  # noqa: E402
from airflow_upsert_provider.engine.sources.lag import format_lag  # noqa: E402
from airflow_upsert_provider.sample_data import (  # noqa: E402
    SAMPLE_DELETE_MARKER,
    SAMPLE_KEYS,
    SAMPLE_ORDER_BY,
    SAMPLE_SCHEMA_DDL,
    SampleSpec,
    generate,
)
from task_logs import save_task_logs  # noqa: E402  (beside this script)

WORK = os.path.join(REPO, ".demo")
AIRFLOW_HOME = os.path.join(WORK, "airflow")
LANDING = os.path.join(WORK, "landing")
CONSENSUS_URL = f"sqlite:///{WORK}/upsert/consensus.db"
BLOB_ROOT = os.path.join(WORK, "upsert", "blob")
SHARD = "orders"
# Source files per batch of the demo's shard (and of new shards on its connection).
MAX_FILES_PER_BATCH = 8
LOG_FOLDER = os.path.join(AIRFLOW_HOME, "logs")
# Every field of the `upsert` connection form, so that editing the connection in the UI shows
# them all filled in.
UPSERT_CONNECTION_EXTRA = {
    "consensus_url": CONSENSUS_URL,
    "blob_root": BLOB_ROOT,
    "spark_conn_id": "spark_default",
    "default_buckets": DEFAULT_BUCKETS,
    "default_max_files_per_batch": MAX_FILES_PER_BATCH,
    # Used only by shards that read a Kafka topic (the demo's shard reads a directory).
    "kafka_conn_id": "kafka_default",
    # Used only when blob_root is on S3 (the demo's is a local directory).
    "aws_conn_id": "aws_default",
}
BIN = os.path.dirname(sys.executable)

ENV = dict(
    os.environ,
    AIRFLOW_HOME=AIRFLOW_HOME,
    AIRFLOW__CORE__DAGS_FOLDER=os.path.join(REPO, "dags"),
    AIRFLOW__CORE__LOAD_EXAMPLES="False",
    AIRFLOW__DATABASE__LOAD_DEFAULT_CONNECTIONS="False",
    UPSERT_CONSENSUS_URL=CONSENSUS_URL,
    UPSERT_BLOB_ROOT=BLOB_ROOT,
    SPARK_LOCAL_IP="127.0.0.1",
    PYSPARK_PYTHON=sys.executable,
    PATH=BIN + os.pathsep + os.environ.get("PATH", ""),
)
for inherited in ("AIRFLOW_CONN_UPSERT_DEFAULT", "AIRFLOW_CONN_SPARK_DEFAULT"):
    ENV.pop(inherited, None)


def run(*args: str, capture: bool = False, quiet: bool = False) -> str:
    """Run a command of the venv, echoing it; exit the demo if it fails."""
    print(f"\n$ {' '.join(args)}", flush=True)
    proc = subprocess.run(
        [os.path.join(BIN, args[0]), *args[1:]], env=ENV, cwd=WORK, text=True,
        stdout=subprocess.PIPE if capture or quiet else None,
        stderr=subprocess.STDOUT if quiet else None,
    )
    if proc.returncode != 0:
        if quiet:
            print(proc.stdout[-4000:])
        sys.exit(f"{args[0]} {args[1]} failed with exit code {proc.returncode}")
    return proc.stdout or ""


def airflow_setup() -> None:
    print(f"Airflow home: {AIRFLOW_HOME}")
    run("airflow", "db", "migrate", quiet=True)
    run("airflow", "connections", "add", "upsert_default", "--conn-type", "upsert",
        "--conn-extra", json.dumps(UPSERT_CONNECTION_EXTRA), quiet=True)
    run("airflow", "connections", "add", "spark_default", "--conn-type", "spark", "--conn-host", "local[*]",
        quiet=True)
    run("airflow", "dags", "reserialize", quiet=True)


def task_report(dag_id: str, task_id: str) -> tuple[str, dict]:
    """The latest run's task state and the XCom it returned, from Airflow's metadata DB."""
    with sqlite3.connect(os.path.join(AIRFLOW_HOME, "airflow.db")) as db:
        run_id, = db.execute("SELECT run_id FROM dag_run WHERE dag_id = ? ORDER BY id DESC LIMIT 1",
                             (dag_id,)).fetchone()
        state, = db.execute("SELECT state FROM task_instance WHERE dag_id = ? AND run_id = ? AND task_id = ?",
                            (dag_id, run_id, task_id)).fetchone()
        value, = db.execute("SELECT value FROM xcom WHERE dag_id = ? AND run_id = ? AND task_id = ? "
                            "AND key = 'return_value'", (dag_id, run_id, task_id)).fetchone()
    return run_id, {"state": state, **json.loads(value)}


def main() -> None:
    started = time.monotonic()
    shutil.rmtree(WORK, ignore_errors=True)
    os.makedirs(WORK)
    airflow_setup()

    spec = SampleSpec(records=200_000, keys=50_000, partitions=4, segments_per_partition=8)
    print(f"\nGenerating {spec.records:,} change records over {spec.keys:,} keys "
          f"({spec.partitions} partitions x {spec.segments_per_partition} segments) in {LANDING}")
    generate(LANDING, spec)
    run("upsertctl", "--master", "local[2]", "init", SHARD, "--source", f"dir:{LANDING}",
        "--key", SAMPLE_KEYS[0], "--order-by", SAMPLE_ORDER_BY, "--delete-marker", SAMPLE_DELETE_MARKER,
        "--schema", SAMPLE_SCHEMA_DDL, "--max-files-per-batch", str(MAX_FILES_PER_BATCH), quiet=True)

    print("\nThe scheduled example DAG, one run end to end (Spark local[*], SQLite consensus):")
    output = run("airflow", "dags", "test", "upsert_microbatch", quiet=True)
    run_id, report = task_report("upsert_microbatch", "upsert")
    # `airflow dags test` prints task logs to the console only: keep them where the UI reads them.
    logs = save_task_logs(output, LOG_FOLDER, "upsert_microbatch", run_id)
    print(f"  run {run_id}: task `upsert` {report['state']}, writer {report['writer_id']}")
    for batch in report["batches"]:
        timings = ", ".join(f"{k} {v:.2f}s" for k, v in batch.get("timings", {}).items())
        print(f"  batch ts={batch['ts']} {batch['outcome']}: rows in {batch['rows_in']:,}, out "
              f"{batch['rows_out']:,}, rejected {batch['rejected']}, lag {format_lag(batch['lag'], batch['lag_unit'])}"
              f"{' (' + timings + ')' if timings else ''}")
    status = json.loads(run("upsertctl", "--master", "local[2]", "status", SHARD, "--json", capture=True))
    print(f"  shard {SHARD}: upper {status['upper']}, {status['rows']:,} rows, "
          f"lag {format_lag(status['source']['lag'], status['source']['lag_unit'])}")
    rows = run("upsertctl", "--master", "local[2]", "read", SHARD, capture=True).splitlines()
    print("  first rows of the table:")
    for line in rows[:5]:
        print("    " + line)

    print("\nMore changes land; two writers now run on the same shard at once. Every batch is")
    print("bound once, both compute it, one compare-and-append wins; the other reports")
    print("`already_persisted` and moves on. Nothing is written twice, nothing is lost.")
    generate(LANDING, SampleSpec(records=50_000, keys=50_000, partitions=4, segments_per_partition=4,
                                 first_seq=1000, seed=7))
    procs = [
        subprocess.Popen(
            [os.path.join(BIN, "upsertctl"), "--master", "local[1]", "run-batch", SHARD,
             "--until-caught-up", "--json", "--writer-id", f"demo-writer-{n}"],
            env=ENV, text=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )
        for n in (2, 3)
    ]
    for proc in procs:
        out, _ = proc.communicate()
        if proc.returncode != 0:
            sys.exit(f"a concurrent writer failed with exit code {proc.returncode}")
        writer = json.loads(out)
        outcomes = ", ".join(f"ts={b['ts']} {b['outcome']}" for b in writer["batches"])
        print(f"  {writer['writer_id']}: {outcomes}")
    status = json.loads(run("upsertctl", "status", SHARD, "--json", "--no-rows", capture=True))
    print(f"  upper {status['upper']}, lag {format_lag(status['source']['lag'], status['source']['lag_unit'])}")

    print(f"\nDone in {time.monotonic() - started:.0f}s. Where to look:")
    print(f"  export AIRFLOW_HOME={AIRFLOW_HOME} AIRFLOW__CORE__DAGS_FOLDER={ENV['AIRFLOW__CORE__DAGS_FOLDER']} \\")
    print("         AIRFLOW__CORE__LOAD_EXAMPLES=False SPARK_LOCAL_IP=127.0.0.1 \\")
    print(f"         UPSERT_CONSENSUS_URL={CONSENSUS_URL} UPSERT_BLOB_ROOT={BLOB_ROOT}")
    for path in logs:
        print(f"  task log (also in the UI): {os.path.relpath(path, REPO)}")
    print(f"  .venv/bin/upsertctl status {SHARD}          # frontier, lag, rows")
    print(f"  .venv/bin/upsertctl read {SHARD} | head     # the table")
    print("  .venv/bin/airflow tasks states-for-dag-run upsert_microbatch " + run_id)
    print("  .venv/bin/airflow dags test upsert_backfill --conf '{\"batch_size\": 64}'")
    print("  .venv/bin/airflow standalone                 # the UI: the nine example DAGs, this run and its log")


if __name__ == "__main__":
    main()
