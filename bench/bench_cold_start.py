"""Cold in-process task: settings of a new local Spark session against one fresh-process batch.

    .venv/bin/python bench/bench_cold_start.py --repeat 3            # 1M-row shard, 100k changes
    .venv/bin/python bench/bench_cold_start.py --rows 200000 --batch 20000 --repeat 1   # quick
    .venv/bin/python bench/bench_cold_start.py --only baseline,tiered1   # some candidates

One shard of about ``--rows`` keys is committed once (not measured) and ``--batch`` changes
land after it; that state (consensus file and blob root) is the template. Every sample copies
the template and runs one ``upsertctl run-batch --max-batches 1`` in a fresh process over the
copy, so every candidate does the same work on the same files: what an Airflow task with
Spark in its process pays. Candidates are rounds-robin interleaved (round 1 of each, then
round 2...), medians reported, each against ``baseline`` (the session settings before this
benchmark existed) measured in the same run. The last copy of every candidate is then read
and its table compared with the baseline's (row count and a sum of row hashes).

A candidate is a set of defaults for a new session: :data:`DEFAULT_CONF` entries and driver
JVM options (:data:`DRIVER_JAVA_OPTIONS`) that the sample process installs in
``engine.spark`` before ``upsertctl`` runs: a candidate replaces the defaults themselves,
which ``upsertctl --conf`` (settings added to them) and PYSPARK_SUBMIT_ARGS (which loses to
them) cannot. The log4j option the engine sets stays on every candidate.

The ``cds`` candidates use a class-data-sharing archive of the driver JVM: one unmeasured run
with ``-XX:ArchiveClassesAtExit=F`` writes it, later runs map it with
``-XX:SharedArchiveFile=F``. ``cds_missing`` points at a file that does not exist and
``cds_stale`` at an archive written by another classpath (checks that the JVM keeps working).
``engine_archive`` is the engine's own path: ``upsertctl spark-archive build`` (its generic
sample batch, not this shard's) into a state directory of the work directory, then the
engine's defaults, which add the archive's options themselves. Every other candidate runs
with ``UPSERT_CLASS_ARCHIVE=off``, so an archive built on this machine never leaks in.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from airflow_upsert_provider.engine.spark import session as engine_spark  # noqa: E402
from airflow_upsert_provider.sample_data import SAMPLE_SCHEMA_DDL, SampleSpec, generate  # noqa: E402

SHARD = "cold"
# The sample process: the candidate's defaults go into engine.spark, then upsertctl runs.
SAMPLE_PROCESS = """
import json, os, sys
from airflow_upsert_provider.engine.spark import session as spark
candidate = json.loads(os.environ["COLD_START_CANDIDATE"])
spark.DEFAULT_CONF.clear()
spark.DEFAULT_CONF.update(candidate["conf"])
spark.DRIVER_JAVA_OPTIONS = tuple(candidate["java"])
from airflow_upsert_provider.cli import main
sys.exit(main())
"""
# The session settings before this benchmark (the reference of every ratio).
BASELINE_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.sources.partitionOverwriteMode": "static",
    "spark.driver.memory": "2g",
}


def candidates(work: str) -> dict[str, dict]:
    """name -> {"conf": DEFAULT_CONF, "java": JVM options, "env": environment}; all start from
    the baseline."""
    archive = os.path.join(work, "driver.jsa")
    stale = os.path.join(work, "stale.jsa")

    def make(java: tuple[str, ...] = (), **conf: str) -> dict:
        return {"conf": {**BASELINE_CONF, **{k.replace("__", "."): v for k, v in conf.items()}}, "java": list(java),
                "env": {"UPSERT_CLASS_ARCHIVE": "off"}}

    shuffle = "spark__sql__shuffle__partitions"
    return {
        "baseline": make(),
        "adopted": {"conf": dict(engine_spark.DEFAULT_CONF), "java": list(engine_spark.DRIVER_JAVA_OPTIONS),
                    "env": {"UPSERT_CLASS_ARCHIVE": "off"}},
        "engine_archive": {"conf": dict(engine_spark.DEFAULT_CONF), "java": list(engine_spark.DRIVER_JAVA_OPTIONS),
                           "env": {"UPSERT_STATE_DIR": os.path.join(work, "state")}},
        "tiered1": make(("-XX:TieredStopAtLevel=1",)),
        "serialgc": make(("-XX:+UseSerialGC",)),
        "parallelgc": make(("-XX:+UseParallelGC",)),
        "cds": make((f"-XX:SharedArchiveFile={archive}",)),
        "cds_missing": make((f"-XX:SharedArchiveFile={os.path.join(work, 'missing.jsa')}",)),
        "cds_stale": make((f"-XX:SharedArchiveFile={stale}",)),
        "shuffle2": make(**{shuffle: "2"}),
        "shuffle4": make(**{shuffle: "4"}),
        "aqe_off": make(spark__sql__adaptive__enabled="false"),
        "wholestage_off": make(spark__sql__codegen__wholeStage="false"),
        "no_codegen": make(spark__sql__codegen__factoryMode="NO_CODEGEN"),
        "memory1g": make(spark__driver__memory="1g"),
        "memory4g": make(spark__driver__memory="4g"),
        "tiered1_serialgc": make(("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")),
        "tiered1_cds": make(("-XX:TieredStopAtLevel=1", f"-XX:SharedArchiveFile={archive}")),
        "tiered1_serialgc_cds": make(("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", f"-XX:SharedArchiveFile={archive}")),
    }


def clone_db(source: str, target: str) -> None:
    """A consistent copy of a SQLite file (its WAL included)."""
    with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
        src.backup(dst)
    dst.close()
    src.close()


def sample_env(base_env: dict[str, str], copy: str, candidate: dict) -> dict[str, str]:
    return {**base_env, "UPSERT_CONSENSUS_URL": f"sqlite:///{copy}/consensus.db",
            "UPSERT_BLOB_ROOT": os.path.join(copy, "blob"), "COLD_START_CANDIDATE": json.dumps(candidate),
            **candidate.get("env", {})}


def run_sample(template: str, copy: str, base_env: dict[str, str], candidate: dict,
               expect_rows: int) -> tuple[float, dict, str]:
    """Copy the template, run one batch in a fresh process: (wall seconds, JSON, stderr)."""
    shutil.rmtree(copy, ignore_errors=True)
    os.makedirs(copy)
    clone_db(os.path.join(template, "consensus.db"), os.path.join(copy, "consensus.db"))
    shutil.copytree(os.path.join(template, "blob"), os.path.join(copy, "blob"))
    env = sample_env(base_env, copy, candidate)
    argv = [sys.executable, "-c", SAMPLE_PROCESS, "run-batch", SHARD, "--max-batches", "1", "--json"]
    started = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"run-batch failed ({done.returncode}) with {candidate}: {done.stderr[-3000:]}")
    try:
        out = json.loads(done.stdout)
    except json.JSONDecodeError:
        raise SystemExit(f"run-batch stdout is not JSON with {candidate}: {done.stdout[-2000:]!r}") from None
    committed = [b for b in out["batches"] if b["outcome"] == "committed"]
    assert len(committed) == 1 and committed[0]["rows_in"] == expect_rows, out
    return seconds, committed[0], done.stderr


def table_digest(spark, copy: str) -> tuple[int, int]:
    """(rows, sum of a 64-bit hash of every row) of the copy's table."""
    from pyspark.sql import functions as F

    from airflow_upsert_provider.engine.blob.files import open_blob
    from airflow_upsert_provider.engine.store.registry import open_consensus
    from airflow_upsert_provider.engine.table.shard import Shard

    consensus = open_consensus(f"sqlite:///{copy}/consensus.db")
    try:
        frame = Shard.open(consensus, open_blob(os.path.join(copy, "blob")), SHARD).read(spark)
        row = frame.select(F.xxhash64(*frame.columns).cast("decimal(38,0)").alias("h")) \
            .agg(F.count("*").alias("n"), F.sum("h").alias("s")).collect()[0]
        return int(row["n"]), int(row["s"] or 0)
    finally:
        consensus.dispose()


def build_template(template: str, landing: str, base_env: dict[str, str], rows: int, batch: int) -> dict:
    """The shard with its base committed and ``batch`` changes pending (not measured)."""
    os.makedirs(template, exist_ok=True)
    env = {**base_env, "UPSERT_CONSENSUS_URL": f"sqlite:///{template}/consensus.db",
           "UPSERT_BLOB_ROOT": os.path.join(template, "blob"), "UPSERT_CLASS_ARCHIVE": "off"}
    upsertctl = [sys.executable, "-m", "airflow_upsert_provider.cli"]
    # Random keys: about 80% of the key space appears in 1.6 x rows records.
    generate(landing, SampleSpec(records=int(rows * 1.6), keys=rows, partitions=4, segments_per_partition=8,
                                 delete_ratio=0.0, seed=1))
    for argv in (["init", SHARD, "--source", f"dir:{landing}", "--key", "id", "--order-by", "updated_at",
                  "--delete-marker", "deleted", "--schema", SAMPLE_SCHEMA_DDL, "--max-files-per-batch", "1000"],
                 ["run-batch", SHARD, "--max-batches", "1"]):
        done = subprocess.run([*upsertctl, *argv, "--json"], env=env, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise SystemExit(f"upsertctl {argv[0]} failed: {done.stderr[-3000:]}")
    base = json.loads(done.stdout)["batches"][0]
    # 10% new keys, 2% deletes, a later clock than the base.
    generate(landing, SampleSpec(records=batch, keys=int(rows * 1.1), partitions=4, segments_per_partition=2,
                                 delete_ratio=0.02, first_seq=1000, seed=2))
    return base


def write_archives(work: str, template: str, base_env: dict[str, str], batch: int) -> dict[str, float]:
    """The class-data-sharing archives: ``driver.jsa`` from one unmeasured batch of this
    shard; ``stale.jsa`` from a JVM whose classpath differs (a JDK tool), to see what a
    stale archive does."""
    archive = os.path.join(work, "driver.jsa")
    dump = {"conf": BASELINE_CONF, "java": ["-Xlog:disable", f"-XX:ArchiveClassesAtExit={archive}"],
            "env": {"UPSERT_CLASS_ARCHIVE": "off"}}
    seconds, _, stderr = run_sample(template, os.path.join(work, "dump"), base_env, dump, batch)
    shutil.rmtree(os.path.join(work, "dump"), ignore_errors=True)
    if not os.path.exists(archive):
        raise SystemExit(f"the driver JVM wrote no archive at {archive}: {stderr[-2000:]}")
    stale = os.path.join(work, "stale.jsa")
    java = os.path.join(os.environ.get("JAVA_HOME") or os.path.dirname(os.path.dirname(shutil.which("java"))),
                        "bin", "java")
    subprocess.run([java, f"-XX:ArchiveClassesAtExit={stale}", "-cp", REPO, "-version"],
                   capture_output=True, timeout=120)
    return {"dump_run_seconds": round(seconds, 2), "archive_mb": round(os.path.getsize(archive) / 2**20, 1)}


def build_engine_archive(work: str, base_env: dict[str, str]) -> dict:
    """``upsertctl spark-archive build`` into the work directory's state directory (not measured
    against the candidates; its wall time is reported)."""
    env = {**base_env, "UPSERT_STATE_DIR": os.path.join(work, "state")}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "airflow_upsert_provider.cli", "spark-archive", "build", "--json"],
                          env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"upsertctl spark-archive build failed: {done.stderr[-3000:]}")
    out = json.loads(done.stdout)
    if not out["used"]:
        raise SystemExit(f"the built archive would not be used: {out}")
    return {"build_seconds": round(time.monotonic() - started, 2), "archive_mb": round(out["size"] / 2**20, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000, help="keys in the base table (about)")
    parser.add_argument("--batch", type=int, default=100_000, help="changes in the measured batch")
    parser.add_argument("--repeat", type=int, default=3, help="samples per candidate (median reported)")
    parser.add_argument("--only", default=None, help="comma-separated candidates (baseline always runs)")
    parser.add_argument("--work", default=None, help="work directory (default: a temporary one, removed)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    work = args.work or tempfile.mkdtemp(prefix="bench-cold-")
    os.makedirs(work, exist_ok=True)
    template, landing = os.path.join(work, "template"), os.path.join(work, "landing")
    base_env = {**os.environ, "PYTHONPATH": REPO}
    for key in ("UPSERT_SPARK_REMOTE", "UPSERT_SPARK_MASTER", "PYSPARK_SUBMIT_ARGS", "UPSERT_CLASS_ARCHIVE"):
        base_env.pop(key, None)
    chosen = candidates(work)
    if args.only:
        names = ["baseline", *[n for n in args.only.split(",") if n != "baseline"]]
        unknown = [n for n in names if n not in chosen]
        if unknown:
            raise SystemExit(f"unknown candidates {unknown}; known: {', '.join(chosen)}")
        chosen = {n: chosen[n] for n in names}
    results: dict = {"rows": args.rows, "batch": args.batch, "repeat": args.repeat, "load_before": os.getloadavg()}
    try:
        started = time.monotonic()
        base = build_template(template, landing, base_env, args.rows, args.batch)
        print(f"template: base of {base['rows_out']:,} rows committed in {time.monotonic() - started:.1f} s; "
              f"{args.batch:,} changes pending", flush=True)
        if any("SharedArchiveFile" in " ".join(c["java"]) for c in chosen.values()):
            results["archive"] = write_archives(work, template, base_env, args.batch)
            print(f"class-data-sharing archive: {results['archive']}", flush=True)
        if "engine_archive" in chosen:
            results["engine_archive"] = build_engine_archive(work, base_env)
            print(f"upsertctl spark-archive build: {results['engine_archive']}", flush=True)
        timings: dict[str, list[float]] = {name: [] for name in chosen}
        steps: dict[str, list[float]] = {name: [] for name in chosen}
        warnings: dict[str, str] = {}
        for attempt in range(args.repeat):
            for name, candidate in chosen.items():
                seconds, batch, stderr = run_sample(template, os.path.join(work, "runs", name), base_env, candidate,
                                                    args.batch)
                timings[name].append(seconds)
                steps[name].append(batch["seconds"])
                if stderr.strip():
                    warnings[name] = stderr.strip()[-500:]
                print(f"round {attempt + 1}/{args.repeat} {name}: {seconds:.2f} s (batch step {batch['seconds']:.2f} s)",
                      flush=True)
        results["load_after"] = os.getloadavg()

        from airflow_upsert_provider.engine.spark.session import get_spark

        spark = get_spark("local[2]")
        digests = {name: table_digest(spark, os.path.join(work, "runs", name)) for name in chosen}
        baseline = statistics.median(timings["baseline"])
        results["candidates"] = {
            name: {"wall": round(statistics.median(timings[name]), 2), "samples": [round(s, 2) for s in timings[name]],
                   "batch_step": round(statistics.median(steps[name]), 2),
                   "ratio": round(statistics.median(timings[name]) / baseline, 3),
                   "table_equal": digests[name] == digests["baseline"], "rows": digests[name][0],
                   "java": chosen[name]["java"],
                   "conf": {k: v for k, v in chosen[name]["conf"].items() if BASELINE_CONF.get(k) != v},
                   "stderr": warnings.get(name, "")}
            for name in chosen
        }
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(results))
        return
    print(f"table {results['candidates']['baseline']['rows']:,} rows after the batch, batch {args.batch:,} changes, "
          f"{args.repeat} samples each; load average {results['load_before'][0]:.2f} before, "
          f"{results['load_after'][0]:.2f} after")
    print("| candidate | task wall, median (s) | samples (s) | batch step (s) | vs baseline | table equal | stderr |")
    print("|---|---:|---|---:|---:|---|---|")
    for name, row in results["candidates"].items():
        print(f"| {name} | {row['wall']} | {', '.join(map(str, row['samples']))} | {row['batch_step']} | "
              f"{row['ratio']:.3f}x | {row['table_equal']} | {row['stderr'][:120]!r} |")
    for name, row in results["candidates"].items():
        print(f"{name}: java {row['java']} conf {row['conf']}")


if __name__ == "__main__":
    main()
