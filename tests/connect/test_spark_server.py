"""upsertctl spark-server: racing starts leave one server, status checks pid and port, a
connect-mode run against a server that is down fails at once with a retryable error naming
the address, and the pure decisions (memory, addresses, state files)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from airflow_upsert_provider.engine.errors import ConfigurationError, SparkUnavailable
from airflow_upsert_provider.engine.spark.server import (
    GIB,
    ServerState,
    SparkServer,
    driver_memory,
    parse_remote,
    require_reachable,
)
from airflow_upsert_provider.sample_data import SAMPLE_SCHEMA_DDL, SampleSpec, generate
from tests.conftest import cli_env
from tests.connect.conftest import UPSERTCTL, free_port, spark_server_cli
from tests.helpers import landing_env, run_cli_json


def test_two_starts_at_once_leave_one_server(connect_server):
    first, second = connect_server["starts"]
    assert sorted([first["started"], second["started"]]) == [False, True]  # one started it
    assert first["pid"] == second["pid"] and first["address"] == second["address"] == connect_server["address"]
    assert first["running"] and first["answering"] and second["answering"]
    state = SparkServer(connect_server["state_dir"]).read_state()
    assert state is not None and state.pid == first["pid"] and state.port == connect_server["port"]
    assert os.path.isfile(state.log)


def test_start_again_reports_the_running_server(connect_server):
    again = spark_server_cli(connect_server["state_dir"], "start", "--port", str(connect_server["port"]))
    assert again.returncode == 0, again.stderr
    out = json.loads(again.stdout)
    assert out["started"] is False and out["pid"] == connect_server["starts"][0]["pid"]
    # Another port does not start a second server: the running one is reported, with a note.
    other = json.loads(spark_server_cli(connect_server["state_dir"], "start", "--port", str(free_port())).stdout)
    assert other["started"] is False and other["port"] == connect_server["port"] and "note" in other


def test_status_checks_the_pid_and_a_query_through_connect(connect_server):
    done = spark_server_cli(connect_server["state_dir"], "status", "--query")
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["running"] and out["answering"] and out["query_seconds"] > 0


@pytest.mark.slow
def test_a_start_right_after_a_stop_gets_the_same_port(tmp_path, monkeypatch):
    """A stop returns once the port is closed, not only once the pid looks gone: an exiting
    JVM unmaps its memory (its command line then reads empty, as a zombie's does) before it
    closes its sockets, which takes long with a large heap. The test opens that window from
    the moment the stop has signalled the server, by reporting the pid as gone from then on."""
    from airflow_upsert_provider.engine.spark import server as spark_server
    from airflow_upsert_provider.engine.spark.server import port_answers

    server = SparkServer(str(tmp_path))
    port = free_port()
    real_is_server_process = spark_server.is_server_process
    signalled = []
    real_killpg = os.killpg

    def killpg(pid, sig):
        signalled.append(pid)
        real_killpg(pid, sig)

    monkeypatch.setattr(spark_server.os, "killpg", killpg)
    monkeypatch.setattr(spark_server, "is_server_process",
                        lambda pid: False if signalled else real_is_server_process(pid))
    try:
        started = server.start(port=port, master="local[1]", memory="1g")
        assert started["started"] is True and started["answering"] is True
        stopped = server.stop()
        assert stopped["stopped"] is True and signalled == [started["pid"]]
        assert not port_answers("127.0.0.1", port)
        signalled.clear()
        again = server.start(port=port, master="local[1]", memory="1g")
        assert again["started"] is True and again["port"] == port
    finally:
        signalled.clear()
        server.stop(timeout=5)


def test_status_and_stop_without_a_server(tmp_path):
    state_dir = str(tmp_path)
    done = spark_server_cli(state_dir, "status")
    assert done.returncode == 2 and json.loads(done.stdout)["running"] is False
    stopped = spark_server_cli(state_dir, "stop")
    assert stopped.returncode == 0 and json.loads(stopped.stdout)["stopped"] is False
    # A record whose pid is gone (or reused by another program) is stale, not a server.
    server = SparkServer(state_dir)
    os.makedirs(server.dir, exist_ok=True)
    server._write_state(ServerState(pid=os.getpid(), host="127.0.0.1", port=free_port(), log=server.log_path,
                                    started_at=time.time(), driver_memory="1024m", master="local[*]"))
    status = server.status()
    assert status["running"] is False and status["stale"] is True
    assert server.stop()["stopped"] is False and server.read_state() is None


def test_a_torn_state_file_is_no_server(tmp_path):
    server = SparkServer(str(tmp_path))
    os.makedirs(server.dir)
    with open(server.state_path, "w") as handle:
        handle.write('{"pid": 12')
    assert server.read_state() is None and server.status()["running"] is False


def test_state_dir_defaults(monkeypatch, tmp_path):
    from airflow_upsert_provider.engine.spark.server import state_dir

    monkeypatch.delenv("UPSERT_STATE_DIR", raising=False)
    assert state_dir() == os.path.abspath("./.upsert/spark-server")
    monkeypatch.setenv("UPSERT_STATE_DIR", str(tmp_path))
    assert state_dir() == str(tmp_path / "spark-server")
    assert state_dir("/x") == "/x/spark-server"


@pytest.mark.parametrize(("ram_gib", "expected"), [(2, "1024m"), (6, "2048m"), (12, "4096m"), (23, "7850m"),
                                                   (24, "8192m"), (256, "8192m")])
def test_driver_memory_is_a_third_of_ram_between_1g_and_8g(ram_gib, expected):
    assert driver_memory(ram_gib * GIB) == expected


@pytest.mark.parametrize(("url", "expected"), [("sc://127.0.0.1:15002", ("127.0.0.1", 15002)),
                                               ("sc://localhost", ("localhost", 15002)),
                                               ("sc://h:1/;token=x", ("h", 1)), ("sc://[::1]:9", ("::1", 9))])
def test_parse_remote(url, expected):
    assert parse_remote(url) == expected


@pytest.mark.parametrize("url", ["127.0.0.1:15002", "sc://", "sc://h:port", "sc://h:0", "sc://h:70000", "http://h:1"])
def test_parse_remote_refuses_what_is_not_an_address(url):
    with pytest.raises(ConfigurationError):
        parse_remote(url)


def test_bad_port_and_conf_are_usage_errors(tmp_path):
    for argv in (["start", "--port", "0"], ["start", "--conf", "novalue"], ["start", "--memory", "1z"],
                 ["start", "--conf", "spark.driver.memory=1z"]):
        done = spark_server_cli(str(tmp_path), *argv)
        assert done.returncode == 2 and json.loads(done.stdout)["error"] == "ConfigurationError"


def test_a_server_that_is_down_is_a_retryable_error_naming_the_address(connect_server, tmp_path, monkeypatch,
                                                                       capsys):
    down = f"sc://127.0.0.1:{free_port()}"
    with pytest.raises(SparkUnavailable) as raised:
        require_reachable(down)
    assert raised.value.retryable and raised.value.exit_code == 2 and down in raised.value.message

    # upsertctl in a fresh process, as a task runs it: exit 2, the error names the address,
    # and it comes at once (Spark's client alone would retry for minutes).
    landing = landing_env(tmp_path, monkeypatch, SampleSpec(records=50, keys=10, partitions=1,
                                                           segments_per_partition=1, seed=1))
    env = {**os.environ, "UPSERT_SPARK_REMOTE": down}
    done = subprocess.run([*UPSERTCTL, "init", "s", "--source", f"dir:{landing}", "--key", "id", "--json"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2, done.stderr
    payload = json.loads(done.stdout)
    assert payload["error"] == "SparkUnavailable" and payload["retryable"] is True and payload["address"] == down
    assert down in done.stderr
    # The shard made through the live server; its batch then runs against the one that is down.
    code, out, err = run_cli_json(capsys, "init", "s", "--source", f"dir:{landing}", "--key", "id",
                                  "--schema", "id BIGINT, name STRING")
    assert code == 0, err
    started = time.monotonic()
    done = subprocess.run([*UPSERTCTL, "--remote", down, "run-batch", "s", "--json"], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "UPSERT_SPARK_REMOTE": ""})
    assert time.monotonic() - started < 60
    assert done.returncode == 2, done.stderr
    payload = json.loads(done.stdout)
    assert payload["error"] == "SparkUnavailable" and payload["retryable"] is True and payload["address"] == down


def test_master_and_remote_together_are_refused(tmp_path, monkeypatch, capsys):
    landing = landing_env(tmp_path, monkeypatch, SampleSpec(records=50, keys=10, partitions=1,
                                                           segments_per_partition=1, seed=1))
    code, out, _ = run_cli_json(capsys, "--master", "local[1]", "init", "s", "--source", f"dir:{landing}",
                                "--key", "id", "--schema", "id BIGINT")
    assert code == 2 and out["error"] == "ConfigurationError" and out["field"] == "master"


def test_a_server_conf_a_client_cannot_change_is_named(spark, connect_server):
    from airflow_upsert_provider.engine.spark.session import get_spark

    with pytest.raises(ConfigurationError) as raised:
        get_spark(remote=connect_server["address"], conf={"spark.driver.memory": "1g"})
    assert "spark.driver.memory" in raised.value.message and connect_server["address"] in raised.value.message


def test_a_bad_value_for_a_runtime_setting_is_named_through_connect(spark, connect_server):
    from airflow_upsert_provider.engine.spark.session import get_spark

    before = spark.conf.get("spark.sql.shuffle.partitions")
    with pytest.raises(ConfigurationError) as raised:
        get_spark(remote=connect_server["address"], conf={"spark.sql.shuffle.partitions": "abc-s3cr3t-k5"})
    assert raised.value.exit_code == 2 and raised.value.details["key"] == "spark.sql.shuffle.partitions"
    assert "spark.sql.shuffle.partitions" in raised.value.message and "s3cr3t" not in raised.value.message
    assert spark.conf.get("spark.sql.shuffle.partitions") == before
    # The server refused it and told the client; its own log does not keep the value.
    log = open(SparkServer(connect_server["state_dir"]).log_path, encoding="utf-8").read()
    assert "s3cr3t" not in log


def test_start_refuses_a_setting_every_session_would_refuse_naming_the_key_only(tmp_path):
    """A server started with it would run, then refuse every client (rc 1 each) and write the
    value into server.log for each session (finding K5)."""
    state_dir = str(tmp_path)
    try:
        done = spark_server_cli(state_dir, "start", "--port", str(free_port()), "--memory", "1g",
                                "--conf", "spark.master=local[1]", "--conf", "spark.sql.shuffle.partitions=abc-s3cr3t")
        out = json.loads(done.stdout)
        assert done.returncode == 2, done.stderr
        assert out["error"] == "ConfigurationError" and out["key"] == "spark.sql.shuffle.partitions"
        assert "s3cr3t" not in done.stdout + done.stderr
        assert "spark.sql.shuffle.partitions" in done.stderr
        assert SparkServer(state_dir).status()["running"] is False  # none was started
        log = SparkServer(state_dir).log_path
        assert not os.path.exists(log) or "s3cr3t" not in open(log, encoding="utf-8").read()
    finally:
        spark_server_cli(state_dir, "stop")


@pytest.mark.slow
def test_a_client_of_a_server_whose_sessions_fail_gets_a_configuration_error(tmp_path):
    """A server started with a setting its sessions refuse (by an older version, or by hand)
    answers every session with 'Application error processing RPC': exit 2 naming the server
    and what to do, not an unexpected error (exit 1)."""
    # Started through SparkServer, as an older version's `spark-server start` did: without
    # the check of its settings that the command runs first.
    server = SparkServer(str(tmp_path / "state"))
    landing = tmp_path / "landing"
    generate(str(landing), SampleSpec(records=20, keys=5, partitions=1, segments_per_partition=1, seed=2))
    env = {**cli_env(f"sqlite:///{tmp_path / 'c.db'}", str(tmp_path / "blob")), "UPSERT_SPARK_REMOTE": ""}
    env.pop("UPSERT_SPARK_MASTER")
    init = subprocess.run([*UPSERTCTL, "init", "s", "--source", f"dir:{landing}", "--key", "id", "--schema",
                           SAMPLE_SCHEMA_DDL], env=env, capture_output=True, text=True, timeout=300)
    assert init.returncode == 0, init.stderr
    try:
        started = server.start(port=free_port(), master="local[1]", memory="1g", timeout=300,
                               conf={"spark.sql.shuffle.partitions": "abc"})
        done = subprocess.run([*UPSERTCTL, "--remote", started["address"], "status", "s", "--json"], env=env,
                              capture_output=True, text=True, timeout=300)
    finally:
        server.stop(timeout=10)
    assert done.returncode == 2, done.stderr
    out = json.loads(done.stdout)
    assert out["error"] == "ConfigurationError" and out["field"] == "spark_conf"
    assert started["address"] in out["message"] and "spark-server stop" in out["message"]


@pytest.mark.slow
def test_a_start_that_fails_quotes_the_cause_not_stack_frames(tmp_path):
    done = spark_server_cli(str(tmp_path), "start", "--port", str(free_port()), "--memory", "1g",
                            "--conf", "spark.master=garbage")
    assert done.returncode == 2, done.stderr
    out = json.loads(done.stdout)
    assert out["error"] == "SparkUnavailable"
    assert out["message"].endswith("server.log: org.apache.spark.SparkException: Master must either be yarn or "
                                   "start with spark, k8s, or local"), out["message"]
    assert "SparkSubmit.scala" not in out["message"]


# A stand-in for spark-submit: records its command line and the properties file it was given
# (content and mode), then listens on the port those properties name, as the server would.
FAKE_SPARK_SUBMIT = """#!{python}
import json, os, signal, socket, stat, sys
args = sys.argv[1:]
text, mode = "", None
if "--properties-file" in args:
    path = args[args.index("--properties-file") + 1]
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    mode = stat.S_IMODE(os.stat(path).st_mode)
lines = text.splitlines() + [args[i + 1] for i, arg in enumerate(args) if arg == "--conf"]
props = dict(line.partition("=")[::2] for line in lines)
with open({record!r}, "w", encoding="utf-8") as handle:
    json.dump({{"argv": sys.argv, "properties": text, "mode": mode}}, handle)
print("server log line", flush=True)
sock = socket.socket()
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind(("127.0.0.1", int(props["spark.connect.grpc.binding.port"])))
sock.listen()
signal.signal(signal.SIGTERM, lambda *a: os._exit(0))
while True:
    sock.accept()[0].close()
"""


def test_start_passes_conf_values_in_a_private_file_never_on_the_command_line_or_in_the_log(tmp_path, monkeypatch):
    from airflow_upsert_provider.engine.spark import server as spark_server

    home, record = tmp_path / "spark-home", tmp_path / "record.json"
    (home / "bin").mkdir(parents=True)
    submit = home / "bin" / "spark-submit"
    submit.write_text(FAKE_SPARK_SUBMIT.format(python=sys.executable, record=str(record)))
    submit.chmod(0o755)
    monkeypatch.setattr(spark_server, "_spark_home", lambda: str(home))
    secret = "s3cr3t-key=with:odd#chars"
    server = SparkServer(str(tmp_path / "state"))
    try:
        started = server.start(port=free_port(), memory="1g", timeout=60,
                               conf={"spark.hadoop.fs.s3a.secret.key": secret})
        assert started["started"] is True and started["answering"] is True
        seen = json.loads(record.read_text())
        with open(f"/proc/{started['pid']}/cmdline", "rb") as handle:
            cmdline = handle.read().decode()
    finally:
        server.stop(timeout=10)
    assert secret not in " ".join(seen["argv"]) and secret not in cmdline
    assert "--conf" not in seen["argv"] and "--properties-file" in seen["argv"]
    # The file was the owner's alone, held the value (escaped as Java reads it back), and is
    # gone once the server listened.
    assert seen["mode"] == 0o600
    assert "spark.hadoop.fs.s3a.secret.key=s3cr3t-key\\=with\\:odd\\#chars\n" in seen["properties"]
    assert not os.path.exists(server.properties_path)
    log = open(server.log_path, encoding="utf-8").read()
    assert secret not in log and "s3cr3t" not in log
    assert "spark.hadoop.fs.s3a.secret.key" in log and "server log line" in log


def test_properties_read_back_exactly():
    from airflow_upsert_provider.engine.spark.server import properties_text

    settings = {"a key": " lead\\ing=x:y#z!\n\tend", "spark.x": "-Dp=1 -Dq=2", "u": "ü€"}
    # What java.util.Properties.load does with each escape, for the characters written.
    unescape = {"n": "\n", "t": "\t", "r": "\r", "f": "\f"}
    parsed = {}
    for line in properties_text(settings).splitlines():
        chars, out, key, i = line, [], None, 0
        while i < len(chars):
            c = chars[i]
            if c == "\\":
                out.append(unescape.get(chars[i + 1], chars[i + 1]))
                i += 2
                continue
            if c == "=" and key is None:
                key, out = "".join(out), []
            else:
                out.append(c)
            i += 1
        parsed[key] = "".join(out)
    assert parsed == settings
