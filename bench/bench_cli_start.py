"""What a light `upsertctl` command costs in a fresh process, as a task or a shell runs it.

    .venv/bin/python bench/bench_cli_start.py --repeat 7

Two pairs, each measured round-robin in the same run (A then B, --repeat times), medians and
the A/B ratio per pair reported:

- ``init``: ``upsertctl init --schema`` with a plain column list (parsed without Spark)
  against the same init whose schema has a bare TIMESTAMP column (left to Spark's parser, so
  the process starts a local Spark session for it): the cost of a JVM start at init.
- ``open``: ``upsertctl status --no-rows`` (opens the store, no Spark) against the same
  command in a process that imports Alembic first, as every open did before it stopped
  needing Alembic: the cost of that import on every process that opens a store.

Every sample is a new Python process on a copy-free SQLite store of its own (init) or one
shared store (status), with the suite's usual local settings (SPARK_LOCAL_IP=127.0.0.1).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from airflow_upsert_provider.sample_data import SAMPLE_SCHEMA_DDL, SampleSpec, generate  # noqa: E402

# The same columns, the order column a TIMESTAMP: outside the plain subset, so Spark parses it.
SPARK_PARSED_DDL = "id BIGINT, name STRING, amount DOUBLE, updated_at TIMESTAMP, deleted BOOLEAN"
CLI = "from airflow_upsert_provider.cli import main; raise SystemExit(main(sys.argv[1:]))"
WITH_ALEMBIC = "import alembic.command, alembic.config, alembic.script; " + CLI


def timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:6])} ... exited {done.returncode}: {done.stderr[-2000:]}")
    return elapsed


def python(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", "import sys; " + code, *args]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7, help="samples of each command (median reported)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="bench-cli-start-")
    try:
        landing = os.path.join(work, "landing")
        generate(landing, SampleSpec(records=200, keys=50, partitions=1, segments_per_partition=1))
        env = dict(os.environ, SPARK_LOCAL_IP=os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"))
        env.pop("UPSERT_CONSENSUS_URL", None)
        env.pop("UPSERT_BLOB_ROOT", None)
        blob = os.path.join(work, "blob")
        os.makedirs(blob)

        def init_argv(n: int, ddl: str) -> list[str]:
            return python(CLI, "--consensus", f"sqlite:///{work}/init-{n}.db", "--blob-root", blob, "init",
                          f"s{n}", "--source", f"dir:{landing}", "--key", "id", "--schema", ddl)

        shared = f"sqlite:///{work}/shared.db"
        timed(python(CLI, "--consensus", shared, "--blob-root", blob, "init", "shared", "--source",
                     f"dir:{landing}", "--key", "id", "--schema", SAMPLE_SCHEMA_DDL), env)
        status = ["--consensus", shared, "--blob-root", blob, "status", "shared", "--no-rows", "--json"]

        samples: dict[str, list[float]] = {k: [] for k in ("init_plain", "init_spark", "open", "open_alembic")}
        n = 0
        for round_no in range(args.repeat):
            for name, argv in (("init_plain", init_argv(n, SAMPLE_SCHEMA_DDL)),
                               ("init_spark", init_argv(n + 1, SPARK_PARSED_DDL)),
                               ("open", python(CLI, *status)),
                               ("open_alembic", python(WITH_ALEMBIC, *status))):
                samples[name].append(timed(argv, env))
            n += 2
            print(f"round {round_no + 1}/{args.repeat}: " + ", ".join(
                f"{k} {v[-1]:.2f} s" for k, v in samples.items()), file=sys.stderr, flush=True)

        medians = {k: statistics.median(v) for k, v in samples.items()}
        figures = {
            "repeat": args.repeat,
            "median_seconds": {k: round(v, 3) for k, v in medians.items()},
            "range_seconds": {k: [round(min(v), 3), round(max(v), 3)] for k, v in samples.items()},
            "init_plain_vs_spark": round(medians["init_plain"] / medians["init_spark"], 3),
            "open_vs_open_importing_alembic": round(medians["open"] / medians["open_alembic"], 3),
        }
        if args.json:
            print(json.dumps(figures, indent=2))
            return
        print(f"fresh process, median of {args.repeat} (min-max):")
        for name, label in (("init_plain", "init, plain --schema (no Spark)"),
                            ("init_spark", "init, --schema Spark parses (baseline)"),
                            ("open", "status --no-rows"),
                            ("open_alembic", "status --no-rows, Alembic imported (baseline)")):
            low, high = figures["range_seconds"][name]
            print(f"  {label:<48} {medians[name]:6.2f} s  ({low:.2f}-{high:.2f})")
        print(f"  init: {figures['init_plain_vs_spark']}x the baseline; "
              f"open: {figures['open_vs_open_importing_alembic']}x the baseline")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
