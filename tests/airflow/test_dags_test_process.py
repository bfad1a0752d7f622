"""The two sides of tests/airflow/dags_test_process.py without Airflow: the exit code a command
gets, and how the test's side splits the process's output into one result per command. A stand-in
process speaks the protocol (the real one runs in test_example_dags.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.airflow.conftest import AirflowHome, DagsTestProcess
from tests.airflow.dags_test_process import END, _exit_code

# Answers each command line with some output, then END and the exit code the command names;
# "die" ends the process without an answer, "mute" never answers.
STAND_IN = rf"""
import json, sys
for line in sys.stdin:
    argv = json.loads(line)
    dag_id = argv[2]
    if dag_id == "die":
        print("going down", flush=True)
        sys.exit(3)
    if dag_id == "mute":
        continue
    print("log of", dag_id, flush=True)
    print("error line of", dag_id, file=sys.stderr, flush=True)
    # The end marker may follow output of the same line that did not end it.
    print("tail without newline", end="", flush=True)
    # Exit code: the number of arguments after the DAG id (2 with a --conf).
    print({END!r}, len(argv) - 3, flush=True)
"""


@pytest.mark.parametrize(("code", "exit_code", "stderr"), [
    (None, 0, ""), (0, 0, ""), (2, 2, ""), ("DagRun failed", 1, "DagRun failed\n"),
])
def test_a_commands_exit_code_is_what_the_interpreter_would_exit_with(code, exit_code, stderr, capsys):
    assert _exit_code(SystemExit(code)) == exit_code
    assert capsys.readouterr().err == stderr


@pytest.fixture
def stand_in(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", STAND_IN], text=True, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    home = AirflowHome(str(tmp_path), {})
    try:
        yield DagsTestProcess(home, proc)
    finally:
        proc.kill()
        proc.wait()


def test_output_and_exit_codes_are_split_per_command(stand_in):
    ok = stand_in.dags_test("first")
    failed = stand_in.dags_test("second", conf={"x": 1})
    assert (ok.args, ok.returncode) == (["dags", "test", "first"], 0)
    assert ok.stdout == "log of first\nerror line of first\ntail without newline" and ok.stderr == ""
    assert (failed.args, failed.returncode) == (["dags", "test", "second", "--conf", '{"x": 1}'], 2)
    assert failed.stdout == "log of second\nerror line of second\ntail without newline"


def test_a_process_that_ends_mid_command_fails_with_its_exit_code_and_output(stand_in):
    with pytest.raises(AssertionError) as failure:
        stand_in.dags_test("die")
    assert str(failure.value).startswith("the Airflow process ended (exit 3) during dags test die:\ngoing down")


def test_a_command_that_does_not_end_in_its_timeout_fails_naming_it(stand_in):
    with pytest.raises(AssertionError) as failure:
        stand_in.dags_test("mute", timeout=0.5)
    assert str(failure.value) == "dags test mute did not end in 0.5 s:\n"
