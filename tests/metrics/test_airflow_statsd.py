"""Metrics from Airflow tasks through ``[metrics]``: a real `airflow dags test` of the
micro-batch example DAG with ``statsd_on`` (InfluxDB tags) pointed at a StatsD listener on
loopback sends its batches' metrics under Airflow's prefix; an operator run in process with
metrics off sends nothing, and with them on sends its outcome."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from airflow_upsert_provider.sample_data import SampleSpec, generate
from tests.airflow.conftest import airflow_home, failure_text, init_shard  # noqa: F401 - the fixture
from tests.metrics.statsd_listener import StatsdListener, parse_line

SPEC = SampleSpec(records=600, keys=150, partitions=2, segments_per_partition=2, seed=5)


def statsd_env(listener: StatsdListener, on: bool) -> dict[str, str]:
    return {"AIRFLOW__METRICS__STATSD_ON": str(on), "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
            "AIRFLOW__METRICS__STATSD_PORT": str(listener.port), "AIRFLOW__METRICS__STATSD_PREFIX": "airflow",
            "AIRFLOW__METRICS__STATSD_INFLUXDB_ENABLED": "True"}


@pytest.mark.slow
def test_a_dag_runs_batches_reach_statsd_with_airflows_prefix_and_tags(airflow_home, tmp_path, listener):  # noqa: F811
    landing = str(tmp_path / "landing")
    generate(landing, SPEC)
    url, blob = f"sqlite:///{tmp_path / 'consensus.db'}", str(tmp_path / "blob")
    init_shard(url, blob, landing, max_files_per_batch=2)
    home = airflow_home.clone(str(tmp_path / "home"))  # its own metadata database: no other test's events
    proc = home.dags_test("upsert_microbatch", home.env(url, blob, **statsd_env(listener, on=True)))
    assert proc.returncode == 0, failure_text(proc)
    report = home.xcom("upsert_microbatch", home.latest_run("upsert_microbatch"), "upsert")
    ours = [parse_line(line) for line in listener.drain("after-dag") if line.startswith("airflow.upsert.")]

    def values(name, **tags):
        return [v for n, t, v, _ in ours if n == f"airflow.upsert.{name}" and t == {"shard": "orders", **tags}]

    committed = [b for b in report["batches"] if b["outcome"] == "committed"]
    assert len(committed) == 2
    assert values("batch.outcome", outcome="committed") == [1.0, 1.0]
    assert values("batch.outcome", outcome="nothing_to_do") == [1.0]
    assert values("batch.rows_out") == [float(b["rows_out"]) for b in committed]
    assert values("batch.bytes_written") == [float(b["bytes_written"]) for b in committed]
    assert values("lag", unit="segments") == [float(b["lag"]) for b in report["batches"]]
    assert values("upper") == [1.0, 2.0, 2.0]
    assert values("live_runs") == [2.0]
    assert len(values("batch.duration", outcome="committed")) == 2


def test_an_operator_sends_nothing_with_metrics_off_and_its_outcome_with_them_on(sqlite_url, blob, tmp_path,
                                                                                  monkeypatch, listener):
    from airflow_upsert_provider import metrics
    from airflow_upsert_provider.engine.store.registry import open_consensus
    from airflow_upsert_provider.operators.maintenance import GarbageCollectOperator
    from airflow_upsert_provider.operators.upsert import MicroBatchUpsertOperator
    from tests.helpers import make_shard

    consensus = open_consensus(sqlite_url)
    make_shard(consensus, blob, tmp_path)  # an empty landing directory: nothing to do
    consensus.dispose()
    monkeypatch.setenv("AIRFLOW_CONN_UPSERT_DEFAULT", json.dumps(
        {"conn_type": "upsert", "extra": {"consensus_url": sqlite_url, "blob_root": blob.root}}))
    ti = SimpleNamespace(dag_id="d", run_id="r", task_id="t", map_index=-1, try_number=1)

    def run_tasks() -> list[tuple]:
        metrics.airflow_sink.cache_clear()  # a task process builds its sink once
        MicroBatchUpsertOperator(task_id="t", shard="orders").execute({"ti": ti})  # nothing to do: no Spark
        GarbageCollectOperator(task_id="gc", shard="orders", sweep=False).execute({})
        return [parse_line(line) for line in listener.drain(f"after-{len(ran)}") if "upsert." in line]

    ran: list[bool] = []
    for name, value in statsd_env(listener, on=False).items():
        monkeypatch.setenv(name, value)
    assert run_tasks() == []
    ran.append(True)
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_ON", "True")
    got = {(n, tuple(sorted(t.items()))) for n, t, _, _ in run_tasks()}
    assert ("airflow.upsert.batch.outcome", (("outcome", "nothing_to_do"), ("shard", "orders"))) in got
    assert ("airflow.upsert.gc.duration", (("shard", "orders"),)) in got
    assert ("airflow.upsert.live_runs", (("shard", "orders"),)) in got
    metrics.airflow_sink.cache_clear()
