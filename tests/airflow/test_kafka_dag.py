"""`airflow dags test upsert_kafka`: the example DAG reads a topic through a `kafka`
connection for a window; the table equals the oracle, the consumer group holds the shard's
frontier, and the connection's password reaches neither the task output nor XCom.

How many batches a fixed window holds depends on the machine's speed, so the window is long
and the test ends it the way an operator would, with a stream stop, once the shard holds every
batch the topic makes (counted in consensus, not timed).
"""

from __future__ import annotations

import json
import subprocess

import pytest

from airflow_upsert_provider.engine.store import streams
from airflow_upsert_provider.engine.blob.files import open_blob
from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.engine.lifecycle.group_offsets import group_status
from airflow_upsert_provider.engine.table.shard import Shard
from tests.kafka.conftest import kafka_bootstrap, kafka_topic  # noqa: F401 - fixtures
from tests.helpers import table
from tests.kafka.test_continuous import SECRET, Changes, client_config, kafka_shard
from tests.pgserver import wait_for

pytestmark = pytest.mark.long_process


def test_the_kafka_example_dag_upserts_a_window_of_a_topic(airflow_home, tmp_path, kafka_bootstrap, kafka_topic):  # noqa: F811
    url = f"sqlite:///{tmp_path / 'c.db'}"
    consensus = open_consensus(url)
    blob = open_blob(str(tmp_path / "blob"))
    blob.ensure_root()
    changes = Changes(kafka_bootstrap, kafka_topic)
    changes.produce(120)
    kafka_shard(consensus, blob, kafka_topic, kafka_bootstrap, max_records=50, shard_id="orders_cdc")
    shard = Shard.open(consensus, blob, "orders_cdc", kafka_config=client_config(kafka_bootstrap))
    kafka = {"conn_type": "kafka", "extra": dict(client_config(kafka_bootstrap).properties)}
    env = airflow_home.env(url, blob.root, AIRFLOW_CONN_KAFKA_DEFAULT=json.dumps(kafka))

    # 120 records at <= 50 a batch: three batches, then the window idles until it is stopped.
    # The window (shorter than the task's 15 min execution timeout) only bounds a broken run.
    output = tmp_path / "dags-test.out"
    with open(output, "w") as sink:
        proc = subprocess.Popen(airflow_home.dags_test_cmd("upsert_kafka", conf={"window": "12m"}), env=env,
                                cwd=airflow_home.path, text=True, stdout=sink, stderr=subprocess.STDOUT)
        try:
            assert wait_for(lambda: shard.state().upper >= 3 or proc.poll() is not None, timeout=600, interval=0.5)
            assert proc.poll() is None, "the window ended before the shard held three batches"
            assert streams.stop(consensus, "orders_cdc", "test", "the topic is consumed").changed
            proc.wait(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = output.read_text()
    assert proc.returncode == 0, text[-6000:]
    run_id = airflow_home.latest_run("upsert_kafka")
    report = airflow_home.xcom("upsert_kafka", run_id, "upsert")
    assert report["upper"] == 3 and report["committed"] == 3
    assert "STOPPING" in report["stopped_because"]  # the stop ended the window, not its length
    assert SECRET not in text + json.dumps(report)

    assert table(shard) == changes.oracle()
    group = group_status(shard)
    assert group["committed"] == shard.bound_offsets(3) and group["alert"] is False
