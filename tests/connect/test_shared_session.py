"""Fresh task processes with the engine's default settings run in one server session (a
batch in a new Connect session pays about 0.5 s more on the server); a task with settings of
its own gets a session of its own; a shared session the server closed is replaced."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# A fresh process opens the engine's session as a task does and prints which server session
# it got. argv: address, JSON conf, a shared id to use instead of the recorded one (or ""),
# "release" to release the session at the end (as a foreign client might), "private" to ask
# for a session of its own.
CHILD = """
import json, sys
from airflow_upsert_provider.engine.spark import session as S
address, conf, shared_id, release = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4] == "release"
if shared_id:
    S.shared_session_id = lambda host, port, now, **kw: shared_id
session = S.get_connect_spark(address, conf, private=sys.argv[5] == "private")
assert session.range(5).count() == 5
print(json.dumps({"session_id": session.client._session_id, "server_session": session.client._server_session_id,
                  "shuffle": session.conf.get("spark.sql.shuffle.partitions")}))
if release:
    session.release_session_on_close = True
session.stop()
"""


def child(address: str, conf: dict | None = None, shared_id: str = "", release: bool = False,
          private: bool = False, env: dict | None = None) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, address, json.dumps(conf or {}), shared_id,
                           "release" if release else "keep", "private" if private else "shared"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def shared_id():
    import uuid

    return str(uuid.uuid4())


def test_fresh_processes_with_default_settings_share_one_server_session(connect_server, shared_id):
    first = child(connect_server["address"], shared_id=shared_id)
    second = child(connect_server["address"], shared_id=shared_id)
    assert first["session_id"] == second["session_id"] == shared_id
    # One server session, not two of the same name: stopping the first client kept it.
    assert first["server_session"] == second["server_session"]


def test_a_task_with_settings_of_its_own_gets_a_session_of_its_own(connect_server, shared_id):
    shared = child(connect_server["address"], shared_id=shared_id)
    own = child(connect_server["address"], {"spark.sql.shuffle.partitions": "3"}, shared_id=shared_id)
    assert own["session_id"] != shared_id and own["shuffle"] == "3"
    # The setting did not reach the shared session.
    assert child(connect_server["address"], shared_id=shared_id)["shuffle"] == shared["shuffle"]


def test_a_session_named_by_the_address_is_used_and_kept(connect_server, shared_id):
    from airflow_upsert_provider.engine.spark.session import with_session_id

    address = with_session_id(connect_server["address"], shared_id)
    first = child(address, {"spark.sql.shuffle.partitions": "3"})
    second = child(address, {"spark.sql.shuffle.partitions": "3"})
    assert first["session_id"] == second["session_id"] == shared_id
    assert first["server_session"] == second["server_session"]


def test_a_shared_session_the_server_closed_is_replaced(connect_server, shared_id):
    released = child(connect_server["address"], shared_id=shared_id, release=True)
    assert released["session_id"] == shared_id
    # The server now refuses that id for good; the next task runs in a new session.
    replaced = child(connect_server["address"], shared_id=shared_id)
    assert replaced["session_id"] != shared_id
    assert replaced["server_session"] != released["server_session"]


def test_a_task_that_registers_a_secret_gets_a_session_of_its_own(connect_server, shared_id):
    shared = child(connect_server["address"], shared_id=shared_id)
    own = child(connect_server["address"], shared_id=shared_id, private=True)
    assert shared["session_id"] == shared_id and own["session_id"] != shared_id
    assert own["server_session"] != shared["server_session"]


def test_processes_sharing_a_state_directory_share_the_recorded_random_session(connect_server, tmp_path):
    import os

    from airflow_upsert_provider.engine.spark.session import shared_session_path
    from airflow_upsert_provider.engine.spark.server import parse_remote

    env = {**os.environ, "UPSERT_STATE_DIR": str(tmp_path)}
    first = child(connect_server["address"], env=env)
    second = child(connect_server["address"], env=env)
    assert first["session_id"] == second["session_id"]
    record = json.loads(open(shared_session_path(*parse_remote(connect_server["address"]), str(tmp_path))).read())
    assert record["session_id"] == first["session_id"]
