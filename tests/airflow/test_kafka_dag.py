"""`airflow dags test upsert_kafka`: the example DAG reads a topic through a `kafka`
connection for a short window; the table equals the oracle, the consumer group holds the
shard's frontier, and the connection's password reaches neither the task output nor XCom."""

from __future__ import annotations

import json

from airflow_upsert_provider.engine.blob import open_blob
from airflow_upsert_provider.engine.consensus import open_consensus
from airflow_upsert_provider.engine.group_offsets import group_status
from airflow_upsert_provider.engine.shard import Shard
from tests.kafka.conftest import kafka_bootstrap, kafka_topic  # noqa: F401 - fixtures
from tests.kafka.test_continuous import SECRET, Changes, client_config, kafka_shard, table


def test_the_kafka_example_dag_upserts_a_window_of_a_topic(airflow_home, spark, tmp_path, kafka_bootstrap, kafka_topic):  # noqa: F811
    url = f"sqlite:///{tmp_path / 'c.db'}"
    consensus = open_consensus(url)
    blob = open_blob(str(tmp_path / "blob"))
    blob.ensure_root()
    changes = Changes(kafka_bootstrap, kafka_topic)
    changes.produce(120)
    kafka_shard(consensus, blob, kafka_topic, kafka_bootstrap, max_records=50, shard_id="orders_cdc")
    kafka = {"conn_type": "kafka", "extra": dict(client_config(kafka_bootstrap).properties)}
    env = airflow_home.env(url, blob.root, AIRFLOW_CONN_KAFKA_DEFAULT=json.dumps(kafka))

    # A window long enough for three batches on a cold JVM; it then idles until it ends.
    proc = airflow_home.dags_test("upsert_kafka", env, conf={"window": "40s"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_id = airflow_home.latest_run("upsert_kafka")
    report = airflow_home.xcom("upsert_kafka", run_id, "upsert")
    assert report["upper"] == 3 and report["committed"] == 3
    assert SECRET not in proc.stdout + proc.stderr + json.dumps(report)

    shard = Shard.open(consensus, blob, "orders_cdc", kafka_config=client_config(kafka_bootstrap))
    assert table(shard, spark) == changes.oracle()
    group = group_status(shard)
    assert group["committed"] == shard.bound_offsets(3) and group["alert"] is False
