"""`upsertctl` on a Kafka shard: init (schema inferred from Debezium events), run-batch,
status, read; the client config file's secrets never reach the output."""

from __future__ import annotations

import json

from tests.helpers import cli_store, run_cli, run_cli_json
from tests.kafka.conftest import produce_changes

SECRET = "p4ss-w0rd-never-shown"


def debezium(op: str, *, before=None, after=None, lsn=None) -> dict:
    event = {"op": op, "before": before, "after": after, "source": {"connector": "postgresql", "lsn": lsn}}
    return {"schema": {"type": "struct"}, "payload": event}


def test_debezium_topic_through_upsertctl(spark, tmp_path, monkeypatch, capsys, kafka_bootstrap, kafka_topic):
    cli_store(tmp_path, monkeypatch, f"sqlite:///{tmp_path / 'c.db'}")
    config = tmp_path / "kafka.json"
    # The mock cluster ignores SASL settings it is not asked to use; the password is only here
    # to prove it never reaches the output.
    config.write_text(json.dumps({"bootstrap.servers": kafka_bootstrap, "sasl.password": SECRET}))
    monkeypatch.setenv("UPSERT_KAFKA_CONFIG", str(config))
    row = lambda i, name: {"id": i, "name": name}  # noqa: E731
    produce_changes(kafka_bootstrap, kafka_topic, [
        (0, '{"id": 1}', debezium("r", after=row(1, "snap"), lsn=10)),
        (0, '{"id": 2}', debezium("c", after=row(2, "two"), lsn=11)),
        # Out of order within the batch: the later offset carries the earlier position, so
        # the update at LSN 30 wins over the one at LSN 20.
        (0, '{"id": 1}', debezium("u", before=row(1, "snap"), after=row(1, "newest"), lsn=30)),
        (0, '{"id": 1}', debezium("u", before=row(1, "snap"), after=row(1, "older"), lsn=20)),
        (1, '{"id": 3}', debezium("c", after=row(3, "three"), lsn=12)),
        (1, '{"id": 3}', debezium("d", before={"id": 3}, lsn=40)),
        (1, '{"id": 3}', None),  # the tombstone after a delete: skipped
    ])
    code, out, err = run_cli_json(capsys, "init", "cdc", "--source", f"kafka:{kafka_topic}", "--key", "id",
                                  "--envelope", "debezium")
    assert code == 0, err
    assert [f["name"] for f in json.loads(out["config"]["schema"])["fields"]] == ["id", "name"]
    assert out["config"]["extra"]["kafka"]["envelope"] == "debezium"

    code, out, err = run_cli_json(capsys, "run-batch", "cdc", "--until-caught-up")
    assert code == 0, err
    assert out["upper"] == 1 and out["batches"][0]["rows_in"] == 6

    code, text, err = run_cli(capsys, "read", "cdc")
    assert code == 0, err
    assert [json.loads(line) for line in text.splitlines()] == [{"id": 1, "name": "newest"}, {"id": 2, "name": "two"}]

    code, status, err = run_cli_json(capsys, "status", "cdc", "--no-rows")
    assert code == 0, err
    assert status["source"]["lag_offsets"] == {"0": 0, "1": 0, "2": 0, "3": 0}
    assert status["source"]["bound"] == {"0": 4, "1": 3, "2": 0, "3": 0}
    assert status["group"]["group"] == "upsert-cdc" and status["group"]["alert"] is False
    assert status["group"]["committed"] == {"0": 4, "1": 3, "2": 0, "3": 0}
    everything = json.dumps([out, status]) + text + err + capsys.readouterr().err
    assert SECRET not in everything


def test_kafka_options_are_refused_for_a_directory_source(tmp_path, monkeypatch, capsys):
    cli_store(tmp_path, monkeypatch, f"sqlite:///{tmp_path / 'c.db'}")
    (tmp_path / "landing").mkdir()
    code, _, err = run_cli(capsys, "init", "d", "--source", f"dir:{tmp_path / 'landing'}", "--key", "id",
                           "--schema", "id BIGINT", "--envelope", "debezium")
    assert code == 2 and "--envelope apply to kafka:TOPIC sources only" in err


def test_a_kafka_shard_without_client_config_says_how_to_give_one(tmp_path, monkeypatch, capsys):
    cli_store(tmp_path, monkeypatch, f"sqlite:///{tmp_path / 'c.db'}")
    monkeypatch.delenv("UPSERT_KAFKA_CONFIG", raising=False)
    code, _, err = run_cli(capsys, "init", "k", "--source", "kafka:orders", "--key", "id", "--schema", "id BIGINT")
    assert code == 2 and "--kafka-config FILE" in err


def test_continuous_and_for_go_together(tmp_path, monkeypatch, capsys):
    cli_store(tmp_path, monkeypatch, f"sqlite:///{tmp_path / 'c.db'}")
    code, _, err = run_cli(capsys, "run-batch", "k", "--continuous")
    assert code == 2 and "--continuous and --for DURATION go together" in err
    code, _, err = run_cli(capsys, "run-batch", "k", "--for", "10m")
    assert code == 2 and "go together" in err
    code, _, err = run_cli(capsys, "run-batch", "k", "--continuous", "--for", "soon")
    assert code == 2 and "'soon' is not a duration" in err
