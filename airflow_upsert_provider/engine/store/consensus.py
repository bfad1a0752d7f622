"""Consensus: the linearizable store of every shard's authoritative state.

One interface, two real stores through SQLAlchemy Core: SQLite (embedded default, WAL mode,
``BEGIN IMMEDIATE`` so a transaction takes the write lock up front) and PostgreSQL (shared,
row-level compare-and-set). Every compare-and-set is one conditional UPDATE checked by
rowcount inside one short transaction; nothing here is held while Spark works.
"""

from __future__ import annotations

import enum
import json
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.engine.url import URL, make_url

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

metadata = sa.MetaData()

shards_table = sa.Table(
    "upsert_shards",
    metadata,
    sa.Column("shard_id", sa.String(128), primary_key=True),
    sa.Column("upper", sa.BigInteger, nullable=False),
    sa.Column("since", sa.BigInteger, nullable=False),
    # Bumped by every state change; compaction (which leaves upper alone) compares on it.
    sa.Column("seqno", sa.BigInteger, nullable=False),
    sa.Column("config", sa.Text, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
)

# binding(ts): which source offsets batch ts covers. Inserted once, never updated.
bindings_table = sa.Table(
    "upsert_bindings",
    metadata,
    sa.Column("shard_id", sa.String(128), primary_key=True),
    sa.Column("ts", sa.BigInteger, primary_key=True),
    sa.Column("ranges", sa.Text, nullable=False),
    sa.Column("minted_by", sa.String(512), nullable=False),
    sa.Column("minted_at", sa.Float, nullable=False),
)

# The one committed batch of every ts < upper (invariant 2: the primary key makes it one).
batches_table = sa.Table(
    "upsert_batches",
    metadata,
    sa.Column("shard_id", sa.String(128), primary_key=True),
    sa.Column("ts", sa.BigInteger, primary_key=True),
    sa.Column("writer_id", sa.String(512), nullable=False),
    sa.Column("token", sa.String(64), nullable=False),
    sa.Column("run", sa.Text, nullable=False),
    sa.Column("stats", sa.Text, nullable=False),
    sa.Column("committed_at", sa.Float, nullable=False),
)

# What planning a batch knows about a source partition (store/source_index.py): its names
# whose verdict is settled as of a binding. Here because a snapshot carries it: a restored
# shard checks it against the binding it is anchored at, and catches up from the later ones.
settled_names_table = sa.Table(
    "upsert_source_settled",
    metadata,
    sa.Column("shard_id", sa.String(128), primary_key=True),
    sa.Column("partition", sa.String(512), primary_key=True),
    # The binding these names are settled through; -1 before the first binding.
    sa.Column("through_ts", sa.BigInteger, nullable=False),
    # Digest of that binding: a row left by an earlier shard of the same id does not match.
    sa.Column("binding_digest", sa.String(64), nullable=False),
    # File names joined by "/", the one character no file name holds.
    sa.Column("names", sa.Text, nullable=False),
)

# The audit summary of batch rows truncated below since (store/history.py): one row per
# truncation, [from_ts, to_ts).
batch_rollups_table = sa.Table(
    "upsert_batch_rollups",
    metadata,
    sa.Column("shard_id", sa.String(128), primary_key=True),
    sa.Column("from_ts", sa.BigInteger, primary_key=True),
    sa.Column("to_ts", sa.BigInteger, nullable=False),
    sa.Column("batches", sa.BigInteger, nullable=False),
    sa.Column("rows_in", sa.BigInteger, nullable=False),
    sa.Column("rows_out", sa.BigInteger, nullable=False),
    sa.Column("rejected", sa.BigInteger, nullable=False),
    sa.Column("first_committed_at", sa.Float, nullable=True),
    sa.Column("last_committed_at", sa.Float, nullable=True),
    sa.Column("rolled_up_at", sa.Float, nullable=False),
)

# Source files set aside in quarantine mode (unparseable names, late arrivals, unreadable
# files), so each is reported once and never silently skipped.
quarantined_files_table = sa.Table(
    "upsert_quarantined_files",
    metadata,
    sa.Column("shard_id", sa.String(128), primary_key=True),
    sa.Column("file", sa.String(2048), primary_key=True),
    sa.Column("reason", sa.Text, nullable=False),
    sa.Column("ts", sa.BigInteger, nullable=False),
)


# The compacted run of a shard: every batch below ``since`` merged into one run per bucket.
# One row per shard, replaced together with ``since`` by compare-and-set on since (writers
# only move upper, so a compaction never makes a writer lose, nor a writer a compaction).
compactions_table = sa.Table(
    "upsert_compactions",
    metadata,
    sa.Column("shard_id", sa.String(128), primary_key=True),
    sa.Column("since", sa.BigInteger, nullable=False),
    sa.Column("run", sa.Text, nullable=False),
    sa.Column("compacted_at", sa.Float, nullable=False),
)


@dataclass(frozen=True)
class CommitAttempt:
    """What a commit is about to make live, as commit hooks see it."""

    shard_id: str
    # "append": a batch at ``ts``; "compaction": a compacted run below since ``ts``.
    kind: str
    ts: int
    # The run descriptions ({"path", "files": [{"path", ...}], ...}) the commit names.
    runs: tuple[dict[str, Any], ...]
    writer_id: str = ""
    # The stream epoch the writer started under (None: not checked, e.g. a maintenance task).
    epoch: int | None = None


# Hooks run inside the commit transaction of every append and swap, after its compare-and-set
# matched: each returns None or a reason to refuse (the transaction rolls back and
# CommitRefused is raised), or raises an UpsertError of its own (same rollback), and may write
# rows of its own in the same transaction. The store runs those its schema lists
# (store/registry.py), in that order.
CommitHook = Callable[[Any, CommitAttempt], "str | None"]


@dataclass(frozen=True)
class RestoreEvent:
    """A shard being restored from a checkpoint, as restore hooks see it."""

    shard_id: str
    upper: int
    actor: str
    reason: str


# Hooks run inside the transaction that restores a shard (e.g. the stream starts RECOVERING).
RestoreHook = Callable[[Any, RestoreEvent], None]


@dataclass(frozen=True)
class StoreSchema:
    """The tables a store creates and the hooks it runs in its transactions. Composed once, in
    store/registry.py, and given to the store when it is opened."""

    tables: tuple[sa.Table, ...]
    commit_hooks: tuple[CommitHook, ...] = ()
    restore_hooks: tuple[RestoreHook, ...] = ()


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


class AppendOutcome(str, enum.Enum):
    COMMITTED = "committed"
    # The upper had already moved past expected_upper with this very token: an earlier
    # attempt of ours landed (e.g. the connection dropped after the commit).
    ALREADY_COMMITTED = "already_committed"
    # A peer's batch holds that ts: ours provably lost.
    UPPER_MOVED = "upper_moved"
    # The upper is past that ts, whose batch row was truncated (below since, older than GC's
    # grace period): the batch is persisted, but whose token won is no longer known.
    TRUNCATED = "truncated"
    # The upper is below expected_upper: the batch must be held until the shard gets there.
    UPPER_BEHIND = "upper_behind"


@dataclass(frozen=True)
class ShardRecord:
    shard_id: str
    upper: int
    since: int
    seqno: int
    config: str
    created_at: float


@dataclass(frozen=True)
class Binding:
    ts: int
    # partition -> {"from": int, "to": int, "files": [[seq, name], ...], "count": int}
    ranges: dict[str, dict[str, Any]]
    # [{"file": path, "reason": str}] set aside when this binding was minted (quarantine mode)
    quarantined: list[dict[str, str]] = field(default_factory=list)
    minted_by: str = ""

    def to_offsets(self) -> dict[str, int]:
        return {p: r["to"] for p, r in self.ranges.items()}

    def to_json(self) -> str:
        return json.dumps({"ranges": self.ranges, "quarantined": self.quarantined}, sort_keys=True)


@dataclass(frozen=True)
class BatchRecord:
    ts: int
    writer_id: str
    token: str
    # {"path": staging dir, "files": [{"path", "bytes"}], "rows": int}
    run: dict[str, Any]
    stats: dict[str, Any]
    committed_at: float = 0.0


@dataclass(frozen=True)
class AppendResult:
    outcome: AppendOutcome
    # The authoritative upper after the attempt, read from the store, never from a cache.
    upper: int
    # On UPPER_MOVED: the writer and token of the batch that holds expected_upper.
    winner_writer_id: str | None = None
    winner_token: str | None = None


@dataclass(frozen=True)
class CompactionRecord:
    # The run covers every ts < since; reads as of ts >= since add the batches from since on.
    since: int
    run: dict[str, Any]
    compacted_at: float = 0.0


@dataclass(frozen=True)
class Rollup:
    """The audit summary of a truncated range of batches [from_ts, to_ts)."""

    from_ts: int
    to_ts: int
    batches: int
    rows_in: int
    rows_out: int
    rejected: int
    first_committed_at: float | None
    last_committed_at: float | None
    rolled_up_at: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def rollup_from_row(row) -> Rollup:
    return Rollup(**{k: v for k, v in row._mapping.items() if k != "shard_id"})


@dataclass(frozen=True)
class ShardSnapshot:
    """What consensus holds about one shard that its state at the upper needs, read in one
    transaction: what a checkpoint records and what a restore writes back. Batches and
    bindings from since - 1 on (``history_from``): what reads, the next binding, a seek and
    the last commit need; older rows are history (store/history.py), summed up in
    ``rollups``."""

    record: ShardRecord
    compaction: CompactionRecord | None
    batches: list[BatchRecord]
    bindings: list[Binding]
    # [{"file", "reason", "ts"}]: source files set aside, with the batch that set them aside
    quarantined: list[dict[str, Any]]
    rollups: list[Rollup] = field(default_factory=list)
    # The source index rows ({"partition", "through_ts", "binding_digest", "names"}); the
    # bindings start at the lowest one's anchor when that is below since - 1.
    source_index: list[dict[str, Any]] = field(default_factory=list)

    def live_runs(self, as_of: int | None = None) -> list[dict[str, Any]]:
        """The runs a read as of ``as_of`` (default: the upper) merges."""
        return live_runs(self.compaction, self.batches, self.record.upper if as_of is None else as_of)


@dataclass(frozen=True)
class LiveView:
    """What a read as of ``as_of`` needs, read in one transaction: the shard's state, its
    compacted run and the batches from the compaction's since up to ``as_of``."""

    record: ShardRecord
    compaction: CompactionRecord | None
    batches: list[BatchRecord]
    as_of: int

    @property
    def runs(self) -> list[dict[str, Any]]:
        return live_runs(self.compaction, self.batches, self.as_of)


def live_runs(
    compaction: CompactionRecord | None, batches: list[BatchRecord], as_of: int
) -> list[dict[str, Any]]:
    """The runs a read as of ``as_of`` merges: the compacted run (every ts below its since)
    and the committed batches from its since up to ``as_of``. The one rule that reads,
    compaction, checkpoints and GC share; the caller checks since <= as_of <= upper."""
    base = compaction.since if compaction else 0
    runs = [compaction.run] if compaction else []
    return runs + [b.run for b in batches if base <= b.ts < as_of]


# SQLSTATEs of a PostgreSQL session timeout (lock_not_available, query_canceled): the option
# that bounds it.
_SESSION_TIMEOUTS = {"55P03": "lock_timeout", "57014": "statement_timeout"}


def history_from(since: int) -> int:
    """The lowest ts whose batch and binding rows a shard always keeps (store/history.py)."""
    return max(since - 1, 0)


# Drivers a bare ``postgresql://`` or ``postgres://`` (the libpq spelling) URL means.
_DEFAULT_DRIVERS = {"postgres": "postgresql+psycopg", "postgresql": "postgresql+psycopg"}


def normalize_url(url: str) -> str:
    """Accept ``postgresql://`` and ``postgres://`` as the psycopg 3 driver. Raises
    :class:`ConfigurationError` (without echoing the URL) when it cannot be parsed."""
    parsed = parse_url(url)
    driver = _DEFAULT_DRIVERS.get(parsed.drivername)
    if driver is not None:
        parsed = parsed.set(drivername=driver)
    return parsed.render_as_string(hide_password=False)


def redact_url(url: str) -> str:
    """The URL with its password masked, for logs and error messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # an unparseable URL still must not leak what it holds
        return "<unparseable consensus url>"


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

    def _run(self, fn):
        """Run ``fn(conn)`` in one transaction; map store failures to honest errors.

        A failure before the commit (connecting, or any statement: the store rolls an
        unfinished transaction back) changed nothing: :class:`ConsensusUnavailable` (exit 2,
        retryable). A failure of the commit of a transaction that wrote may or may not have
        landed: :class:`ConsensusOutcomeUnknown` (exit 5, retryable).
        """
        committing = wrote = False
        try:
            with self.engine.connect() as conn:
                conn.info[_WROTE] = False
                with conn.begin():
                    result = fn(conn)
                    # Without the write tracker (see open_store), assume it wrote.
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

    def _run_snapshot(self, fn):
        """Run the reads of ``fn(conn)`` in one transaction that sees one snapshot of the
        store. PostgreSQL's default (READ COMMITTED) takes a snapshot per statement, so a
        compaction swap between two SELECTs could mix its row with older batches: REPEATABLE
        READ there. SQLite transactions are serializable already; a read one begins deferred,
        so that in WAL mode it reads beside a writer instead of queueing for the write lock."""
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

        if not self._run(txn):
            raise ShardExists(f"shard {shard_id!r} already exists", shard=shard_id)
        return self.get_shard(shard_id)

    def get_shard(self, shard_id: str) -> ShardRecord:
        row = self._run_snapshot(
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
        rows = self._run_snapshot(
            lambda conn: conn.execute(sa.select(shards_table).order_by(shards_table.c.shard_id)).all()
        )
        return [ShardRecord(**r._mapping) for r in rows]

    # -- bindings -------------------------------------------------------------------------

    def get_binding(self, shard_id: str, ts: int) -> Binding | None:
        row = self._run_snapshot(
            lambda conn: conn.execute(
                sa.select(bindings_table).where(
                    bindings_table.c.shard_id == shard_id, bindings_table.c.ts == ts
                )
            ).first()
        )
        return None if row is None else _binding_from_row(row)

    def bindings(self, shard_id: str) -> Iterator[Binding]:
        rows = self._run_snapshot(
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

        return self._run(txn)

    def quarantined_files(self, shard_id: str) -> dict[str, str]:
        rows = self._run_snapshot(
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
            # Not chained (as in _run): a driver's error may echo the URL's password; the
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

        upper, since, winner = self._run_snapshot(txn)
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
        row = self._run_snapshot(
            lambda conn: conn.execute(
                sa.select(batches_table).where(
                    batches_table.c.shard_id == shard_id, batches_table.c.ts == ts
                )
            ).first()
        )
        return None if row is None else _batch_from_row(row)

    def batches(self, shard_id: str, *, from_ts: int = 0, below: int | None = None) -> list[BatchRecord]:
        query = sa.select(batches_table).where(
            batches_table.c.shard_id == shard_id, batches_table.c.ts >= from_ts
        )
        if below is not None:
            query = query.where(batches_table.c.ts < below)
        rows = self._run_snapshot(lambda conn: conn.execute(query.order_by(batches_table.c.ts)).all())
        return [_batch_from_row(r) for r in rows]

    # -- compaction, snapshots and restore ---------------------------------------------------

    def get_compaction(self, shard_id: str) -> CompactionRecord | None:
        row = self._run_snapshot(
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

        return self._run(txn)

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

        return self._run_snapshot(txn)

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
            )

        return self._run_snapshot(txn)

    def restore_shard(
        self, shard_id: str, snapshot: ShardSnapshot, *, actor: str = "", reason: str = ""
    ) -> ShardRecord:
        """Write ``snapshot`` as shard ``shard_id`` in one transaction, with the restore hooks.
        Refused if the shard exists: a restore never moves an existing upper backwards
        (restore under a new id). ``actor`` and ``reason`` are recorded by the hooks."""
        record = snapshot.record

        def txn(conn):
            existing = conn.execute(
                sa.select(shards_table.c.upper).where(shards_table.c.shard_id == shard_id)
            ).scalar_one_or_none()
            if existing is not None or not insert_ignore(
                conn,
                shards_table,
                shard_id=shard_id,
                upper=record.upper,
                since=record.since,
                seqno=record.seqno,
                config=record.config,
                created_at=time.time(),
            ):
                raise ShardExists(
                    f"cannot restore into shard {shard_id!r}: it exists"
                    + (f" with upper {existing}" if existing is not None else "")
                    + f" (the checkpoint's upper is {record.upper}); a restore never moves an "
                    "existing upper backwards: restore into an empty consensus or under a new shard id",
                    shard=shard_id,
                    upper=existing,
                )
            # Stale rows of a shard id used before (dropped shard) must not mix in.
            for table in (bindings_table, batches_table, quarantined_files_table, compactions_table,
                          batch_rollups_table, settled_names_table):
                conn.execute(sa.delete(table).where(table.c.shard_id == shard_id))
            if snapshot.bindings:
                conn.execute(
                    sa.insert(bindings_table),
                    [
                        {"shard_id": shard_id, "ts": b.ts, "ranges": b.to_json(), "minted_by": b.minted_by,
                         "minted_at": time.time()}
                        for b in snapshot.bindings
                    ],
                )
            if snapshot.batches:
                conn.execute(
                    sa.insert(batches_table),
                    [
                        {"shard_id": shard_id, "ts": b.ts, "writer_id": b.writer_id, "token": b.token,
                         "run": json.dumps(b.run, sort_keys=True), "stats": json.dumps(b.stats, sort_keys=True),
                         "committed_at": b.committed_at}
                        for b in snapshot.batches
                    ],
                )
            if snapshot.quarantined:
                conn.execute(
                    sa.insert(quarantined_files_table),
                    [{"shard_id": shard_id, **q} for q in snapshot.quarantined],
                )
            if snapshot.source_index:
                conn.execute(
                    sa.insert(settled_names_table),
                    [{"shard_id": shard_id, **r} for r in snapshot.source_index],
                )
            if snapshot.rollups:
                conn.execute(
                    sa.insert(batch_rollups_table),
                    [{"shard_id": shard_id, **r.to_dict()} for r in snapshot.rollups],
                )
            if snapshot.compaction is not None:
                conn.execute(
                    sa.insert(compactions_table).values(
                        shard_id=shard_id,
                        since=snapshot.compaction.since,
                        run=json.dumps(snapshot.compaction.run, sort_keys=True),
                        compacted_at=snapshot.compaction.compacted_at,
                    )
                )
            for hook in self.restore_hooks:
                hook(conn, RestoreEvent(shard_id, record.upper, actor, reason))
            return ShardRecord(**conn.execute(
                sa.select(shards_table).where(shards_table.c.shard_id == shard_id)
            ).one()._mapping)

        return self._run(txn)


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


def _binding_from_row(row) -> Binding:
    data = json.loads(row.ranges)
    return Binding(
        ts=row.ts,
        ranges=data["ranges"],
        quarantined=data.get("quarantined", []),
        minted_by=row.minted_by,
    )


def _batch_from_row(row) -> BatchRecord:
    return BatchRecord(
        ts=row.ts,
        writer_id=row.writer_id,
        token=row.token,
        run=json.loads(row.run),
        stats=json.loads(row.stats),
        committed_at=row.committed_at,
    )


def _compaction_from_row(row) -> CompactionRecord:
    return CompactionRecord(since=row.since, run=json.loads(row.run), compacted_at=row.compacted_at)


def _short(exc: BaseException, url: str | None = None) -> str:
    """The first line of a driver error, with the password of ``url`` masked should the
    driver have echoed it."""
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    line = text[0] if text else type(exc).__name__
    password = _password_of(url) if url else None
    return line.replace(password, "***") if password else line


def _password_of(url: str) -> str | None:
    try:
        return make_url(url).password or None
    except Exception:
        return None


def _sqlite_error_name(exc: sa.exc.DBAPIError) -> str | None:
    return getattr(exc.orig, "sqlite_errorname", None)


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


# Execution option of a connection whose transaction only reads (``_run_snapshot``).
_READ_ONLY = "upsert_read_only"


def _configure_sqlite(engine: Engine, busy_timeout_ms: int) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):  # pragma: no cover - exercised through every test
        # Let SQLAlchemy issue BEGIN itself (below) instead of pysqlite's deferred BEGIN.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=FULL")
        cur.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):  # pragma: no cover
        # A transaction that may write takes the write lock at BEGIN: a deferred one that
        # reads then writes can fail with SQLITE_BUSY mid-way instead of waiting. One that
        # only reads takes none (WAL: readers never wait for the writer).
        conn.exec_driver_sql("BEGIN" if conn.get_execution_options().get(_READ_ONLY) else "BEGIN IMMEDIATE")


def parse_url(url: str) -> URL:
    """A consensus URL, parsed; a clear error (that does not echo the URL, which may hold a
    password) when it cannot be."""
    try:
        return make_url(url)
    except Exception:
        raise ConfigurationError(
            "invalid consensus URL (expected sqlite:///PATH or postgresql://USER@HOST/DB)",
            field="consensus",
        ) from None


def with_password(url: str, password: str | None) -> str:
    """``url`` with ``password`` set, for stores that keep the password apart from the URL."""
    if not password:
        return url
    return make_url(normalize_url(url)).set(password=password).render_as_string(hide_password=False)


# Query options of a sqlite:/// URL that the SQLite driver uses (it ignores any other).
SQLITE_URL_OPTIONS = frozenset({"timeout", "check_same_thread", "cached_statements", "detect_types"})
# How long a SQLite transaction waits for the write lock when the URL gives no ``timeout``.
SQLITE_DEFAULT_TIMEOUT_S = 60.0

# Session timeouts of a PostgreSQL consensus, in milliseconds: options of its URL that the
# engine applies to every session it opens (libpq never sees them). A session waiting for a
# lock, or a statement running, longer fails retryably instead of holding writers up.
POSTGRES_TIMEOUT_DEFAULTS = {"lock_timeout": 10_000, "statement_timeout": 60_000}
_DURATION_UNITS = {"ms": 1, "s": 1000, "min": 60_000}


def parse_timeout_ms(option: str, value: Any) -> int:
    """A consensus URL's timeout option as milliseconds: ``500ms``, ``10s``, ``2min`` or a bare
    number of milliseconds (PostgreSQL's spelling); 0 turns the timeout off."""
    text = value.strip().lower() if isinstance(value, str) else ""
    number, unit = text, "ms"
    for suffix in sorted(_DURATION_UNITS, key=len, reverse=True):
        if text.endswith(suffix):
            number, unit = text[: -len(suffix)].strip(), suffix
            break
    if not number.isdigit() or int(number) * _DURATION_UNITS[unit] > 2**31 - 1:
        shown = value if isinstance(value, str) else ", ".join(map(str, value))
        raise ConfigurationError(
            f"consensus URL option {option} takes one duration (e.g. 10s, 500ms, 1min; a bare number is "
            f"milliseconds; 0 turns it off), not {shown!r}",
            field=option,
        )
    return int(number) * _DURATION_UNITS[unit]


def postgres_session_options(query: Any) -> str:
    """The libpq ``options`` (``-c name=ms ...``) that set the session timeouts the URL's
    ``query`` asks for (else the defaults), followed by any ``options`` of the URL itself."""
    timeouts = {
        name: parse_timeout_ms(name, query[name]) if name in query else default
        for name, default in POSTGRES_TIMEOUT_DEFAULTS.items()
    }
    options = " ".join(f"-c {name}={ms}" for name, ms in timeouts.items())
    own = query.get("options")
    if own:
        options += " " + (own if isinstance(own, str) else " ".join(own))
    return options


def sqlite_busy_timeout_ms(query: Any) -> int:
    """How long SQLite waits for its write lock: the URL's ``timeout`` (seconds), else 60 s."""
    if "timeout" not in query:
        return int(SQLITE_DEFAULT_TIMEOUT_S * 1000)
    value = query["timeout"]
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = float("nan")
    if not (0 <= seconds < 2**31 / 1000):
        raise ConfigurationError(
            f"consensus URL option timeout takes one number of seconds >= 0, not {value!r}", field="timeout"
        )
    return int(seconds * 1000)


def open_store(url: str, schema: StoreSchema) -> Consensus:
    """Open the consensus store at ``url``, enforcing ``schema``; callers open through
    ``store.registry.open_consensus``, which also checks (or creates) the store's schema.

    ``sqlite:///path.db`` or ``postgresql://user:pass@host:port/db``.
    """
    url = normalize_url(url)
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        path = parsed.database
        if not path or path == ":memory:":
            raise ConfigurationError(
                "the SQLite consensus must be a file (sqlite:///PATH) so that writers share it",
                field="consensus",
            )
        unknown = sorted(set(parsed.query) - SQLITE_URL_OPTIONS)
        if unknown:
            # The SQLite driver would ignore them with a warning: a typo must not pass.
            raise ConfigurationError(
                f"unknown SQLite consensus URL option(s) {', '.join(unknown)} "
                f"(known: {', '.join(sorted(SQLITE_URL_OPTIONS))})",
                field="consensus",
            )
        if os.path.isdir(path):
            raise ConfigurationError(
                f"the SQLite consensus {path} is a directory: name a file in it", field="consensus"
            )
        directory = os.path.dirname(os.path.abspath(path))
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as exc:
            # e.g. a path below a file (sqlite:////etc/passwd/x.db) or a read-only parent.
            raise ConfigurationError(
                f"cannot create the directory {directory} of the SQLite consensus: {exc.strerror}",
                field="consensus",
            ) from None
        busy_timeout_ms = sqlite_busy_timeout_ms(parsed.query)
        engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        _configure_sqlite(engine, busy_timeout_ms)
    elif backend == "postgresql":
        options = postgres_session_options(parsed.query)
        engine = sa.create_engine(
            parsed.difference_update_query([*POSTGRES_TIMEOUT_DEFAULTS, "options"]),
            pool_pre_ping=True,
            pool_size=2,
            max_overflow=2,
            connect_args={"connect_timeout": 10, "options": options},
        )
    else:
        raise ConfigurationError(
            f"unsupported consensus backend {backend!r}: use sqlite or postgresql",
            field="consensus",
        )
    event.listen(engine, "after_cursor_execute", _note_write)
    return Consensus(engine, url, schema)

