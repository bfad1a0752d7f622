"""Consensus: the linearizable store of every shard's authoritative state.

One interface, two real stores through SQLAlchemy Core: SQLite (embedded default, WAL mode,
``BEGIN IMMEDIATE`` so a transaction takes the write lock up front) and PostgreSQL (shared,
row-level compare-and-set). Every compare-and-set is one conditional UPDATE checked by
rowcount inside one short transaction; nothing here is held while Spark works.

Its tables are in store/tables.py, its records in store/records.py, URLs in store/urls.py,
opening a store in store/engines.py and restoring a shard in store/restore.py.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, Callable, Collection, Iterator, TypeVar

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Engine

from airflow_upsert_provider.engine.errors import (
    CommitRefused,
    ConfigurationError,
    ConsensusOutcomeUnknown,
    ConsensusUnavailable,
    IntegrityError,
    UpsertError,
    ShardExists,
    ShardNotFound,
)
from airflow_upsert_provider.engine.store.records import (
    AppendOutcome,
    AppendResult,
    BatchRecord,
    Binding,
    CommitAttempt,
    CommitHook,
    CompactionRecord,
    LiveView,
    RestoreHook,
    ShardRecord,
    ShardSnapshot,
    StoreSchema,
    _batch_from_row,
    _binding_from_row,
    _compaction_from_row,
    history_from,
    rollup_from_row,
)
from airflow_upsert_provider.engine.store.tables import (
    batch_rollups_table,
    batches_table,
    bindings_table,
    compactions_table,
    metadata,
    quarantined_files_table,
    settled_names_table,
    shards_table,
    table_schemas_table,
)
from airflow_upsert_provider.engine.store.urls import _short, redact_url


def _run_commit_hooks(conn, attempt: CommitAttempt, hooks: list[CommitHook]) -> None:
    for hook in hooks:
        reason = hook(conn, attempt)
        if reason is not None:
            what = f"batch {attempt.ts}" if attempt.kind == "append" else f"compaction to since {attempt.ts}"
            raise CommitRefused(
                f"commit of {what} of shard {attempt.shard_id!r} refused: {reason}",
                shard=attempt.shard_id,
                ts=attempt.ts,
                reason=reason,
            )


# What the function given to a transaction returns.
T = TypeVar("T")


# SQLSTATEs of a PostgreSQL session timeout (lock_not_available, query_canceled): the option
# that bounds it.
_SESSION_TIMEOUTS = {"55P03": "lock_timeout", "57014": "statement_timeout"}


class Consensus:
    """The consensus store. Open with ``store.registry.open_consensus``."""

    def __init__(self, engine: Engine, url: str, schema: StoreSchema) -> None:
        self.engine = engine
        self.url = url
        self.dialect = engine.dialect.name
        self.tables = schema.tables
        # This store's own lists, so that a test can add a hook to one store.
        self.commit_hooks: list[CommitHook] = list(schema.commit_hooks)
        self.restore_hooks: list[RestoreHook] = list(schema.restore_hooks)
        self._open = _OpenTransactions()
        event.listen(engine, "begin", self._open.began)
        event.listen(engine, "commit", self._open.ended)
        event.listen(engine, "rollback", self._open.ended)

    def in_transaction(self) -> bool:
        """Whether this thread has a transaction of this store open. Blob I/O never runs
        inside one: a slow object store would hold the store's locks (SQLite's one write lock,
        PostgreSQL's rows) for as long as it takes."""
        return self._open.any()

    # -- plumbing -------------------------------------------------------------------------

    def run_in_transaction(self, fn: Callable[[sa.Connection], T]) -> T:
        """Run ``fn(conn)`` in one transaction that may write, commit it, and return what
        ``fn`` returned. The way every module of the store's layers reads and writes its rows
        together (``fn`` runs its statements on ``conn``; it never commits, nor does blob I/O).

        Isolation: on SQLite the transaction begins ``BEGIN IMMEDIATE``: it takes the one write
        lock up front (waiting up to the URL's ``timeout`` for it) and is serializable. On
        PostgreSQL it is READ COMMITTED (each statement sees what committed before it; a
        conditional UPDATE locks its row until the commit), so a compare-and-set is written as
        one conditional UPDATE checked by its rowcount.

        Retries: none. Whether running ``fn`` again is right is the caller's decision (e.g.
        ``common.retry.CAS_CONTENTION`` around a compare-and-set); both store errors below
        are ``retryable``.

        Errors: an error ``fn`` raises rolls the transaction back and propagates unchanged.
        A store failure before the commit (connecting, an exhausted pool, any statement: the
        store rolls an unfinished transaction back) changed nothing: :class:`ConsensusUnavailable`
        (exit 2), or the determinate error of :meth:`store_error` (a file that is no database,
        a damaged or unopenable store, an unusable URL). A failure of the commit of a
        transaction that wrote may or may not have landed: :class:`ConsensusOutcomeUnknown`
        (exit 5). Messages carry the URL with its password masked, never the driver's error
        chained.
        """
        committing = wrote = False
        try:
            with self.engine.connect() as conn:
                conn.info[_WROTE] = False
                with conn.begin():
                    result = fn(conn)
                    # Without the write tracker (see engines.open_store), assume it wrote.
                    wrote = conn.info[_WROTE] or not _tracks_writes(self.engine)
                    committing = True
                return result
        except sa.exc.TimeoutError:
            raise self.pool_exhausted() from None
        except sa.exc.DBAPIError as exc:
            if committing and wrote:
                raise ConsensusOutcomeUnknown(
                    f"consensus store {redact_url(self.url)} failed while committing, so the "
                    f"change may or may not have landed: {_short(exc, self.url)}; running the "
                    "same step again is safe",
                    consensus=redact_url(self.url),
                ) from None
            raise self.store_error(exc, "consensus store {where} failed") from None

    def pool_exhausted(self) -> ConsensusUnavailable:
        """The pool gave no connection within its timeout: nothing was sent (exit 2, retryable)."""
        return ConsensusUnavailable(
            f"consensus store {redact_url(self.url)} gave no connection in time (pool exhausted); nothing "
            "was changed", consensus=redact_url(self.url),
        )

    def store_error(self, exc: sa.exc.DBAPIError, unavailable: str) -> UpsertError:
        """The determinate error a driver error that left the store unchanged stands for:
        the store is not a database or is damaged, the URL is wrong, or it is unreachable
        (``unavailable`` words that case, ``{where}`` standing for the redacted URL)."""
        where = redact_url(self.url)
        text = _short(exc, self.url)
        if self.dialect == "sqlite" and _sqlite_error_name(exc) == "SQLITE_NOTADB":
            return ConfigurationError(
                f"consensus store {where} is not a SQLite database ({text}): check --consensus / "
                "UPSERT_CONSENSUS_URL; if it is the right file its header is damaged: restore the "
                "shards from a checkpoint into a new store",
                field="consensus",
                consensus=where,
            )
        sqlite_error = (_sqlite_error_name(exc) or "") if self.dialect == "sqlite" else ""
        if sqlite_error.startswith(("SQLITE_CANTOPEN", "SQLITE_READONLY")):
            # Not the store being away for a while: a retry meets the same file system.
            path = self.engine.url.database
            cannot = "open" if sqlite_error.startswith("SQLITE_CANTOPEN") else "write"
            return ConfigurationError(
                f"consensus store {where}: SQLite cannot {cannot} its file {path} ({text})"
                f"{_unwritable_reason(path)}; every process that uses the store reads and writes that "
                f"file and creates {path}-wal and {path}-shm beside it: fix the mount or the "
                "permissions, or point --consensus / UPSERT_CONSENSUS_URL at a writable file; nothing "
                "was changed",
                field="consensus",
                consensus=where,
                file=path,
            )
        if self.dialect == "sqlite" and _sqlite_error_name(exc) == "SQLITE_CORRUPT":
            return IntegrityError(
                f"consensus store {where} is damaged ({text}): restore the shards from a "
                "checkpoint into a new store",
                consensus=where,
            )
        if isinstance(exc, (sa.exc.ProgrammingError, sa.exc.InterfaceError)) and not exc.connection_invalidated:
            # libpq refuses a bad connection string (e.g. an unknown query option) this way.
            return ConfigurationError(
                f"consensus URL {where} is not usable: {text}", field="consensus", consensus=where
            )
        timeout = _SESSION_TIMEOUTS.get(getattr(exc.orig, "sqlstate", None))
        if timeout is not None:
            # Another session held a lock (or the store was slow) past the URL's bound: nothing
            # changed, and the next try may well pass.
            text += f" (the consensus URL option {timeout} bounds this wait; see docs/errors.md)"
        return ConsensusUnavailable(f"{unavailable.format(where=where)}: {text}", consensus=where)

    def read_in_snapshot(self, fn: Callable[[sa.Connection], T]) -> T:
        """Run the reads of ``fn(conn)`` in one transaction that sees one snapshot of the
        store, and return what ``fn`` returned. ``fn`` only reads.

        Isolation: PostgreSQL's default (READ COMMITTED) takes a snapshot per statement, so a
        compaction swap between two SELECTs could mix its row with older batches: REPEATABLE
        READ there. SQLite transactions are serializable already; a read one begins deferred,
        so that in WAL mode it reads beside a writer instead of queueing for the write lock.

        Retries: none (a read is always safe to repeat; the caller decides).

        Errors: an error ``fn`` raises propagates unchanged. A store failure, whenever it
        comes, changed nothing: :class:`ConsensusUnavailable` (exit 2, retryable) or the
        determinate error of :meth:`store_error`."""
        try:
            with self.read_connection() as conn:
                if self.dialect == "postgresql":
                    conn.execution_options(isolation_level="REPEATABLE READ")
                with conn.begin():
                    return fn(conn)
        except sa.exc.TimeoutError:
            raise self.pool_exhausted() from None
        except sa.exc.DBAPIError as exc:
            # Only reads: a failure changed nothing, whenever it came.
            raise self.store_error(exc, "consensus store {where} failed") from None

    def read_connection(self) -> sa.Connection:
        """A connection whose transactions only read: on SQLite they begin deferred and take no
        lock a writer waits for, nor wait for one (WAL mode)."""
        conn = self.engine.connect()
        if self.dialect == "sqlite":
            conn.execution_options(**{_READ_ONLY: True})
        return conn

    def create_schema(self) -> None:
        """Create the tables of this store's schema, without a schema version: for a store built
        by hand (tests). A store opened through ``store.registry.open_consensus`` is created at
        the schema's head revision and checked against it instead (store/migrations/)."""
        try:
            metadata.create_all(self.engine, tables=list(self.tables))
        except sa.exc.DBAPIError as exc:
            raise self.store_error(exc, "cannot reach consensus store {where}") from None

    def dispose(self) -> None:
        self.engine.dispose()

    # -- shards ---------------------------------------------------------------------------

    def create_shard(self, shard_id: str, config_json: str) -> ShardRecord:
        now = time.time()

        def txn(conn):
            return insert_ignore(
                conn,
                shards_table,
                shard_id=shard_id,
                upper=0,
                since=0,
                seqno=0,
                config=config_json,
                created_at=now,
            )

        if not self.run_in_transaction(txn):
            raise ShardExists(f"shard {shard_id!r} already exists", shard=shard_id)
        return self.get_shard(shard_id)

    def get_shard(self, shard_id: str) -> ShardRecord:
        row = self.read_in_snapshot(
            lambda conn: conn.execute(
                sa.select(shards_table).where(shards_table.c.shard_id == shard_id)
            ).first()
        )
        if row is None:
            raise ShardNotFound(
                f"unknown shard {shard_id!r} in {redact_url(self.url)} (create it with `upsertctl init`)",
                shard=shard_id,
            )
        return ShardRecord(**row._mapping)

    def list_shards(self) -> list[ShardRecord]:
        rows = self.read_in_snapshot(
            lambda conn: conn.execute(sa.select(shards_table).order_by(shards_table.c.shard_id)).all()
        )
        return [ShardRecord(**r._mapping) for r in rows]

    # -- bindings -------------------------------------------------------------------------

    def get_binding(self, shard_id: str, ts: int) -> Binding | None:
        row = self.read_in_snapshot(
            lambda conn: conn.execute(
                sa.select(bindings_table).where(
                    bindings_table.c.shard_id == shard_id, bindings_table.c.ts == ts
                )
            ).first()
        )
        return None if row is None else _binding_from_row(row)

    def bindings(self, shard_id: str) -> Iterator[Binding]:
        rows = self.read_in_snapshot(
            lambda conn: conn.execute(
                sa.select(bindings_table)
                .where(bindings_table.c.shard_id == shard_id)
                .order_by(bindings_table.c.ts)
            ).all()
        )
        for row in rows:
            yield _binding_from_row(row)

    def mint_binding(self, shard_id: str, binding: Binding, minted_by: str) -> Binding:
        """Insert binding(ts) unless one exists; return the one that is authoritative.

        The insert is refused unless binding(ts-1) exists and ``binding.from`` equals its
        ``to`` for every partition (contiguity, invariant 2)."""
        ts = binding.ts

        def txn(conn):
            if ts > 0:
                prev = conn.execute(
                    sa.select(bindings_table.c.ranges).where(
                        bindings_table.c.shard_id == shard_id, bindings_table.c.ts == ts - 1
                    )
                ).scalar_one_or_none()
                if prev is None:
                    raise IntegrityError(
                        f"cannot bind ts {ts} of shard {shard_id!r}: binding {ts - 1} does not exist",
                        shard=shard_id,
                        ts=ts,
                    )
                prev_ranges = json.loads(prev)["ranges"]
                for partition, rng in binding.ranges.items():
                    expected_from = prev_ranges.get(partition, {}).get("to", 0)
                    if rng["from"] != expected_from:
                        raise IntegrityError(
                            f"binding {ts} of shard {shard_id!r} is not contiguous in partition "
                            f"{partition!r}: from {rng['from']} != previous to {expected_from}",
                            shard=shard_id,
                            ts=ts,
                        )
            inserted = insert_ignore(
                conn,
                bindings_table,
                shard_id=shard_id,
                ts=ts,
                ranges=binding.to_json(),
                minted_by=minted_by,
                minted_at=time.time(),
            )
            # A peer's binding won: its quarantine list is the one that counts.
            for q in binding.quarantined if inserted else ():
                insert_ignore(
                    conn, quarantined_files_table, shard_id=shard_id, file=q["file"], reason=q["reason"], ts=ts
                )
            row = conn.execute(
                sa.select(bindings_table).where(
                    bindings_table.c.shard_id == shard_id, bindings_table.c.ts == ts
                )
            ).one()
            return _binding_from_row(row)

        return self.run_in_transaction(txn)

    def quarantined_files(self, shard_id: str) -> dict[str, str]:
        rows = self.read_in_snapshot(
            lambda conn: conn.execute(
                sa.select(quarantined_files_table.c.file, quarantined_files_table.c.reason).where(
                    quarantined_files_table.c.shard_id == shard_id
                )
            ).all()
        )
        return {r.file: r.reason for r in rows}

    # -- batches --------------------------------------------------------------------------

    def compare_and_append(
        self, shard_id: str, expected_upper: int, new_upper: int, batch: BatchRecord, *, epoch: int | None = None
    ) -> AppendResult:
        """Commit ``batch`` at ts == expected_upper iff the authoritative upper is
        expected_upper at commit time (invariant 3).

        One transaction: a conditional UPDATE checked by rowcount, the commit hooks (which may
        refuse: CommitRefused or the hook's own error, nothing committed), then the batch row.
        ``epoch`` is the stream epoch the writer started under (fencing, invariant 16).

        Store failures come out split as persist splits them, so that callers need no driver
        types: a failure before the transaction's commit (connecting, waiting for a pooled
        connection, any statement: the store rolls an unfinished transaction back) changed
        nothing, :class:`ConsensusUnavailable`; a failure of the commit itself may or may not
        have landed, :class:`ConsensusOutcomeUnknown` (retry with the same token).
        """
        if new_upper != expected_upper + 1 or batch.ts != expected_upper:
            raise IntegrityError(
                f"an append covers exactly one ts: got {expected_upper}->{new_upper} for ts {batch.ts}",
                shard=shard_id,
            )
        updated = 0
        committing = False
        try:
            with self.engine.begin() as conn:
                updated = self._append_in(conn, shard_id, expected_upper, new_upper, batch, epoch)
                committing = True
            if updated == 1:
                return AppendResult(AppendOutcome.COMMITTED, new_upper)
            return self.resolve_append(shard_id, expected_upper, batch.token)
        except sa.exc.TimeoutError as exc:
            # The pool had no connection to give within its timeout: nothing was sent.
            raise ConsensusUnavailable(
                f"consensus store {redact_url(self.url)} gave no connection for the commit of batch "
                f"{batch.ts} of shard {shard_id!r} in time (pool exhausted); nothing was committed",
                consensus=redact_url(self.url), shard=shard_id, ts=batch.ts,
            ) from exc
        except sa.exc.DBAPIError as exc:
            # Not chained (as in run_in_transaction): a driver's error may echo the URL's password; the
            # message carries its first line, masked.
            # A commit of a transaction whose UPDATE matched nothing changed nothing either.
            if committing and updated == 1:
                raise ConsensusOutcomeUnknown(
                    f"consensus store {redact_url(self.url)} failed while committing batch {batch.ts} of "
                    f"shard {shard_id!r}, so it may or may not have landed: {_short(exc, self.url)}; "
                    "retrying with the same token is safe",
                    consensus=redact_url(self.url), shard=shard_id, ts=batch.ts,
                ) from None
            raise self.store_error(exc, "consensus store {where} failed before an append committed (nothing was "
                                   "committed)") from None

    def _append_in(
        self, conn, shard_id: str, expected_upper: int, new_upper: int, batch: BatchRecord, epoch: int | None
    ) -> int:
        """The statements of one compare-and-append; the rowcount of its conditional UPDATE."""
        updated = conn.execute(
            sa.update(shards_table)
            .where(
                shards_table.c.shard_id == shard_id,
                shards_table.c.upper == expected_upper,
            )
            .values(upper=new_upper, seqno=shards_table.c.seqno + 1)
        ).rowcount
        if updated == 1:
            runs = (batch.run,) + ((batch.stats["rejects"],) if batch.stats.get("rejects") else ())
            _run_commit_hooks(conn, CommitAttempt(shard_id, "append", batch.ts, runs, batch.writer_id, epoch),
                              self.commit_hooks)
            conn.execute(
                sa.insert(batches_table).values(
                    shard_id=shard_id,
                    ts=batch.ts,
                    writer_id=batch.writer_id,
                    token=batch.token,
                    run=json.dumps(batch.run, sort_keys=True),
                    stats=json.dumps(batch.stats, sort_keys=True),
                    committed_at=time.time(),
                )
            )
        return updated

    def resolve_append(self, shard_id: str, expected_upper: int, token: str) -> AppendResult:
        """What became of an append of ts == expected_upper with ``token``, read from the
        authoritative store."""

        def txn(conn):
            state = conn.execute(
                sa.select(shards_table.c.upper, shards_table.c.since).where(shards_table.c.shard_id == shard_id)
            ).first()
            if state is None:
                raise ShardNotFound(f"unknown shard {shard_id!r}", shard=shard_id)
            winner = None
            if state.upper > expected_upper:
                winner = conn.execute(
                    sa.select(batches_table.c.writer_id, batches_table.c.token).where(
                        batches_table.c.shard_id == shard_id, batches_table.c.ts == expected_upper
                    )
                ).first()
            return state.upper, state.since, winner

        upper, since, winner = self.read_in_snapshot(txn)
        if upper <= expected_upper:
            # upper == expected_upper only after an attempt that did not land: the caller
            # may append again.
            return AppendResult(AppendOutcome.UPPER_BEHIND, upper)
        if winner is None and expected_upper < history_from(since):
            # Below since - 1 a batch row may have been truncated (store/history.py).
            return AppendResult(AppendOutcome.TRUNCATED, upper)
        if winner is None:
            raise IntegrityError(
                f"shard {shard_id!r} has upper {upper} but no committed batch at ts {expected_upper}",
                shard=shard_id,
                ts=expected_upper,
            )
        outcome = AppendOutcome.ALREADY_COMMITTED if winner.token == token else AppendOutcome.UPPER_MOVED
        return AppendResult(outcome, upper, winner.writer_id, winner.token)

    def get_batch(self, shard_id: str, ts: int) -> BatchRecord | None:
        row = self.read_in_snapshot(
            lambda conn: conn.execute(
                sa.select(batches_table).where(
                    batches_table.c.shard_id == shard_id, batches_table.c.ts == ts
                )
            ).first()
        )
        return None if row is None else _batch_from_row(row)

    def batches(self, shard_id: str, *, from_ts: int = 0, below: int | None = None,
                writer_ids: Collection[str] | None = None) -> list[BatchRecord]:
        """The batch records of ts in [from_ts, below), in ts order; only those ``writer_ids``
        committed when given (what history truncation kept: a scan bounded by retention)."""
        query = sa.select(batches_table).where(
            batches_table.c.shard_id == shard_id, batches_table.c.ts >= from_ts
        )
        if below is not None:
            query = query.where(batches_table.c.ts < below)
        if writer_ids is not None:
            query = query.where(batches_table.c.writer_id.in_(list(writer_ids)))
        rows = self.read_in_snapshot(lambda conn: conn.execute(query.order_by(batches_table.c.ts)).all())
        return [_batch_from_row(r) for r in rows]

    # -- compaction, snapshots and restore ---------------------------------------------------

    def get_compaction(self, shard_id: str) -> CompactionRecord | None:
        row = self.read_in_snapshot(
            lambda conn: conn.execute(
                sa.select(compactions_table).where(compactions_table.c.shard_id == shard_id)
            ).first()
        )
        return None if row is None else _compaction_from_row(row)

    def compare_and_set_since(
        self, shard_id: str, expected_since: int, new_since: int, run: dict[str, Any]
    ) -> bool:
        """Advance since from ``expected_since`` to ``new_since`` and install ``run`` as the
        compacted run, iff the authoritative since is still ``expected_since`` and the upper
        has reached ``new_since``. One transaction; True if it committed. The commit hooks
        run in it and may refuse (CommitRefused, nothing committed)."""
        if new_since <= expected_since:
            raise IntegrityError(
                f"since of shard {shard_id!r} only advances: {expected_since} -> {new_since}",
                shard=shard_id,
            )

        def txn(conn):
            updated = conn.execute(
                sa.update(shards_table)
                .where(
                    shards_table.c.shard_id == shard_id,
                    shards_table.c.since == expected_since,
                    shards_table.c.upper >= new_since,
                )
                .values(since=new_since, seqno=shards_table.c.seqno + 1)
            ).rowcount
            if updated != 1:
                return False
            _run_commit_hooks(conn, CommitAttempt(shard_id, "compaction", new_since, (run,)), self.commit_hooks)
            conn.execute(sa.delete(compactions_table).where(compactions_table.c.shard_id == shard_id))
            conn.execute(
                sa.insert(compactions_table).values(
                    shard_id=shard_id,
                    since=new_since,
                    run=json.dumps(run, sort_keys=True),
                    compacted_at=time.time(),
                )
            )
            return True

        return self.run_in_transaction(txn)

    def live_view(self, shard_id: str, as_of: int | None = None) -> LiveView:
        """State, compacted run and the batches a read as of ``as_of`` (default: the upper)
        merges, read under one snapshot so that the compaction row and the batches agree."""

        def txn(conn):
            row = conn.execute(sa.select(shards_table).where(shards_table.c.shard_id == shard_id)).first()
            if row is None:
                raise ShardNotFound(f"unknown shard {shard_id!r}", shard=shard_id)
            record = ShardRecord(**row._mapping)
            read_as_of = record.upper if as_of is None else as_of
            compaction = conn.execute(
                sa.select(compactions_table).where(compactions_table.c.shard_id == shard_id)
            ).first()
            compaction = None if compaction is None else _compaction_from_row(compaction)
            batches = conn.execute(
                sa.select(batches_table)
                .where(
                    batches_table.c.shard_id == shard_id,
                    batches_table.c.ts >= (compaction.since if compaction else 0),
                    batches_table.c.ts < read_as_of,
                )
                .order_by(batches_table.c.ts)
            ).all()
            return LiveView(record, compaction, [_batch_from_row(b) for b in batches], read_as_of)

        return self.read_in_snapshot(txn)

    def snapshot(self, shard_id: str) -> ShardSnapshot:
        """State, compacted run, batches, bindings and quarantined files of one shard, read
        in one transaction so that they agree with each other."""

        def txn(conn):
            row = conn.execute(sa.select(shards_table).where(shards_table.c.shard_id == shard_id)).first()
            if row is None:
                raise ShardNotFound(f"unknown shard {shard_id!r}", shard=shard_id)
            compaction = conn.execute(
                sa.select(compactions_table).where(compactions_table.c.shard_id == shard_id)
            ).first()
            # Not the whole history: from since - 1 on (see ShardSnapshot), by primary key.
            start = history_from(row.since)
            index_rows = conn.execute(
                sa.select(settled_names_table)
                .where(settled_names_table.c.shard_id == shard_id)
                .order_by(settled_names_table.c.partition)
            ).all()
            bindings_from = min([start] + [max(r.through_ts, 0) for r in index_rows])
            batches = conn.execute(
                sa.select(batches_table)
                .where(batches_table.c.shard_id == shard_id, batches_table.c.ts >= start)
                .order_by(batches_table.c.ts)
            ).all()
            bindings = conn.execute(
                sa.select(bindings_table)
                .where(bindings_table.c.shard_id == shard_id, bindings_table.c.ts >= bindings_from)
                .order_by(bindings_table.c.ts)
            ).all()
            rollup_rows = conn.execute(
                sa.select(batch_rollups_table)
                .where(batch_rollups_table.c.shard_id == shard_id)
                .order_by(batch_rollups_table.c.from_ts)
            ).all()
            schema_rows = conn.execute(
                sa.select(table_schemas_table)
                .where(table_schemas_table.c.shard_id == shard_id)
                .order_by(table_schemas_table.c.version)
            ).all()
            quarantined = conn.execute(
                sa.select(
                    quarantined_files_table.c.file, quarantined_files_table.c.reason, quarantined_files_table.c.ts
                )
                .where(quarantined_files_table.c.shard_id == shard_id)
                .order_by(quarantined_files_table.c.file)
            ).all()
            return ShardSnapshot(
                record=ShardRecord(**row._mapping),
                compaction=None if compaction is None else _compaction_from_row(compaction),
                batches=[_batch_from_row(b) for b in batches],
                bindings=[_binding_from_row(b) for b in bindings],
                quarantined=[{"file": q.file, "reason": q.reason, "ts": q.ts} for q in quarantined],
                rollups=[rollup_from_row(r) for r in rollup_rows],
                source_index=[
                    {"partition": r.partition, "through_ts": r.through_ts, "binding_digest": r.binding_digest,
                     "names": r.names}
                    for r in index_rows
                ],
                table_schemas=[{k: v for k, v in r._mapping.items() if k != "shard_id"} for r in schema_rows],
            )

        return self.read_in_snapshot(txn)


def insert_ignore(conn, table: sa.Table, **values: Any) -> bool:
    """INSERT unless the primary key exists, inside the caller's transaction; True if this
    call inserted the row. Decided by RETURNING, not rowcount: drivers report -1 for ON
    CONFLICT inserts."""
    if conn.dialect.name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    key = list(table.primary_key.columns)[0]
    stmt = insert(table).values(**values).on_conflict_do_nothing().returning(key)
    return conn.execute(stmt).first() is not None


def shard_exists(conn, shard_id: str) -> bool:
    """Whether ``shard_id`` has a row in the shards table, inside the caller's transaction."""
    return conn.execute(
        sa.select(shards_table.c.shard_id).where(shards_table.c.shard_id == shard_id)
    ).first() is not None


def _sqlite_error_name(exc: sa.exc.DBAPIError) -> str | None:
    return getattr(exc.orig, "sqlite_errorname", None)


def _unwritable_reason(path: str) -> str:
    """Why the SQLite file at ``path`` cannot be written, when its file system is mounted
    read-only; else nothing (permissions, among others, are SQLite's own words)."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        read_only = bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        return ""
    return f": the file system holding {directory} is mounted read-only" if read_only else ""


class _OpenTransactions(threading.local):
    """The connections with a transaction open, per thread (engine begin/commit/rollback)."""

    def __init__(self) -> None:
        self.connections: set[int] = set()

    def began(self, conn) -> None:
        self.connections.add(id(conn))

    def ended(self, conn) -> None:
        self.connections.discard(id(conn))

    def any(self) -> bool:
        return bool(self.connections)


# Set on a connection when a statement of its transaction inserted, updated or deleted: a
# commit that fails after that may have landed, one of a read-only transaction never matters.
_WROTE = "upsert_wrote"


def _note_write(conn, cursor, statement, parameters, context, executemany) -> None:
    if context is not None and (context.isinsert or context.isupdate or context.isdelete):
        conn.info[_WROTE] = True


def _tracks_writes(engine: Engine) -> bool:
    return event.contains(engine, "after_cursor_execute", _note_write)


# Execution option of a connection whose transaction only reads (``read_in_snapshot``).
_READ_ONLY = "upsert_read_only"
