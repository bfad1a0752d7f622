"""Submit mode keeps the driver on loopback only where the driver runs on this machine's loopback.

``SPARK_LOCAL_IP=127.0.0.1`` binds the driver to loopback: right on a local master and on a
standalone cluster running on loopback, wrong on YARN, Kubernetes or a remote standalone
master, whose executors (and, on YARN, the application master, which gets it as
``spark.yarn.appMasterEnv.SPARK_LOCAL_IP``) must reach the driver over the network.

The recording ``spark-submit`` of ``test_submit_secrets`` keeps the argument list and the
environment the Spark provider really ran it with; no cluster is started.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
from airflow.sdk.exceptions import AirflowException

from airflow_upsert_provider.operators.upsert import MicroBatchUpsertOperator, driver_on_loopback, submit_env_vars
from airflow_upsert_provider.sample_data import SampleSpec, generate
from tests.airflow.conftest import init_shard
from tests.airflow.test_submit_secrets import TaskInstance, install_recorder

LOOPBACK_MASTERS = [
    "local", "local[1]", "local[*]", "local[2,3]", "local-cluster[2,1,1024]",
    "spark://127.0.0.1:7077", "spark://localhost:7077", "spark://127.0.0.1", "spark://[::1]:7077",
    "spark://127.0.0.1:7077,localhost:7078",
]
CLUSTER_MASTERS = [
    "yarn", "k8s://https://127.0.0.1:6443", "k8s://https://10.0.0.5:6443", "spark://10.0.0.5:7077",
    "spark://spark-master:7077", "spark://127.0.0.1:7077,10.0.0.6:7077", "spark://[2001:db8::1]:7077",
    "spark://127.0.0.10:7077", "mesos://127.0.0.1:5050",
]


def test_only_a_driver_on_loopback_gets_spark_local_ip():
    for master in LOOPBACK_MASTERS:
        assert driver_on_loopback(master), master
        env_vars = submit_env_vars(master)
        assert env_vars["SPARK_LOCAL_IP"] == os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"), master
        assert env_vars["PYSPARK_PYTHON"] == sys.executable
    for master in CLUSTER_MASTERS:
        assert not driver_on_loopback(master), master
        assert submit_env_vars(master) == {"PYSPARK_PYTHON": sys.executable}, master


# (Spark connection or None for none defined, master spark-submit gets, whether the driver is on loopback)
CONNECTIONS = {
    "yarn": ({"conn_type": "spark", "host": "yarn", "extra": {"queue": "etl"}}, "yarn", False),
    "no-connection": (None, "yarn", False),
    "kubernetes": ({"conn_type": "spark", "host": "k8s://https://10.0.0.5", "port": 6443},
                   "k8s://https://10.0.0.5:6443", False),
    "remote-standalone": ({"conn_type": "spark", "host": "spark://10.0.0.5", "port": 7077},
                          "spark://10.0.0.5:7077", False),
    "loopback-standalone": ({"conn_type": "spark", "host": "spark://127.0.0.1", "port": 7077},
                            "spark://127.0.0.1:7077", True),
}


@pytest.fixture(scope="module")
def sqlite_connection(tmp_path_factory) -> str:
    """An upsert connection to one sample shard on SQLite, made once: no test here runs a batch."""
    path = tmp_path_factory.mktemp("submit-loopback")
    landing = str(path / "landing")
    generate(landing, SampleSpec(records=40, keys=10, partitions=1, segments_per_partition=1, seed=3))
    url, blob = f"sqlite:///{path / 'consensus.db'}", str(path / "blob")
    init_shard(url, blob, landing)
    return json.dumps({"conn_type": "upsert", "extra": {"consensus_url": url, "blob_root": blob}})


@pytest.mark.parametrize("cluster", sorted(CONNECTIONS))
def test_spark_local_ip_reaches_spark_submit_only_where_the_driver_runs_on_loopback(
    cluster, sqlite_connection, tmp_path, monkeypatch
):
    connection, master, loopback = CONNECTIONS[cluster]
    monkeypatch.setenv("AIRFLOW_CONN_UPSERT_DEFAULT", sqlite_connection)
    if connection is None:
        monkeypatch.delenv("AIRFLOW_CONN_SPARK_DEFAULT", raising=False)
    else:
        monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps(connection))
    if cluster == "kubernetes":
        # The provider refuses k8s:// masters without the Kubernetes provider; only the
        # command line it builds matters here.
        from airflow.providers.apache.spark.hooks import spark_submit

        monkeypatch.setattr(spark_submit, "kube_client", object(), raising=False)
    record_file = install_recorder(tmp_path, monkeypatch)
    # Whatever spark-submit gets comes from the operator, not from this test's environment.
    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    operator = MicroBatchUpsertOperator(task_id="upsert", shard="orders", spark_mode="submit")
    with pytest.raises(AirflowException, match="the Spark job ended without a result"):
        operator.execute({"ti": TaskInstance()})
    record = json.loads(record_file.read_text())
    argv = record["argv"]
    assert argv[argv.index("--master") + 1] == master
    # Never a --conf argument: a standalone master gets the variables in the environment only.
    assert [arg for arg in argv if "SPARK_LOCAL_IP" in arg] == []
    if loopback:
        assert record["env"]["SPARK_LOCAL_IP"] == "127.0.0.1"
    else:
        assert "SPARK_LOCAL_IP" not in record["env"]
        if cluster in ("yarn", "no-connection"):
            # The provider does turn the other variables into application master settings.
            assert any(arg.startswith("spark.yarn.appMasterEnv.PYSPARK_PYTHON=") for arg in argv)
        elif cluster == "kubernetes":
            assert any(arg.startswith("spark.kubernetes.driverEnv.PYSPARK_PYTHON=") for arg in argv)
