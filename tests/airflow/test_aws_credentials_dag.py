"""A real `airflow dags test` whose upsert connection names an `aws` connection (both from
AIRFLOW_CONN_* variables) reaches the S3 server, from the task and from the executors of its
local Spark session, while the machine's own credentials are refused; the connection's secret
and session token appear in no process's argv, no Spark setting, no query plan, no page of the
Spark UI's environment, no task log, no XCom and no error of a denied or unreachable store.

The task's Spark work runs what the engine's executors run (``filesystem_for`` on the blob
root, in a Python worker) and records, while the JVM and its Python workers are alive, the
argv of every process of the machine; the test asserts on that evidence.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.airflow.conftest import failure_text
from tests.conftest import AWS_VARIABLES
from tests.pgserver import free_port

pytestmark = pytest.mark.slow

DAG_ID = "aws_credentials_probe"

DAG = '''
import contextlib
import io
import json
import os
import urllib.request

import pendulum
from airflow.sdk import dag, task

from airflow_upsert_provider.operators.upsert import MicroBatchUpsertOperator


@dag(dag_id="aws_credentials_probe", schedule=None, start_date=pendulum.datetime(2024, 1, 1), catchup=False)
def probe():
    @task
    def reach():
        from airflow_upsert_provider.hooks.upsert import UpsertShardHook

        def argv_of_every_process():
            found = {}
            for pid in os.listdir("/proc"):
                if pid.isdigit():
                    try:
                        with open(f"/proc/{pid}/cmdline", "rb") as handle:
                            found[pid] = handle.read().replace(b"\\0", b" ").decode("utf-8", "replace")
                    except OSError:
                        pass
            return found

        hook = UpsertShardHook()
        try:
            blob = hook.get_blob(create=True)
            blob.write_file(blob.path("marker"), b"written-by-the-task", sync=True)
            marker = blob.path("marker")
            spark = hook.get_spark(conf={"spark.ui.enabled": "true", "spark.ui.port": os.environ["PROBE_UI_PORT"]})

            def on_executor(batches):
                import pyarrow as pa

                from airflow_upsert_provider.engine.blob.filesystems import filesystem_for

                for _ in batches:
                    filesystem, path = filesystem_for(marker)
                    with filesystem.open_input_stream(path) as stream:
                        data = stream.read().decode()
                    yield pa.RecordBatch.from_pylist([{
                        "data": data, "pid": os.getpid(), "argv": json.dumps(argv_of_every_process())}])

            frame = spark.range(1, numPartitions=1).mapInArrow(on_executor, "data string, pid long, argv string")
            plan = io.StringIO()
            with contextlib.redirect_stdout(plan):
                frame.explain(mode="extended")
            rows = frame.collect()
            ui = os.environ["PROBE_UI_PORT"]
            with urllib.request.urlopen(f"http://127.0.0.1:{ui}/environment/", timeout=60) as page:
                environment_page = page.read().decode("utf-8", "replace")
            app = spark.sparkContext.applicationId
            with urllib.request.urlopen(f"http://127.0.0.1:{ui}/api/v1/applications/{app}/environment",
                                        timeout=60) as page:
                environment_api = page.read().decode("utf-8", "replace")
            evidence = {
                "executor": [{"data": r["data"], "pid": r["pid"], "argv": json.loads(r["argv"])} for r in rows],
                "driver_pid": os.getpid(),
                "conf": spark.sparkContext.getConf().getAll(),
                "plan": plan.getvalue(),
                "environment_page": environment_page,
                "environment_api": environment_api,
            }
            with open(os.environ["PROBE_EVIDENCE"], "w") as handle:
                json.dump(evidence, handle)
            spark.stop()
            return {"marker": rows[0]["data"], "executors": len(rows)}
        finally:
            hook.close()

    reach()
    # The operator itself, on stores it cannot use: a denied identity, an endpoint where
    # nothing listens. Both fail before any Spark starts.
    MicroBatchUpsertOperator(task_id="denied", shard="orders", upsert_conn_id="upsert_denied", retries=0)
    MicroBatchUpsertOperator(task_id="nowhere", shard="orders", upsert_conn_id="upsert_nowhere", retries=0)


probe()
'''


def upsert_connection(consensus_url: str, blob_root: str, aws_conn_id: str) -> str:
    return json.dumps({"conn_type": "upsert", "extra": {
        "consensus_url": consensus_url, "blob_root": blob_root, "aws_conn_id": aws_conn_id}})


def aws_connection(key: str, secret: str, token: str | None, endpoint: str) -> str:
    extra = {"endpoint_url": endpoint, "region_name": "us-east-1"}
    if token:
        extra["aws_session_token"] = token
    return json.dumps({"conn_type": "aws", "login": key, "password": secret, "extra": extra})


def test_a_task_reaches_s3_with_the_aws_connection_and_its_secret_shows_nowhere(
        airflow_home, s3_server, s3_root, tmp_path):
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "aws_credentials_probe.py").write_text(DAG)
    machine_key, machine_secret = s3_server.denied_credentials()
    key, secret, token = s3_server.role_credentials()
    denied_key, denied_secret = s3_server.denied_credentials()
    nowhere_key, nowhere_secret, nowhere_token = s3_server.role_credentials()
    secrets = {"secret": secret, "token": token, "denied secret": denied_secret,
               "unreachable secret": nowhere_secret, "unreachable token": nowhere_token}
    nowhere = f"http://127.0.0.1:{free_port()}"
    consensus_url = f"sqlite:///{tmp_path / 'consensus.db'}"
    evidence_file = tmp_path / "evidence.json"

    env = airflow_home.env(consensus_url, s3_root, AIRFLOW__CORE__DAGS_FOLDER=str(dags))
    for name in AWS_VARIABLES:
        env.pop(name, None)
    env.update(
        # The machine's own chain: an identity the server refuses, and an endpoint on loopback
        # where nothing listens (the server is reached only through the connections').
        AWS_ACCESS_KEY_ID=machine_key, AWS_SECRET_ACCESS_KEY=machine_secret, AWS_REGION="us-east-1",
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{free_port()}",
        AWS_CONFIG_FILE=str(tmp_path / "aws-config-absent"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "aws-credentials-absent"),
        AWS_EC2_METADATA_DISABLED="true", AWS_MAX_ATTEMPTS="2",
        AIRFLOW_CONN_UPSERT_DEFAULT=upsert_connection(consensus_url, s3_root, "aws_lake"),
        AIRFLOW_CONN_AWS_LAKE=aws_connection(key, secret, token, s3_server.endpoint),
        AIRFLOW_CONN_UPSERT_DENIED=upsert_connection(consensus_url, s3_root, "aws_denied"),
        AIRFLOW_CONN_AWS_DENIED=aws_connection(denied_key, denied_secret, None, s3_server.endpoint),
        AIRFLOW_CONN_UPSERT_NOWHERE=upsert_connection(consensus_url, s3_root, "aws_nowhere"),
        AIRFLOW_CONN_AWS_NOWHERE=aws_connection(nowhere_key, nowhere_secret, nowhere_token, nowhere),
        PROBE_UI_PORT=str(free_port()), PROBE_EVIDENCE=str(evidence_file),
    )
    s3_server.checking_access(True)
    try:
        proc = airflow_home.dags_test(DAG_ID, env)
    finally:
        s3_server.checking_access(False)
    run_id = airflow_home.latest_run(DAG_ID)
    assert airflow_home.task_instance(DAG_ID, run_id, "reach")[0] == "success", failure_text(proc)

    # Reached: the task wrote through the connection's credentials, an executor read it back.
    bucket = s3_root.split("/")[2]
    assert "shards/marker" in s3_server.keys(bucket, "shards/")
    assert airflow_home.xcom(DAG_ID, run_id, "reach") == {"marker": "written-by-the-task", "executors": 1}
    evidence = json.loads(evidence_file.read_text())
    assert [e["data"] for e in evidence["executor"]] == ["written-by-the-task"]
    assert evidence["executor"][0]["pid"] != evidence["driver_pid"]  # a Python worker, not the driver

    # argv of every process while the JVM and its Python workers ran: they were seen, without it.
    argv = evidence["executor"][0]["argv"]
    assert any("org.apache.spark.deploy.SparkSubmit" in line for line in argv.values()), "no driver JVM seen"
    assert any("pyspark.daemon" in line or "pyspark.worker" in line for line in argv.values()), "no worker seen"
    assert str(evidence["executor"][0]["pid"]) in argv

    places = {
        "argv of a process": json.dumps(argv),
        "Spark settings": json.dumps(evidence["conf"]),
        "query plan": evidence["plan"],
        "Spark UI environment page": evidence["environment_page"],
        "Spark UI environment API": evidence["environment_api"],
        "task log and output": proc.stdout + proc.stderr + logs_of(airflow_home.path, DAG_ID),
        "XCom": json.dumps(airflow_home.query("SELECT task_id, value FROM xcom WHERE dag_id = ? AND run_id = ?",
                                              DAG_ID, run_id), default=str),
    }
    # The places were really captured.
    assert "mapInArrow" in places["query plan"] or "MapInArrow" in places["query plan"], places["query plan"]
    assert "Spark Properties" in places["Spark UI environment page"]
    assert "sparkProperties" in places["Spark UI environment API"]
    assert "written-by-the-task" in places["XCom"]
    assert "credentials of the aws connection 'aws_lake'" in places["task log and output"]
    for place, text in places.items():
        for what, value in secrets.items():
            assert value not in text, f"the {what} appears in the {place}"

    # The operator's errors on a denied identity and an unreachable endpoint: named, no secret.
    for task_id in ("denied", "nowhere"):
        assert airflow_home.task_instance(DAG_ID, run_id, task_id)[0] == "failed", failure_text(proc)
    output = places["task log and output"]
    assert "access denied" in output and f"prefix 'shards', endpoint {s3_server.endpoint}" in output
    assert "nothing answered at the endpoint" in output and nowhere in output


def logs_of(home: str, dag_id: str) -> str:
    """Every task log file Airflow wrote for the DAG under its home."""
    texts = []
    for root, _, files in os.walk(os.path.join(home, "logs")):
        if f"dag_id={dag_id}" in root:
            for name in files:
                with open(os.path.join(root, name), encoding="utf-8", errors="replace") as handle:
                    texts.append(handle.read())
    return "\n".join(texts)
