"""A Kafka shard's frontier is observed and pages like a directory shard's, from `upsertctl
frontier` (client config from --kafka-config or UPSERT_KAFKA_CONFIG) and from the sensor (the
upsert connection's kafka_conn_id), on a librdkafka mock cluster. In a store mixing directory
and Kafka shards, a shard that cannot be observed is named with its reason and never hides
the others. No Spark: nothing here commits a batch."""

from __future__ import annotations

import glob
import json
import time
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_upsert_provider.engine.frontier import observations
from airflow_upsert_provider.engine.config import ShardConfig
from airflow_upsert_provider.engine.frontier.pages import dedup_key
from airflow_upsert_provider.engine.table.shard import Shard
from airflow_upsert_provider.engine.sources.kafka import KafkaConfig
from airflow_upsert_provider.engine.sources.kafka_options import KafkaShardOptions
from airflow_upsert_provider.sample_data import SampleSpec
from airflow_upsert_provider.sensors.frontier import FrontierStallSensor
from tests.airflow.test_frontier_sensor import INTEGRATION_KEY, conn_env, pager  # noqa: F401 - fixture
from tests.helpers import cli_store, make_shard, run_cli, run_cli_json
from tests.kafka.conftest import kafka_bootstrap, kafka_topic, produce_changes  # noqa: F401 - fixtures

SECRET = "k4fka-s3cret-never-shown"
SPEC = SampleSpec(records=160, keys=40, partitions=2, segments_per_partition=4, seed=5)
SCHEMA = json.dumps({"type": "struct", "fields": [
    {"name": "id", "type": "long", "nullable": True, "metadata": {}},
    {"name": "name", "type": "string", "nullable": True, "metadata": {}},
]})
# Stalled after max(2 x 1 s, 5 s) = 5 s of pending records and an unmoved upper.
QUICK = dict(cadence_seconds=1, stall_multiplier=2, min_stall_seconds=5, window_seconds=600, consecutive_breaches=2)


def mixed_store(tmp_path, monkeypatch, bootstrap: str, topic: str):
    """A store with directory shard ``d`` and Kafka shard ``k`` (40 records produced, none
    committed), and a client config file holding a secret: (consensus, blob, config path)."""
    consensus, blob = cli_store(tmp_path, monkeypatch, f"sqlite:///{tmp_path / 'c.db'}")
    monkeypatch.delenv("UPSERT_KAFKA_CONFIG", raising=False)
    make_shard(consensus, blob, tmp_path, spec=SPEC, shard_id="d", max_files_per_batch=2)
    produce_changes(bootstrap, topic, [(i % 4, str(i), {"id": i, "name": f"n{i}"}) for i in range(40)])
    config = ShardConfig(source=f"kafka:{topic}", keys=("id",), schema=SCHEMA, buckets=2,
                         extra=KafkaShardOptions(max_records_per_batch=100).to_extra())
    Shard.create(consensus, blob, "k", config, kafka_config=KafkaConfig.from_dict({"bootstrap.servers": bootstrap}))
    path = tmp_path / "kafka.json"
    path.write_text(json.dumps({"bootstrap.servers": bootstrap, "sasl.password": SECRET}))
    return consensus, blob, path


def test_upsertctl_observes_a_kafka_shard_and_one_it_cannot_observe_hides_no_other(
        tmp_path, monkeypatch, capsys, kafka_bootstrap, kafka_topic):
    consensus, _, config = mixed_store(tmp_path, monkeypatch, kafka_bootstrap, kafka_topic)
    try:
        # No client config: the directory shard is observed and recorded, the Kafka one is named
        # with its reason, and the exit says not everything was observed.
        code, out, err = run_cli_json(capsys, "frontier", "observe")
        assert code == 2
        assert [o["shard_id"] for o in out["observations"]] == ["d"]
        assert list(out["unobservable"]) == ["k"] and "no client config was given" in out["unobservable"]["k"]
        assert "shard k: not observable: ConfigurationError: kafka topic" in err
        assert [observations.observation_count(consensus, s) for s in ("d", "k")] == [1, 0]
        code, text, err = run_cli(capsys, "frontier", "observe")
        assert code == 2 and text.rstrip().endswith("1 observation(s) recorded, 1 shard(s) not observable")

        # --kafka-config: both observed; the Kafka shard's high watermarks are the topic's.
        code, out, err = run_cli_json(capsys, "frontier", "observe", "--kafka-config", str(config))
        assert (code, out["unobservable"]) == (0, {}), err
        [d, k] = out["observations"]
        assert (d["shard_id"], k["shard_id"]) == ("d", "k")
        assert k["high_watermark"] == {"0": 10, "1": 10, "2": 10, "3": 10}
        # 40 records produced, none committed: 40 records pending; the directory shard's 8
        # segment files (offsets 0 to 30 by tens in two partitions) are 8 segments, not 62.
        assert (k["upper"], k["lag"], k["lag_unit"], k["bound"]) == (0, 40, "records", {})
        assert (d["lag"], d["lag_unit"]) == (8, "segments") == (len(pending_files(tmp_path)), "segments")
        assert k["upstream"]["group"] == "upsert-k" and "error" not in k["upstream"]

        # UPSERT_KAFKA_CONFIG: `frontier status` observes it too.
        monkeypatch.setenv("UPSERT_KAFKA_CONFIG", str(config))
        code, status, err = run_cli_json(capsys, "frontier", "status", "k")
        assert code == 0, err
        assert status["observe_error"] is None and status["observation"]["lag"] == 40
        assert status["evaluation"]["status"] == "OK"
        assert (status["evaluation"]["lag"], status["evaluation"]["lag_unit"]) == (40, "records")
        code, text, err = run_cli(capsys, "frontier", "status", "k")
        assert code == 0 and "\nlag: 40 records pending" in text, text
        assert SECRET not in json.dumps([out, status]) + err + capsys.readouterr().err
        assert [observations.observation_count(consensus, s) for s in ("d", "k")] == [3, 3]
    finally:
        consensus.dispose()


def sensor_context(run_id: str) -> dict:
    ti = SimpleNamespace(dag_id="monitor", run_id=run_id, task_id="watch", map_index=-1, try_number=1, log_url=None)
    return {"ti": ti, "run_id": run_id}


def stepping_clock(start: float, step: float):
    """A sensor clock that moves ``step`` seconds a round (the rounds' own time, not the machine's)."""
    rounds = iter(range(10_000))
    return lambda: start + step * next(rounds)


def pending_files(tmp_path) -> list[str]:
    """The directory shard's segment files on disk (none is bound in these tests)."""
    return glob.glob(str(tmp_path / "landing" / "*" / "*.jsonl"))


def watch(shard: str, **kwargs) -> FrontierStallSensor:
    kwargs = {"pagerduty_events_conn_id": "pagerduty_test", **kwargs}
    task = FrontierStallSensor(task_id="watch", shard=shard, poke_interval=0.01, watch_seconds=600,
                               namespace="mixed", **QUICK, **kwargs)
    task.clock = stepping_clock(time.time(), 10)
    return task


def test_a_stalled_kafka_shard_pages_and_one_that_cannot_be_observed_pages_stale_beside_the_others(
        tmp_path, monkeypatch, kafka_bootstrap, kafka_topic, pager):  # noqa: F811 - fixtures
    consensus, blob, config = mixed_store(tmp_path, monkeypatch, kafka_bootstrap, kafka_topic)
    upsert = {"conn_type": "upsert", "extra": {"consensus_url": f"sqlite:///{tmp_path / 'c.db'}",
                                               "blob_root": blob.root, "kafka_conn_id": "kafka_test"}}
    env = {**conn_env(pager), "AIRFLOW_CONN_UPSERT_DEFAULT": json.dumps(upsert),
           "AIRFLOW_CONN_KAFKA_TEST": json.dumps({"conn_type": "kafka", "extra": json.loads(config.read_text())})}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    try:
        # The Kafka shard through the upsert connection's kafka_conn_id: observed, stalled, paged.
        logged: list[str] = []
        record = lambda fmt, *args: logged.append(fmt % args)  # noqa: E731
        with monkeypatch.context() as patched, pytest.raises(AirflowFailException) as failed:
            patched.setattr(FrontierStallSensor, "log", SimpleNamespace(info=record, warning=record, error=record,
                                                                        debug=record))
            watch("k").execute(sensor_context("r1"))
        # Every round's log line says the unit.
        assert any(line.startswith("shard k: STALLED (upper 0, 40 records pending, the oldest for ") for line in logged), \
            logged
        assert str(failed.value).startswith("shard k: frontier STALLED; upper 0 stuck since ")
        assert "\n  behind: 40 records pending, the oldest for " in str(failed.value)
        [page] = pager.events()
        assert page["dedup_key"] == dedup_key("k", "mixed") and page["event_action"] == "trigger"
        assert ", +40 records / " in page["payload"]["summary"]
        details = page["payload"]["custom_details"]
        assert (details["status"], details["upper"], details["lag"], details["lag_unit"]) == \
            ("STALLED", 0, 40, "records")
        assert "with 40 records pending" in details["reasons"][0]

        # The directory shard beside it pages on its own, in segment files, to Slack too.
        pager.clear()
        with pytest.raises(AirflowFailException, match="shard d: frontier STALLED") as failed:
            watch("d", slack_webhook_conn_id="slack_test").execute(sensor_context("r1"))
        assert "\n  behind: 8 segments pending, the oldest for " in str(failed.value)
        [page] = pager.events()
        assert page["dedup_key"] == dedup_key("d", "mixed")
        assert ", +8 segments / " in page["payload"]["summary"]
        details = page["payload"]["custom_details"]
        assert (details["lag"], details["lag_unit"]) == (len(pending_files(tmp_path)), "segments") == (8, "segments")
        [slack] = pager.slack_messages()
        assert "+8 segments / " in slack["text"] and "• lag: `8 segments pending, the oldest for " in slack["text"]

        # A second Kafka shard whose kafka connection does not exist: never observed, never
        # silent. Its rounds name why; with nothing recorded it is STALE, and STALE pages.
        Shard.create(consensus, blob, "k2", Shard.open(consensus, blob, "k").config,
                     kafka_config=KafkaConfig.from_dict({"bootstrap.servers": kafka_bootstrap}))
        pager.clear()
        with pytest.raises(AirflowFailException) as stale:
            watch("k2", kafka_conn_id="no_such_kafka").execute(sensor_context("r1"))
        assert "shard k2: frontier STALE" in str(stale.value)
        assert "not observable: ConfigurationError: Airflow connection 'no_such_kafka' is not defined" \
            in str(stale.value)
        [page] = pager.events()
        assert page["dedup_key"] == dedup_key("k2", "mixed")
        assert page["payload"]["summary"].startswith("STALE: k2 not observed: not observable: ")
        assert SECRET not in json.dumps(pager.requests) + str(failed.value) + str(stale.value)
    finally:
        consensus.dispose()
