"""Keep the task logs of an `airflow dags test` run where the Airflow UI reads them.

`airflow dags test` runs each task inside its own process and prints the task's log to the
console with everything else; it writes no task log file, so the UI finds nothing to show
for the run ("Could not read served logs"). This module takes that console output, cuts it
into one block per task try (Airflow marks each with "[DAG TEST] starting task_id=..." and
"[DAG TEST] end task task_id=..."), and writes each block, one JSON record per line as
Airflow's own task logs are, to the file Airflow's file task handler reads for that try:
``<base_log_folder>/dag_id=D/run_id=R/task_id=T/[map_index=M/]attempt=N.log`` (Airflow's
default ``log_filename_template``).
"""

from __future__ import annotations

import json
import os
import re

_START = re.compile(r"\[DAG TEST\] starting task_id=(?P<task_id>\S+) map_index=(?P<map_index>-?\d+)")
_END = re.compile(r"\[DAG TEST\] end task task_id=(?P<task_id>\S+) map_index=(?P<map_index>-?\d+)")
# A console record: "2026-11-23T13:16:16.597430Z [info     ] message [logger] key=value ..."
_RECORD = re.compile(r"^(?P<timestamp>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z) \[(?P<level>\w+)\s*\] (?P<event>.*)$")
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
# Its message, padded, then "[logger]", then key=value pairs.
_EVENT = re.compile(r"^(?P<message>.*?)\s*\[(?P<logger>[A-Za-z_][\w.]*)\](?P<fields>(?: \S+=.*)?)$")


def task_log_path(log_folder: str, dag_id: str, run_id: str, task_id: str, map_index: int, attempt: int) -> str:
    """Where Airflow's default ``log_filename_template`` puts the log of one task try."""
    mapped = f"map_index={map_index}" if map_index >= 0 else ""
    return os.path.join(
        log_folder, f"dag_id={dag_id}", f"run_id={run_id}", f"task_id={task_id}", mapped, f"attempt={attempt}.log"
    )


def _as_record(line: str) -> dict[str, str]:
    match = _RECORD.match(line)
    if match is None:
        # Output that is not a log record (a print, Spark's own output, a traceback line).
        return {"event": line}
    record = {"timestamp": match["timestamp"], "level": match["level"], "event": match["event"]}
    event = _EVENT.match(match["event"])
    if event is not None:
        record.update(event=event["message"] + event["fields"], logger=event["logger"])
    return record


def save_task_logs(output: str, log_folder: str, dag_id: str, run_id: str) -> list[str]:
    """Write the log of every task try found in ``output`` (the console output of one
    ``airflow dags test`` run of ``dag_id``, run ``run_id``); return the files written.
    Tries of one task are numbered from 1 in the order they ran."""
    written: list[str] = []
    attempts: dict[tuple[str, int], int] = {}
    block: list[str] | None = None
    key: tuple[str, int] | None = None
    for raw in output.splitlines():
        line = _COLOUR.sub("", raw)
        started = _START.search(line)
        if started:
            key = (started["task_id"], int(started["map_index"]))
            block = [line]
            continue
        if block is None or key is None:
            continue
        block.append(line)
        ended = _END.search(line)
        if ended and (ended["task_id"], int(ended["map_index"])) == key:
            attempts[key] = attempts.get(key, 0) + 1
            path = task_log_path(log_folder, dag_id, run_id, key[0], key[1], attempts[key])
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w", encoding="utf-8") as handle:
                for entry in block:
                    if entry.strip():
                        handle.write(json.dumps(_as_record(entry)) + "\n")
            written.append(path)
            block, key = None, None
    return written
