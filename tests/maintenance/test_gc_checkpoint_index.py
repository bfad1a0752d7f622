"""What the retained checkpoints of every shard pin, learned from the consensus store's index
(store/checkpoint_refs.py) instead of reading every manifest at every GC: the pure choice of
which manifests to read (seeded sweeps), and on the S3 server a GC of a shard whose replaced
runs only another shard's checkpoint still names, with the manifest GETs counted. No Spark."""

from __future__ import annotations

import random

from airflow_upsert_provider.engine.blob.files import open_blob
from airflow_upsert_provider.engine.maintenance.checkpoint import create_checkpoint
from airflow_upsert_provider.engine.maintenance.checkpoint_catalog import MANIFEST_NAME
from airflow_upsert_provider.engine.maintenance.checkpoint_restore import restore_checkpoint
from airflow_upsert_provider.engine.maintenance.gc import collect_garbage
from airflow_upsert_provider.engine.maintenance.gc_plan import PINNED, plan_manifest_reads
from airflow_upsert_provider.engine.store.checkpoint_refs import references_of
from airflow_upsert_provider.engine.table.shard import Shard
from tests.maintenance.support import age_compaction
from tests.maintenance.test_gc_state import GRACE, assert_intact, commit, replaced_runs
from tests.arrow_runs import compact_batches
from tests.helpers import make_shard


def random_case(rng: random.Random):
    owners = [f"s{i}" for i in range(rng.randrange(0, 4))]
    listed = {o: {f"c{j}": rng.choice("abc") for j in range(rng.randrange(0, 5))} for o in owners}
    indexed = {}
    for owner in owners + ["gone"]:
        for j in range(5):
            if rng.random() < 0.5:
                indexed[owner, f"c{j}"] = rng.choice("abc")
    return listed, indexed


def test_each_listed_checkpoint_is_taken_from_the_index_only_with_its_manifests_digest_else_read():
    rng = random.Random(35)
    for _ in range(3000):
        listed, indexed = random_case(rng)
        plan = plan_manifest_reads(listed, indexed)
        keys = {(o, c) for o, ids in listed.items() for c in ids}
        assert sorted(plan.indexed + plan.read) == sorted(keys)  # each once, nothing else
        assert all(indexed[k] == listed[k[0]][k[1]] for k in plan.indexed)
        assert all(indexed.get(k) != listed[k[0]][k[1]] for k in plan.read)
        # Stale: rows of a read owner its catalog does not list with that digest; an owner
        # not read this time (its catalog unreadable, or elsewhere) keeps its rows.
        assert plan.stale == sorted(k for k, d in indexed.items() if k[0] in listed and listed[k[0]].get(k[1]) != d)
        assert not any(k[0] == "gone" for k in plan.stale)
        # Recording what was read makes the next plan read nothing.
        again = plan_manifest_reads(listed, {**{k: d for k, d in indexed.items() if k not in plan.stale},
                                             **{k: listed[k[0]][k[1]] for k in plan.read}})
        assert again.read == [] and again.stale == []


def manifest_gets(s3_server, since: int) -> list[str]:
    return [target for method, target in s3_server.requests()[since:]
            if method == "GET" and target.split("?")[0].endswith(MANIFEST_NAME)]


def test_runs_only_another_shards_checkpoint_names_are_kept_and_each_manifest_is_read_once(
        consensus, s3_server, s3_root, tmp_path):
    blob = open_blob(s3_root)
    orders = make_shard(consensus, blob, tmp_path / "orders", shard_id="orders", buckets=2)
    rng, history = random.Random(5), []
    commit(orders, rng, history, 3)
    restore_from = create_checkpoint(orders)
    # A replica restored from it reads the orders' runs; its checkpoint names them.
    restore_checkpoint(consensus, blob, "orders", restore_from.id, target_shard_id="replica")
    replica = Shard.open(consensus, blob, "replica")
    replica_checkpoint = create_checkpoint(replica)
    compact_batches(replica, list(history), 3)  # the replica's state no longer names them
    shared = {b.run["path"] for b in orders.batches(below=3)}
    compact_batches(orders, history, 3)
    orders_checkpoint = create_checkpoint(orders, keep_last=1)  # the orders' own no longer names them
    s3_server.age(s3_root.split("/")[2], seconds=3 * 3600)
    age_compaction(consensus, "orders")
    age_compaction(consensus, "replica")
    assert shared <= replaced_runs(orders)

    # First GC: every retained manifest is read once (no index rows yet) and indexed.
    before = len(s3_server.requests())
    report = collect_garbage(consensus, blob, "orders", grace_seconds=GRACE, sweep=False)
    assert len(manifest_gets(s3_server, before)) == report.checkpoints_read == 2
    assert report.pending == {PINNED: len(shared)} and report.items == []
    indexed = references_of(consensus, ["orders", "replica"])
    assert sorted(indexed) == [("orders", orders_checkpoint.id), ("replica", replica_checkpoint.id)]
    assert {p.rsplit("/", 2)[0] for p in indexed["replica", replica_checkpoint.id][1]} >= shared

    # Later GCs, from state and sweeping: no manifest read, the same runs kept.
    for sweep in (False, True):
        before = len(s3_server.requests())
        report = collect_garbage(consensus, blob, "orders", grace_seconds=GRACE, sweep=sweep)
        assert manifest_gets(s3_server, before) == [] and report.checkpoints_read == 0
        assert report.checkpoints_indexed == 2 and report.items == []
        assert all(blob.exists(blob.path(p)) for p in shared)
    assert_intact(orders, history)

    # Retention drops the replica's checkpoint and its index row: the runs go, one manifest read.
    create_checkpoint(replica, keep_last=1)
    assert ("replica", replica_checkpoint.id) not in references_of(consensus, ["replica"])
    before = len(s3_server.requests())
    report = collect_garbage(consensus, blob, "orders", grace_seconds=GRACE, sweep=False)
    assert len(manifest_gets(s3_server, before)) == 1 and report.checkpoints_indexed == 1
    assert {i.path for i in report.items} == shared and replaced_runs(orders) == set()
    assert not any(blob.exists(blob.path(p)) for p in shared)
    assert_intact(orders, history)



def test_index_rows_are_dropped_only_for_a_directory_gone_from_the_blob_that_no_shard_owns():
    from itertools import combinations, product

    from airflow_upsert_provider.engine.maintenance.gc_plan import orphaned_index_owners

    names = ("a", "b", "c")
    subsets = [set(c) for r in range(len(names) + 1) for c in combinations(names, r)]
    for indexed, in_blob, shards in product(subsets, repeat=3):
        assert orphaned_index_owners(indexed, in_blob, shards) == sorted(
            o for o in names if o in indexed and o not in in_blob and o not in shards)


def test_gc_drops_the_index_rows_of_a_directory_that_no_longer_exists(consensus, s3_server, s3_root, tmp_path):
    """A copy of a shard's checkpoints in a directory no shard owns is indexed by the first GC;
    once the directory is deleted, the next GC drops its rows and keeps the shard's own."""
    blob = open_blob(s3_root)
    orders = make_shard(consensus, blob, tmp_path / "orders", shard_id="orders", buckets=1)
    commit(orders, random.Random(3), [], 2)
    own = create_checkpoint(orders)
    for listed in list(blob.walk_files(blob.path("orders", "checkpoints"))):
        relative = blob.relative(listed.path).split("/", 1)[1]
        blob.write_file(blob.path("stray", relative), blob.read_bytes(listed.path), sync=True)
    collect_garbage(consensus, blob, "orders", grace_seconds=GRACE, sweep=False)
    assert sorted(references_of(consensus, ["orders", "stray"])) == [("orders", own.id), ("stray", own.id)]

    blob.delete_tree(blob.path("stray"))
    collect_garbage(consensus, blob, "orders", grace_seconds=GRACE, sweep=False)
    assert sorted(references_of(consensus, ["orders", "stray"])) == [("orders", own.id)]
