"""The change-feed consumer DAG run by Airflow's scheduler from its producers' Asset events.

Real producer runs (the upsert operator in `airflow dags test`) emit events into one metadata
database; the scheduler's own steps turn them into asset-triggered runs of
`upsert_changes_consumer`, whose task runs with those events (tests/airflow/consumer_steps.py).
The producers: a backfill; a scheduled run whose first try dies after its first commit, before
its event, while a second backfill runs beside it, then is retried (and announces its first
try's batch, below the peer's newer ones); a last scheduled run after new source segments. The
consumer runs between them see a batch no event names yet and ranges that skip it, then a range
they delivered already; the files they deliver hold every committed batch exactly once
(docs/changes.md, "Incremental consumers"). The cursor logic alone, over random histories:
tests/changes/test_consumer.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from airflow_upsert_provider.engine.blob.files import open_blob
from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.engine.table.change_consumer import changes_file_name
from airflow_upsert_provider.engine.table.changes import read_changes
from airflow_upsert_provider.engine.table.shard import Shard
from airflow_upsert_provider.sample_data import SampleSpec, generate
from tests.airflow.conftest import AirflowHome, failure_text, init_shard
from tests.pgserver import wait_for

pytestmark = pytest.mark.slow

STEPS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "consumer_steps.py")
CONSUMER = "upsert_changes_consumer"
URI = "upsert://upsert_default/orders"
SPEC = SampleSpec(records=1000, keys=200, partitions=2, segments_per_partition=5, seed=17)
# One more segment per partition, written after the first producers, at the next offsets.
LATER = SampleSpec(records=200, keys=200, partitions=2, segments_per_partition=1, seed=18,
                   first_seq=SPEC.first_seq + SPEC.segments_per_partition * SPEC.seq_step)


def _trigger_and_run(home: AirflowHome, env: dict[str, str]) -> list[tuple[str, str]]:
    """The scheduler's step for the consumer DAG and its new runs' tasks; (run_id, state) each."""
    proc = home.run([sys.executable, STEPS, "trigger-and-run", CONSUMER], env, timeout=600)
    assert proc.returncode == 0, failure_text(proc)
    return [tuple(line.split()[1:3]) for line in proc.stdout.splitlines() if line.startswith("RUN ")]


def _delivered(home: AirflowHome, run_id: str) -> list[list[int]]:
    assert home.task_instance(CONSUMER, run_id, "deliver_changes") == ("success", 1)
    return home.xcom(CONSUMER, run_id, "deliver_changes")


def _consumed_ranges(home: AirflowHome, run_id: str) -> list[tuple[int, int]]:
    """The (from_ts, to_ts) of the Asset events Airflow handed the run as its triggering events."""
    import json

    rows = home.query(
        "SELECT e.extra FROM asset_event e JOIN dagrun_asset_event d ON d.event_id = e.id "
        "JOIN dag_run r ON r.id = d.dag_run_id WHERE r.dag_id = ? AND r.run_id = ? ORDER BY e.id",
        CONSUMER, run_id,
    )
    extras = [json.loads(extra) if isinstance(extra, str) else extra for (extra,) in rows]
    return [(e["from_ts"], e["to_ts"]) for e in extras]


# Six Airflow processes and four Spark batches in one scenario: twelve minutes on a loaded
# 2-core machine, beyond the suite's default per-test bound.
@pytest.mark.timeout(1800)
def test_scheduled_consumer_runs_deliver_every_committed_batch_once(airflow_home, tmp_path):
    landing = str(tmp_path / "landing")
    generate(landing, SPEC)
    url, blob = f"sqlite:///{tmp_path / 'consensus.db'}", str(tmp_path / "blob")
    init_shard(url, blob, landing, max_files_per_batch=2)
    home = airflow_home.clone(str(tmp_path / "home"))
    env = home.env(url, blob)
    # Airflow queues no run of a paused DAG.
    home.query("UPDATE dag SET is_paused = 0 WHERE dag_id = ?", CONSUMER)
    out_dir = os.path.join(home.path, "upsert", "changes", "orders")

    with home.dags_test_process(env) as airflow:
        # A backfill of one batch: ts 0, one event [0, 1).
        proc = airflow.dags_test("upsert_backfill", conf={"shard": "orders", "batch_size": 2, "max_batches": 1})
        assert proc.returncode == 0, failure_text(proc)
        [(first_run, state)] = _trigger_and_run(home, env)
        assert state == "success" and _consumed_ranges(home, first_run) == [(0, 1)]
        assert _delivered(home, first_run) == [[0, 1]]

        # A scheduled run commits ts 1, then its try dies before its event; a second backfill runs
        # beside it and commits the rest in one batch (ts 2, event [2, 3)).
        signal, go = str(tmp_path / "committed"), str(tmp_path / "go")
        dying = subprocess.Popen(
            [sys.executable, STEPS, "producer-dies-after-commit", "upsert_microbatch", signal, go],
            env=env, cwd=home.path, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )
        try:
            assert wait_for(lambda: os.path.exists(signal) or dying.poll() is not None, timeout=600)
            assert dying.poll() is None, dying.stdout.read()[-6000:]
            proc = airflow.dags_test("upsert_backfill", conf={"shard": "orders", "batch_size": 6})
            assert proc.returncode == 0, failure_text(proc)
            # A consumer run now: its event names [2, 3); ts 1 is committed and not yet announced.
            [(second_run, state)] = _trigger_and_run(home, env)
            assert state == "success" and _consumed_ranges(home, second_run) == [(2, 3)]
            assert _delivered(home, second_run) == [[1, 3]]
        finally:
            open(go, "w").close()
            output = dying.communicate(timeout=600)[0]
        # The retry (try 2) finds its earlier try's batch below a peer's newer ones and announces
        # it: its range starts at ts 1 and runs to the upper, its rows are try 1's batch's.
        assert dying.returncode == 0, output[-6000:]
        producer_run = home.latest_run("upsert_microbatch")
        assert home.task_instance("upsert_microbatch", producer_run, "upsert") == ("success", 2)
        events = home.asset_events(URI)
        assert [(e["from_ts"], e["to_ts"]) for e in events] == [(0, 1), (2, 3), (1, 3)]
        consensus = open_consensus(url)
        try:
            try_one = consensus.get_batch("orders", 1)
        finally:
            consensus.dispose()
        assert try_one.writer_id.endswith(":upsert:try1")
        assert events[-1]["rows_out"] == try_one.stats["rows_out"] > 0 and events[-1]["committed"] == 0
        # Its event triggers a consumer run; that range was delivered already: nothing new.
        [(third_run, state)] = _trigger_and_run(home, env)
        assert state == "success" and _consumed_ranges(home, third_run) == [(1, 3)]
        assert _delivered(home, third_run) == []

        # New segments, a scheduled run: ts 3, event [3, 4).
        generate(landing, LATER)
        proc = airflow.dags_test("upsert_microbatch")
        assert proc.returncode == 0, failure_text(proc)
        [(fourth_run, state)] = _trigger_and_run(home, env)
        assert state == "success" and _consumed_ranges(home, fourth_run) == [(3, 4)]
        assert _delivered(home, fourth_run) == [[3, 4]]

    consensus = open_consensus(url)
    try:
        shard = Shard.open(consensus, open_blob(blob), "orders")
        batches = [b.ts for b in shard.batches()]
        assert batches == list(range(4)) and shard.state().upper == 4
        # Every committed batch is in exactly one delivered file, and each file holds the feed of
        # its range: its rows are the shard's net changes there, nothing else.
        ranges = [(0, 1), (1, 3), (3, 4)]
        assert sorted(os.listdir(out_dir)) == [changes_file_name(a, b) for a, b in ranges]
        versions = []
        for from_ts, to_ts in ranges:
            delivered = pq.read_table(os.path.join(out_dir, changes_file_name(from_ts, to_ts)))
            expected = read_changes(shard, from_ts, to_ts).read_all()
            assert delivered.num_rows == expected.num_rows > 0
            assert sorted(map(str, delivered.to_pylist())) == sorted(map(str, expected.to_pylist()))
            file_versions = set(delivered.column("_commit_version").to_pylist())
            assert file_versions <= set(range(from_ts, to_ts))
            versions.append(file_versions)
        # No batch was read twice: the files' versions are disjoint; and none was missed.
        assert sum(len(v) for v in versions) == len(set().union(*versions))
        assert set(range(4)) == {ts for a, b in ranges for ts in range(a, b)}
    finally:
        consensus.dispose()
