"""GC claims: the run directories GC is about to delete, recorded in consensus first.

GC claims the directories it will delete in one transaction that also re-reads what committed
since it planned, and only then deletes them. Every commit (a batch's append, a compaction's
swap) refuses, inside its own transaction, a run GC has claimed (``refuse_claimed``, a commit
hook). A writer paused between staging and appending for longer than the grace period is
therefore refused instead of committing files that are gone, and restages under a new path.

Claim lifetime. A claim on ``<shard>/runs/ts=T/…`` (or ``rejects/ts=T/…``) matters while the
shard's upper is <= T, one on ``<shard>/runs/since=S/…`` while its since is < S: after that no
append of ts T and no swap to since S can commit (upper and since only advance), so the claim
is dropped by the next GC, and never made in the first place for such a path. A claim whose path
does not parse is kept for ever. A GC that crashes between claiming and deleting leaves claimed
files on disk: no commit can name them, and the next GC plans them again and deletes them.

Checkpoint directories GC deletes (abandoned or unlisted, ``<shard>/checkpoints/<id>``) are
claimed the same way, under the shard's catalog lock, leaving out any the catalog's rows list
then, and a catalog change refuses to list a claimed one (``refuse_claimed_checkpoints``; an
import of the blob's catalog drops it): a ``checkpoint create`` paused past the grace period
between its manifest and its catalog entry writes the checkpoint again. Checkpoint ids
are unique per attempt and such claims are few (leftovers of crashed or overtaken creates), so
they are kept.

Blob ownership. A shard restored from a checkpoint into another consensus store that shares the
blob root (a disaster restore, while the original store still exists) has its files in the
same directory the original store's shard of that id knows. The restore records a new
generation for the shard in the store it restores into (``upsert_blob_owners``, in the
restore's transaction) and writes it to ``<blob>/<shard>/OWNER.json``; ``recover seek``
writes it again if a crash came in between, before any writer can resume. GC and every
checkpoint catalog change check that the marker, if there is one, is the generation their own
store recorded for the shard (``check_blob_owner``): the original store's GC and retention
refuse to touch the restored shard's files (``BlobOwnedElsewhere``, exit 4).

Runs a compaction replaced are recorded here too (``upsert_replaced_runs``), in the swap's
transaction: GC keeps every run replaced less than its grace period ago, whichever compaction
replaced it (the compactions table holds only the latest). The rows are also GC's work list:
a GC from state deletes the replaced runs nothing pins any more and drops their rows only
after deleting them (``forget_replaced``); a row pinned by a checkpoint stays until a later GC
finds the run free. The rows are the garbage still to collect, never the shard's history.
"""

from __future__ import annotations

import json
import time
from typing import Any, Iterable

import sqlalchemy as sa

import uuid

from airflow_upsert_provider.engine.blob.interface import Blob
from airflow_upsert_provider.engine.store.consensus import Consensus, insert_ignore
from airflow_upsert_provider.engine.store.records import CommitAttempt, RestoreEvent
from airflow_upsert_provider.engine.store.tables import batches_table, compactions_table, metadata, shards_table
from airflow_upsert_provider.engine.errors import IntegrityError

gc_claims_table = sa.Table(
    "upsert_gc_claims",
    metadata,
    # Blob-relative run directory, as a run's ``path`` is recorded.
    sa.Column("path", sa.String(1024), primary_key=True),
    sa.Column("shard_id", sa.String(128), nullable=False, index=True),
    sa.Column("claimed_at", sa.Float, nullable=False),
)

replaced_runs_table = sa.Table(
    "upsert_replaced_runs",
    metadata,
    sa.Column("shard_id", sa.String(128), primary_key=True),
    sa.Column("path", sa.String(1024), primary_key=True),
    sa.Column("replaced_at", sa.Float, nullable=False),
)

blob_owners_table = sa.Table(
    "upsert_blob_owners",
    metadata,
    sa.Column("shard_id", sa.String(128), primary_key=True),
    # Random per restore: the generation whose store may collect the shard's blob directory.
    sa.Column("generation", sa.String(64), nullable=False),
    sa.Column("taken_at", sa.Float, nullable=False),
)

OWNER_NAME = "OWNER.json"

# Rows per IN (...) list: far below every store's parameter limit.
CHUNK = 500


def run_dir_of_relative(path: str) -> str:
    """The run directory (``<shard>/<runs|rejects>/<group>/<name>``) a blob-relative path is in.
    Relative paths are '/'-separated on every store (``Blob.relative``)."""
    return "/".join(path.split("/")[:4])


def checkpoint_dir_relative(shard_id: str, checkpoint_id: str) -> str:
    """A checkpoint's directory relative to the blob root, as GC claims it."""
    return f"{shard_id}/checkpoints/{checkpoint_id}"


def directories_of(runs: Iterable[dict[str, Any] | None]) -> set[str]:
    """Every run directory the run descriptions name: their paths and their files' directories."""
    dirs: set[str] = set()
    for run in runs:
        if not run:
            continue
        dirs.add(run_dir_of_relative(run["path"]))
        dirs.update(run_dir_of_relative(f["path"]) for f in run.get("files", ()))
    return dirs


def claim_needed(path: str, upper: int, since: int) -> bool:
    """Whether a commit could still name ``path``: a batch's run at ts >= upper, a compaction
    output to a since above the current one, or anything whose group does not parse."""
    parts = path.split("/")
    if len(parts) >= 2 and parts[1] == "checkpoints":
        return True  # a paused create may still try to list it, however late
    group = parts[2] if len(parts) >= 3 else ""
    kind, _, number = group.partition("=")
    if not number.isdigit():
        return True
    if kind == "ts":
        return int(number) >= upper
    if kind == "since":
        return int(number) > since
    return True


def refuse_claimed(conn: sa.Connection, attempt: CommitAttempt) -> str | None:
    """Commit hook: refuse a commit naming a claimed directory; record what a swap replaces."""
    dirs = sorted(directories_of(attempt.runs))
    claimed: list[str] = []
    for start in range(0, len(dirs), CHUNK):
        claimed += conn.execute(
            sa.select(gc_claims_table.c.path).where(gc_claims_table.c.path.in_(dirs[start : start + CHUNK]))
        ).scalars().all()
    if claimed:
        return f"GC claimed {sorted(claimed)[0]} for deletion" + (
            f" (and {len(claimed) - 1} more)" if len(claimed) > 1 else ""
        )
    if attempt.kind == "compaction":
        replaced = sorted({p for run in attempt.runs for p in run.get("replaces", ())})
        now = time.time()
        for start in range(0, len(replaced), CHUNK):
            chunk = replaced[start : start + CHUNK]
            conn.execute(
                sa.delete(replaced_runs_table).where(
                    replaced_runs_table.c.shard_id == attempt.shard_id, replaced_runs_table.c.path.in_(chunk)
                )
            )
            conn.execute(
                sa.insert(replaced_runs_table),
                [{"shard_id": attempt.shard_id, "path": p, "replaced_at": now} for p in chunk],
            )
    return None




def recently_replaced(consensus: Consensus, cutoff: float) -> set[str]:
    """Runs some compaction of any shard replaced at or after ``cutoff`` (a shard restored
    under a new id compacts runs in the original shard's directory)."""
    return set(
        consensus.read_in_snapshot(
            lambda conn: conn.execute(
                sa.select(replaced_runs_table.c.path).where(replaced_runs_table.c.replaced_at >= cutoff)
            ).scalars().all()
        )
    )


def replacements_of(consensus: Consensus, shard_id: str) -> list[tuple[str, float]]:
    """(path, replaced_at) of every run below ``<shard>/runs/`` a compaction replaced (its
    latest replacement), whichever shard's compaction replaced it (a shard restored under a
    new id compacts runs in the original's directory). Rows stay until GC deleted the run (``forget_replaced``), so
    this is the garbage still to collect and the runs a checkpoint pins: it never grows with
    the shard's history."""
    prefix = f"{shard_id}/runs/"
    # A run two shards' compactions replaced (a restored shard's and the original's) is one
    # run, in grace until the later replacement's grace ends.
    latest: dict[str, float] = {}
    for row in consensus.read_in_snapshot(
            lambda conn: conn.execute(
                sa.select(replaced_runs_table.c.path, replaced_runs_table.c.replaced_at).where(
                    replaced_runs_table.c.path.startswith(prefix, autoescape=True)
                )
            ).all()
    ):
        latest[row.path] = max(row.replaced_at, latest.get(row.path, row.replaced_at))
    return sorted(latest.items())


def recorded_files(consensus: Consensus, shard_id: str, run_dirs: Iterable[str]) -> dict[str, list[dict[str, Any]]]:
    """The files (each with its ``path`` and ``bytes``) that the store records of each of
    ``run_dirs`` (``<shard>/runs/ts=T/<name>``) while it still holds the row of the batch that
    committed it; a run it no longer records (its batch row truncated, a compacted run, a
    losing writer's) is left out. One read of the batch rows by ts, not a listing per run."""
    wanted: dict[int, set[str]] = {}
    for path in run_dirs:
        parts = path.split("/")
        kind, _, number = parts[2].partition("=") if len(parts) == 4 else ("", "", "")
        if parts[0] == shard_id and kind == "ts" and number.isdigit():
            wanted.setdefault(int(number), set()).add(path)
    found: dict[str, list[dict[str, Any]]] = {}
    numbers = sorted(wanted)

    def read(conn) -> None:
        for start in range(0, len(numbers), CHUNK):
            for row in conn.execute(sa.select(batches_table.c.ts, batches_table.c.run).where(
                    batches_table.c.shard_id == shard_id, batches_table.c.ts.in_(numbers[start : start + CHUNK]))):
                run = json.loads(row.run)
                if run and run.get("path") in wanted[row.ts] and all("bytes" in f for f in run.get("files", ())):
                    found[run["path"]] = list(run.get("files", ()))

    consensus.read_in_snapshot(read)
    return found


def forget_replaced(consensus: Consensus, paths: list[str]) -> None:
    """Drop the replacement rows of run directories GC deleted, after deleting them: a GC
    that stops between its deletion and this finds them again and deletes nothing more (a
    missing directory is no error), so no replaced run is lost by a crash."""
    paths = sorted(set(paths))

    def txn(conn) -> None:
        for start in range(0, len(paths), CHUNK):
            conn.execute(sa.delete(replaced_runs_table).where(replaced_runs_table.c.path.in_(paths[start : start + CHUNK])))

    if paths:
        consensus.run_in_transaction(txn)


def claim_for_deletion(
    consensus: Consensus,
    shard_id: str,
    candidates: list[str],
    planned_upper: int,
    checkpoint_candidates: list[str] = (),
) -> tuple[list[str], list[str]]:
    """Claim the run and checkpoint directories GC planned to delete; return those it may
    now delete (runs, checkpoint directories).

    One transaction, serialized with every append and swap of the shard (all write the shard
    row) and, when checkpoint directories are claimed, with every catalog change (it takes the
    catalog lock): a run that a batch or compaction committed since GC planned at
    ``planned_upper`` is left out. Expired claims of the shard are dropped in the same go.

    No blob I/O runs inside it: the catalog is the store's rows (store/catalog_rows.py), read
    under the lock. A checkpoint a change listed before the claim is left out and unclaimed; a
    change that takes the lock after sees the claim and is refused
    (``refuse_claimed_checkpoints``). While the store does not hold the shard's catalog, the
    blob's catalog GC planned with is the one, and the candidates are unlisted in it; an import
    after the claim drops what is claimed."""

    def txn(conn) -> tuple[list[str], list[str]]:
        # A write to the shard row (changing nothing) orders this transaction with every
        # append and swap, which update the same row: whichever commits second sees the
        # other (and under snapshot isolation gets a serialization failure, not a stale read).
        conn.execute(
            sa.update(shards_table).where(shards_table.c.shard_id == shard_id).values(seqno=shards_table.c.seqno)
        )
        row = conn.execute(
            sa.select(shards_table.c.upper, shards_table.c.since).where(shards_table.c.shard_id == shard_id)
        ).first()
        if row is None:
            return [], []
        committed_since_plan = [
            r.run for r in conn.execute(
                sa.select(batches_table.c.run).where(
                    batches_table.c.shard_id == shard_id, batches_table.c.ts >= planned_upper
                )
            )
        ]
        compaction = conn.execute(
            sa.select(compactions_table.c.run).where(compactions_table.c.shard_id == shard_id)
        ).scalar_one_or_none()
        live = directories_of(json.loads(r) for r in committed_since_plan + ([compaction] if compaction else []))
        doomed = [p for p in candidates if p not in live]
        needed = sorted(p for p in doomed if claim_needed(p, row.upper, row.since))
        now = time.time()
        _insert_claims(conn, shard_id, needed, now)
        expired = [
            p for p in conn.execute(
                sa.select(gc_claims_table.c.path).where(gc_claims_table.c.shard_id == shard_id)
            ).scalars()
            if not claim_needed(p, row.upper, row.since)
        ]
        for start in range(0, len(expired), CHUNK):
            conn.execute(sa.delete(gc_claims_table).where(gc_claims_table.c.path.in_(expired[start : start + CHUNK])))
        checkpoints: list[str] = []
        if checkpoint_candidates:
            # Imported here: catalog_lock and this module are both loaded by consensus.
            from airflow_upsert_provider.engine.store.catalog_lock import catalog_locks_table
            from airflow_upsert_provider.engine.store.catalog_rows import listed_ids_in

            insert_ignore(conn, catalog_locks_table, shard_id=shard_id, version=0, changed_at=now)
            locked = sa.select(catalog_locks_table.c.version).where(catalog_locks_table.c.shard_id == shard_id)
            conn.execute(locked.with_for_update() if consensus.dialect == "postgresql" else locked)
            listed = listed_ids_in(conn, shard_id) or set()
            checkpoints = [p for p in checkpoint_candidates if p.rpartition("/")[2] not in listed]
            _insert_claims(conn, shard_id, checkpoints, now)
        return doomed, checkpoints

    return consensus.run_in_transaction(txn)


def _insert_claims(conn, shard_id: str, paths: list[str], now: float) -> None:
    for start in range(0, len(paths), CHUNK):
        chunk = paths[start : start + CHUNK]
        existing = set(conn.execute(sa.select(gc_claims_table.c.path).where(gc_claims_table.c.path.in_(chunk))).scalars())
        fresh = [{"path": p, "shard_id": shard_id, "claimed_at": now} for p in chunk if p not in existing]
        if fresh:
            conn.execute(sa.insert(gc_claims_table), fresh)


def claimed_checkpoints(conn, shard_id: str, checkpoint_ids: list[str]) -> set[str]:
    """The ids among ``checkpoint_ids`` whose directory GC claimed, in the caller's transaction."""
    claimed: set[str] = set()
    for start in range(0, len(checkpoint_ids), CHUNK):
        paths = [checkpoint_dir_relative(shard_id, i) for i in checkpoint_ids[start : start + CHUNK]]
        claimed.update(
            p.rpartition("/")[2]
            for p in conn.execute(sa.select(gc_claims_table.c.path).where(gc_claims_table.c.path.in_(paths))).scalars()
        )
    return claimed


def refuse_claimed_checkpoints(conn, shard_id: str, checkpoint_ids: list[str]) -> str | None:
    """Run under the catalog lock before listing checkpoints: a reason to refuse if GC
    claimed the directory of any of them, else None."""
    claimed = claimed_checkpoints(conn, shard_id, checkpoint_ids)
    if not claimed:
        return None
    return f"GC claimed {checkpoint_dir_relative(shard_id, sorted(claimed)[0])} for deletion"


def claims(consensus: Consensus, shard_id: str) -> list[str]:
    """The directories of ``shard_id`` GC has claimed (for tests and reports)."""
    return list(
        consensus.read_in_snapshot(
            lambda conn: conn.execute(
                sa.select(gc_claims_table.c.path)
                .where(gc_claims_table.c.shard_id == shard_id)
                .order_by(gc_claims_table.c.path)
            ).scalars().all()
        )
    )


# -- blob ownership (see the module docstring) -------------------------------------------------


class BlobOwnedElsewhere(IntegrityError):
    """The shard's blob directory belongs to another generation of the shard: it was restored
    into another consensus store sharing the blob root. Nothing was deleted or changed."""


def take_ownership(conn, event: RestoreEvent) -> None:
    """Restore hook: the restored shard gets a new generation, in the restore's transaction."""
    conn.execute(sa.delete(blob_owners_table).where(blob_owners_table.c.shard_id == event.shard_id))
    conn.execute(
        sa.insert(blob_owners_table).values(shard_id=event.shard_id, generation=uuid.uuid4().hex, taken_at=time.time())
    )



def owner_conflict(recorded: str | None, on_blob: str | None) -> bool:
    """Whether a store that recorded generation ``recorded`` (None: none, a shard never
    restored) must keep off a directory marked ``on_blob`` (None: unmarked)."""
    return on_blob is not None and on_blob != recorded


def recorded_generation(consensus: Consensus, shard_id: str) -> str | None:
    return consensus.read_in_snapshot(
        lambda conn: conn.execute(
            sa.select(blob_owners_table.c.generation).where(blob_owners_table.c.shard_id == shard_id)
        ).scalar_one_or_none()
    )


def owner_path(blob: Blob, shard_id: str) -> str:
    return blob.path(shard_id, OWNER_NAME)


def blob_generation(blob: Blob, shard_id: str) -> str | None:
    """The generation ``<shard>/OWNER.json`` marks; None if there is no marker."""
    path = owner_path(blob, shard_id)
    try:
        doc = json.loads(blob.read_bytes(path))
        generation = doc["generation"]
        if not isinstance(generation, str) or not generation:
            raise ValueError("no generation")
        return generation
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise IntegrityError(
            f"blob owner marker {path} of shard {shard_id!r} is unreadable or corrupt ({exc}): nothing was "
            "changed; see docs/recovery.md, 'A restore into another store'",
            shard=shard_id,
            file=path,
        ) from None


def mark_blob_owner(consensus: Consensus, blob: Blob, shard_id: str) -> None:
    """Write the generation this store recorded for ``shard_id`` to its blob directory, if
    it recorded one and the marker says otherwise (after a restore; idempotent)."""
    generation = recorded_generation(consensus, shard_id)
    if generation is None or blob_generation(blob, shard_id) == generation:
        return
    doc = {"format": 1, "shard": shard_id, "generation": generation, "marked_at": time.time()}
    blob.write_atomic(owner_path(blob, shard_id), json.dumps(doc, sort_keys=True).encode())


def check_blob_owner(consensus: Consensus, blob: Blob, shard_id: str, doing: str) -> None:
    """Refuse (``BlobOwnedElsewhere``) to ``doing`` in the blob directory of ``shard_id``
    unless it is unmarked or marked with the generation this store recorded."""
    on_blob = blob_generation(blob, shard_id)
    recorded = recorded_generation(consensus, shard_id)
    if owner_conflict(recorded, on_blob):
        path = owner_path(blob, shard_id)
        raise BlobOwnedElsewhere(
            f"refusing to {doing} of shard {shard_id!r}: {path} marks generation {on_blob[:12]}, and this "
            f"consensus store recorded {'generation ' + recorded[:12] if recorded else 'none'} for the shard: the "
            "shard was restored from a checkpoint into another consensus store that shares this blob root, and "
            "its files are that store's now. Nothing was deleted or changed; run maintenance against the store "
            "the shard was restored into (docs/recovery.md, 'A restore into another store')",
            shard=shard_id,
            file=path,
            generation=on_blob,
            recorded=recorded,
        )
