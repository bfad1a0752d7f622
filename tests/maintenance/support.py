"""Builders shared by the maintenance tests: shards with committed batches, reads at every
ts, file-tree snapshots, and file ages."""

from __future__ import annotations

import os
import time

from airflow_upsert_provider.engine.write.writer import Writer
from airflow_upsert_provider.sample_data import SampleSpec
from tests.helpers import make_shard, table
from tests.oracle import oracle_table

# 2 partitions x 6 segments, 2 files per batch: 6 batches, with updates and tombstones
# crossing batches (600 keys for 2400 records).
SPEC = SampleSpec(records=2400, keys=600, partitions=2, segments_per_partition=6, delete_ratio=0.1, seed=11)
BATCHES = 6


def written_shard(spark, consensus, blob, tmp_path, *, batches: int | None = BATCHES, shard_id: str = "orders"):
    """A shard with ``batches`` committed batches of ``SPEC`` (None: all of them)."""
    shard = make_shard(consensus, blob, tmp_path, spec=SPEC, shard_id=shard_id, max_files_per_batch=2)
    writer = Writer(shard, "setup", spark_factory=lambda: spark)
    if batches is None:
        writer.run(until_caught_up=True, with_lag=False)
    elif batches:
        writer.run(max_batches=batches, with_lag=False)
    return shard


def reads_at_every_ts(shard, start: int = 0) -> dict[int, dict]:
    return {ts: table(shard, ts) for ts in range(start, shard.state().upper + 1)}


def oracle(shard) -> dict:
    """The expected table at the shard's upper, straight from the source files."""
    return oracle_table(shard.source.root, max_offset=shard.bound_offsets(shard.state().upper))


def tree(root: str) -> dict[str, bytes]:
    """Every file below ``root`` with its content: equal trees mean nothing was touched."""
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as handle:
                out[os.path.relpath(path, root)] = handle.read()
    return out


def crash_after_written(blob, shard_id: str, since: int, crashed: list[str]):
    """A compaction's ``on_step`` that dies (:class:`crashfs.Crash`) once the output of a
    compaction to ``since`` is written, before its swap, adding the output directories to
    ``crashed``."""
    from tests.maintenance.crashfs import Crash

    def die_after_writing(step: str) -> None:
        assert step == "written"
        outputs = blob.path(shard_id, "runs", f"since={since:012d}")
        crashed.extend(os.path.join(outputs, name) for name in os.listdir(outputs))
        raise Crash("after the compaction's output was written")

    return die_after_writing


def age_files(root: str, seconds: float = 3 * 3600) -> None:
    """Make every file and directory below ``root`` look ``seconds`` old (older than a
    test's grace: GC measures a directory's age too)."""
    past = time.time() - seconds
    for dirpath, dirs, files in os.walk(root):
        for name in files + dirs:
            os.utime(os.path.join(dirpath, name), (past, past))


def age_compaction(consensus, shard_id: str, seconds: float = 3 * 3600) -> None:
    """Make the shard's compactions look ``seconds`` old: GC keeps the runs each replaced for
    the grace period after it."""
    import sqlalchemy as sa

    from airflow_upsert_provider.engine.store.tables import compactions_table

    from airflow_upsert_provider.engine.store.gc_claims import replaced_runs_table

    with consensus.engine.begin() as conn:
        conn.execute(
            sa.update(compactions_table)
            .where(compactions_table.c.shard_id == shard_id)
            .values(compacted_at=compactions_table.c.compacted_at - seconds)
        )
        conn.execute(
            sa.update(replaced_runs_table)
            .where(replaced_runs_table.c.shard_id == shard_id)
            .values(replaced_at=replaced_runs_table.c.replaced_at - seconds)
        )


def files_of(blob, runs) -> set[str]:
    return {blob.path(f["path"]) for run in runs for f in run["files"]}


def copy_blob(source, target) -> int:
    """Copy every file below ``source``'s root to ``target``'s (an S3 root, say) under the same
    relative path, leaving consensus as it is: its records name files by those relative paths,
    so the shard opened on ``target`` is the same shard. Returns the number of files copied.

    Why: the engine does not write a batch's runs to object storage yet (Spark writes them
    through Hadoop's local filesystem), so a test of maintenance on an object-storage root
    takes the files of real batches written on local disk."""
    copied = 0
    for f in source.walk_files(source.root):
        target.write_file(target.path(source.relative(f.path)), source.read_bytes(f.path), sync=True)
        copied += 1
    return copied


def as_legacy_catalog(consensus, blob, shard_id: str) -> str:
    """Leave the shard's checkpoint catalog as a release before the store held catalogs left
    it: its entries in ``<shard>/checkpoints/CATALOG.json`` only, no copy and no rows in the
    store. Returns the file's path."""
    import json

    import sqlalchemy as sa

    from airflow_upsert_provider.engine.maintenance.checkpoint_catalog import (
        CATALOG_NAME,
        Catalog,
        checkpoints_root,
        copy_version,
    )
    from airflow_upsert_provider.engine.store.catalog_rows import catalog_entries_table, catalogs_table

    catalog = Catalog.load(blob, shard_id, consensus)
    root = checkpoints_root(blob, shard_id)
    doc = {"format": 1, "shard": shard_id, "checkpoints": [e.to_dict() for e in catalog.entries]}
    path = blob.join(root, CATALOG_NAME)
    blob.write_atomic(path, json.dumps(doc, indent=1, sort_keys=True).encode())
    for name in blob.listdir(root):
        if copy_version(name) is not None:
            blob.delete_file(blob.join(root, name))
    with consensus.engine.begin() as conn:
        for rows_of in (catalog_entries_table, catalogs_table):
            conn.execute(sa.delete(rows_of).where(rows_of.c.shard_id == shard_id))
    return path


def catalog_copies(blob, shard_id: str) -> list[str]:
    """The names of the catalog's blob copies (and of a catalog file before copies)."""
    from airflow_upsert_provider.engine.maintenance.checkpoint_catalog import (
        CATALOG_NAME,
        checkpoints_root,
        copy_version,
    )

    return [n for n in blob.listdir(checkpoints_root(blob, shard_id)) if copy_version(n) is not None or n == CATALOG_NAME]


def copy_sqlite_store(consensus, path: str):
    """A copy of a SQLite consensus store at ``path``, opened (what a crash test restarts
    from: the store's own state is transactional, only the blob loses what was not durable)."""
    import sqlite3

    from airflow_upsert_provider.engine.store.registry import open_consensus

    source = sqlite3.connect(consensus.engine.url.database)
    try:
        source.execute("VACUUM INTO ?", (path,))
    finally:
        source.close()
    return open_consensus(f"sqlite:///{path}")
