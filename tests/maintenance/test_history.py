"""Bounded batch history: rows below since are rolled up and truncated by GC, in bounded
chunks, keeping what retries, checkpoints, restore, seek and audit need; GC of rejects/."""

from __future__ import annotations

import os
import time

import pytest
import sqlalchemy as sa
from sqlalchemy import event

from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.engine.maintenance.checkpoint import create_checkpoint, read_manifest, restore_checkpoint
from airflow_upsert_provider.engine.maintenance.compaction import compact
from airflow_upsert_provider.engine.maintenance.gc import collect_garbage
from airflow_upsert_provider.engine.store.records import AppendOutcome, BatchRecord
from airflow_upsert_provider.engine.store.tables import batches_table, bindings_table
from airflow_upsert_provider.engine.store.history import keep_from, plan_truncation, rollups, truncate_history
from airflow_upsert_provider.engine.table.shard import Shard
from airflow_upsert_provider.engine.write.writer import ALREADY_PERSISTED, Writer
from tests.helpers import recover, table
from tests.maintenance.support import age_files, oracle, written_shard

HOUR = 3600.0
DAY = 86400.0


# -- the plan (pure) ------------------------------------------------------------------------


def test_plan_keeps_since_minus_one_and_everything_above():
    assert plan_truncation(0, since=10, held_from=None, chunk=4) == [(0, 4), (4, 8), (8, 9)]
    assert keep_from(10, None) == 9


def test_plan_keeps_rows_committed_inside_the_grace_period():
    # ts 5 was committed inside the grace period: it and everything above it stay.
    assert plan_truncation(0, since=10, held_from=5, chunk=4) == [(0, 4), (4, 5)]
    assert keep_from(10, 5) == 5


def test_plan_starts_at_the_oldest_row_left_and_has_nothing_to_do_at_the_bottom():
    assert plan_truncation(9, since=10, held_from=None, chunk=4) == []
    assert plan_truncation(6, since=10, held_from=None, chunk=100) == [(6, 9)]
    assert plan_truncation(None, since=10, held_from=None, chunk=4) == []
    for since in (0, 1):
        assert plan_truncation(0, since=since, held_from=None, chunk=4) == []
    with pytest.raises(ValueError):
        plan_truncation(0, since=10, held_from=None, chunk=0)


# -- on a store ----------------------------------------------------------------------------


def _age_batches(consensus, shard_id: str, seconds: float) -> None:
    """Make the shard's batches look committed ``seconds`` ago (older than GC's grace)."""
    with consensus.engine.begin() as conn:
        conn.execute(
            sa.update(batches_table)
            .where(batches_table.c.shard_id == shard_id)
            .values(committed_at=batches_table.c.committed_at - seconds)
        )


def _ts_of(consensus, table: sa.Table, shard_id: str) -> list[int]:
    with consensus.engine.connect() as conn:
        return list(conn.execute(sa.select(table.c.ts).where(table.c.shard_id == shard_id).order_by(table.c.ts))
                    .scalars())


def test_truncated_history_retries_checkpoints_restores_seeks_resumes_and_reads_the_oracle(
    spark, consensus, blob, tmp_path
):
    shard = written_shard(spark, consensus, blob, tmp_path, batches=4)
    stats = [b.stats for b in shard.batches()]
    # Batch 1 as its writer would retry it after losing the answer to its commit; a slow
    # writer will hold batch 4, the upper, which a peer commits first.
    slow = Writer(shard, "slow", spark_factory=lambda: spark)
    committed_1 = consensus.get_batch(shard.shard_id, 1)
    compact(spark, shard)  # since 4
    _age_batches(consensus, shard.shard_id, 2 * HOUR)
    age_files(blob.root)

    report = collect_garbage(consensus, blob, shard.shard_id, grace_seconds=HOUR)
    assert report.history == {"kept_from": 3, "batches": 3, "bindings": 3, "chunks": 1}
    assert _ts_of(consensus, batches_table, shard.shard_id) == [3]
    assert _ts_of(consensus, bindings_table, shard.shard_id) == [3]
    [rollup] = rollups(consensus, shard.shard_id)
    assert (rollup.from_ts, rollup.to_ts, rollup.batches) == (0, 3, 3)
    assert rollup.rows_in == sum(s["rows_in"] for s in stats[:3])
    assert rollup.rows_out == sum(s["rows_out"] for s in stats[:3])
    assert rollup.first_committed_at <= rollup.last_committed_at < time.time() - HOUR

    # The retry of batch 1 with its own token learns that it is persisted (ts < upper).
    retried = consensus.compare_and_append(shard.shard_id, 1, 2, committed_1)
    assert (retried.outcome, retried.upper) == (AppendOutcome.TRUNCATED, 4)

    # The token check of a batch held at the upper still works: a peer's token won.
    shard.mint_binding(4, minted_by="slow")
    held = slow.stage(4)
    Writer(shard, "peer", spark_factory=lambda: spark).run(max_batches=1, with_lag=False)
    assert slow.append(held) == ALREADY_PERSISTED
    assert not os.path.exists(blob.path(held.run["path"]))  # provably lost: deleted at once

    # A checkpoint of the truncated shard restores, seeks and resumes to the oracle.
    entry = create_checkpoint(shard)
    manifest = read_manifest(blob, shard.shard_id, entry.id)
    assert [b["ts"] for b in manifest["bindings"]] == [3, 4] and manifest["rollups"][0]["batches"] == 3
    restore_checkpoint(consensus, blob, shard.shard_id, entry.id, target_shard_id="orders-restored")
    restored = Shard.open(consensus, blob, "orders-restored")
    assert [r.batches for r in rollups(consensus, "orders-restored")] == [3]
    recover(restored)
    Writer(restored, "resumed", spark_factory=lambda: spark).run(until_caught_up=True, with_lag=False)
    Writer(shard, "on", spark_factory=lambda: spark).run(until_caught_up=True, with_lag=False)
    assert table(restored) == oracle(restored) == table(shard)


def test_retry_of_a_truncated_batch_keeps_its_files(spark, consensus, blob, tmp_path):
    shard = written_shard(spark, consensus, blob, tmp_path, batches=3)
    slow = Writer(shard, "slow", spark_factory=lambda: spark)
    shard.mint_binding(3, minted_by="slow")
    held = slow.stage(3)
    # Its append landed, but the answer was lost: the writer still holds it.
    committed = BatchRecord(held.ts, slow.writer_id, held.token, held.run, {"rows_in": held.rows_in})
    assert consensus.compare_and_append(shard.shard_id, 3, 4, committed).outcome is AppendOutcome.COMMITTED
    Writer(shard, "on", spark_factory=lambda: spark).run(max_batches=2, with_lag=False)
    compact(spark, shard)  # since 6
    _age_batches(consensus, shard.shard_id, 2 * HOUR)
    truncate_history(consensus, shard.shard_id, committed_before=time.time() - HOUR,
                     source_partitions=shard.anchor_source_index())
    assert _ts_of(consensus, batches_table, shard.shard_id) == [5]

    # Whose token won is no longer recorded: persisted, and the files stay for GC to judge
    # (a checkpoint may list them).
    assert slow.append(held) == ALREADY_PERSISTED
    assert os.path.isdir(blob.path(held.run["path"]))


def test_rows_committed_inside_the_grace_period_stay(spark, consensus, blob, tmp_path):
    shard = written_shard(spark, consensus, blob, tmp_path, batches=4)
    compact(spark, shard)
    report = truncate_history(consensus, shard.shard_id, committed_before=time.time() - HOUR,
                              source_partitions=shard.anchor_source_index())
    assert (report.batches, report.bindings) == (0, 0)
    assert _ts_of(consensus, batches_table, shard.shard_id) == [0, 1, 2, 3]
    # A retry inside the grace period still learns that its own token landed.
    first = consensus.get_batch(shard.shard_id, 0)
    assert consensus.compare_and_append(shard.shard_id, 0, 1, first).outcome is AppendOutcome.ALREADY_COMMITTED


def test_truncation_deletes_in_bounded_chunks(spark, consensus, blob, tmp_path):
    shard = written_shard(spark, consensus, blob, tmp_path, batches=6)
    compact(spark, shard)  # since 6: ts 0..4 go
    _age_batches(consensus, shard.shard_id, 2 * HOUR)
    deleted_per_statement: list[int] = []

    def count(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("DELETE") and "upsert_batches" in statement:
            deleted_per_statement.append(cursor.rowcount)

    chunks = []
    event.listen(consensus.engine, "after_cursor_execute", count)
    try:
        report = truncate_history(consensus, shard.shard_id, committed_before=time.time() - HOUR, chunk=2,
                                  source_partitions=shard.anchor_source_index(),
                                  on_chunk=lambda lo, hi: chunks.append((lo, hi)))
    finally:
        event.remove(consensus.engine, "after_cursor_execute", count)
    assert chunks == [(0, 2), (2, 4), (4, 5)]
    assert deleted_per_statement == [2, 2, 1]
    assert report.batches == 5 and _ts_of(consensus, batches_table, shard.shard_id) == [5]
    # One truncation, one audit row.
    [rollup] = rollups(consensus, shard.shard_id)
    assert (rollup.from_ts, rollup.to_ts, rollup.batches) == (0, 5, 5)


def test_every_truncation_folds_into_the_shards_one_rollup_row(spark, consensus, blob, tmp_path):
    # A checkpoint carries the rollups: a row per truncation (per GC) made it cost more as the
    # history grew.
    shard = written_shard(spark, consensus, blob, tmp_path, batches=6)
    compact(spark, shard)  # since 6: ts 0..4 may go
    partitions = shard.anchor_source_index()
    with consensus.engine.begin() as conn:  # ts 0..2 past the grace period, 3..5 inside it
        conn.execute(sa.update(batches_table)
                     .where(batches_table.c.shard_id == shard.shard_id, batches_table.c.ts < 3)
                     .values(committed_at=batches_table.c.committed_at - 2 * HOUR))
    first = truncate_history(consensus, shard.shard_id, committed_before=time.time() - HOUR,
                             source_partitions=partitions)
    _age_batches(consensus, shard.shard_id, 2 * HOUR)
    second = truncate_history(consensus, shard.shard_id, committed_before=time.time() - HOUR,
                              source_partitions=partitions)
    assert (first.batches, second.batches) == (3, 2)
    [rollup] = rollups(consensus, shard.shard_id)
    assert (rollup.from_ts, rollup.to_ts, rollup.batches) == (0, 5, 5)


def test_bindings_from_the_lowest_source_index_anchor_stay(spark, consensus, blob, tmp_path):
    # A shard of 4 batches has no source index row yet (rows are saved every 32 bindings):
    # planning would rebuild them from binding 0, so every binding stays.
    shard = written_shard(spark, consensus, blob, tmp_path, batches=4)
    compact(spark, shard)
    _age_batches(consensus, shard.shard_id, 2 * HOUR)
    partitions = shard.source.partitions()
    report = truncate_history(consensus, shard.shard_id, committed_before=time.time() - HOUR,
                              source_partitions=partitions)
    assert (report.kept_from, report.batches) == (0, 0)
    # Once anchored at binding(upper - 1) (as GC does first), truncation goes up to since - 1,
    # and planning checks the rows against their anchor: the next batches bind and commit.
    assert sorted(shard.anchor_source_index()) == sorted(partitions)
    report = truncate_history(consensus, shard.shard_id, committed_before=time.time() - HOUR,
                              source_partitions=partitions)
    assert (report.kept_from, report.batches) == (3, 3)
    Writer(shard, "on", spark_factory=lambda: spark).run(until_caught_up=True, with_lag=False)
    assert table(shard) == oracle(shard)


def test_a_planner_overtaken_by_a_peer_and_a_truncation_takes_the_peers_binding(spark, consensus, blob, tmp_path,
                                                                               monkeypatch):
    """A planner holds binding(3) to plan binding 4; before it reads the source index, a peer
    binds and commits batch 4 and GC anchors the index rows at binding 4 and truncates
    bindings 0..2. The planner took the index row (now ahead of its binding) as unusable and
    caught up from binding 0, whose rows were gone: every segment bound by 0..2, still in the
    landing directory, was called a late arrival (the long soak's writer exited 3 on it)."""
    import airflow_upsert_provider.engine.table.shard as shard_module
    from airflow_upsert_provider.engine.errors import PlanningOutdated

    shard = written_shard(spark, consensus, blob, tmp_path, batches=4)
    compact(spark, shard)  # since 4: bindings 0..2 may go
    _age_batches(consensus, shard.shard_id, 2 * HOUR)
    held = {ts: shard.binding(ts) for ts in (1, 3)}
    real_survey = shard_module.survey_source
    overtaken = []

    def survey_after_the_peer(source, index, previous):
        if not overtaken:
            overtaken.append(previous.ts)
            peer = Writer(Shard.open(consensus, blob, shard.shard_id), "peer", spark_factory=lambda: spark)
            assert [b.outcome for b in peer.run(max_batches=1, with_lag=False).results] == ["committed"]
            report = collect_garbage(consensus, blob, shard.shard_id, grace_seconds=HOUR)
            assert report.history["bindings"] == 3
        return real_survey(source, index, previous)

    monkeypatch.setattr(shard_module, "survey_source", survey_after_the_peer)
    minted = shard.mint_binding(4, minted_by="overtaken")
    assert overtaken == [3]
    assert _ts_of(consensus, bindings_table, shard.shard_id) == [3, 4]
    assert minted.to_json() == shard.binding(4).to_json()
    # Planning from binding(3) now subtracts binding 4's names from the row anchored at it.
    index = shard.source_index()
    for partition in shard.source.partitions():
        names, _ = index.settled(partition, held[3])
        assert names == index.settled(partition, shard.binding(4))[0] - index.settled_by(partition, shard.binding(4))
    # From binding(1), whose successor is truncated, nothing can be settled: a retryable
    # refusal, never a late arrival.
    with pytest.raises(PlanningOutdated) as refused:
        index.settled("p0", held[1])
    assert refused.value.retryable and refused.value.exit_code == 2
    Writer(shard, "on", spark_factory=lambda: spark).run(until_caught_up=True, with_lag=False)
    assert table(shard) == oracle(shard)


def test_source_prune_deletes_the_segments_of_truncated_bindings(spark, consensus, blob, tmp_path):
    from airflow_upsert_provider.engine.maintenance.retention import prune

    shard = written_shard(spark, consensus, blob, tmp_path, batches=4)
    compact(spark, shard)
    _age_batches(consensus, shard.shard_id, 2 * HOUR)
    age_files(blob.root)
    assert collect_garbage(consensus, blob, shard.shard_id, grace_seconds=HOUR).history["bindings"] == 3
    report = prune(shard, below="committed")
    # Batches 0..3 bound 2 segments each (one per partition), every one of them deleted.
    assert report.files == 8 and all(p.kept_unbound == 0 for p in report.partitions)
    assert all(len(os.listdir(shard.source.partition_dir(p))) == 1 + 2 for p in ("p0", "p1"))  # log + 2 left


# -- rejects/ ------------------------------------------------------------------------------


def _rejects_dir(blob, shard_id: str, ts: int, name: str, age: float) -> str:
    directory = blob.path(shard_id, "rejects", f"ts={ts:012d}", name)
    os.makedirs(directory)
    with open(os.path.join(directory, "part-0.jsonl"), "w") as handle:
        handle.write('{"id": 1, "_error": "bad"}\n')
    past = time.time() - age
    for path in (os.path.join(directory, "part-0.jsonl"), directory, os.path.dirname(directory)):
        os.utime(path, (past, past))
    return directory


def test_gc_collects_rejects_of_batches_below_since_once_past_their_retention(spark, consensus, blob, tmp_path):
    shard = written_shard(spark, consensus, blob, tmp_path, batches=4)
    compact(spark, shard, since=3)
    old = _rejects_dir(blob, shard.shard_id, 1, "w-old", 40 * DAY)
    young = _rejects_dir(blob, shard.shard_id, 2, "w-young", 2 * DAY)
    live = _rejects_dir(blob, shard.shard_id, 3, "w-live", 40 * DAY)  # batch 3 >= since: live

    kept_all = collect_garbage(consensus, blob, shard.shard_id, grace_seconds=HOUR, rejects_retention_seconds=0)
    assert not [i for i in kept_all.items if i.kind == "rejects"]
    assert all(os.path.isdir(d) for d in (old, young, live))

    report = collect_garbage(consensus, blob, shard.shard_id, grace_seconds=HOUR)
    assert [(i.kind, i.path) for i in report.items if i.kind == "rejects"] == [
        ("rejects", blob.relative(old))
    ]
    assert not os.path.exists(old) and os.path.isdir(young) and os.path.isdir(live)

    collect_garbage(consensus, blob, shard.shard_id, grace_seconds=HOUR, rejects_retention_seconds=DAY)
    assert not os.path.exists(young) and os.path.isdir(live)


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf")])
def test_an_invalid_rejects_retention_is_refused_naming_it(spark, consensus, blob, tmp_path, bad):
    shard = written_shard(spark, consensus, blob, tmp_path, batches=0)
    with pytest.raises(ConfigurationError, match="rejects retention") as caught:
        collect_garbage(consensus, blob, shard.shard_id, rejects_retention_seconds=bad)
    assert caught.value.details["field"] == "rejects_retention"


# -- truncated history accuses no good file ---------------------------------------------------


def _landing_files(shard) -> dict[str, bytes]:
    files = {}
    for partition in shard.source.partitions():
        directory = shard.source.partition_dir(partition)
        for name in os.listdir(directory):
            if not name.startswith("."):
                with open(os.path.join(directory, name), "rb") as handle:
                    files[os.path.join(directory, name)] = handle.read()
    return files


def test_a_pruned_segment_put_back_after_truncation_is_settled_not_a_late_arrival(spark, consensus, blob, tmp_path):
    """Batches, compact, gc with grace 0 (which truncates the history), source prune below
    committed, one more batch, then one pruned segment copied back with the same name and
    bytes: the next batches bind and commit (before: BadInputError, exit 3, "late arrival:
    offset 0 is below the bound offset ...", until the file was removed)."""
    from airflow_upsert_provider.engine.maintenance.retention import prune
    from tests.oracle import oracle_table

    shard = written_shard(spark, consensus, blob, tmp_path, batches=4)
    everything = oracle_table(shard.source.root)  # the table once every segment is read
    landed = _landing_files(shard)
    compact(spark, shard)  # since 4
    assert collect_garbage(consensus, blob, shard.shard_id, grace_seconds=0).history["bindings"] == 3
    assert prune(shard, below="committed").files == 8
    writer = Writer(shard, "on", spark_factory=lambda: spark)
    assert [r.outcome for r in writer.run(max_batches=1, with_lag=False).results] == ["committed"]

    put_back = os.path.join(shard.source.partition_dir("p0"), "0.jsonl")
    assert put_back in landed and not os.path.exists(put_back)
    with open(put_back, "wb") as handle:
        handle.write(landed[put_back])
    results = writer.run(until_caught_up=True, with_lag=False).results
    assert {r.outcome for r in results} == {"committed", "nothing_to_do"}
    assert shard.state().upper == 6 and os.path.exists(put_back)
    assert table(shard) == everything


def test_a_partition_absent_during_gc_and_back_later_is_not_a_late_arrival(spark, consensus, blob, tmp_path):
    """A partition's directory is moved away while GC anchors the source index and truncates
    the history, and moved back: its segments bound by truncated bindings are settled (its
    row was anchored too), and the shard catches up (before: BadInputError, exit 3, a late
    arrival for each of them)."""
    shard = written_shard(spark, consensus, blob, tmp_path, batches=4)
    compact(spark, shard)  # since 4
    directory = shard.source.partition_dir("p1")
    os.rename(directory, str(tmp_path / "p1-away"))
    report = collect_garbage(consensus, blob, shard.shard_id, grace_seconds=0)
    assert report.history["bindings"] == 3
    os.rename(str(tmp_path / "p1-away"), directory)
    index = shard.source_index()
    assert index.settled("p1", shard.binding(3)) == ({f"{o}.jsonl" for o in (0, 10, 20, 30)}, 0)

    Writer(shard, "on", spark_factory=lambda: spark).run(until_caught_up=True, with_lag=False)
    assert shard.state().upper == 6
    assert table(shard) == oracle(shard)


# -- a writer paused across a truncation --------------------------------------------------------


@pytest.mark.parametrize("paused", ["after_it_took_the_binding", "before_it_minted"])
def test_a_writer_paused_across_commits_compaction_and_gc_reports_already_persisted(
    spark, consensus, blob, tmp_path, paused
):
    """A writer reads the upper (2) and is paused, after it took binding(2) or before it
    minted it, while a peer commits batches 2..4, compaction moves since to 5 and GC with
    grace 0 truncates bindings 0..3. Resumed, its step reports batch 2 as already persisted
    and the writer catches up (before: ConfigurationError, exit 2, not retryable: "batch 2 of
    shard 'orders' is not bound yet" / "cannot bind ts 2: binding 1 is missing")."""
    shard = written_shard(spark, consensus, blob, tmp_path, batches=2)
    writer = Writer(shard, "paused", spark_factory=lambda: spark)
    real_mint = shard.mint_binding

    def peer_commits_compacts_and_collects() -> None:
        peer = Writer(Shard.open(consensus, blob, shard.shard_id), "peer", spark_factory=lambda: spark)
        assert [r.outcome for r in peer.run(max_batches=3, with_lag=False).results] == ["committed"] * 3
        compact(spark, shard)
        assert collect_garbage(consensus, blob, shard.shard_id, grace_seconds=0).history["bindings"] == 4
        assert shard.binding(1) is None and shard.binding(2) is None

    def paused_mint(ts, **kwargs):
        assert ts == 2
        if paused == "before_it_minted":
            peer_commits_compacts_and_collects()
            return real_mint(ts, **kwargs)
        binding = real_mint(ts, **kwargs)
        peer_commits_compacts_and_collects()
        return binding

    shard.mint_binding = paused_mint
    result = writer.step()
    assert (result.ts, result.outcome, result.upper) == (2, ALREADY_PERSISTED, 5)
    assert writer.converged == 1 and not writer.held
    shard.mint_binding = real_mint
    assert {r.outcome for r in writer.run(until_caught_up=True, with_lag=False).results} == {"committed", "nothing_to_do"}
    assert shard.state().upper == 6 and table(shard) == oracle(shard)


def test_a_missing_binding_past_the_upper_is_retryable_and_below_it_a_configuration_error():
    from airflow_upsert_provider.engine.errors import PlanningOutdated
    from airflow_upsert_provider.engine.table.shard import missing_binding_error

    for ts in range(1, 12):
        for upper in range(0, 14):
            for missing in (ts, ts - 1):
                error = missing_binding_error("orders", ts, missing, upper)
                if ts < upper:
                    assert isinstance(error, PlanningOutdated) and error.retryable and error.exit_code == 2
                    assert f"batch {ts} of shard 'orders' was persisted by a peer meanwhile (upper {upper})" in error.message
                else:
                    assert isinstance(error, ConfigurationError) and not error.retryable
                    assert error.message == (f"batch {ts} of shard 'orders' is not bound yet" if missing == ts
                                             else f"cannot bind ts {ts}: binding {ts - 1} is missing")
