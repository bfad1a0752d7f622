"""Recovery order and fencing with a real shard (invariants 12 and 16).

Steps taken out of order are refused with their message and exit code and change nothing;
a writer whose batch was staged before a recovery began is fenced at its commit and its
staged files are dropped; a stop lets the batch in hand commit and starts no other. On
PostgreSQL, a commit racing `recover begin` in another process is ordered entirely before it
or fenced."""

from __future__ import annotations

import multiprocessing
import os

import psycopg
import pytest
import sqlalchemy as sa

from airflow_upsert_provider.engine.lifecycle import recovery
from airflow_upsert_provider.engine.store import streams
from airflow_upsert_provider.engine.store.records import AppendOutcome
from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.engine.errors import StreamFenced, StreamNotReady, TransitionRefused
from airflow_upsert_provider.engine.store.stream_rules import Status
from airflow_upsert_provider.engine.write.writer import COMMITTED, Writer
from tests.helpers import batch, make_shard, recover, table
from tests.maintenance.support import oracle, written_shard
from tests.pgserver import wait_for

TIMEOUT = 120


def run_dirs(shard) -> set[str]:
    """Every staging directory of a batch run (``runs/ts=<ts>/<writer>-<nonce>``)."""
    root = shard.blob.path(shard.shard_id, "runs")
    if not os.path.isdir(root):
        return set()
    return {os.path.join(root, ts, d) for ts in os.listdir(root) for d in os.listdir(os.path.join(root, ts))}


def committed_dirs(shard) -> set[str]:
    return {shard.blob.path(b.run["path"]) for b in shard.batches()}


class ActsAfterStaging(Writer):
    """A writer that runs ``act`` once, right after it staged its first batch and before it
    commits it: the operator's step lands exactly between the two."""

    def __init__(self, *args, act, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.act = act
        self.staged_paths: list[str] = []

    def stage(self, ts: int):
        staged = super().stage(ts)
        self.staged_paths.append(self.shard.blob.path(staged.run["path"]))
        if self.act is not None:
            act, self.act = self.act, None
            act()
        return staged


def test_steps_out_of_order_are_refused_and_fenced_writers_commit_nothing(spark, consensus, blob, tmp_path):
    shard = written_shard(spark, consensus, blob, tmp_path, batches=2)
    shard_id = shard.shard_id
    factory = lambda: spark  # noqa: E731

    # -- a stop lets the batch in hand commit and starts no other ------------------------------
    stopping = ActsAfterStaging(shard, "in-hand", spark_factory=factory,
                                act=lambda: streams.stop(consensus, shard_id, "operator", "maintenance"))
    report = stopping.run(until_caught_up=True, with_lag=False)
    assert [(r.ts, r.outcome) for r in report.results] == [(2, COMMITTED)]
    assert report.upper == shard.state().upper == 3
    assert report.stopped_because.startswith("the stream is STOPPING (epoch 0), set by operator")
    assert shard.binding(3) is None  # no further batch was even bound
    streams.finalize_stop(consensus, streams.read_stream(consensus, shard_id), "operator")
    with pytest.raises(StreamNotReady) as not_ready:
        Writer(shard, "while-stopped", spark_factory=factory).run()
    assert not_ready.value.exit_code == 6
    assert "shard 'orders' is not READY: the stream is STOPPED (epoch 0), set by operator" in not_ready.value.message
    streams.resume(consensus, shard_id, "operator")

    before_table, before_upper = table(shard), shard.state().upper

    # -- recover begin, then every step that may not come next ---------------------------------
    epoch = streams.begin_recovery(consensus, shard_id, "operator", "drill").state.epoch
    with pytest.raises(TransitionRefused) as resumed_early:
        streams.resume_after_recovery(consensus, shard_id, None, "operator")
    assert resumed_early.value.exit_code == 7
    assert f"recovery epoch {epoch} has no seek: run recover seek first" in resumed_early.value.message
    with pytest.raises(TransitionRefused) as other_epoch:
        recovery.seek(shard, epoch=epoch - 1, actor="operator")
    assert other_epoch.value.exit_code == 7
    assert f"it was asked for epoch {epoch - 1}, but the open recovery is epoch {epoch}" in other_epoch.value.message
    with pytest.raises(StreamNotReady) as run_during:
        Writer(shard, "during-recovery", spark_factory=factory).run()
    assert run_during.value.exit_code == 6
    assert f"the stream is RECOVERING (epoch {epoch}), set by operator" in run_during.value.message
    assert run_during.value.details["status"] == "RECOVERING" and run_during.value.details["epoch"] == epoch
    state = streams.read_stream(consensus, shard_id)
    assert (state.status, state.epoch, state.seeked_epoch) == (Status.RECOVERING, epoch, None)
    assert [h["action"] for h in streams.stream_history(consensus, shard_id)][-1] == "recover begin"
    assert (table(shard), shard.state().upper) == (before_table, before_upper)
    assert shard.binding(before_upper) is None
    recover(shard, actor="operator")

    # -- a writer that staged before `recover begin` commits after it: fenced -------------------
    fenced = ActsAfterStaging(shard, "staged-before-begin", spark_factory=factory,
                              act=lambda: streams.begin_recovery(consensus, shard_id, "operator", "second drill"))
    with pytest.raises(StreamFenced) as caught:
        fenced.run(with_lag=False)
    second = streams.read_stream(consensus, shard_id).epoch
    assert caught.value.exit_code == 6 and not caught.value.retryable
    assert (f"commit of batch {before_upper} of shard 'orders' by writer 'staged-before-begin' fenced: "
            f"the stream is RECOVERING (epoch {second}), set by operator") in caught.value.message
    assert "second drill; nothing was committed" in caught.value.message
    assert caught.value.details["writer_epoch"] == epoch != second
    assert fenced.staged_paths and not any(os.path.exists(p) for p in fenced.staged_paths)
    assert run_dirs(shard) == committed_dirs(shard)
    assert (table(shard), shard.state().upper) == (before_table, before_upper)
    assert consensus.get_batch(shard_id, before_upper) is None

    # -- a writer that staged before a whole recovery (begin, seek, resume) commits after it ----
    recover(shard, actor="operator")  # closes the second recovery: READY in epoch `second`

    def whole_recovery() -> None:
        streams.begin_recovery(consensus, shard_id, "operator", "third drill")
        recover(shard, actor="operator")

    across = ActsAfterStaging(shard, "staged-before-recovery", spark_factory=factory, act=whole_recovery)
    with pytest.raises(StreamFenced) as across_caught:
        across.run(with_lag=False)
    third = streams.read_stream(consensus, shard_id)
    assert third.status is Status.READY and third.epoch > second
    assert (f"fenced: a recovery began after this writer started (writer epoch {second}, "
            f"stream READY (epoch {third.epoch})") in across_caught.value.message
    assert across_caught.value.exit_code == 6
    assert across.staged_paths and not any(os.path.exists(p) for p in across.staged_paths)
    assert (table(shard), shard.state().upper) == (before_table, before_upper)

    # Nothing was lost: a writer of the current epoch converges to the source.
    Writer(shard, "after", spark_factory=factory).run(until_caught_up=True, with_lag=False)
    assert table(shard) == oracle(shard)
    assert run_dirs(shard) == committed_dirs(shard)
    assert [b.ts for b in shard.batches()] == list(range(shard.state().upper))


# -- PostgreSQL: a commit and `recover begin` in two processes -----------------------------------


def waiting_on_a_lock(pg_url: str) -> bool:
    """Whether some backend of this database is blocked on a row lock."""
    database = sa.engine.make_url(pg_url).database
    admin = sa.engine.make_url(pg_url).set(drivername="postgresql", database="postgres")
    with psycopg.connect(admin.render_as_string(hide_password=False), autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND wait_event_type = 'Lock'", (database,)
        ).fetchone()
    return row[0] > 0


def commit_paused_in_its_transaction(url: str, shard_id: str, epoch: int, inside, go, out) -> None:
    """Commit batch 0 under ``epoch``; pause inside the transaction, after the fence read the
    stream row (FOR SHARE), until ``go``."""
    consensus = open_consensus(url)

    def pause(_conn, attempt) -> None:
        if attempt.kind == "append":
            inside.set()
            if not go.wait(TIMEOUT):
                raise TimeoutError("never released")

    consensus.commit_hooks.append(pause)  # after the fence: this store's hooks run in order
    try:
        result = consensus.compare_and_append(shard_id, 0, 1, batch(0, token="racer"), epoch=epoch)
        out.put(("commit", result.outcome.value, ""))
    except StreamFenced as fenced:
        out.put(("commit", "fenced", fenced.message))
    finally:
        consensus.dispose()


def commit(url: str, shard_id: str, epoch: int, out) -> None:
    consensus = open_consensus(url)
    try:
        result = consensus.compare_and_append(shard_id, 0, 1, batch(0, token="racer"), epoch=epoch)
        out.put(("commit", result.outcome.value, ""))
    except StreamFenced as fenced:
        out.put(("commit", "fenced", fenced.message))
    finally:
        consensus.dispose()


def begin(url: str, shard_id: str, out) -> None:
    consensus = open_consensus(url)
    try:
        result = streams.begin_recovery(consensus, shard_id, "operator", "race")
        out.put(("begin", result.state.status.value, str(result.state.epoch)))
    finally:
        consensus.dispose()


def begin_paused_before_its_commit(url: str, shard_id: str, inside, go, out) -> None:
    """`recover begin`, paused inside its compare-and-set transaction right after the UPDATE
    of the stream row (the row is locked, the change not yet committed), until ``go``."""
    consensus = open_consensus(url)

    @sa.event.listens_for(consensus.engine, "after_cursor_execute")
    def pause(_conn, _cursor, statement, *_rest) -> None:
        if statement.lstrip().upper().startswith("UPDATE UPSERT_STREAMS"):
            inside.set()
            if not go.wait(TIMEOUT):
                raise TimeoutError("never released")

    try:
        result = streams.begin_recovery(consensus, shard_id, "operator", "race")
        out.put(("begin", result.state.status.value, str(result.state.epoch)))
    finally:
        consensus.dispose()


@pytest.mark.parametrize("first", ["commit", "recover begin"])
def test_commit_racing_recover_begin_is_ordered_before_it_or_fenced(pg_url, blob, tmp_path, first):
    consensus = open_consensus(pg_url)
    try:
        make_shard(consensus, blob, tmp_path)
        # The stream row exists (a stop, finalize and resume ran), READY in epoch 0.
        streams.stop_and_finalize(consensus, "orders", "operator", drain_seconds=0)
        streams.resume(consensus, "orders", "operator")
        writer_epoch = streams.read_stream(consensus, "orders").epoch
        ctx = multiprocessing.get_context("spawn")
        inside, go, out = ctx.Event(), ctx.Event(), ctx.Queue()
        if first == "commit":
            holder = ctx.Process(target=commit_paused_in_its_transaction,
                                 args=(pg_url, "orders", writer_epoch, inside, go, out))
            other = ctx.Process(target=begin, args=(pg_url, "orders", out))
        else:
            holder = ctx.Process(target=begin_paused_before_its_commit, args=(pg_url, "orders", inside, go, out))
            other = ctx.Process(target=commit, args=(pg_url, "orders", writer_epoch, out))
        holder.start()
        assert inside.wait(TIMEOUT)
        other.start()
        # The second one is blocked on the stream row the first holds, not done.
        assert wait_for(lambda: waiting_on_a_lock(pg_url), timeout=TIMEOUT)
        assert other.is_alive()
        go.set()
        holder.join(TIMEOUT)
        other.join(TIMEOUT)
        assert (holder.exitcode, other.exitcode) == (0, 0)
        results = {kind: (outcome, text) for kind, outcome, text in (out.get(timeout=5) for _ in range(2))}

        state = streams.read_stream(consensus, "orders")
        assert state.status is Status.RECOVERING and state.epoch > writer_epoch
        assert results["begin"] == ("RECOVERING", str(state.epoch))
        record = consensus.get_shard("orders")
        if first == "commit":
            # Entirely before: it committed under the old epoch, and the recovery began after.
            assert results["commit"] == (AppendOutcome.COMMITTED.value, "")
            assert record.upper == 1 and consensus.get_batch("orders", 0).token == "racer"
        else:
            # Entirely after: it saw the new epoch, committed nothing.
            assert results["commit"][0] == "fenced"
            assert f"the stream is RECOVERING (epoch {state.epoch})" in results["commit"][1]
            assert record.upper == 0 and consensus.get_batch("orders", 0) is None
        assert [h["action"] for h in streams.stream_history(consensus, "orders")][-1] == "recover begin"
    finally:
        consensus.dispose()
