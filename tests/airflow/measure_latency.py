"""Latency of one micro-batch task on the embedded defaults, per Spark mode: in-process,
submit (a standalone cluster on loopback) and connect (a local Spark Connect server).

``python -m tests.airflow.measure_latency [--repeat N] [--modes in_process,connect]`` (from
the repository root). Each
sample is one `airflow dags test upsert_microbatch` run whose task commits exactly one batch
of 8 segment files (20,000 records); the split comes from the task's XCom: Spark start,
the Spark job (read, parse and validate the segments, latest per key, bucket, sort, write
Parquet: one fused job), describe (list and checksum the written files), commit
(compare-and-append), and the rest of the task (shard open, binding, lag).

Connect mode runs against a server this script starts with ``upsertctl spark-server start
--state-dir`` (its own state directory under the work directory) and stops at the end; the
DAG reaches it through the upsert connection's Spark connection, of type ``spark_connect``.
The server is warmed by one unrecorded task first (a server starts once, then serves every
task); its start time is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime

from airflow_upsert_provider.sample_data import SampleSpec, generate
from tests.airflow.conftest import AirflowHome, home_env, init_shard, VENV_BIN
from tests.airflow.test_scale_out import StandaloneCluster
from tests.conftest import REPO_ROOT


def make_home(path: str) -> AirflowHome:
    os.makedirs(path, exist_ok=True)
    env = home_env(dict(os.environ), path)
    env.update(
        AIRFLOW__CORE__DAGS_FOLDER=os.path.join(REPO_ROOT, "dags"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        SPARK_LOCAL_IP="127.0.0.1",
        PYSPARK_PYTHON=sys.executable,
        PATH=VENV_BIN + os.pathsep + env.get("PATH", ""),
        PYTHONPATH=REPO_ROOT + os.pathsep + env.get("PYTHONPATH", ""),
    )
    home = AirflowHome(path, env)
    for step in (["db", "migrate"], ["dags", "reserialize"]):
        proc = home.run([os.path.join(VENV_BIN, "airflow"), *step], env)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return home


def sample(home: AirflowHome, work: str, name: str, mode: str, **spark: object) -> dict:
    landing = os.path.join(work, name, "landing")
    generate(landing, SampleSpec(records=20_000, keys=10_000, partitions=4, segments_per_partition=2))
    url, blob = f"sqlite:///{work}/{name}/consensus.db", os.path.join(work, name, "blob")
    init_shard(url, blob, landing, max_files_per_batch=64)
    started = time.monotonic()
    proc = home.dags_test("upsert_microbatch", home.env(url, blob, **spark), conf={"spark_mode": mode})
    wall = time.monotonic() - started
    assert proc.returncode == 0, proc.stdout[-4000:]
    run_id = home.latest_run("upsert_microbatch")
    report = home.xcom("upsert_microbatch", run_id, "upsert")
    start, end = home.query(
        "SELECT start_date, end_date FROM task_instance WHERE dag_id = 'upsert_microbatch' AND run_id = ?", run_id
    )[0]
    batch = report["batches"][0]
    assert batch["outcome"] == "committed" and report["committed"] == 1
    t = batch["timings"]
    row = {
        "mode": mode,
        "dags_test_wall": wall,
        "task_instance": (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds(),
        "task_execute": report["task_seconds"],
        "spark_start": report["spark_start_seconds"],
        "spark_job": t.get("spark_job", t.get("read", 0.0) + t.get("write", 0.0)),
        "describe": t.get("describe", 0.0),
        "commit": t["commit"],
    }
    if mode == "submit":
        row["spark_submit_process"] = report["submit_seconds"]
        row["driver"] = report["driver_seconds"]
    return row


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def spark_server(action: str, state_dir: str, *argv: str) -> dict:
    """``upsertctl spark-server ACTION --state-dir STATE_DIR ... --json``: its JSON output."""
    proc = subprocess.run(
        [os.path.join(VENV_BIN, "upsertctl"), "spark-server", action, "--state-dir", state_dir, *argv, "--json"],
        env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1"), text=True, capture_output=True, timeout=300,
    )
    assert proc.returncode == 0, f"spark-server {action} failed: {proc.stderr[-2000:]}"
    return json.loads(proc.stdout)


def connect_conn(port: int) -> dict[str, str]:
    """The environment naming the server as the upsert connection's Spark connection."""
    return {"AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark_connect", "host": "127.0.0.1",
                                                      "port": port})}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--master", default="local[2]", help="the in-process Spark master")
    parser.add_argument("--modes", default="in_process,submit,connect", help="comma-separated Spark modes")
    parser.add_argument("--server-memory", default="4g", help="driver memory of the Spark Connect server")
    args = parser.parse_args()
    modes = args.modes.split(",")
    work = tempfile.mkdtemp(prefix="upsert-latency-")
    cluster = None
    server_state = None
    rows = []
    try:
        home = make_home(os.path.join(work, "home"))
        if "in_process" in modes:
            rows += [sample(home, work, f"local{i}", "in_process", spark_master=args.master)
                     for i in range(args.repeat)]
        if "submit" in modes:
            cluster = StandaloneCluster(os.path.join(work, "cluster")).start()
            rows += [
                sample(home, work, f"submit{i}", "submit", spark_master="spark://127.0.0.1", spark_port=cluster.port)
                for i in range(args.repeat)
            ]
        if "connect" in modes:
            server_state = os.path.join(work, "state")
            port = free_port()
            started = time.monotonic()
            status = spark_server("start", server_state, "--port", str(port), "--memory", args.server_memory)
            print(json.dumps({"spark_server_start": round(time.monotonic() - started, 2),
                              "address": status["address"], "driver_memory": status["driver_memory"]}))
            warm = sample(home, work, "connect_warmup", "connect", **connect_conn(port))
            print(json.dumps({"warmup": {k: round(v, 2) if isinstance(v, float) else v for k, v in warm.items()}}))
            rows += [sample(home, work, f"connect{i}", "connect", **connect_conn(port)) for i in range(args.repeat)]
    finally:
        if server_state is not None:
            spark_server("stop", server_state)
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    for row in rows:
        print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}))
    # Medians per mode: the figures of docs/performance.md's table.
    for mode in dict.fromkeys(row["mode"] for row in rows):
        samples = [row for row in rows if row["mode"] == mode]
        keys = [k for k in samples[0] if k != "mode"]
        print(json.dumps({"mode": mode, "median_of": len(samples),
                          **{k: round(statistics.median(row[k] for row in samples), 2) for k in keys}}))


if __name__ == "__main__":
    main()
