"""Ctrl-C while a command waits for SQLite's write lock ends the command at once with exit 130,
not when the URL's ``timeout`` runs out (issue 34, note D13). A real ``upsertctl`` process, a
lock really held by another connection, and a SIGINT sent once the process is inside the wait."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time

from airflow_upsert_provider.engine.store.migrations import VERSION_TABLE, code_head
from airflow_upsert_provider.engine.store.registry import open_consensus

# Runs `upsertctl ARGV` and says on stdout when SQLite starts executing BEGIN IMMEDIATE (a trace
# callback runs inside that statement's step, before SQLite looks at the lock): from then until
# the statement returns, the process is inside SQLite's lock wait.
CHILD = """
import sys
import sqlalchemy as sa

def say_when_waiting(statement):
    if statement.startswith("BEGIN IMMEDIATE"):
        print("waiting for the write lock", flush=True)

sa.event.listen(sa.engine.Engine, "connect", lambda dbapi_conn, _record: dbapi_conn.set_trace_callback(say_when_waiting))
from airflow_upsert_provider import cli
sys.exit(cli.main(sys.argv[1:]))
"""

# Far longer than the test waits for the process: an interrupt that lands only when SQLite
# gives up shows as a process still running.
LOCK_TIMEOUT_S = 600
EXIT_WITHIN_S = 120


def test_ctrl_c_during_a_sqlite_lock_wait_ends_the_command_at_once(tmp_path):
    path = tmp_path / "consensus.db"
    url = f"sqlite:///{path}?timeout={LOCK_TIMEOUT_S}"
    open_consensus(url).dispose()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, "db", "upgrade"],
            env={**os.environ, "UPSERT_CONSENSUS_URL": url},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        try:
            assert child.stdout.readline() == "waiting for the write lock\n"
            interrupted_at = time.monotonic()
            # A SIGINT whose handler runs inside the trace callback (the print above) is lost:
            # sqlite3 clears an exception a callback raises. So one is sent for every attempt
            # the child reports until it exits; the first that lands in the wait ends it.
            lines = []

            def interrupt_each_attempt() -> None:
                while True:
                    child.send_signal(signal.SIGINT)
                    line = child.stdout.readline()
                    if not line:
                        return
                    lines.append(line)

            sender = threading.Thread(target=interrupt_each_attempt, daemon=True)
            sender.start()
            child.wait(timeout=EXIT_WITHIN_S)
            sender.join(timeout=EXIT_WITHIN_S)
            err = child.stderr.read()
        finally:
            if child.poll() is None:
                child.kill()
                child.communicate()
        # Well inside the URL's timeout: the interrupt did not wait for SQLite to give up.
        assert time.monotonic() - interrupted_at < LOCK_TIMEOUT_S / 2
        assert child.returncode == 130, err
        assert err.strip().splitlines()[-1] == "upsertctl: interrupted" and "Traceback" not in err
        # Nothing but the reports of its attempts at the lock (one per 100 ms slice).
        assert set(lines) <= {"waiting for the write lock\n"}
        # The lock was never taken from its holder, and the holder can still write.
        holder.execute(f"UPDATE {VERSION_TABLE} SET version_num = version_num")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    rows = sqlite3.connect(path).execute(f"SELECT version_num FROM {VERSION_TABLE}").fetchall()
    assert rows == [(code_head(),)]
