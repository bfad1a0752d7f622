"""The shared Spark Connect session's id, the address parameters that name a session, and
what keeps a Kafka client config's secrets out of a shared session: no server."""

from __future__ import annotations

import json
import os
import stat
import uuid

import pytest

from airflow_upsert_provider.engine.spark.session import (
    SHARED_SESSION_WINDOW_SECONDS,
    named_session_id,
    shared_session_decision,
    shared_session_id,
    shared_session_path,
    with_session_id,
)


def test_the_recorded_shared_session_is_kept_within_its_window_then_replaced():
    fresh = str(uuid.uuid4())
    record = {"session_id": str(uuid.uuid4()), "created_at": 1000.0}
    assert shared_session_decision(None, 1000.0, fresh) == {"session_id": fresh, "created_at": 1000.0}
    assert shared_session_decision(record, 1000.0 + SHARED_SESSION_WINDOW_SECONDS - 1, fresh) == record
    assert shared_session_decision(record, 1000.0 + SHARED_SESSION_WINDOW_SECONDS, fresh)["session_id"] == fresh
    # A session the server closed is replaced at once; a record from the future or a torn
    # one is not trusted.
    assert shared_session_decision(record, 1001.0, fresh, closed_id=record["session_id"])["session_id"] == fresh
    for bad in ({**record, "created_at": 5000.0}, {**record, "session_id": "not-a-uuid"}, {"session_id": 1}, []):
        assert shared_session_decision(bad, 1000.0, fresh)["session_id"] == fresh


def test_the_shared_session_id_is_random_recorded_owner_only_and_found_by_the_next_process(tmp_path):
    first = shared_session_id("127.0.0.1", 15002, 1000.0, base=str(tmp_path / "a"))
    assert uuid.UUID(first).version == 4
    assert shared_session_id("127.0.0.1", 15002, 1010.0, base=str(tmp_path / "a")) == first
    # Another state directory (another machine): another id; nothing derives it from the clock.
    assert shared_session_id("127.0.0.1", 15002, 1000.0, base=str(tmp_path / "b")) != first
    path = shared_session_path("127.0.0.1", 15002, str(tmp_path / "a"))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert json.loads(open(path).read())["session_id"] == first
    # Another server has its own.
    assert shared_session_id("127.0.0.1", 15003, 1000.0, base=str(tmp_path / "a")) != first
    later = shared_session_id("127.0.0.1", 15002, 1000.0 + SHARED_SESSION_WINDOW_SECONDS, base=str(tmp_path / "a"))
    assert later != first and json.loads(open(path).read())["session_id"] == later


def test_no_shared_session_when_the_state_directory_cannot_hold_the_record(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert shared_session_id("127.0.0.1", 15002, 1000.0, base=str(blocker)) is None


def test_a_kafka_slice_with_secrets_is_never_registered_in_a_shared_session(monkeypatch):
    from airflow_upsert_provider.engine.spark import session as spark_module
    from airflow_upsert_provider.engine.errors import ConfigurationError
    from airflow_upsert_provider.engine.sources.kafka import KafkaConfig, KafkaSource

    registered = []

    class Session:  # a Connect client session's surface, as far as read_slice uses it
        session_id = str(uuid.uuid4())

        class dataSource:
            register = registered.append

    secret = KafkaSource("t", KafkaConfig.from_dict({"bootstrap.servers": "b:9092", "sasl.password": "pw-9"}))
    plain = KafkaSource("t", KafkaConfig.from_dict({"bootstrap.servers": "b:9092"}))
    for source in (secret, plain):
        monkeypatch.setattr(source, "check_slice", lambda ranges: dict(ranges))
    monkeypatch.setattr(spark_module, "is_connect_session", lambda spark: spark is Session)
    monkeypatch.setattr(spark_module, "_SHARED_SESSION_IDS", {Session.session_id})
    with pytest.raises(ConfigurationError, match="shared") as info:
        secret.read_slice(Session, {0: (0, 5)})
    assert "pw-9" not in info.value.message and registered == []
    assert secret.carries_secrets and not plain.carries_secrets


def test_the_cli_asks_for_a_session_of_its_own_when_the_kafka_config_has_secrets(tmp_path, monkeypatch):
    import argparse

    from airflow_upsert_provider.cli import context
    from airflow_upsert_provider.engine.spark import session as spark_module

    asked = []
    monkeypatch.setattr(spark_module, "get_spark", lambda *a, **kw: asked.append(kw) or object())
    for properties, private in (({"bootstrap.servers": "b:9092", "sasl.password": "pw"}, True),
                                ({"bootstrap.servers": "b:9092"}, False)):
        config = tmp_path / f"k{private}.json"
        config.write_text(json.dumps(properties))
        args = argparse.Namespace(command="status", consensus=f"sqlite:///{tmp_path}/c.db",
                                  blob_root=str(tmp_path / "blob"), kafka_config=str(config), spark_conf=[],
                                  remote="sc://127.0.0.1:1", master=None)
        ctx = context.Context(args)
        ctx.kafka_config()
        ctx.spark()
        assert asked[-1]["private"] is private


def test_the_session_named_by_an_address():
    assert named_session_id("sc://h:15002") is None
    assert named_session_id("sc://h:15002/;token=t") is None
    assert named_session_id("sc://h:15002/;session_id=") is None
    assert named_session_id("sc://h:15002/;token=t;session_id=abc") == "abc"


def test_naming_a_session_keeps_the_other_parameters():
    assert with_session_id("sc://h:1", "S") == "sc://h:1/;session_id=S"
    assert with_session_id("sc://h:1/", "S") == "sc://h:1/;session_id=S"
    assert with_session_id("sc://h:1/;token=t;session_id=old", "S") == "sc://h:1/;token=t;session_id=S"
    assert with_session_id("sc://[::1]:1/;token=t", "S") == "sc://[::1]:1/;token=t;session_id=S"
    assert named_session_id(with_session_id("sc://h:1/;token=t", "S")) == "S"
