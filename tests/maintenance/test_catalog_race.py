"""The checkpoint catalog under overlapping changes: two `checkpoint create` processes and
retention at once lose no entry (each change is a compare-and-set under the catalog lock)."""

from __future__ import annotations

import multiprocessing
import os

from airflow_upsert_provider.engine.maintenance.checkpoint import create_checkpoint, list_checkpoints
from airflow_upsert_provider.engine.maintenance.checkpoint_catalog import Catalog, checkpoint_dirs
from airflow_upsert_provider.engine.maintenance.checkpoint_retention import apply_retention
from airflow_upsert_provider.engine.maintenance.checkpoint_verify import verify_checkpoint
from airflow_upsert_provider.engine.errors import ConfigurationError
from tests.maintenance.support import written_shard

TIMEOUT = 120


def _open_shard(consensus_url: str, blob_root: str, shard_id: str):
    from airflow_upsert_provider.engine.blob.files import open_blob
    from airflow_upsert_provider.engine.store.registry import open_consensus
    from airflow_upsert_provider.engine.table.shard import Shard

    return Shard.open(open_consensus(consensus_url), open_blob(blob_root), shard_id)


def create_paused_before_catalog(consensus_url, blob_root, shard_id, ready, go, out) -> None:
    """Process A: create a checkpoint, pausing after its commit marker, before the catalog."""
    shard = _open_shard(consensus_url, blob_root, shard_id)

    def pause(step: str) -> None:
        if step == "commit":
            ready.set()
            if not go.wait(TIMEOUT):
                raise TimeoutError("never released")

    out.put(("A", create_checkpoint(shard, on_step=pause).id))


def create_with_retention(consensus_url, blob_root, shard_id, keep_last, out) -> None:
    """Process B: create a checkpoint, then apply retention (keep the last N)."""
    shard = _open_shard(consensus_url, blob_root, shard_id)
    out.put(("B", create_checkpoint(shard, keep_last=keep_last).id))


def retention_only(consensus_url, blob_root, shard_id, keep_last, out) -> None:
    """Process C: retention alone, as a maintenance task runs it."""
    shard = _open_shard(consensus_url, blob_root, shard_id)
    removed = apply_retention(Catalog.load(shard.blob, shard_id, shard.consensus), keep_last=keep_last)
    out.put(("C", [e.id for e in removed]))


def run(ctx, target, *args):
    process = ctx.Process(target=target, args=args)
    process.start()
    return process


def test_two_creates_and_retention_in_separate_processes_lose_no_entry(spark, consensus, consensus_url, blob, tmp_path):
    shard = written_shard(spark, consensus, blob, tmp_path, batches=2)
    x0, x1 = create_checkpoint(shard).id, create_checkpoint(shard).id
    ctx = multiprocessing.get_context("spawn")
    ready, go, out = ctx.Event(), ctx.Event(), ctx.Queue()
    args = (consensus_url, blob.root, shard.shard_id)

    # A holds the catalog it loaded before B and C change it, then adds its entry.
    a = run(ctx, create_paused_before_catalog, *args, ready, go, out)
    assert ready.wait(TIMEOUT)
    b = run(ctx, create_with_retention, *args, 3, out)  # [x0, x1, B] -> keeps all three
    b.join(TIMEOUT)
    c = run(ctx, retention_only, *args, 2, out)  # [x0, x1, B] -> drops x0
    c.join(TIMEOUT)
    go.set()
    a.join(TIMEOUT)
    assert (a.exitcode, b.exitcode, c.exitcode) == (0, 0, 0)
    results = dict(out.get(timeout=5) for _ in range(3))

    listed = [e.id for e in list_checkpoints(blob, shard.shard_id)]
    assert results["C"] == [x0]
    assert sorted(listed) == sorted([x1, results["B"], results["A"]])
    for checkpoint_id in listed:
        verify_checkpoint(blob, shard.shard_id, checkpoint_id)
    assert sorted(checkpoint_dirs(blob, shard.shard_id)) == sorted(listed)


def test_retention_decides_on_the_catalog_as_it_is_under_the_lock(spark, consensus, blob, tmp_path):
    """A retention holding a stale catalog object never resurrects nor drops the wrong one."""
    shard = written_shard(spark, consensus, blob, tmp_path, batches=1)
    first = create_checkpoint(shard)
    stale = Catalog.load(blob, shard.shard_id, consensus)  # lists only the first
    second, third = create_checkpoint(shard), create_checkpoint(shard)
    removed = apply_retention(stale, keep_last=2)
    assert [e.id for e in removed] == [first.id]
    assert [e.id for e in list_checkpoints(blob, shard.shard_id)] == [second.id, third.id]
    assert stale.entries == list_checkpoints(blob, shard.shard_id)
    assert not os.path.exists(os.path.join(blob.root, shard.shard_id, "checkpoints", first.id))


def test_changing_a_catalog_without_its_lock_is_refused(spark, consensus, blob, tmp_path):
    shard = written_shard(spark, consensus, blob, tmp_path, batches=1)
    entry = create_checkpoint(shard)
    try:
        Catalog.load(blob, shard.shard_id).remove({entry.id})
    except ConfigurationError as exc:
        assert "needs the consensus store" in str(exc)
    else:
        raise AssertionError("a catalog change without the consensus lock was accepted")
    assert [e.id for e in list_checkpoints(blob, shard.shard_id)] == [entry.id]


# -- no blob I/O while the catalog lock (or any consensus transaction) is held ------------------


def lock_probe(consensus, shard_id: str):
    """A check, from a connection of its own, that nothing holds the store's write lock
    (SQLite) or the shard's catalog lock row (PostgreSQL) right now: None, or what blocked."""
    if consensus.dialect == "sqlite":
        import sqlite3

        def probe() -> str | None:
            conn = sqlite3.connect(consensus.engine.url.database, timeout=0, isolation_level=None)
            try:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("ROLLBACK")
                return None
            except sqlite3.OperationalError as exc:
                return str(exc)
            finally:
                conn.close()

        return probe
    import sqlalchemy as sa

    engine = sa.create_engine(consensus.engine.url, poolclass=sa.pool.NullPool)

    def probe() -> str | None:
        try:
            with engine.begin() as conn:
                conn.execute(
                    sa.text("SELECT shard_id FROM upsert_catalog_locks WHERE shard_id = :s FOR UPDATE NOWAIT"),
                    {"s": shard_id},
                )
            return None
        except sa.exc.OperationalError as exc:
            return str(exc.orig).splitlines()[0]

    return probe


def test_a_catalog_change_does_no_blob_io_while_the_catalog_lock_is_held(consensus, blob):
    from airflow_upsert_provider.engine.maintenance.checkpoint_catalog import CheckpointEntry
    from tests.test_store_load import guard_blob

    inside = guard_blob(blob, consensus)
    probe = lock_probe(consensus, "orders")
    calls: list[str] = []
    blocked: list[tuple[str, str]] = []
    for name in ("write_atomic", "read_bytes", "listdir", "exists", "delete_file"):
        method = getattr(blob, name)

        def probed(*args, _method=method, _name=name, **kwargs):
            calls.append(_name)
            reason = probe()
            if reason is not None:
                blocked.append((_name, reason))
            return _method(*args, **kwargs)

        setattr(blob, name, probed)

    def entry(n: int) -> CheckpointEntry:
        return CheckpointEntry(f"{n:012d}-abcdef0{n}", n, 0, float(n), 1, 10, f"{n:064d}")

    catalog = Catalog.load(blob, "orders", consensus)
    catalog.ensure()
    catalog.add(entry(1))
    catalog.add(entry(2))
    catalog.remove({entry(1).id})
    assert {"write_atomic", "read_bytes", "listdir"} <= set(calls)  # the copies were written and read
    assert blocked == [] and inside == []
    assert [e.id for e in Catalog.load(blob, "orders", consensus).entries] == [entry(2).id]
    assert [e.id for e in list_checkpoints(blob, "orders")] == [entry(2).id]  # the blob copy
