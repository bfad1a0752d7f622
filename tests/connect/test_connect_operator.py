"""MicroBatchUpsertOperator in ``spark_mode="connect"``: the address comes from a
``spark_connect`` connection through the Spark provider's SparkConnectHook, a server that is
down fails the try with a retryable error naming the address (never the token), and on_kill
interrupts the task's Connect operations."""

from __future__ import annotations

import json
import threading
import time

import pytest
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_upsert_provider.engine.blob.files import open_blob
from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.operators.upsert import MicroBatchUpsertOperator
from airflow_upsert_provider.sample_data import SampleSpec
from tests.connect.conftest import free_port
from tests.helpers import make_shard
from tests.oracle import oracle_table, table_from_rows

TOKEN = "tok-7f3a-secret"
SPEC = SampleSpec(records=1500, keys=300, partitions=2, segments_per_partition=3, seed=5)


class TaskInstance:
    dag_id, run_id, task_id, map_index, try_number = "connect_upsert", "manual__1", "upsert", -1, 1


@pytest.fixture
def store(sqlite_url, tmp_path, connect_server, monkeypatch):
    blob = open_blob(str(tmp_path / "blob"))
    blob.ensure_root()
    consensus = open_consensus(sqlite_url)
    shard = make_shard(consensus, blob, tmp_path, spec=SPEC)
    upsert = {"conn_type": "upsert", "extra": {"consensus_url": sqlite_url, "blob_root": blob.root}}
    monkeypatch.setenv("AIRFLOW_CONN_UPSERT_DEFAULT", json.dumps(upsert))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[1]"}))
    monkeypatch.setenv("AIRFLOW_CONN_WARM_SPARK", json.dumps(
        {"conn_type": "spark_connect", "host": "127.0.0.1", "port": connect_server["port"]}))
    monkeypatch.setenv("AIRFLOW_CONN_DOWN_SPARK", json.dumps(
        {"conn_type": "spark_connect", "host": "127.0.0.1", "port": free_port(), "password": TOKEN}))
    monkeypatch.delenv("UPSERT_SPARK_REMOTE", raising=False)  # the connection decides here

    def spark_conn_in_upsert_connection(conn_id: str) -> None:
        monkeypatch.setenv("AIRFLOW_CONN_UPSERT_DEFAULT", json.dumps(
            {**upsert, "extra": {**upsert["extra"], "spark_conn_id": conn_id}}))

    yield shard, spark_conn_in_upsert_connection
    consensus.dispose()


def test_connect_mode_runs_the_batches_on_the_server_named_by_the_connection(store, spark):
    shard, spark_conn_in_upsert_connection = store
    report = MicroBatchUpsertOperator(task_id="upsert", shard=shard.shard_id, spark_mode="connect",
                                      spark_connect_conn_id="warm_spark", max_batches=2).execute({"ti": TaskInstance()})
    assert report["spark_mode"] == "connect" and report["committed"] == 2
    # The upsert connection's Spark connection, when it is a spark_connect one, is used too.
    spark_conn_in_upsert_connection("warm_spark")
    report = MicroBatchUpsertOperator(task_id="upsert", shard=shard.shard_id, spark_mode="connect",
                                      until_caught_up=True).execute({"ti": TaskInstance()})
    assert report["upper"] == shard.state().upper
    assert table_from_rows(shard.read(spark).collect()) == oracle_table(shard.source.root)


def test_connect_mode_with_the_server_down_fails_retryably_naming_the_address(store, caplog):
    shard, _ = store
    operator = MicroBatchUpsertOperator(task_id="upsert", shard=shard.shard_id, spark_mode="connect",
                                        spark_connect_conn_id="down_spark")
    started = time.monotonic()
    with caplog.at_level("INFO"), pytest.raises(AirflowException) as raised:
        operator.execute({"ti": TaskInstance()})
    assert time.monotonic() - started < 30
    assert type(raised.value) is AirflowException  # retried by Airflow, not AirflowFailException
    message = str(raised.value)
    assert "no Spark Connect server answers at sc://127.0.0.1:" in message and message.endswith("(retryable)")
    assert TOKEN not in message and TOKEN not in caplog.text
    assert shard.state().upper == 0


def test_connect_mode_with_nothing_to_do_never_reaches_the_server(store):
    """A task that finds the shard caught up, or only batches a peer already committed, starts
    no Spark work: the same task against a server that is down succeeds."""
    shard, _ = store
    caught_up = MicroBatchUpsertOperator(task_id="upsert", shard=shard.shard_id, spark_mode="connect",
                                         spark_connect_conn_id="warm_spark", until_caught_up=True)
    first = caught_up.execute({"ti": TaskInstance()})
    assert first["committed"] > 0 and first["upper"] == shard.state().upper
    upper = shard.state().upper
    idle = MicroBatchUpsertOperator(task_id="upsert", shard=shard.shard_id, spark_mode="connect",
                                    spark_connect_conn_id="down_spark", until_caught_up=True)
    report = idle.execute({"ti": TaskInstance()})
    assert report["committed"] == 0 and report["upper"] == upper == shard.state().upper
    assert report["spark_start_seconds"] == 0


def test_connect_mode_with_a_missing_or_wrong_connection_fails_without_retry(store):
    shard, _ = store
    for conn_id, expected in (("no_such_conn", "is not defined"), ("spark_default", "needs a 'spark_connect' one")):
        operator = MicroBatchUpsertOperator(task_id="upsert", shard=shard.shard_id, spark_mode="connect",
                                            spark_connect_conn_id=conn_id)
        with pytest.raises(AirflowFailException, match=expected):
            operator.execute({"ti": TaskInstance()})


def test_on_kill_interrupts_only_the_tasks_own_connect_operations(connect_server):
    """Two tasks in one shared server session: on_kill stops the killed task's job, and the
    other task's job runs on."""
    from pyspark.sql import SparkSession

    from airflow_upsert_provider.engine.spark.session import new_session_id, with_session_id

    address = with_session_id(connect_server["address"], new_session_id())
    killed, other = (SparkSession.builder.remote(address).create() for _ in range(2))
    for session in (killed, other):
        session.release_session_on_close = False  # the shared session outlives these clients
    operator = MicroBatchUpsertOperator(task_id="upsert", shard="any", spark_mode="connect")
    operator._spark = (killed, True)
    other_tag = "other-task"
    running = {name: threading.Event() for name in ("killed", "other")}
    outcome: dict = {}

    def long_job(name: str, session, tag: str) -> None:
        session.addTag(tag)
        # The server reports progress only once the job runs: then its tag can be interrupted.
        session.registerProgressHandler(lambda stages, **_: stages and running[name].set())
        try:
            session.range(0, 10**13, numPartitions=64).selectExpr("sum(id * 7 % 13)").collect()
            outcome[name] = None
        except Exception as exc:  # an interrupt
            outcome[name] = exc

    workers = {
        "killed": threading.Thread(target=long_job, args=("killed", killed, operator._connect_tag)),
        "other": threading.Thread(target=long_job, args=("other", other, other_tag)),
    }
    for worker in workers.values():
        worker.start()
    assert all(event.wait(60) for event in running.values())
    operator.on_kill()
    workers["killed"].join(60)
    assert not workers["killed"].is_alive() and outcome["killed"] is not None
    assert workers["other"].is_alive(), "on_kill interrupted another task's job"
    other.interruptTag(other_tag)
    workers["other"].join(60)
    assert not workers["other"].is_alive() and "other" in outcome
    assert operator._killed
    # The shared session itself was not released: a new client runs in it.
    after = SparkSession.builder.remote(address).create()
    after.release_session_on_close = False
    try:
        assert after.range(3).count() == 3
    finally:
        after.stop()
        other.stop()
