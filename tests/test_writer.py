"""The writer: on a real SparkSession (catch-up, determinism, convergence, commit faults) and,
without Spark, a staging directory deleted under it and the store's failures as it sees them."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from airflow_upsert_provider.engine.write import writer as writer_module
from airflow_upsert_provider.engine.errors import CommitOutcomeUnknown, ConsensusOutcomeUnknown
from airflow_upsert_provider.engine.write.writer import Writer
from airflow_upsert_provider.sample_data import SampleSpec, write_segment
from tests.conftest import sqlite_only
from tests.helpers import make_shard, spark_table, table
from tests.oracle import oracle_table

SMALL = SampleSpec(records=3000, keys=600, partitions=3, segments_per_partition=4, seed=3)


def landing_of(shard) -> str:
    return shard.source.root


def no_spark():
    raise AssertionError("this step must not start a Spark job")


def committed_dirs(shard) -> set[str]:
    return {shard.blob.path(b.run["path"]) for b in shard.batches()}


def staged_dirs(shard) -> set[str]:
    runs = shard.blob.path(shard.shard_id, "runs")
    return {os.path.join(runs, ts, d) for ts in os.listdir(runs) for d in os.listdir(os.path.join(runs, ts))}


def test_catch_up_equals_oracle_and_every_ts_committed_once(spark, consensus, blob, tmp_path):
    shard = make_shard(consensus, blob, tmp_path, spec=SMALL)
    report = Writer(shard, "w1", spark_factory=lambda: spark).run(until_caught_up=True)
    outcomes = [r.outcome for r in report.results]
    assert outcomes == ["committed"] * 3 + ["nothing_to_do"]
    state = shard.state()
    assert state.upper == 3 == report.upper
    assert [b.ts for b in shard.batches()] == [0, 1, 2]
    assert table(shard) == oracle_table(landing_of(shard))
    # Caught up: another step mints no empty batch.
    assert Writer(shard, "w2", spark_factory=no_spark).step().outcome == "nothing_to_do"
    assert shard.state().upper == 3


@sqlite_only
def test_read_as_of_every_ts_matches_oracle_of_bound_offsets(spark, consensus, blob, tmp_path):
    shard = make_shard(consensus, blob, tmp_path, spec=SMALL)
    Writer(shard, "w", spark_factory=lambda: spark).run(until_caught_up=True)
    for as_of in range(0, 4):
        expected = oracle_table(landing_of(shard), max_offset=shard.bound_offsets(as_of))
        assert spark_table(shard, spark, as_of) == expected, f"as_of={as_of}"


@sqlite_only
def test_two_writers_stage_identical_batches(spark, consensus, blob, tmp_path):
    shard = make_shard(consensus, blob, tmp_path, spec=SMALL)
    shard.mint_binding(0, minted_by="a")
    a = Writer(shard, "a", spark_factory=lambda: spark).stage(0)
    b = Writer(shard, "b", spark_factory=lambda: spark).stage(0)
    assert a.run["path"] != b.run["path"]  # staging paths unique per (writer, attempt)

    def rows(staged):
        frame = spark.read.parquet(*[blob.path(f["path"]) for f in staged.run["files"]])
        return sorted(tuple(r) for r in frame.collect())

    assert rows(a) == rows(b)
    assert (a.rows_in, a.rows_out) == (b.rows_in, b.rows_out)
    # Same buckets, same per-bucket content.
    buckets = lambda s: sorted(os.path.basename(os.path.dirname(f["path"])) for f in s.run["files"])  # noqa: E731
    assert buckets(a) == buckets(b)


def test_lagging_writer_drops_persisted_batches_and_reaches_upper(spark, consensus, blob, tmp_path):
    """The Materialize #36860 shape: a peer has advanced the upper to 10; a lagging writer
    holds batches at ts 5 and 7. They are dropped, without Spark, and its progress reaches 10."""
    spec = SampleSpec(records=1000, keys=300, partitions=1, segments_per_partition=10, seed=5)
    shard = make_shard(consensus, blob, tmp_path, spec=spec, max_files_per_batch=1)
    peer = Writer(shard, "peer", spark_factory=lambda: spark)
    peer.run(max_batches=10)
    assert shard.state().upper == 10

    lagging = Writer(shard, "lagging", spark_factory=lambda: spark)
    held = [lagging.stage(5), lagging.stage(7)]
    held_dirs = [blob.path(s.run["path"]) for s in held]
    assert all(os.path.isdir(d) for d in held_dirs)
    assert lagging.progress == 0

    lagging._spark_factory = no_spark
    result = lagging.step()
    assert result.outcome == "nothing_to_do"  # the source holds exactly 10 batches
    assert lagging.held == {}
    assert lagging.converged == 2
    assert lagging.progress == shard.state().upper == 10
    # Its files provably lost (a peer's token holds ts 5 and 7): deleted. The peer's stay.
    assert not any(os.path.exists(d) for d in held_dirs)
    assert all(os.path.isdir(d) for d in committed_dirs(shard))
    assert table(shard) == oracle_table(landing_of(shard))


def test_batch_ahead_of_upper_is_held_not_appended(spark, consensus, blob, tmp_path):
    spec = SampleSpec(records=400, keys=100, partitions=1, segments_per_partition=3, seed=9)
    shard = make_shard(consensus, blob, tmp_path, spec=spec, max_files_per_batch=1)
    for ts in range(3):
        shard.mint_binding(ts, minted_by="m")
    w = Writer(shard, "w", spark_factory=lambda: spark)
    ahead = w.stage(2)
    assert w.append(ahead) == "held"
    assert 2 in w.held and shard.state().upper == 0
    w.run(until_caught_up=True)
    # The held batch was appended when the upper reached it, not restaged.
    assert shard.consensus.get_batch(shard.shard_id, 2).token == ahead.token
    assert table(shard) == oracle_table(landing_of(shard))


def test_lost_connection_after_commit_reports_already_committed(spark, consensus, blob, tmp_path, monkeypatch):
    shard = make_shard(consensus, blob, tmp_path, spec=SMALL)
    real = shard.consensus.compare_and_append
    calls = []

    def commit_then_drop(*args, **kwargs):
        result = real(*args, **kwargs)
        calls.append(result.outcome)
        if len(calls) == 1:
            # What the store raises when the connection drops while the commit lands.
            raise ConsensusOutcomeUnknown("consensus store failed while committing batch 0: server closed the connection")
        return result

    monkeypatch.setattr(shard.consensus, "compare_and_append", commit_then_drop)
    monkeypatch.setattr(writer_module, "APPEND_RETRY_DELAY_SECONDS", 0)
    w = Writer(shard, "w", spark_factory=lambda: spark)
    result = w.step()
    assert result.outcome == "already_committed"
    assert [c.value for c in calls] == ["committed", "already_committed"]
    batch = shard.consensus.get_batch(shard.shard_id, 0)
    assert batch.writer_id == "w" and shard.state().upper == 1
    assert committed_dirs(shard) == staged_dirs(shard)  # files kept, and they are the committed ones


def test_unknown_outcome_keeps_files_and_a_new_writer_proceeds(spark, consensus, blob, tmp_path, monkeypatch):
    shard = make_shard(consensus, blob, tmp_path, spec=SMALL)
    monkeypatch.setattr(writer_module, "APPEND_RETRY_DELAY_SECONDS", 0)

    def unreachable(*args, **kwargs):
        raise ConsensusOutcomeUnknown("consensus store failed while committing batch 0: connection reset")

    broken = Writer(shard, "broken", spark_factory=lambda: spark)
    monkeypatch.setattr(shard, "compare_and_append", unreachable)
    with pytest.raises(CommitOutcomeUnknown) as info:
        broken.step()
    assert info.value.exit_code == 5
    orphan = staged_dirs(shard)
    assert len(orphan) == 1 and all(os.listdir(d) for d in orphan)  # invariant 7: never deleted
    monkeypatch.undo()

    Writer(shard, "healthy", spark_factory=lambda: spark).run(until_caught_up=True)
    assert orphan <= staged_dirs(shard)  # still there: only GC may remove them
    assert not orphan & committed_dirs(shard)
    assert table(shard) == oracle_table(landing_of(shard))


def test_zombie_append_after_peer_commit_is_dropped_and_cleaned(spark, consensus, blob, tmp_path):
    """A crash between staging and the compare-and-set, then the process wakes up later."""
    shard = make_shard(consensus, blob, tmp_path, spec=SMALL)
    shard.mint_binding(0, minted_by="zombie")
    zombie = Writer(shard, "zombie", spark_factory=lambda: spark)
    staged = zombie.stage(0)
    Writer(shard, "retry", spark_factory=lambda: spark).run(until_caught_up=True)
    assert shard.state().upper == 3
    assert zombie.append(staged) == "already_persisted"
    assert not os.path.exists(blob.path(staged.run["path"]))
    assert zombie.progress == 3
    assert table(shard) == oracle_table(landing_of(shard))


@sqlite_only
def test_staging_never_reads_the_table(spark, consensus, blob, tmp_path):
    """A write costs O(batch): batch 1 stages fine even with every earlier run unreadable."""
    shard = make_shard(consensus, blob, tmp_path, spec=SMALL)
    w = Writer(shard, "w", spark_factory=lambda: spark)
    w.run(max_batches=1)
    for batch in shard.batches():
        for f in batch.run["files"]:
            with open(blob.path(f["path"]), "wb") as handle:
                handle.write(b"garbage")
    assert w.step().outcome == "committed"


@sqlite_only
def test_tombstones_and_tie_breaking(spark, consensus, blob, tmp_path):
    landing = tmp_path / "landing"

    def rec(id_, name, at, deleted=False):
        return json.dumps({"id": id_, "name": name, "amount": 1.0, "updated_at": at, "deleted": deleted})

    write_segment(str(landing / "a" / "0.jsonl"), [
        rec(1, "one", 5), rec(1, None, 6, True),  # inserted then deleted in one batch
        rec(2, "two", 1, True),  # deleted, re-inserted in batch 1
        rec(3, "a-line1", 7), rec(3, "a-line2", 7),  # tie: later line wins
        rec(4, "newer", 9),
    ])
    write_segment(str(landing / "b" / "0.jsonl"), [rec(3, "b-wins-partition", 7), rec(4, "older", 8)])
    write_segment(str(landing / "a" / "10.jsonl"), [rec(2, "two-again", 2), rec(5, "late-but-old", 0)])
    shard = make_shard(consensus, blob, tmp_path, max_files_per_batch=2)
    Writer(shard, "w", spark_factory=lambda: spark).run(until_caught_up=True)
    # Spark's reads (tests/test_run_io_spark.py runs this test again with the executors reading).
    rows = {k[0]: v["name"] for k, v in spark_table(shard, spark).items()}
    assert rows == {2: "two-again", 3: "b-wins-partition", 4: "newer", 5: "late-but-old"}
    assert spark_table(shard, spark) == oracle_table(str(landing))


@sqlite_only
def test_status_reports_frontier_lag_and_rows(spark, consensus, blob, tmp_path):
    shard = make_shard(consensus, blob, tmp_path, spec=SMALL)
    before = shard.status().to_dict()
    assert before["upper"] == 0 and before["rows"] is None
    assert before["source"]["high_watermark"] == {"p0": 31, "p1": 31, "p2": 31}
    assert before["source"]["lag_offsets"] == {"p0": 31, "p1": 31, "p2": 31}
    assert before["source"]["pending_segments"] == 12
    # The lag is those 12 files, not the 93 offsets between the bound and the high watermarks.
    assert (before["source"]["lag"], before["source"]["lag_unit"]) == (12, "segments")
    Writer(shard, "w", spark_factory=lambda: spark).run(max_batches=1)
    after = shard.status(spark).to_dict()
    assert after["upper"] == 1 and after["seqno"] == 1 and after["since"] == 0
    # Four files per batch, taken in (offset, partition) order: 0@p0, 0@p1, 0@p2, 10@p0.
    assert after["source"]["bound"] == {"p0": 11, "p1": 1, "p2": 1}
    assert after["source"]["pending_segments"] == 8
    assert (after["source"]["lag"], after["source"]["lag_unit"]) == (8, "segments")
    assert after["rows"] == len(table(shard))


# -- a staging directory deleted under the writer (GC with a short grace period) -----------------


@pytest.fixture
def store(sqlite_url):
    from airflow_upsert_provider.engine.store.registry import open_consensus

    consensus = open_consensus(sqlite_url)
    yield consensus
    consensus.dispose()


def spark_error_naming(path: str) -> Exception:
    """What a Spark write whose directory GC removed raises (a Py4JJavaError's text)."""
    return RuntimeError(
        "An error occurred while calling o278.parquet.\n: ExitCodeException exitCode=1: "
        f"chmod: cannot access '{path}/_SUCCESS': No such file or directory"
    )


def fake_stage(outcomes: list[str], calls: list[str]):
    """A stand-in for the Spark batch: per attempt, "lost" has the attempt's directory removed
    while it writes (the error names it), "ok" writes one file and describes it."""
    from airflow_upsert_provider.engine.write.upsert import StagedOutput

    def stage(spark, shard, binding, *, run_dir, rejects_dir, on_bad_record, messages=None):
        calls.append(run_dir)
        os.makedirs(os.path.join(run_dir, "_temporary"))
        if outcomes.pop(0) == "lost":
            shutil.rmtree(run_dir)
            raise spark_error_naming(run_dir)
        with open(os.path.join(run_dir, "part-0.parquet"), "wb") as handle:
            handle.write(b"x")
        os.rmdir(os.path.join(run_dir, "_temporary"))
        return StagedOutput({"path": os.path.relpath(run_dir, shard.blob.root), "files": [], "rows": 0}, None, 0, 0, 0)

    return stage


def test_a_staging_directory_deleted_while_spark_writes_is_restaged(store, blob, tmp_path, monkeypatch):
    from airflow_upsert_provider.engine.write import upsert as upsert_module

    shard = make_shard(store, blob, tmp_path, spec=SMALL)
    calls: list[str] = []
    monkeypatch.setattr(upsert_module, "stage_batch", fake_stage(["lost", "ok"], calls))
    result = Writer(shard, "w", spark_factory=object).step()
    assert result.outcome == "committed" and shard.state().upper == 1
    assert len(calls) == 2 and calls[0] != calls[1]  # a new path for the second attempt
    assert shard.consensus.get_batch(shard.shard_id, 0).run["path"] == os.path.relpath(calls[1], blob.root)
    assert not os.path.exists(calls[0])


def test_a_staging_directory_lost_on_every_attempt_is_a_retryable_error_naming_it(store, blob, tmp_path, monkeypatch):
    from airflow_upsert_provider.engine.write import upsert as upsert_module
    from airflow_upsert_provider.engine.errors import StagingLost

    shard = make_shard(store, blob, tmp_path, spec=SMALL)
    calls: list[str] = []
    monkeypatch.setattr(upsert_module, "stage_batch", fake_stage(["lost"] * 10, calls))
    with pytest.raises(StagingLost) as info:
        Writer(shard, "w", spark_factory=object).step()
    assert len(calls) == writer_module.MAX_RESTAGES + 1
    assert info.value.exit_code == 2 and info.value.retryable
    assert info.value.details["path"] == calls[-1] and calls[-1] in info.value.message
    assert shard.state().upper == 0


def test_staging_lost_is_decided_by_the_error_naming_the_attempt_or_by_a_gc_claim():
    from airflow_upsert_provider.engine.write.writer import staging_lost

    run_dir, rejects_dir = "/b/s/runs/ts=000000000000/w-abc", "/b/s/rejects/ts=000000000000/w-abc"
    dirs = (run_dir, rejects_dir)
    assert staging_lost(spark_error_naming(run_dir), dirs, claimed=False)
    temporary = RuntimeError(f"[TASK_WRITE_FAILED] Task failed while writing rows to file:{run_dir}. "
                             f"Caused by: java.io.FileNotFoundException: File file:{run_dir}/_temporary/0 does not exist")
    assert staging_lost(temporary, dirs, claimed=False)
    described = FileNotFoundError(2, "No such file or directory")
    described.filename = f"{run_dir}/_bucket=1/part-0.parquet"
    try:
        raise RuntimeError("describing the run failed") from described
    except RuntimeError as chained:
        assert staging_lost(chained, dirs, claimed=False)
    # Another attempt's directory, or a failure that says nothing about a missing file: reported as it is.
    assert not staging_lost(spark_error_naming("/b/s/runs/ts=000000000000/w-other"), dirs, claimed=False)
    assert not staging_lost(RuntimeError(f"OutOfMemoryError while writing {run_dir}"), dirs, claimed=False)
    assert staging_lost(RuntimeError("anything"), dirs, claimed=True)


# -- the store's failures, split at the store ------------------------------------------------------


def staged_by_hand(shard, ts: int, token: str) -> "writer_module.StagedBatch":
    run_dir = shard.run_dir(ts, "w", token[:12])
    os.makedirs(run_dir)
    with open(os.path.join(run_dir, "part-0.parquet"), "wb") as handle:
        handle.write(b"x")
    run = {"path": os.path.relpath(run_dir, shard.blob.root), "files": [], "rows": 0}
    return writer_module.StagedBatch(ts, token, run, None, 0, 0, 0, [], 0.0)


def test_the_writer_imports_no_sqlalchemy():
    import ast

    tree = ast.parse(open(writer_module.__file__, encoding="utf-8").read())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not {m for m in imported if m.split(".")[0] == "sqlalchemy"}


def test_a_store_that_fails_before_every_commit_is_determinate_exit_2(store, blob, tmp_path, monkeypatch):
    from airflow_upsert_provider.engine.errors import ConsensusUnavailable

    shard = make_shard(store, blob, tmp_path, spec=SMALL)
    monkeypatch.setattr(writer_module, "APPEND_RETRY_DELAY_SECONDS", 0)
    writer = Writer(shard, "w", spark_factory=no_spark)
    staged = staged_by_hand(shard, 0, "a" * 32)
    attempts = []

    def refused(*args, **kwargs):
        attempts.append(1)
        raise ConsensusUnavailable("consensus store sqlite:///c.db failed: database is locked")

    monkeypatch.setattr(shard, "compare_and_append", refused)
    with pytest.raises(ConsensusUnavailable) as info:
        writer.append(staged)
    assert not isinstance(info.value, CommitOutcomeUnknown)
    assert info.value.exit_code == 2 and info.value.retryable and info.value.details["ts"] == 0
    assert "nothing was committed" in info.value.message
    assert len(attempts) == writer_module.APPEND_RETRIES + 1


def test_a_new_epoch_keeps_the_files_of_a_held_batch_whose_commit_may_have_landed(store, blob, tmp_path, monkeypatch):
    from airflow_upsert_provider.engine.store import streams
    from airflow_upsert_provider.engine.errors import ConsensusOutcomeUnknown

    shard = make_shard(store, blob, tmp_path, spec=SMALL)
    monkeypatch.setattr(writer_module, "APPEND_RETRY_DELAY_SECONDS", 0)
    writer = Writer(shard, "w", spark_factory=no_spark)
    writer.start()
    staged = staged_by_hand(shard, 0, "b" * 32)
    writer.held[0] = staged
    real = shard.compare_and_append

    def lands_then_drops(*args, **kwargs):
        real(*args, **kwargs)
        raise ConsensusOutcomeUnknown("consensus store failed while committing batch 0")

    monkeypatch.setattr(shard, "compare_and_append", lands_then_drops)
    with pytest.raises(CommitOutcomeUnknown):
        writer.append(staged)
    monkeypatch.undo()
    # A recovery: the next run of this writer starts in a new epoch.
    streams.begin_recovery(store, shard.shard_id, "ops")
    streams.record_seek(store, shard.shard_id, None, {}, "ops")
    streams.resume_after_recovery(store, shard.shard_id, None, "ops")
    writer.start()
    assert writer.epoch != 0
    assert shard.consensus.get_batch(shard.shard_id, 0).token == staged.token
    assert os.listdir(shard.blob.path(staged.run["path"]))  # the committed batch's files are still there
    assert not writer.held
