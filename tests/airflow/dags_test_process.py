"""One Airflow process that runs `airflow dags test` commands one at a time, on the test's word.

Each line on stdin is one command's arguments as a JSON list (``["dags", "test", DAG_ID, ...]``);
the process runs it through Airflow's own CLI parser and command, as ``airflow`` would, then
writes :data:`END` and the command's exit code on a line of its own and waits for the next.
stdin's end ends the process. The test asserts on the shard and on the metadata database
between two commands, as it would between two ``airflow`` processes; the commands share what a
process start costs (importing Airflow, about 8 s of CPU) and the Spark driver JVM, which a
stopped session leaves running for the next task's session.
"""

from __future__ import annotations

import json
import sys
import traceback

# A record separator: no log line of Airflow, Spark or the engine holds one.
END = "\x1edags test ended, exit"


def _exit_code(exc: SystemExit) -> int:
    """What the interpreter would exit with, writing a message code to stderr as it does."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def main() -> None:
    from airflow.cli import cli_parser
    from airflow.configuration import write_default_airflow_configuration_if_needed

    write_default_airflow_configuration_if_needed()
    parser = cli_parser.get_parser()
    for line in sys.stdin:
        argv = json.loads(line)
        if argv[:2] != ["dags", "test"]:
            raise SystemExit(f"not a dags test command: {argv}")
        try:
            args = parser.parse_args(argv)
            args.func(args)
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc)
        except Exception:  # noqa: BLE001 - as the interpreter would: the traceback, exit 1
            traceback.print_exc()
            code = 1
        sys.stderr.flush()
        print(f"{END} {code}", flush=True)


if __name__ == "__main__":
    main()
