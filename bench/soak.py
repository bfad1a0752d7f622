"""Soak: one shard as it lives for months, on PostgreSQL, with racing writers killed at random.

One shard reads a landing directory that a feeder keeps appending segments to (updates and
deletes of overlapping keys). Beside it, all at once, until the shard holds ``--batches``
batches:

  writers      ``--writers`` OS processes, each ``upsertctl run-batch --continuous`` (one warm
               JVM per writer), racing for every batch; every ``--kill-every`` batches or so
               (drawn from ``--seed``) one of them, chosen at random, is SIGKILLed with its
               JVM and started again (a new writer id: a new try)
  maintenance  one process at a time, on a batch schedule: ``upsertctl compact`` every
               ``--compact-every`` batches, ``checkpoint create --keep-last`` every
               ``--checkpoint-every``, ``gc --grace`` every ``--gc-every``
  monitor      the frontier sensor's evaluation round (observe, record, evaluate the stall
               rules, advance the alert state, take pages) every ``--observe-every`` seconds;
               any page decided is a failure: no false page

Then the feeder stops, the writers catch up to the end of the source, ``upsertctl stream
stop`` stops them (each must exit 0), a final compaction and ``gc --grace 0`` run, and the
soak checks: the table (``upsertctl read``) equals the oracle computed from the source files;
no page; no leaked file (every file under the shard's blob directory is named by the live
state or a retained checkpoint); every batch committed once (contiguous batches and bindings
in consensus, and no ts reported committed by two writer processes or twice by one).

It reports the consensus store's size (``upsertctl db status --json``) and the per-batch time
(median and p95 of the committed batches' own seconds, as the writers print them) at the
start and at the end, the SIGKILLs, batches, compactions, checkpoints, GCs and wall time, as a
table and as JSON (``bench/results/soak-<time>.json`` by default).

    .venv/bin/python bench/soak.py [--batches 10000] [--writers 3] [--kill-every 300] [--seed 1]

Without ``--consensus`` a throwaway PostgreSQL server is started (tests/pgserver.py) and
removed at the end. Exit 0 when every check held, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from airflow_upsert_provider.sample_data import SAMPLE_SCHEMA_DDL, write_segment  # noqa: E402

SHARD = "soak"
PARTITIONS = ("p0", "p1")
# A committed batch as a writer prints it (cli/shard.py cmd_run_batch).
BATCH_LINE = re.compile(r"^batch ts=(\d+) (\w+): .*, ([0-9.]+)s; ")


@dataclass
class SoakOptions:
    """What to run. Batch counts are in batches of the shard (its upper)."""

    batches: int = 10_000
    writers: int = 3
    kill_every: int = 300
    seed: int = 1
    compact_every: int = 250
    checkpoint_every: int = 500
    keep_last: int = 2
    gc_every: int = 500
    # The monitor DAG's history retention (`upsertctl frontier prune`, its default settings).
    prune_every: int = 500
    # GC on its schedule keeps files younger than this (a writer still staging); the final GC
    # runs with grace 0 once every writer has stopped.
    gc_grace_seconds: float = 120.0
    observe_every_seconds: float = 5.0
    # The monitor's stall rule: stalled after max(3 x cadence, min_stall) with records pending
    # and the upper unmoved. A SIGKILLed writer's peers keep committing, so the upper never
    # waits for a restart; the threshold covers a compaction's or a JVM start's worst pause
    # on a loaded machine.
    cadence_seconds: float = 20.0
    min_stall_seconds: float = 180.0
    records_per_segment: int = 20
    keys: int = 2_000
    delete_ratio: float = 0.1
    max_files_per_batch: int = 2
    # Segments per partition the feeder keeps written beyond what is bound: the writers always
    # have a batch to take, and the source never runs away from them.
    ahead: int = 4
    # Batches per window of the start and end figures.
    window: int = 100
    progress_seconds: float = 30.0
    # Stop feeding after this many minutes even if the shard holds fewer batches (0: no limit);
    # the report says which ended the run.
    max_minutes: float = 0.0
    spark_master: str = "local[1]"
    workdir: str | None = None
    consensus_url: str | None = None
    out: str | None = None
    keep_workdir: bool = False


@dataclass
class SoakReport:
    options: dict[str, Any]
    checks: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    workdir: str = ""

    @property
    def ok(self) -> bool:
        return not self.failures


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def window_figures(seconds_by_ts: dict[int, float], first: int, last: int) -> dict[str, Any]:
    """Median and p95 of the committed batches' own seconds for ts in [first, last)."""
    values = [s for ts, s in seconds_by_ts.items() if first <= ts < last]
    return {
        "from_ts": first, "to_ts": last, "batches": len(values),
        "median_seconds": None if not values else round(statistics.median(values), 3),
        "p95_seconds": None if not values else round(percentile(values, 0.95), 3),
    }


def parse_writer_log(path: str) -> list[tuple[int, str, float]]:
    """(ts, outcome, seconds) of every batch line a writer printed."""
    out = []
    with open(path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            m = BATCH_LINE.match(line)
            if m:
                out.append((int(m.group(1)), m.group(2), float(m.group(3))))
    return out


class Feeder:
    """Appends segments to the landing directory, ``ahead`` per partition beyond what the shard
    has bound. The order column is a counter that never repeats, so that no two records of a
    key tie in it: the oracle needs no model of how the engine batches."""

    def __init__(self, landing: str, opts: SoakOptions) -> None:
        self.landing = landing
        self.opts = opts
        self.rng = random.Random(opts.seed)
        self.clock = 0
        self.written = {p: 0 for p in PARTITIONS}  # next seq per partition

    def write_one(self, partition: str) -> None:
        lines = []
        for _ in range(self.opts.records_per_segment):
            self.clock += 1
            key = self.rng.randrange(self.opts.keys)
            deleted = self.rng.random() < self.opts.delete_ratio
            lines.append(json.dumps({
                "id": key,
                "name": None if deleted else f"name-{key}-{self.rng.randrange(1000)}",
                "amount": None if deleted else round(self.rng.uniform(0, 1000), 2),
                "updated_at": self.clock,
                "deleted": deleted,
            }))
        seq = self.written[partition]
        write_segment(os.path.join(self.landing, partition, f"{seq:020d}.jsonl"), lines)
        self.written[partition] = seq + 1

    def top_up(self, bound: dict[str, int]) -> int:
        """Write what keeps ``ahead`` segments unbound per partition; return how many."""
        wrote = 0
        for p in PARTITIONS:
            while self.written[p] < bound.get(p, 0) + self.opts.ahead:
                self.write_one(p)
                wrote += 1
        return wrote


class Soak:
    def __init__(self, opts: SoakOptions) -> None:
        self.opts = opts
        self.rng = random.Random(opts.seed + 1)
        self.workdir = opts.workdir or tempfile.mkdtemp(prefix="upsert-soak-")
        os.makedirs(self.workdir, exist_ok=True)
        self.landing = os.path.join(self.workdir, "landing")
        self.blob_root = os.path.join(self.workdir, "blob")
        self.logs = os.path.join(self.workdir, "logs")
        os.makedirs(self.logs, exist_ok=True)
        self.pg_server = None
        self.url = opts.consensus_url
        self.report = SoakReport(options=asdict(opts), workdir=self.workdir)
        self.failures = self.report.failures
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.procs: dict[int, subprocess.Popen] = {}
        self.incarnation = {i: 0 for i in range(opts.writers)}
        self.writer_logs: list[str] = []
        self.counts = {"sigkills": 0, "writer_starts": 0, "compactions": 0, "checkpoints": 0, "gcs": 0,
                       "prunes": 0, "monitor_rounds": 0, "segments": 0}
        self.maintenance: list[dict[str, Any]] = []
        self.statuses: dict[str, int] = {}
        self.pages: list[dict[str, Any]] = []
        self.max_breaches = 0

    # -- processes ----------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            UPSERT_CONSENSUS_URL=self.url,
            UPSERT_BLOB_ROOT=self.blob_root,
            UPSERT_SPARK_MASTER=self.opts.spark_master,
            SPARK_LOCAL_IP=env.get("SPARK_LOCAL_IP", "127.0.0.1"),
            PYTHONPATH=REPO + os.pathsep + env.get("PYTHONPATH", ""),
        )
        return env

    def upsertctl(self, *argv: str, timeout: float = 1800) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "airflow_upsert_provider.cli", *argv], env=self.env(),
                              capture_output=True, text=True, timeout=timeout)

    def start_writer(self, slot: int) -> None:
        self.incarnation[slot] += 1
        writer_id = f"soak-w{slot}-{self.incarnation[slot]}"
        path = os.path.join(self.logs, f"{writer_id}.log")
        self.writer_logs.append(path)
        with open(path, "w") as log:
            # A session of its own: a SIGKILL takes the writer's whole group, its JVM with it.
            self.procs[slot] = subprocess.Popen(
                [sys.executable, "-m", "airflow_upsert_provider.cli", "run-batch", SHARD, "--continuous",
                 "--for", "24h", "--writer-id", writer_id],
                env=self.env(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.counts["writer_starts"] += 1

    def kill_writer(self, slot: int) -> None:
        proc = self.procs[slot]
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=120)
        self.counts["sigkills"] += 1

    def check_writers(self) -> None:
        """A writer that exited by itself before the end is a failure; it is started again."""
        for slot, proc in self.procs.items():
            code = proc.poll()
            if code is not None:
                self.fail(f"writer {os.path.basename(self.writer_logs_of(slot))} exited {code} on its own: "
                          + self.tail(self.writer_logs_of(slot)))
                self.start_writer(slot)

    def writer_logs_of(self, slot: int) -> str:
        return os.path.join(self.logs, f"soak-w{slot}-{self.incarnation[slot]}.log")

    @staticmethod
    def tail(path: str, chars: int = 1500) -> str:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()[-chars:]

    def fail(self, message: str) -> None:
        with self.lock:
            self.failures.append(message)
        print(f"soak: FAILURE: {message}", file=sys.stderr, flush=True)

    # -- the shard ----------------------------------------------------------------------------

    def open_shard(self):
        from airflow_upsert_provider.engine.blob.files import open_blob
        from airflow_upsert_provider.engine.store.registry import open_consensus
        from airflow_upsert_provider.engine.table.shard import Shard

        consensus = open_consensus(self.url)
        return Shard.open(consensus, open_blob(self.blob_root), SHARD)

    def db_status(self) -> dict[str, Any]:
        done = self.upsertctl("db", "status", "--json", timeout=300)
        if done.returncode != 0:
            self.fail(f"db status exited {done.returncode}: {done.stdout[-500:]} {done.stderr[-500:]}")
            return {}
        status = json.loads(done.stdout)
        return {"total_bytes": status.get("total_bytes", status.get("file_bytes")),
                "rows": {name: t["rows"] for name, t in status["tables"].items()},
                "bytes": {name: t["bytes"] for name, t in status["tables"].items()}}

    # -- loops --------------------------------------------------------------------------------

    def feeder_loop(self, feeder: Feeder, shard, feeding: threading.Event) -> None:
        try:
            while feeding.is_set() and not self.stop_event.is_set():
                bound = shard.bound_offsets(shard.state().upper)
                wrote = feeder.top_up(bound)
                self.counts["segments"] += wrote
                time.sleep(0.2)
        except Exception as exc:  # noqa: BLE001 - a dead feeder would stall the soak silently
            self.fail(f"feeder: {type(exc).__name__}: {exc}")

    def maintenance_loop(self, shard) -> None:
        opts = self.opts
        due = {"compact": opts.compact_every, "checkpoint": opts.checkpoint_every, "gc": opts.gc_every,
               "prune": opts.prune_every}
        every = dict(due)
        commands = {
            "compact": ("compact", SHARD, "--json"),
            "checkpoint": ("checkpoint", "create", SHARD, "--keep-last", str(opts.keep_last), "--json"),
            "gc": ("gc", SHARD, "--grace", str(opts.gc_grace_seconds), "--json"),
            "prune": ("frontier", "prune", "--json"),
        }
        counter = {"compact": "compactions", "checkpoint": "checkpoints", "gc": "gcs", "prune": "prunes"}
        while not self.stop_event.is_set():
            upper = shard.state().upper
            ran = False
            for kind in ("compact", "checkpoint", "gc", "prune"):
                if upper >= due[kind] and not self.stop_event.is_set():
                    self.run_maintenance(kind, commands[kind], upper)
                    self.counts[counter[kind]] += 1
                    due[kind] = upper + every[kind]
                    ran = True
            if not ran:
                self.stop_event.wait(1.0)

    def run_maintenance(self, kind: str, argv: tuple[str, ...], upper: int) -> dict[str, Any]:
        started = time.monotonic()
        done = self.upsertctl(*argv)
        entry = {"kind": kind, "at_upper": upper, "exit": done.returncode,
                 "seconds": round(time.monotonic() - started, 2)}
        self.maintenance.append(entry)
        if done.returncode != 0:
            self.fail(f"{kind} at upper {upper} exited {done.returncode}: {done.stdout[-800:]} {done.stderr[-800:]}")
        return entry

    def monitor_loop(self, shard) -> None:
        from airflow_upsert_provider.engine.frontier import observations
        from airflow_upsert_provider.engine.frontier.model import StallSettings

        settings = StallSettings(cadence_seconds=self.opts.cadence_seconds,
                                 min_stall_seconds=self.opts.min_stall_seconds,
                                 window_seconds=max(900.0, 2 * self.opts.min_stall_seconds))

        def compose_page(evaluation, state, action) -> dict:
            return {"action": action, "status": getattr(evaluation.status, "value", evaluation.status),
                    "reasons": list(evaluation.reasons)}

        while not self.stop_event.is_set():
            try:
                round_ = observations.evaluate_shard(shard.consensus, shard.blob, SHARD, settings,
                                                     observer="soak-monitor", compose_page=compose_page)
                self.counts["monitor_rounds"] += 1
                status = getattr(round_.evaluation.status, "value", round_.evaluation.status)
                self.statuses[status] = self.statuses.get(status, 0) + 1
                self.max_breaches = max(self.max_breaches, round_.state.consecutive_breaches)
                if round_.action is not None or round_.pages or round_.state.firing:
                    page = {"action": round_.action, "status": status, "at": time.time(),
                            "reasons": list(round_.evaluation.reasons)}
                    self.pages.append(page)
                    self.fail(f"the monitor paged: {page}")
            except Exception as exc:  # noqa: BLE001 - a monitor that cannot evaluate is blind
                self.fail(f"monitor round: {type(exc).__name__}: {exc}")
            self.stop_event.wait(self.opts.observe_every_seconds)

    # -- the run ------------------------------------------------------------------------------

    def run(self) -> SoakReport:
        wall_started = time.monotonic()
        try:
            self._run()
        finally:
            self.stop_event.set()
            for slot, proc in self.procs.items():
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=60)
            self.report.figures["wall_seconds"] = round(time.monotonic() - wall_started, 1)
            if self.pg_server is not None:
                self.pg_server.stop()
        return self.report

    def _run(self) -> None:
        opts = self.opts
        if self.url is None:
            from tests.pgserver import PostgresServer

            self.pg_server = PostgresServer().start()
            self.url = self.pg_server.create_database("soak")
        feeder = Feeder(self.landing, opts)
        feeder.top_up({})
        created = self.upsertctl("init", SHARD, "--source", f"dir:{self.landing}", "--key", "id",
                                 "--order-by", "updated_at", "--delete-marker", "deleted", "--schema",
                                 SAMPLE_SCHEMA_DDL, "--buckets", "2",
                                 "--max-files-per-batch", str(opts.max_files_per_batch), "--json")
        if created.returncode != 0:
            raise RuntimeError(f"upsertctl init exited {created.returncode}: {created.stderr[-2000:]}")
        shard = self.open_shard()
        self.report.figures["consensus_at_start"] = self.db_status()

        feeding = threading.Event()
        feeding.set()
        threads = [
            threading.Thread(target=self.feeder_loop, args=(feeder, shard, feeding), name="feeder", daemon=True),
            threading.Thread(target=self.maintenance_loop, args=(shard,), name="maintenance", daemon=True),
            threading.Thread(target=self.monitor_loop, args=(shard,), name="monitor", daemon=True),
        ]
        for slot in range(opts.writers):
            self.start_writer(slot)
        for thread in threads:
            thread.start()

        started = time.monotonic()
        next_kill = self.next_kill(0)
        next_progress = started + opts.progress_seconds
        window_status_taken = False
        while True:
            upper = shard.state().upper
            if upper >= opts.batches and self.scheduled_maintenance_ran():
                self.report.figures["ended_by"] = "batches"
                break
            if opts.max_minutes and time.monotonic() - started >= opts.max_minutes * 60:
                self.report.figures["ended_by"] = f"time limit of {opts.max_minutes:g} minutes"
                break
            if not window_status_taken and upper >= opts.window:
                # The store after the first window, beside the start's figures.
                self.report.figures["consensus_after_first_window"] = self.db_status()
                window_status_taken = True
            if upper >= next_kill:
                slot = self.rng.randrange(opts.writers)
                self.kill_writer(slot)
                print(f"soak: SIGKILL writer soak-w{slot}-{self.incarnation[slot]} at upper {upper}", flush=True)
                self.start_writer(slot)
                next_kill = self.next_kill(upper)
            self.check_writers()
            now = time.monotonic()
            if now >= next_progress:
                self.progress(upper, now - started)
                next_progress = now + opts.progress_seconds
            time.sleep(0.5)

        # The end: the source stops growing, the writers catch up to its end, then stop.
        feeding.clear()
        threads[0].join(timeout=60)
        written = dict(feeder.written)
        deadline = time.monotonic() + 1800
        while time.monotonic() < deadline:
            state = shard.state()
            if shard.bound_offsets(state.upper) == written and shard.binding(state.upper) is None:
                break
            self.check_writers()
            time.sleep(0.5)
        else:
            self.fail(f"the writers did not catch up to the source's end {written} in 30 minutes")
        self.progress(shard.state().upper, time.monotonic() - started)
        self.stop_event.set()  # maintenance and monitor: their round in hand ends, no other starts
        for thread in threads[1:]:
            thread.join(timeout=1800)
        stopped = self.upsertctl("stream", "stop", SHARD, "--reason", "soak ends", "--drain", "600", timeout=900)
        if stopped.returncode != 0:
            self.fail(f"stream stop exited {stopped.returncode}: {stopped.stderr[-1000:]}")
        for slot, proc in self.procs.items():
            try:
                code = proc.wait(timeout=600)
            except subprocess.TimeoutExpired:
                code = None
            if code != 0:
                self.fail(f"writer soak-w{slot}-{self.incarnation[slot]} did not stop cleanly (exit {code}): "
                          + self.tail(self.writer_logs_of(slot)))
        self.report.figures["batches_seen_by_end"] = shard.state().upper

        final_compact = self.run_maintenance("compact", ("compact", SHARD, "--json"), shard.state().upper)
        final_gc = self.run_maintenance("gc", ("gc", SHARD, "--grace", "0", "--json"), shard.state().upper)
        self.counts["compactions"] += 1
        self.counts["gcs"] += 1
        self.report.figures["final_maintenance"] = [final_compact, final_gc]
        self.check(shard, written)

    def scheduled_maintenance_ran(self) -> bool:
        """Whether every kind of maintenance due within the soak's batches ran at least once
        beside the writers (on a fast machine the writers outrun a compaction's JVM start)."""
        opts = self.opts
        due = {kind for kind, every in (("compact", opts.compact_every), ("checkpoint", opts.checkpoint_every),
                                        ("gc", opts.gc_every), ("prune", opts.prune_every)) if every <= opts.batches}
        return due <= {m["kind"] for m in self.maintenance}

    def next_kill(self, upper: int) -> int:
        k = self.opts.kill_every
        return upper + self.rng.randint(max(1, k // 2), max(1, k + k // 2))

    def progress(self, upper: int, elapsed: float) -> None:
        c = self.counts
        print(f"soak: {elapsed:7.0f}s upper {upper}/{self.opts.batches} "
              f"({upper / max(elapsed, 1e-9) * 60:.1f} batches/min) kills {c['sigkills']} "
              f"compactions {c['compactions']} checkpoints {c['checkpoints']} gcs {c['gcs']} "
              f"monitor {c['monitor_rounds']} rounds {self.statuses} pages {len(self.pages)} "
              f"failures {len(self.failures)}", flush=True)

    # -- the checks ---------------------------------------------------------------------------

    def check(self, shard, written: dict[str, int]) -> None:
        from tests.oracle import oracle_table

        checks = self.report.checks
        state = shard.state()
        checks["upper"] = state.upper
        checks["since"] = state.since

        # The table equals the oracle of every segment written. Read without Spark (the Arrow
        # reader, which tests/test_arrow_reader_spark.py holds equal to Spark's): a JVM start
        # less at the end of every soak.
        out = os.path.join(self.workdir, "table.parquet")
        read = self.upsertctl("read", SHARD, "--format", "parquet", "--out", out)
        if read.returncode != 0:
            self.fail(f"read exited {read.returncode}: {read.stderr[-1000:]}")
            checks["table_equals_oracle"] = False
        else:
            import pyarrow.parquet as pq

            table = {(row["id"],): row for row in pq.read_table(out).to_pylist()}
            expected = oracle_table(self.landing)
            checks["table_rows"] = len(table)
            checks["table_equals_oracle"] = table == expected
            if table != expected:
                differ = sorted(k for k in set(table) | set(expected) if table.get(k) != expected.get(k))
                self.fail(f"the table differs from the oracle on {len(differ)} key(s), first {differ[:5]}")
        checks["segments_written"] = written
        checks["all_segments_bound"] = shard.bound_offsets(state.upper) == written

        # No page.
        from airflow_upsert_provider.engine.frontier.observations import load_alert_state

        alert, _ = load_alert_state(shard.consensus, SHARD)
        checks["pages"] = len(self.pages)
        checks["alert_pages_sent"] = alert.pages_sent
        checks["alert_firing"] = alert.firing
        checks["monitor_statuses"] = dict(self.statuses)
        checks["max_consecutive_breaches"] = self.max_breaches
        if alert.firing or alert.outbox:
            self.fail(f"the alert state is firing or holds pages: {alert.to_dict()}")

        # Every batch committed once.
        self.check_exactly_once(shard, checks)

        # No leaked file.
        try:
            leaked, missing = leaked_and_missing_files(shard)
        except Exception as exc:  # noqa: BLE001 - the figures below are still reported
            self.fail(f"the leak check failed: {type(exc).__name__}: {exc}")
            leaked, missing = ["(not checked)"], []
        checks["leaked_files"] = len(leaked)
        checks["missing_files"] = len(missing)
        runs_root = shard.blob.path(SHARD, "runs")
        # GC removes an empty ts=/since= directory once it is older than its grace: the last
        # GC's own leave the run with it (not files: reported, not counted as leaks).
        checks["empty_group_directories"] = sum(
            1 for g in os.listdir(runs_root) if not os.listdir(os.path.join(runs_root, g))) if os.path.isdir(runs_root) else 0
        if leaked:
            self.fail(f"{len(leaked)} file(s) under the shard's blob are referenced by nothing, first {leaked[:5]}")
        if missing:
            self.fail(f"{len(missing)} referenced file(s) are missing, first {missing[:5]}")

        # Figures.
        seconds: dict[int, float] = {}
        for path in self.writer_logs:
            for ts, outcome, secs in parse_writer_log(path):
                if outcome == "committed":
                    seconds[ts] = secs
        w = self.opts.window
        figures = self.report.figures
        figures["per_batch_at_start"] = window_figures(seconds, 0, w)
        figures["per_batch_at_end"] = window_figures(seconds, max(0, state.upper - w), state.upper)
        figures["consensus_at_end"] = self.db_status()
        figures["counts"] = dict(self.counts, batches=state.upper)
        figures["maintenance"] = {kind: summarize([m["seconds"] for m in self.maintenance if m["kind"] == kind])
                                  for kind in ("compact", "checkpoint", "gc", "prune")}
        figures["uptime"] = uptime()

    def check_exactly_once(self, shard, checks: dict[str, Any]) -> None:
        records = shard.batches()
        ts_list = [b.ts for b in records]
        upper = shard.state().upper
        first = ts_list[0] if ts_list else upper
        # Batch rows below since may be truncated by retention: the rows kept are the ones
        # from the first kept ts to the upper, each once.
        contiguous = ts_list == list(range(first, upper))
        checks["batch_rows_kept"] = len(ts_list)
        checks["batch_rows_contiguous"] = contiguous
        if not contiguous:
            self.fail(f"consensus batches are not each ts once from {first} to {upper}")
        gaps = []
        for ts in range(max(1, first), upper):
            prev, cur = shard.binding(ts - 1), shard.binding(ts)
            if prev is None or cur is None:
                continue
            for partition, rng in cur.ranges.items():
                if rng["from"] != prev.ranges.get(partition, {"to": 0})["to"]:
                    gaps.append(ts)
        checks["binding_gaps"] = len(gaps)
        if gaps:
            self.fail(f"bindings are not contiguous at ts {gaps[:5]}")
        by_ts: dict[int, list[str]] = {}
        for path in self.writer_logs:
            writer_id = os.path.basename(path)[:-len(".log")]
            for ts, outcome, _ in parse_writer_log(path):
                if outcome == "committed":
                    by_ts.setdefault(ts, []).append(writer_id)
        twice = {ts: ids for ts, ids in by_ts.items() if len(ids) > 1}
        recorded = {b.ts: b.writer_id for b in records}
        disagree = {ts: (ids, recorded[ts]) for ts, ids in by_ts.items() if ts in recorded and ids[0] != recorded[ts]}
        checks["committed_reported_by_writers"] = len(by_ts)
        # A writer SIGKILLed between its commit and its line reported nothing for that ts.
        checks["committed_unreported"] = upper - len(by_ts)
        checks["committed_twice"] = len(twice)
        checks["committed_by_other_writer"] = len(disagree)
        if twice:
            self.fail(f"ts committed more than once: {dict(list(twice.items())[:5])}")
        if disagree:
            self.fail(f"writers report commits consensus records for another writer: {dict(list(disagree.items())[:5])}")


def leaked_and_missing_files(shard) -> tuple[list[str], list[str]]:
    """Files under the shard's blob directory that neither the live state nor a retained
    checkpoint accounts for (leaked), run directories nothing references (leaked, even when
    empty), and files they name that are not there (missing). The blob copy of the store's
    current catalog version and a checkpoint's own files (manifest, commit marker) belong to
    it (an older copy left behind is a leak); Spark's markers beside a referenced run's
    files (``_SUCCESS``, ``.*.crc``) belong to that run."""
    from airflow_upsert_provider.engine.maintenance.checkpoint_catalog import Catalog, checkpoint_path
    from airflow_upsert_provider.engine.maintenance.checkpoint_manifest import read_manifest
    from airflow_upsert_provider.engine.store.gc_claims import run_dir_of_relative

    blob = shard.blob
    referenced = {blob.path(f["path"]) for run in shard.live_runs() for f in run["files"]}
    catalog = Catalog.load(blob, shard.shard_id, shard.consensus)
    kept_dirs = set()
    for entry in catalog.entries:
        manifest = read_manifest(blob, shard.shard_id, entry.id)
        referenced |= {blob.path(f["path"]) for f in manifest["files"]}
        kept_dirs.add(checkpoint_path(blob, shard.shard_id, entry.id))
    runs_root = blob.path(shard.shard_id, "runs")
    run_dirs = {blob.path(run_dir_of_relative(blob.relative(p))) for p in referenced}

    def accounted(path: str) -> bool:
        name = os.path.basename(path)
        if path in referenced or path == catalog.copy_path(catalog.version) or any(
                path.startswith(d + os.sep) for d in kept_dirs):
            return True
        marker = name == "_SUCCESS" or (name.startswith(".") and name.endswith(".crc"))
        return marker and blob.path(run_dir_of_relative(blob.relative(path))) in run_dirs

    leaked = []
    for dirpath, _dirs, files in os.walk(blob.path(shard.shard_id)):
        leaked += [p for p in (os.path.join(dirpath, name) for name in files) if not accounted(p)]
    for group in os.listdir(runs_root) if os.path.isdir(runs_root) else []:
        for name in os.listdir(os.path.join(runs_root, group)):
            directory = os.path.join(runs_root, group, name)
            if directory not in run_dirs and not any(p.startswith(directory + os.sep) for p in leaked):
                leaked.append(directory + os.sep)
    missing = sorted(p for p in referenced if not os.path.exists(p))
    return sorted(leaked), missing


def summarize(values: list[float]) -> dict[str, Any]:
    return {"count": len(values),
            "median_seconds": None if not values else round(statistics.median(values), 2),
            "max_seconds": None if not values else round(max(values), 2)}


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def git_commit() -> str:
    try:
        return subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def print_table(report: SoakReport) -> None:
    f, c = report.figures, report.checks
    counts = f.get("counts", {})

    def size(key: str) -> str:
        s = f.get(key) or {}
        rows = s.get("rows") or {}
        return f"{s.get('total_bytes')} bytes, " + ", ".join(f"{n} {r}" for n, r in rows.items() if r)

    def per_batch(key: str) -> str:
        s = f.get(key) or {}
        return (f"median {s.get('median_seconds')} s, p95 {s.get('p95_seconds')} s over ts "
                f"[{s.get('from_ts')}, {s.get('to_ts')}) ({s.get('batches')} batches)")

    rows = [
        ("batches (upper)", f"{counts.get('batches')} (ended by {f.get('ended_by')})"),
        ("wall time", f"{f.get('wall_seconds')} s"),
        ("writers / SIGKILLs / writer starts",
         f"{report.options['writers']} / {counts.get('sigkills')} / {counts.get('writer_starts')}"),
        ("compactions / checkpoints / GCs / prunes",
         f"{counts.get('compactions')} / {counts.get('checkpoints')} / {counts.get('gcs')} / {counts.get('prunes')}"),
        ("monitor rounds / statuses / pages", f"{counts.get('monitor_rounds')} / {c.get('monitor_statuses')} / {c.get('pages')}"),
        ("per batch at start", per_batch("per_batch_at_start")),
        ("per batch at end", per_batch("per_batch_at_end")),
        ("consensus at start", size("consensus_at_start")),
        ("consensus at end", size("consensus_at_end")),
        ("table equals oracle", f"{c.get('table_equals_oracle')} ({c.get('table_rows')} rows)"),
        ("leaked / missing files", f"{c.get('leaked_files')} / {c.get('missing_files')}"),
        ("committed twice / unreported (killed)", f"{c.get('committed_twice')} / {c.get('committed_unreported')}"),
        ("load", f.get("uptime")),
        ("commit", f.get("commit")),
        ("result", "OK" if report.ok else f"FAILED ({len(report.failures)})"),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    for failure in report.failures:
        print(f"FAILURE: {failure}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = SoakOptions()
    for name, value in asdict(defaults).items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            parser.add_argument(flag, action="store_true", default=value)
        else:
            kind = type(value) if value is not None else str
            parser.add_argument(flag, type=kind, default=value)
    args = parser.parse_args(argv)
    opts = SoakOptions(**vars(args))
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # A SIGTERM (or a SIGINT where a background job ignores it) ends the run through its
    # cleanup: writers killed, a throwaway PostgreSQL stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    soak = Soak(opts)
    print(f"soak: {opts.batches} batches, {opts.writers} writers, a SIGKILL every ~{opts.kill_every} batches, "
          f"seed {opts.seed}, in {soak.workdir}", flush=True)
    report = soak.run()
    report.figures["commit"] = git_commit()
    report.figures.setdefault("uptime", uptime())
    print_table(report)
    out = opts.out or os.path.join(REPO, "bench", "results", f"soak-{time.strftime('%Y%m%dT%H%M%S')}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as handle:
        json.dump(asdict(report), handle, indent=2, default=str)
    print(f"soak: report written to {out}")
    if report.ok and not opts.keep_workdir and not opts.workdir:
        shutil.rmtree(soak.workdir, ignore_errors=True)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
