"""MicroBatchUpsertOperator on a Kafka shard: the client config comes from an Airflow `kafka`
connection (named by the task or by the upsert connection), continuous mode runs for
``continuous_for``, and a ``sasl.password`` never reaches XCom, the task log or the submit
command line (it travels to a submitted job in a private file)."""

from __future__ import annotations

import datetime
import json
import logging
import os
import stat

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_upsert_provider.engine.store import streams
from airflow_upsert_provider.engine.blob.files import open_blob
from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.hooks.upsert import UpsertShardHook
from airflow_upsert_provider.operators.arguments import parse_duration
from airflow_upsert_provider.operators.upsert import MicroBatchUpsertOperator, _RunPlan
from tests.helpers import table
from tests.kafka.test_continuous import Changes, client_config, kafka_shard

SECRET = "0per-Pa55-9c2d"


class TaskInstance:
    dag_id, run_id, task_id, map_index, try_number = "kafka_upsert", "manual__1", "upsert", -1, 1


def test_continuous_for_takes_seconds_or_a_duration_and_refuses_anything_else():
    assert parse_duration("10m", "continuous_for") == 600.0
    assert parse_duration("1h30m", "continuous_for") == 5400.0
    assert parse_duration(" 90s ", "continuous_for") == 90.0
    assert parse_duration("45", "continuous_for") == parse_duration(45, "continuous_for") == 45.0
    assert parse_duration(datetime.timedelta(minutes=2), "continuous_for") == 120.0
    assert parse_duration(None, "continuous_for") is None and parse_duration("None", "continuous_for") is None
    for bad in ("10x", "m", "1h 30", "0", "-5", True, float("nan"), "1.5.h"):
        with pytest.raises(AirflowFailException, match="continuous_for must be a duration"):
            parse_duration(bad, "continuous_for")


@pytest.fixture
def store(sqlite_url, tmp_path, kafka_bootstrap, kafka_topic, monkeypatch):
    """A Kafka shard over 90 produced changes; the upsert connection (no kafka_conn_id yet)
    and a `kafka` connection whose extra holds a password."""
    blob = open_blob(str(tmp_path / "blob"))
    blob.ensure_root()
    consensus = open_consensus(sqlite_url)
    changes = Changes(kafka_bootstrap, kafka_topic)
    changes.produce(90)
    shard = kafka_shard(consensus, blob, kafka_topic, kafka_bootstrap, max_records=40)
    upsert = {"conn_type": "upsert", "extra": {"consensus_url": sqlite_url, "blob_root": blob.root}}
    monkeypatch.setenv("AIRFLOW_CONN_UPSERT_DEFAULT", json.dumps(upsert))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[1]"}))
    kafka = {"conn_type": "kafka", "extra": dict(client_config(kafka_bootstrap).properties, **{"sasl.password": SECRET})}
    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_EVENTS", json.dumps(kafka))
    monkeypatch.setenv("AIRFLOW_CONN_NOT_KAFKA", json.dumps({"conn_type": "http", "host": "example.com"}))

    def name_in_upsert_connection(conn_id: str) -> None:
        monkeypatch.setenv("AIRFLOW_CONN_UPSERT_DEFAULT", json.dumps(
            {**upsert, "extra": {**upsert["extra"], "kafka_conn_id": conn_id}}))

    yield shard, changes, name_in_upsert_connection
    consensus.dispose()


def test_a_kafka_shard_without_a_kafka_connection_or_with_the_wrong_type_fails_without_retry(store):
    shard, _, name_in_upsert_connection = store
    with pytest.raises(AirflowFailException) as unnamed:
        MicroBatchUpsertOperator(task_id="upsert", shard=shard.shard_id).execute({"ti": TaskInstance()})
    assert str(unnamed.value).startswith(
        f"configuration error: shard 'events' reads kafka topic {shard.source.topic!r} and no kafka connection is "
        "named: pass kafka_conn_id to the operator, or set 'kafka_conn_id' in the extra of the upsert connection")
    with pytest.raises(AirflowFailException, match="connection 'not_kafka' has type 'http'; kafka_conn_id needs type 'kafka'"):
        MicroBatchUpsertOperator(task_id="upsert", shard=shard.shard_id, kafka_conn_id="not_kafka").execute(
            {"ti": TaskInstance()})
    name_in_upsert_connection("missing")
    with pytest.raises(AirflowFailException, match="connection 'missing' is not defined"):
        MicroBatchUpsertOperator(task_id="upsert", shard=shard.shard_id).execute({"ti": TaskInstance()})
    assert shard.state().upper == 0


def test_continuous_mode_from_the_upsert_connections_kafka_connection_keeps_the_password_out(
    spark, store, caplog, capfd
):
    shard, changes, name_in_upsert_connection = store
    name_in_upsert_connection("kafka_events")
    caplog.set_level(logging.DEBUG)
    operator = MicroBatchUpsertOperator(task_id="upsert", shard=shard.shard_id, continuous_for="1h")
    log_batch = operator._log_batch

    def stop_once_idle(batch: dict) -> None:
        # Caught up: a stop request ends continuous mode before the next batch, long before the hour.
        log_batch(batch)
        if batch["outcome"] == "nothing_to_do":
            streams.stop(shard.consensus, shard.shard_id, "test", "caught up")

    operator._log_batch = stop_once_idle
    report = operator.execute({"ti": TaskInstance()})
    outcomes = [b["outcome"] for b in report["batches"]]
    # 90 changes at 40 a batch, then one idle poll.
    assert outcomes == ["committed", "committed", "committed", "nothing_to_do"]
    assert report["upper"] == 3 and "STOPPING" in report["stopped_because"]
    assert table(shard) == changes.oracle()
    out, err = capfd.readouterr()
    for text in (json.dumps(report), caplog.text, out, err):
        assert SECRET not in text
    # The task log names the topic and group, nothing of the client config.
    assert f"reads kafka topic {shard.source.topic!r} as consumer group 'upsert-events'" in out + caplog.text


def test_submit_mode_hands_the_client_config_to_the_job_in_a_private_file(store, tmp_path, caplog):
    shard, _, _ = store
    caplog.set_level(logging.DEBUG)
    hook = UpsertShardHook()
    opened = hook.open_shard(shard.shard_id, kafka_conn_id="kafka_events")
    assert opened.source.config.properties["sasl.password"] == SECRET
    operator = MicroBatchUpsertOperator(task_id="upsert", shard=shard.shard_id, spark_mode="submit",
                                        kafka_conn_id="kafka_events", continuous_for="10m")
    workdir = tmp_path / "work"
    workdir.mkdir(mode=0o700)
    plan = _RunPlan("w", None, False, None, "fail", 600.0)
    submit = operator._build_submit_hook(hook, plan, hook.get_blob().root, str(workdir), str(workdir / "r.json"),
                                         opened)
    command = submit._build_spark_submit_command(os.path.abspath("spark_job.py"))
    assert not any(SECRET in arg for arg in command)
    assert command[command.index("--continuous-for") + 1] == "600.0"
    assert "--max-batches" not in command and "--until-caught-up" not in command
    config_file = command[command.index("--kafka-config-file") + 1]
    assert stat.S_IMODE(os.stat(config_file).st_mode) == 0o600
    with open(config_file) as handle:
        assert json.load(handle)["sasl.password"] == SECRET
    # The job reads it back as the client config.
    from airflow_upsert_provider.engine.write.spark_job import build_parser

    args = build_parser().parse_args(command[command.index("--shard"):])
    assert args.kafka_config_file == config_file and args.continuous_for == 600.0
    assert SECRET not in json.dumps(submit._env or {}) and SECRET not in caplog.text
    hook.close()


def test_the_submitted_job_reads_the_client_config_file_and_runs_continuously(spark, store, tmp_path, monkeypatch,
                                                                               capfd):
    from airflow_upsert_provider.engine.write import spark_job
    from airflow_upsert_provider.operators.upsert import write_private_file

    shard, changes, _ = store
    monkeypatch.setattr(spark_job, "_session_from_submit", lambda: spark)
    hook = UpsertShardHook()
    config = hook.get_kafka_config("kafka_events")
    config_file = write_private_file(str(tmp_path), "kafka-config.json", json.dumps(dict(config.properties)))
    url_file = write_private_file(str(tmp_path), "consensus-url", hook.settings.consensus_url)
    result_file = tmp_path / "result.json"
    code = spark_job.main([
        "--shard", shard.shard_id, "--writer-id", "job", "--blob-root", hook.get_blob().root,
        "--result-file", str(result_file), "--consensus-url-file", url_file,
        "--kafka-config-file", config_file, "--continuous-for", "0.5",
    ])
    result = json.loads(result_file.read_text())
    assert code == 0 and result["ok"], result
    # Continuous mode: the first batch commits every change; whether another starts before
    # the half second passes depends on the machine's speed, and it would find nothing to do.
    outcomes = [b["outcome"] for b in result["batches"]]
    assert outcomes[0] == "committed" and set(outcomes[1:]) <= {"nothing_to_do"} and result["upper"] == 1
    out, err = capfd.readouterr()
    assert SECRET not in result_file.read_text() + out + err
    hook.close()
