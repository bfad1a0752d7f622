"""Ctrl-C of an in-process `upsertctl run-batch` while Spark writes a batch: the documented
`upsertctl: interrupted` line and exit 130, no Py4J traceback, nothing committed, and no
driver JVM left behind (issue 34, finding G1)."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time

import pytest

from airflow_upsert_provider.sample_data import SAMPLE_SCHEMA_DDL, SampleSpec, generate
from tests.conftest import cli_env

UPSERTCTL = [sys.executable, "-m", "airflow_upsert_provider.cli"]

# upsertctl whose batch write job cannot finish: every row of the run waits in the JVM (one
# hour's Thread.sleep, no Python worker), so a Ctrl-C sent once the job has begun always finds
# it running, on a fast machine as on a slow one, whatever the batch's size.
HELD_WRITE_UPSERTCTL = [sys.executable, "-c", """
from pyspark.sql import functions as F

from airflow_upsert_provider.cli import run
from airflow_upsert_provider.engine.write import upsert

write_bucketed = upsert.write_bucketed


def held(rows, *args, **kwargs):
    sleeping = F.expr("java_method('java.lang.Thread', 'sleep', 3600000L)")
    return write_bucketed(rows.where(sleeping != F.lit("never")), *args, **kwargs)


upsert.write_bucketed = held
run()
"""]


def _children(pid: int) -> set[int]:
    """Every descendant of ``pid`` (the JVM is spark-submit's child or spark-submit itself)."""
    found: set[int] = set()
    pending = [pid]
    while pending:
        parent = pending.pop()
        for path in glob.glob(f"/proc/{parent}/task/*/children"):
            try:
                with open(path, encoding="ascii") as handle:
                    kids = {int(kid) for kid in handle.read().split()}
            except OSError:
                continue
            pending.extend(kids - found)
            found |= kids
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_for(condition, deadline_seconds: float, what: str):
    deadline = time.monotonic() + deadline_seconds
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.01)
    pytest.fail(f"no {what} within {deadline_seconds:.0f}s")


@pytest.mark.slow
def test_ctrl_c_during_a_batch_exits_130_with_one_line_and_commits_nothing(tmp_path):
    from airflow_upsert_provider.engine.store.registry import open_consensus

    landing = tmp_path / "landing"
    generate(str(landing), SampleSpec(records=2_000, keys=2_000, partitions=2, segments_per_partition=2, seed=5))
    consensus_url, blob = f"sqlite:///{tmp_path / 'c.db'}", tmp_path / "blob"
    env = cli_env(consensus_url, str(blob))
    init = subprocess.run([*UPSERTCTL, "init", "s", "--source", f"dir:{landing}", "--key", "id", "--schema",
                           SAMPLE_SCHEMA_DDL, "--json"], env=env, capture_output=True, text=True, timeout=300)
    assert init.returncode == 0, init.stderr
    # Its own process group, as a shell job is: Ctrl-C reaches the whole group.
    batch = subprocess.Popen([*HELD_WRITE_UPSERTCTL, "run-batch", "s", "--until-caught-up"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        # The write job has begun once its committer's `_temporary` directory exists.
        temporary = _wait_for(lambda: glob.glob(str(blob / "s" / "runs" / "ts=*" / "*" / "_temporary")), 300,
                              "_temporary directory of a batch's write job")
        running_ts = int(temporary[0].split("ts=")[1].split(os.sep)[0])
        spark_processes = _children(batch.pid)
        assert spark_processes, "the driver JVM runs as a child of upsertctl"
        os.killpg(batch.pid, signal.SIGINT)
        out, err = batch.communicate(timeout=120)
    finally:
        if batch.poll() is None:
            batch.kill()
            batch.wait()
    assert batch.returncode == 130, err
    assert err == "upsertctl: interrupted\n", err
    # The batch being written when Ctrl-C came is not committed.
    assert open_consensus(consensus_url).get_shard("s").upper == running_ts
    # The driver JVM goes with the process (it exits when its stdin closes).
    _wait_for(lambda: not any(_alive(pid) for pid in spark_processes), 60, "exit of the driver JVM")


def _raised(*types: type[BaseException]) -> BaseException:
    """An exception of ``types[-1]`` raised while handling one of ``types[-2]``, and so on."""
    def raise_from(index: int) -> None:
        if index == 0:
            raise types[0]()
        try:
            raise_from(index - 1)
        except BaseException:
            raise types[index]()

    try:
        raise_from(len(types) - 1)
    except BaseException as exc:
        return exc
    raise AssertionError("unreachable")


def test_only_py4j_reports_of_an_interrupt_are_dropped():
    import logging

    from airflow_upsert_provider.engine.spark.session import Py4JInterruptReports

    py4j_file = os.path.join("site-packages", "py4j", "clientserver.py")
    cases = [
        # (where the record comes from, its exception) -> kept?
        ((py4j_file, _raised(KeyboardInterrupt)), False),
        ((py4j_file, _raised(KeyboardInterrupt, BrokenPipeError)), False),  # closing the interrupted link
        ((py4j_file, _raised(KeyboardInterrupt, OSError, RuntimeError)), False),
        ((py4j_file, _raised(BrokenPipeError)), True),  # Py4J failing on its own is still reported
        ((py4j_file, None), True),
        ((os.path.join("airflow_upsert_provider", "x.py"), _raised(KeyboardInterrupt)), True),
    ]
    for (path, exc), kept in cases:
        exc_info = (type(exc), exc, exc.__traceback__) if exc is not None else None
        record = logging.LogRecord("py4j.clientserver", logging.ERROR, path, 1, "m", None, exc_info)
        assert Py4JInterruptReports.filter(record) is kept, (path, exc)
