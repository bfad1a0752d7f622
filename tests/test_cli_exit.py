"""How the `upsertctl` program exits (``cli.run``): without tearing down the interpreter's
modules, yet with everything a normal exit does that matters: the command's output flushed,
``atexit`` handlers run, other threads waited for, the exit status kept."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest

from airflow_upsert_provider import cli

# A command that leaves buffered output of more than a pipe's capacity, registers an
# exit handler and ends with status 3.
PROGRAM = textwrap.dedent(
    """
    import atexit, sys
    from airflow_upsert_provider import cli

    def command(argv=None):
        atexit.register(lambda: open(sys.argv[1], "w").write("ran"))
        sys.stdout.write("x" * 1_000_000)
        sys.stdout.write("end")
        return 3

    cli.main = command
    cli.run()
    """
)


def test_run_flushes_output_runs_exit_handlers_and_keeps_the_status(tmp_path):
    marker = tmp_path / "atexit-ran"
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(marker)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    assert len(done.stdout) == 1_000_003 and done.stdout.endswith("end")
    assert marker.read_text() == "ran"


def test_run_exits_normally_while_another_thread_runs(monkeypatch):
    """A non-daemon thread still running is waited for, as a normal exit does: no shortcut."""
    release = threading.Event()
    worker = threading.Thread(target=release.wait, daemon=False)

    def command(argv=None):
        worker.start()
        return 4

    def shortcut(*args):
        raise AssertionError("the exit skipped waiting for a running thread")

    monkeypatch.setattr(cli, "main", command)
    monkeypatch.setattr(cli.os, "_exit", shortcut)
    monkeypatch.setattr(cli.atexit, "_run_exitfuncs", shortcut)
    try:
        with pytest.raises(SystemExit) as exited:
            cli.run()
        assert exited.value.code == 4
    finally:
        release.set()
        worker.join()


def test_the_installed_program_is_run():
    from importlib.metadata import entry_points

    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "upsertctl"]
    assert script.value == "airflow_upsert_provider.cli:run"
