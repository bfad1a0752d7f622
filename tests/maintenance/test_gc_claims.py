"""GC claims (invariant 16): a writer or compaction paused past GC's grace period is refused
inside its commit transaction and writes again; no committed batch names a missing file."""

from __future__ import annotations

import os

import pytest

from airflow_upsert_provider.engine.maintenance.checkpoint import (
    checkpoint_dirs,
    create_checkpoint,
    list_checkpoints,
    restore_checkpoint,
    verify_checkpoint,
)
from airflow_upsert_provider.engine.maintenance.compaction import compact
from airflow_upsert_provider.engine.store.records import BatchRecord
from airflow_upsert_provider.engine.errors import CommitRefused
from airflow_upsert_provider.engine.maintenance.gc import collect_garbage
from airflow_upsert_provider.engine.store.gc_claims import claim_for_deletion, claim_needed, claims
from airflow_upsert_provider.engine.table.shard import Shard
from airflow_upsert_provider.engine.write.writer import Writer
from tests.helpers import make_shard, table
from tests.maintenance.support import oracle, written_shard


def committed_files_exist(shard) -> None:
    """No committed batch and no compacted run names a missing file."""
    runs = [b.run for b in shard.batches()]
    compaction = shard.consensus.get_compaction(shard.shard_id)
    runs += [compaction.run] if compaction else []
    missing = [f["path"] for run in runs for f in run["files"] if not os.path.exists(shard.blob.path(f["path"]))]
    assert missing == []


class PausedAfterStaging(Writer):
    """A writer that, after staging its first batch and before appending it, lets ``pause``
    run (GC with grace 0: the pause outlasts any grace period)."""

    def __init__(self, *args, pause, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.pause = pause
        self.first_staged = None

    def stage(self, ts):
        staged = super().stage(ts)
        if self.first_staged is None:
            self.first_staged = staged
            self.pause(staged)
        return staged


def test_writer_paused_past_the_grace_period_restages_instead_of_committing_collected_files(
    spark, consensus, blob, tmp_path
):
    shard = written_shard(spark, consensus, blob, tmp_path, batches=2)
    reports = []
    writer = PausedAfterStaging(
        shard, "slow", spark_factory=lambda: spark,
        pause=lambda staged: reports.append(collect_garbage(consensus, blob, shard.shard_id, grace_seconds=0)),
    )

    result = writer.step()

    first = writer.first_staged
    assert first.run["path"] in {i.path for i in reports[0].items}  # GC did collect the staged run
    assert not os.path.exists(blob.path(first.run["path"]))
    assert claims(consensus, shard.shard_id) == [first.run["path"]]
    assert (result.ts, result.outcome) == (2, "committed")
    committed = shard.consensus.get_batch(shard.shard_id, 2)
    assert committed.token != first.token and committed.run["path"] != first.run["path"]
    assert committed.run["rows"] == first.run["rows"] > 0
    committed_files_exist(shard)

    writer.run(until_caught_up=True, with_lag=False)
    committed_files_exist(shard)
    assert table(shard) == oracle(shard)
    # The claim expired once the upper passed its ts: the next GC drops it.
    collect_garbage(consensus, blob, shard.shard_id, grace_seconds=0)
    assert claims(consensus, shard.shard_id) == []


def test_gc_crash_between_claiming_and_deleting_refuses_the_commit_and_the_next_gc_deletes(
    spark, consensus, blob, tmp_path
):
    shard = written_shard(spark, consensus, blob, tmp_path, batches=1)
    writer = Writer(shard, "slow", spark_factory=lambda: spark)
    shard.mint_binding(1, minted_by="slow")
    staged = writer.stage(1)

    def crash(step: str) -> None:
        if step == "claimed":
            raise KeyboardInterrupt("GC died after claiming")

    with pytest.raises(KeyboardInterrupt):
        collect_garbage(consensus, blob, shard.shard_id, grace_seconds=0, on_step=crash)
    assert os.path.isdir(blob.path(staged.run["path"]))  # claimed, not deleted
    with pytest.raises(CommitRefused, match="GC claimed") as refused:
        writer.append(staged)
    assert staged.run["path"] in str(refused.value) and refused.value.exit_code == 2
    assert shard.state().upper == 1 and shard.consensus.get_batch(shard.shard_id, 1) is None

    report = collect_garbage(consensus, blob, shard.shard_id, grace_seconds=0)
    assert [i.path for i in report.items] == [staged.run["path"]]
    assert not os.path.exists(blob.path(staged.run["path"]))
    writer.run(until_caught_up=True, with_lag=False)
    committed_files_exist(shard)
    assert table(shard) == oracle(shard)


def test_a_commit_after_the_claim_transaction_read_it_is_never_claimed(consensus, blob, tmp_path):
    """The claim transaction re-reads what committed since GC planned: a run committed in
    between is left out (GC then keeps it)."""
    shard = make_shard(consensus, blob, tmp_path)
    path = os.path.join("orders", "runs", "ts=000000000000", "w-abc")
    run = {"path": path, "files": [{"path": os.path.join(path, "_bucket=0", "p.parquet"), "bytes": 1}], "rows": 1}
    shard.compare_and_append(0, 1, BatchRecord(0, "w", "tok", run, {}))
    other = os.path.join("orders", "runs", "ts=000000000001", "x-def")
    assert claim_for_deletion(consensus, "orders", [path, other], planned_upper=0) == ([other], [])
    assert claims(consensus, "orders") == [other]
    with pytest.raises(CommitRefused):
        shard.compare_and_append(1, 2, BatchRecord(1, "x", "t2", {"path": other, "files": [], "rows": 0}, {}))
    assert shard.state().upper == 1


def test_claim_lifetime_rule():
    ts3 = os.path.join("s", "runs", "ts=000000000003", "w-1")
    since3 = os.path.join("s", "runs", "since=000000000003", "compaction-1")
    assert claim_needed(ts3, upper=3, since=0) and claim_needed(ts3, upper=2, since=0)
    assert not claim_needed(ts3, upper=4, since=0)  # no append of ts 3 can commit any more
    assert claim_needed(since3, upper=5, since=2) and not claim_needed(since3, upper=5, since=3)
    assert claim_needed(os.path.join("s", "runs", "odd", "x"), upper=9, since=9)  # unparsed: kept


def test_compaction_paused_past_the_grace_period_writes_a_new_output(spark, consensus, blob, tmp_path):
    shard = written_shard(spark, consensus, blob, tmp_path, batches=3)
    expected = table(shard)
    collected = []

    def pause(step: str) -> None:
        if step == "written" and not collected:
            collected.append(collect_garbage(consensus, blob, shard.shard_id, grace_seconds=0))

    result = compact(spark, shard, on_step=pause)
    first_output = [i.path for i in collected[0].items]
    assert len(first_output) == 1 and "compaction-" in first_output[0]
    assert result.outcome == "compacted" and result.attempts == 2 and result.run_path != first_output[0]
    committed_files_exist(shard)
    assert table(shard) == expected


def test_checkpoint_create_paused_past_the_grace_period_writes_the_checkpoint_again(spark, consensus, blob, tmp_path):
    """GC (grace 0) collects a checkpoint directory whose create paused between manifest and
    catalog: the create is refused the catalog entry and writes the checkpoint again."""
    shard = written_shard(spark, consensus, blob, tmp_path, batches=2)
    expected = table(shard)
    reports = []

    def pause(step: str) -> None:
        if step == "manifest" and not reports:
            reports.append(collect_garbage(consensus, blob, shard.shard_id, grace_seconds=0))

    entry = create_checkpoint(shard, on_step=pause)

    collected = [i.path for i in reports[0].items]
    assert len(collected) == 1 and collected[0].startswith(os.path.join(shard.shard_id, "checkpoints", ""))
    assert os.path.basename(collected[0]) != entry.id
    assert [e.id for e in list_checkpoints(blob, shard.shard_id)] == [entry.id]
    verify_checkpoint(blob, shard.shard_id, entry.id)
    collect_garbage(consensus, blob, shard.shard_id, grace_seconds=0)  # the refused attempt's leftovers
    assert checkpoint_dirs(blob, shard.shard_id) == [entry.id]
    restore_checkpoint(consensus, blob, shard.shard_id, entry.id, target_shard_id="restored")
    assert table(Shard.open(consensus, blob, "restored")) == expected
