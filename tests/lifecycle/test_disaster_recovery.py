"""Disaster recovery end to end (invariant 12): the consensus store is lost; the latest
checkpoint is restored into a new one, the source is sought, the stream resumed, and the
shard catches up with every offset processed exactly once. A seek refuses when segments it
still has to read were deleted (retention), and changes nothing."""

from __future__ import annotations

import collections
import os

import pytest
import sqlalchemy as sa

from airflow_upsert_provider.engine.lifecycle import recovery
from airflow_upsert_provider.engine.store import streams
from airflow_upsert_provider.engine.maintenance.checkpoint import create_checkpoint, list_checkpoints, restore_checkpoint
from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.engine.errors import SourceSegmentsMissing, StreamNotReady
from airflow_upsert_provider.engine.store.stream_rules import Status
from airflow_upsert_provider.engine.table.shard import Shard
from airflow_upsert_provider.engine.sources.planning import range_files
from airflow_upsert_provider.engine.maintenance.retention import record_deletions
from airflow_upsert_provider.engine.write.writer import Writer
from airflow_upsert_provider.sample_data import SampleSpec, generate
from tests.helpers import batch, make_shard, recover, table
from tests.maintenance.support import SPEC
from tests.oracle import oracle_table

# Segments landed after the store was lost: two more per partition, beyond SPEC's offsets.
LATE = SampleSpec(records=400, keys=600, partitions=2, segments_per_partition=2, delete_ratio=0.1,
                  first_seq=100, seed=12)


def lose_the_store(consensus) -> str:
    """Destroy the consensus database; return the URL of an empty one in its place."""
    url = consensus.url
    consensus.dispose()
    parsed = sa.engine.make_url(url)
    if parsed.get_backend_name() == "sqlite":
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(parsed.database + suffix):
                os.remove(parsed.database + suffix)
        return url
    import psycopg

    admin = parsed.set(drivername="postgresql", database="postgres").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{parsed.database}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{parsed.database}"')
    return url


def segment_files(root: str) -> list[tuple[str, int]]:
    """(partition, offset) of every segment file in the landing directory."""
    return sorted(
        (partition, int(name.split(".")[0]))
        for partition in os.listdir(root)
        for name in os.listdir(os.path.join(root, partition))
        if not name.startswith((".", "_"))
    )


def test_restore_seek_resume_after_losing_the_store(spark, consensus_url, blob, tmp_path):
    consensus = open_consensus(consensus_url)
    shard = make_shard(consensus, blob, tmp_path, spec=SPEC, max_files_per_batch=2)
    factory = lambda: spark  # noqa: E731
    writer = Writer(shard, "before", spark_factory=factory)
    writer.run(max_batches=2, with_lag=False)
    create_checkpoint(shard)
    # A recovery drill in the old store: its epoch must never come back after the loss.
    streams.begin_recovery(consensus, shard.shard_id, "operator", "drill")
    recover(shard, actor="operator")
    old_epoch = streams.read_stream(consensus, shard.shard_id).epoch
    Writer(shard, "before", spark_factory=factory).run(max_batches=1, with_lag=False)
    latest = create_checkpoint(shard)
    assert latest.upper == 3
    Writer(shard, "before", spark_factory=factory).run(max_batches=2, with_lag=False)
    assert shard.state().upper == 5  # two batches after the last checkpoint, lost with the store

    url = lose_the_store(consensus)
    generate(shard.source.root, LATE)  # the source kept receiving data meanwhile

    store = open_consensus(url)
    try:
        assert store.list_shards() == []
        assert [e.id for e in list_checkpoints(blob, shard.shard_id)][-1] == latest.id
        record = restore_checkpoint(store, blob, shard.shard_id, latest.id, actor="dr")
        assert record.upper == 3
        restored = Shard.open(store, blob, shard.shard_id)
        opened = streams.read_stream(store, shard.shard_id)
        assert opened.status is Status.RECOVERING and opened.epoch > old_epoch
        with pytest.raises(StreamNotReady):
            Writer(restored, "too-early", spark_factory=factory).run()

        sought = recovery.seek(restored, actor="dr")
        # The source is positioned where batch 3 starts: where binding 2 ended.
        assert sought.upper == 3 and sought.epoch == opened.epoch
        assert sought.position == store.get_binding(shard.shard_id, 2).to_offsets()
        streams.resume_after_recovery(store, shard.shard_id, sought.epoch, "dr")
        Writer(restored, "after", spark_factory=factory).run(until_caught_up=True, with_lag=False)

        # The table is the whole source's, old segments and late ones.
        assert table(restored) == oracle_table(restored.source.root)
        upper = restored.state().upper
        assert [b.ts for b in restored.batches()] == list(range(upper))
        bindings = list(store.bindings(shard.shard_id))
        assert [b.ts for b in bindings] == list(range(upper))
        covered: collections.Counter = collections.Counter()
        reached: dict[str, int] = {}
        for binding in bindings:
            for partition, rng in binding.ranges.items():
                # Contiguous: each range starts where the partition's previous one ended.
                assert rng["from"] == reached.get(partition, 0), (binding.ts, partition)
                reached[partition] = rng["to"]
                covered.update((partition, offset) for offset, _name in range_files(rng, ".jsonl"))
        # Every segment bound exactly once: no gap, no duplicate.
        assert sorted(covered) == segment_files(restored.source.root)
        assert set(covered.values()) == {1}

        history = streams.stream_history(store, shard.shard_id)
        assert [(h["action"], h["to"], h["actor"]) for h in history] == [
            ("restore", "RECOVERING", "dr"), ("recover seek", "RECOVERING", "dr"), ("recover resume", "READY", "dr")]
        assert {h["epoch"] for h in history} == {opened.epoch}
    finally:
        store.dispose()


# -- segments deleted before the seek ----------------------------------------------------------


def shard_with_a_bound_batch_in_hand(consensus, blob, tmp_path):
    """A shard at upper 1 (batch 0 committed), with batch 1 bound and never committed, and a
    recovery open. No Spark: the seek reads bindings and the source only."""
    spec = SampleSpec(records=120, keys=40, partitions=2, segments_per_partition=4, seed=3)
    shard = make_shard(consensus, blob, tmp_path, spec=spec, max_files_per_batch=2)
    shard.mint_binding(0, minted_by="w")
    assert consensus.compare_and_append(shard.shard_id, 0, 1, batch(0)).upper == 1
    assert shard.mint_binding(1, minted_by="w") is not None
    streams.begin_recovery(consensus, shard.shard_id, "operator", "store trouble")
    return shard


def assert_seek_refused_naming(shard, path: str, offset: int, partition: str) -> SourceSegmentsMissing:
    before = streams.read_stream(shard.consensus, shard.shard_id)
    with pytest.raises(SourceSegmentsMissing) as caught:
        recovery.seek(shard, actor="operator")
    error = caught.value
    assert error.exit_code == 4 and not error.retryable
    assert f"segment {path} (offset {offset} of partition {partition!r}" in error.message
    assert "nothing was changed" in error.message
    assert error.details["missing"][0]["file"] == path
    # Unchanged: still RECOVERING in the same epoch, no seek recorded, nothing in the history.
    after = streams.read_stream(shard.consensus, shard.shard_id)
    assert after == before and after.status is Status.RECOVERING and after.seeked_epoch is None
    assert streams.stream_history(shard.consensus, shard.shard_id)[-1]["action"] == "recover begin"
    return error


def test_seek_refuses_when_a_segment_bound_at_the_upper_is_gone(consensus, blob, tmp_path):
    shard = shard_with_a_bound_batch_in_hand(consensus, blob, tmp_path)
    upper = shard.state().upper
    position = shard.bound_offsets(upper)
    partition, rng = sorted(shard.binding(upper).ranges.items())[0]
    offset, name = range_files(rng, ".jsonl")[-1]
    assert offset >= position[partition]
    victim = os.path.join(shard.source.partition_dir(partition), name)
    os.remove(victim)  # by hand: no retention log records it, only the binding names it

    assert_seek_refused_naming(shard, victim, offset, partition)


def test_seek_refuses_when_retention_logged_a_deletion_at_or_after_the_seek_point(consensus, blob, tmp_path):
    shard = shard_with_a_bound_batch_in_hand(consensus, blob, tmp_path)
    upper = shard.state().upper
    position = shard.bound_offsets(upper)
    directory = shard.source.partition_dir("p1")
    bound = {o for _p, r in shard.binding(upper).ranges.items() for o, _n in range_files(r, ".jsonl")}
    names = sorted((int(n.split(".")[0]), n) for n in os.listdir(directory) if not n.startswith("."))

    # Retention deleting a segment below the seek point is harmless: the seek completes.
    early_offset, early_name = names[0]
    assert early_offset < position["p1"]
    record_deletions(directory, [(early_offset, early_name)])
    os.remove(os.path.join(directory, early_name))
    recover(shard, actor="operator")
    streams.begin_recovery(consensus, shard.shard_id, "operator", "again")

    # Not so one the shard still has to read, which no binding names (a lost store would have
    # lost that binding too): only the source's own log knows it is gone.
    late_offset, late_name = names[-1]
    assert late_offset >= position["p1"] and late_offset not in bound
    record_deletions(directory, [(late_offset, late_name)])
    os.remove(os.path.join(directory, late_name))

    error = assert_seek_refused_naming(shard, os.path.join(directory, late_name), late_offset, "p1")
    assert error.details["missing"][0]["known_from"] == f"deleted by retention (logged in {directory}/.retention.jsonl)"
    assert len(error.details["missing"]) == 1


# -- the original store after a restore into another one ---------------------------------------


def test_the_original_stores_gc_and_retention_keep_off_a_shard_restored_into_another_store(blob, tmp_path):
    """A disaster restore into a replacement store on the same blob root, while the original
    store still exists: the restored shard writes a batch; the original store's GC (grace 0)
    and checkpoint retention refuse with exit 4 naming the owner marker, and delete nothing.
    The replacement store's own GC works. No Spark: runs are files a test writes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from airflow_upsert_provider.engine.maintenance.checkpoint import Catalog, apply_retention
    from airflow_upsert_provider.engine.store.records import BatchRecord
    from airflow_upsert_provider.engine.maintenance.gc import collect_garbage
    from airflow_upsert_provider.engine.store.gc_claims import (
        OWNER_NAME,
        BlobOwnedElsewhere,
        blob_generation,
        recorded_generation,
    )
    from tests.maintenance.support import age_files, tree

    spec = SampleSpec(records=120, keys=40, partitions=2, segments_per_partition=4, seed=3)
    original = open_consensus(f"sqlite:///{tmp_path / 'original.db'}")
    replacement = open_consensus(f"sqlite:///{tmp_path / 'replacement.db'}")
    shard = make_shard(original, blob, tmp_path, spec=spec, max_files_per_batch=2)
    shard.mint_binding(0, minted_by="w")
    assert original.compare_and_append(shard.shard_id, 0, 1, batch(0)).upper == 1
    entry = create_checkpoint(shard)

    restore_checkpoint(replacement, blob, shard.shard_id, entry.id, actor="dr")
    owner = blob.path(shard.shard_id, OWNER_NAME)
    generation = recorded_generation(replacement, shard.shard_id)
    assert generation and blob_generation(blob, shard.shard_id) == generation
    os.remove(owner)  # as if the restore crashed before writing it: the seek writes it again
    restored = Shard.open(replacement, blob, shard.shard_id)
    recover(restored, actor="dr")
    assert blob_generation(blob, shard.shard_id) == generation

    # The restored shard commits batch 1 in the replacement store.
    run_dir = blob.path(shard.shard_id, "runs", "ts=000000000001", "after-0123456789ab")
    os.makedirs(os.path.join(run_dir, "_bucket=0"))
    data = os.path.join(run_dir, "_bucket=0", "part-0.parquet")
    pq.write_table(pa.table({"id": [1]}), data)
    rel = os.path.relpath(data, blob.root)
    run = {"path": os.path.relpath(run_dir, blob.root), "files": [{"path": rel, "bytes": os.path.getsize(data)}],
           "rows": 1}
    assert restored.mint_binding(1, minted_by="after") is not None
    assert replacement.compare_and_append(
        shard.shard_id, 1, 2, BatchRecord(ts=1, writer_id="after", token="t1", run=run, stats={})
    ).upper == 2
    age_files(blob.root)
    before = tree(blob.root)

    with pytest.raises(BlobOwnedElsewhere) as caught:
        collect_garbage(original, blob, shard.shard_id, grace_seconds=0)
    assert caught.value.exit_code == 4 and owner in caught.value.message
    assert caught.value.details["file"] == owner
    with pytest.raises(BlobOwnedElsewhere):
        apply_retention(Catalog.load(blob, shard.shard_id, original), keep_last=1)
    with pytest.raises(BlobOwnedElsewhere):
        create_checkpoint(shard)
    assert tree(blob.root) == before

    # The store the shard was restored into collects and checkpoints as usual.
    report = collect_garbage(replacement, blob, shard.shard_id, grace_seconds=0)
    assert report.items == [] and os.path.exists(data)
    assert create_checkpoint(restored).upper == 2
    original.dispose()
    replacement.dispose()
