"""What metrics and lineage add to one task, in a fresh process as Airflow runs it.

    .venv/bin/python bench/bench_observability.py --pairs 3 --airflow-pairs 2

Three measurements, each on and off in the same run, pairs interleaved (on, off, off, on, ...: the
first side alternates):

- ``cli``: ``upsertctl run-batch --max-batches 1`` (one 100-file batch by default) with
  ``--statsd`` pointed at a UDP listener of this process, against the same command without it.
- ``airflow``: the upsert operator's task through ``airflow dags test`` of a one-task DAG,
  with ``[metrics] statsd_on`` (InfluxDB tags, to the same listener) and ``[openlineage]``
  writing its events to a file transport, against both off (``statsd_on = False``,
  ``[openlineage] disabled = True``).
- ``in-process``: building and sending one batch's metrics (the engine's functions and the
  StatsD sink), repeated, the part of the above that is the provider's own code.

Every whole-process sample runs on a fresh copy of one prepared store (an initialised shard
and its landing files), so each sample does the same batch. The figures are whole-process
wall times; the difference of medians is what metrics and lineage add, beside the target
(under 5% of the task and under 50 ms).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from airflow_upsert_provider.sample_data import SAMPLE_SCHEMA_DDL, SampleSpec, generate  # noqa: E402

VENV_BIN = os.path.dirname(sys.executable)
DAG = '''
from datetime import datetime
from airflow.sdk import DAG
from airflow_upsert_provider.operators.upsert import MicroBatchUpsertOperator

with DAG(dag_id="bench_observability", schedule=None, start_date=datetime(2026, 1, 1), catchup=False):
    MicroBatchUpsertOperator(task_id="upsert", shard="orders", max_batches=1)
'''


class Listener:
    """A StatsD server on loopback that counts the lines it gets."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.lines = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                data = self.sock.recv(65535)
            except OSError:
                return
            self.lines += len([line for line in data.split(b"\n") if line])


def timed(argv: list[str], env: dict[str, str], cwd: str | None = None, cpu: list[float] | None = None) -> float:
    """The wall seconds of ``argv`` from start to exit; its CPU seconds (user + system of it and
    the processes it waited for: the Python side, not the JVM PySpark starts, which is not waited
    for) appended to ``cpu`` when given."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=1800)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if cpu is not None:
        cpu.append(after.ru_utime - used.ru_utime + after.ru_stime - used.ru_stime)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:6])} ... exited {done.returncode}:\n{done.stdout[-2000:]}\n"
                         f"{done.stderr[-2000:]}")
    return elapsed


def prepare(work: str, files: int) -> str:
    """A store with the shard ``orders`` initialised on ``files`` landing files (no Spark)."""
    template = os.path.join(work, "template")
    landing = os.path.join(template, "landing")
    generate(landing, SampleSpec(records=files * 1000, keys=files * 500, partitions=2,
                                 segments_per_partition=files // 2, seed=37))
    env = dict(os.environ, PYTHONPATH=REPO)
    timed([os.path.join(VENV_BIN, "upsertctl"), "--consensus", f"sqlite:///{template}/consensus.db",
           "--blob-root", f"{template}/blob", "init", "orders", "--source", f"dir:{landing}", "--key", "id",
           "--order-by", "updated_at", "--delete-marker", "deleted", "--schema", SAMPLE_SCHEMA_DDL,
           "--max-files-per-batch", str(files)], env)
    return template


def fresh_store(template: str, at: str) -> str:
    """A copy of the prepared store at ``at`` (the landing path inside the shard's config is
    the template's, which no run changes)."""
    shutil.rmtree(at, ignore_errors=True)
    shutil.copytree(template, at, ignore=shutil.ignore_patterns("landing"))
    return at


def sides(pair: int, on: list[float], off: list[float]) -> tuple[tuple[bool, list[float]], ...]:
    """The two sides of pair ``pair``, the first side alternating (on first in even pairs, off
    first in odd ones), so that whatever favours the first or second run of a pair favours both."""
    order = ((True, on), (False, off))
    return order if pair % 2 == 0 else order[::-1]


def summary(on: list[float], off: list[float], cpu: dict[bool, list[float]]) -> dict:
    """Wall figures of the on and off samples, and their CPU seconds (``cpu[True]``, ``cpu[False]``):
    the pairs' CPU ratios hold better than wall times on a machine whose load drifts."""
    on_med, off_med = statistics.median(on), statistics.median(off)
    added = on_med - off_med
    cpu_on, cpu_off = statistics.median(cpu[True]), statistics.median(cpu[False])
    cpu_ratios = sorted(a / b for a, b in zip(cpu[True], cpu[False]))
    return {"on": [round(x, 3) for x in on], "off": [round(x, 3) for x in off], "on_median": round(on_med, 3),
            "off_median": round(off_med, 3), "added_seconds": round(added, 3),
            "added_percent": round(100 * added / off_med, 2),
            "cpu_on": [round(x, 3) for x in cpu[True]], "cpu_off": [round(x, 3) for x in cpu[False]],
            "cpu_on_median": round(cpu_on, 3), "cpu_off_median": round(cpu_off, 3),
            "cpu_added_seconds": round(cpu_on - cpu_off, 3),
            "cpu_pair_ratio_median": round(statistics.median(cpu_ratios), 4),
            "cpu_pair_ratio_range": [round(cpu_ratios[0], 4), round(cpu_ratios[-1], 4)],
            "target_met": added < 0.05 and added < 0.05 * off_med}


def bench_cli(template: str, work: str, pairs: int, listener: Listener) -> dict:
    base = dict(os.environ, PYTHONPATH=REPO, SPARK_LOCAL_IP="127.0.0.1", UPSERT_SPARK_MASTER="local[1]")
    base.pop("UPSERT_STATSD", None)
    on, off = [], []
    cpu: dict[bool, list[float]] = {True: [], False: []}
    for pair in range(pairs):
        for metrics_on, samples in sides(pair, on, off):
            store = fresh_store(template, os.path.join(work, "cli"))
            argv = [os.path.join(VENV_BIN, "upsertctl"), "--consensus", f"sqlite:///{store}/consensus.db",
                    "--blob-root", f"{store}/blob", "run-batch", "orders", "--max-batches", "1", "--json"]
            if metrics_on:
                argv[1:1] = ["--statsd", f"127.0.0.1:{listener.port}"]
            before = listener.lines
            samples.append(timed(argv, base, cpu=cpu[metrics_on]))
            time.sleep(0.2)  # let the listener read what the process sent (UDP), for the count below
            sent = listener.lines - before
            if metrics_on != (sent > 0):
                raise SystemExit(f"cli: metrics {'on' if metrics_on else 'off'} sent {sent} lines")
    return summary(on, off, cpu)


def bench_airflow(template: str, work: str, pairs: int, listener: Listener) -> dict:
    home = os.path.join(work, "airflow-home")
    dags = os.path.join(home, "dags")
    os.makedirs(dags, exist_ok=True)
    with open(os.path.join(dags, "bench_observability.py"), "w") as f:
        f.write(DAG)
    store = os.path.join(work, "airflow-store")
    base = dict(os.environ, PYTHONPATH=REPO, AIRFLOW_HOME=home, AIRFLOW__CORE__DAGS_FOLDER=dags,
                AIRFLOW__CORE__LOAD_EXAMPLES="False", AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home}/airflow.db",
                SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
                PATH=VENV_BIN + os.pathsep + os.environ.get("PATH", ""),
                AIRFLOW_CONN_UPSERT_DEFAULT=json.dumps({"conn_type": "upsert", "extra": {
                    "consensus_url": f"sqlite:///{store}/consensus.db", "blob_root": f"{store}/blob"}}),
                AIRFLOW_CONN_SPARK_DEFAULT=json.dumps({"conn_type": "spark", "host": "local[1]"}),
                AIRFLOW__METRICS__STATSD_HOST="127.0.0.1", AIRFLOW__METRICS__STATSD_PORT=str(listener.port),
                AIRFLOW__METRICS__STATSD_INFLUXDB_ENABLED="True")
    for step in (["db", "migrate"], ["dags", "reserialize"]):
        timed([os.path.join(VENV_BIN, "airflow"), *step], base, cwd=home)
    lineage_file = os.path.join(work, "openlineage.jsonl")
    settings = {
        True: {"AIRFLOW__METRICS__STATSD_ON": "True", "AIRFLOW__OPENLINEAGE__DISABLED": "False",
               "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps({"type": "file", "log_file_path": lineage_file,
                                                              "append": True})},
        False: {"AIRFLOW__METRICS__STATSD_ON": "False", "AIRFLOW__OPENLINEAGE__DISABLED": "True"},
    }
    on, off = [], []
    cpu: dict[bool, list[float]] = {True: [], False: []}
    for pair in range(pairs):
        for observed, samples in sides(pair, on, off):
            fresh_store(template, store)
            before = listener.lines
            samples.append(timed([os.path.join(VENV_BIN, "airflow"), "dags", "test", "bench_observability"],
                                 dict(base, **settings[observed]), cwd=home, cpu=cpu[observed]))
            time.sleep(0.2)  # as above
            upsert_lines = listener.lines - before
            if observed != (upsert_lines > 0):
                raise SystemExit(f"airflow: observed={observed} sent {upsert_lines} lines")
    out = summary(on, off, cpu)
    out["lineage_events"] = sum(1 for _ in open(lineage_file)) if os.path.exists(lineage_file) else 0
    return out


def bench_in_process(repeat: int, listener: Listener) -> dict:
    from airflow_upsert_provider.cli.metrics import StatsdSink
    from airflow_upsert_provider.engine.common.metrics import batch_metrics, live_runs_metrics, send_quietly

    result = {"ts": 4, "outcome": "committed", "rows_in": 100000, "rows_out": 90000, "rejected": 0,
              "bytes_written": 4_000_000, "seconds": 8.2, "upper": 5, "lag": 3, "lag_unit": "segments",
              "lag_seconds": 42.0}
    started = time.perf_counter()
    sink = StatsdSink("127.0.0.1", listener.port)
    first = time.perf_counter() - started
    samples = []
    for _ in range(repeat):
        t = time.perf_counter()
        send_quietly(sink, [*batch_metrics("orders", result), *live_runs_metrics("orders", 12)])
        samples.append(time.perf_counter() - t)
    return {"sink_build_seconds": round(first, 6), "per_batch_median_seconds": round(statistics.median(samples), 6),
            "per_batch_max_seconds": round(max(samples), 6), "repeat": repeat}


LINEAGE_PROBE = '''
import json, sys, time
from airflow_upsert_provider.hooks.upsert import UpsertShardHook
hook = UpsertShardHook()
shard = hook.open_shard("orders")
result = {"batches": [{"ts": 0, "outcome": "committed", "rows_out": 9000, "bytes_written": 400000}],
          "schema_version": 1}
started = time.perf_counter()
# What the OpenLineage provider's listener has imported in every task process where lineage is on,
# before the operator's lineage is asked for: Airflow's, not the provider's.
import openlineage.client.event_v2, openlineage.client.facet_v2, airflow.providers.openlineage.extractors
client_import = time.perf_counter() - started
started = time.perf_counter()
from airflow_upsert_provider import lineage
from airflow_upsert_provider.lineage.rules import Captured, UPSERT
enabled = lineage.lineage_enabled()
facts = lineage.shard_facts(hook, shard)
built = lineage.operator_lineage(Captured(UPSERT, facts, result))
first = time.perf_counter() - started
samples = []
for _ in range(int(sys.argv[1])):
    started = time.perf_counter()
    lineage.operator_lineage(Captured(UPSERT, lineage.shard_facts(hook, shard), result))
    samples.append(time.perf_counter() - started)
samples.sort()
assert enabled and built.outputs, "lineage was not built"
print(json.dumps({"client_import_seconds": client_import, "first_seconds": first,
                  "repeat_median_seconds": samples[len(samples) // 2], "repeat": len(samples)}))
'''


def bench_lineage_in_process(template: str, work: str, repeat: int) -> dict:
    """What the provider's own lineage code costs in a fresh process, as the upsert task runs it
    after its batches: the shard's facts read from the store (its frontier and stream status) and
    the facets built, the first time (its own imports included) and again; beside it, the imports
    of the OpenLineage client and extractors that Airflow's listener makes whenever lineage is on
    (whether this provider reports lineage or not)."""
    store = fresh_store(template, os.path.join(work, "lineage-store"))
    env = dict(os.environ, PYTHONPATH=REPO, AIRFLOW__OPENLINEAGE__TRANSPORT=json.dumps({"type": "console"}),
               AIRFLOW_CONN_UPSERT_DEFAULT=json.dumps({"conn_type": "upsert", "extra": {
                   "consensus_url": f"sqlite:///{store}/consensus.db", "blob_root": f"{store}/blob"}}))
    done = subprocess.run([sys.executable, "-c", LINEAGE_PROBE, str(repeat)], env=env, capture_output=True,
                          text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"lineage probe exited {done.returncode}:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(name: str, figures: dict, as_json: bool) -> None:
    """One measurement's figures, printed as soon as it is done (a long run keeps what it measured)."""
    if as_json:
        print(json.dumps({name: figures}), flush=True)
    elif name == "lineage_in_process":
        print(f"lineage in a fresh process: the shard's facts read and the facets built in "
              f"{figures['first_seconds'] * 1000:.1f} ms the first time (imports included), "
              f"{figures['repeat_median_seconds'] * 1000:.2f} ms again (median of {figures['repeat']}); "
              f"(Airflow's listener imports the OpenLineage client and extractors in "
              f"{figures['client_import_seconds'] * 1000:.0f} ms, whenever lineage is on)",
              flush=True)
    elif name == "in_process":
        print(f"in process: sink built in {figures['sink_build_seconds'] * 1000:.2f} ms; one batch's metrics built "
              f"and sent in {figures['per_batch_median_seconds'] * 1e6:.0f} us (median of {figures['repeat']}, max "
              f"{figures['per_batch_max_seconds'] * 1e6:.0f} us)", flush=True)
    else:
        print(f"{name}: on {figures['on_median']:.2f} s, off {figures['off_median']:.2f} s (medians; on {figures['on']}, "
              f"off {figures['off']}): added {figures['added_seconds'] * 1000:+.0f} ms "
              f"({figures['added_percent']:+.1f}%); target {'met' if figures['target_met'] else 'missed'}; CPU on "
              f"{figures['cpu_on_median']:.2f} s, off {figures['cpu_off_median']:.2f} s, pair ratio "
              f"{figures['cpu_pair_ratio_median']:.3f} ({figures['cpu_pair_ratio_range'][0]:.3f}-"
              f"{figures['cpu_pair_ratio_range'][1]:.3f}); "
              f"load average {os.getloadavg()}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3, help="on/off pairs of the upsertctl batch (0: skip)")
    parser.add_argument("--airflow-pairs", type=int, default=2, help="on/off pairs of the Airflow task (0: skip)")
    parser.add_argument("--files", type=int, default=20, help="landing files of the one batch")
    parser.add_argument("--json", action="store_true", help="one JSON object per measurement, as each is done")
    args = parser.parse_args()
    listener = Listener()
    work = tempfile.mkdtemp(prefix="bench-observability-")
    try:
        report("in_process", bench_in_process(1000, listener), args.json)
        template = prepare(work, args.files)
        report("lineage_in_process", bench_lineage_in_process(template, work, 100), args.json)
        if args.pairs:
            report("cli", bench_cli(template, work, args.pairs, listener), args.json)
        if args.airflow_pairs:
            report("airflow", bench_airflow(template, work, args.airflow_pairs, listener), args.json)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
