"""Schema versions of the consensus store, and their migrations (Alembic, driven from code).

A store records the revision of its schema in its own version table, ``upsert_schema_version``
(never Alembic's default ``alembic_version``: a PostgreSQL database may be shared with
Airflow's metadata, which uses that one). Opening a store reads that one row and compares it
with the code's head (store/schema_version.py decides): a store without our tables is created
at the head and stamped in one transaction; a store at the head is used; anything else is
refused with :class:`SchemaVersionMismatch`. Only :func:`upgrade` (``upsertctl db upgrade``)
migrates, under a lock, so nothing upgrades in the middle of a batch.

There is no ``alembic.ini``: :func:`alembic_config` builds the configuration in code, with the
``script_location`` of this package; ``env.py`` runs the migrations on the connection it is
handed, inside the caller's transaction.

Adding a migration (for the project's developers), when a table of store/registry.py's
``STORE_SCHEMA`` changes:

1. Change the table in its module (tables.py, streams.py, ...).
2. Write the revision: ``python -c "from alembic import command; from
   airflow_upsert_provider.engine.store.migrations import alembic_config;
   command.revision(alembic_config(), message='what changes', rev_id='0002')"`` creates
   ``versions/0002_what_changes.py`` after the current head (ids are four digits, in order).
   Fill in ``upgrade()`` with ``alembic.op`` (``op.add_column``, ``op.create_index``, ...; on
   SQLite an ALTER that SQLite lacks goes through ``with op.batch_alter_table(...)``, which
   env.py turns on for SQLite). Never import the live tables into a revision: a revision is
   frozen, the tables move on. Keep ``downgrade()`` raising: downgrades are not supported.
3. Make it work on a store that is still being written by the previous release's writers only
   if the docs say so; the documented way is writers stopped, ``db upgrade``, writers started.
   A writer of an older release that kept running is refused at its next commit: the commit
   hook :func:`refuse_other_revision` reads the revision inside every commit transaction, and
   a migration always changes it. Releases from before that hook do not read it: the first
   revision that alters a table they write (shards, batches, bindings, compactions) must also
   make their statements fail, by a rename or a ``NOT NULL`` column without a default that
   only newer code fills (docs/upgrading.md, "Releases from before the commit check").
4. tests/store/test_migrations.py fails until the chain from the baseline builds exactly the
   tables of ``STORE_SCHEMA`` (``alembic.autogenerate.compare_metadata``), on SQLite and
   PostgreSQL; add a case there for the data the revision moves.
"""

from __future__ import annotations

import functools
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import sqlalchemy as sa

from airflow_upsert_provider.engine.store.consensus import Consensus
from airflow_upsert_provider.engine.store.records import CommitAttempt
from airflow_upsert_provider.engine.store.tables import metadata
from airflow_upsert_provider.engine.store.urls import redact_url
if TYPE_CHECKING:
    # Alembic is imported where a migration runs or its scripts are read, never by an open:
    # its import cost every process that opens a store a good part of a second.
    from alembic.config import Config
    from alembic.script import ScriptDirectory

from airflow_upsert_provider.engine.store.schema_version import (
    SchemaAction,
    decide_schema_action,
    schema_mismatch,
    stamped_revisions,
)

# Our own version table (see the module's docstring).
VERSION_TABLE = "upsert_schema_version"

# Key of the PostgreSQL advisory lock that serializes creating and upgrading a store's schema
# ("upsertdb" as a signed 64-bit integer).
SCHEMA_LOCK_KEY = int.from_bytes(b"upsertdb", "big", signed=True)

# The revisions of the chain in versions/, the baseline first. An open compares the store with
# these and stamps a new store without reading the scripts: a task in submit mode imports this
# package from a zip (--py-files), where Alembic cannot list the versions directory.
# tests/store/test_migrations.py checks that this is the chain of versions/.
REVISIONS: tuple[str, ...] = ("0001", "0002", "0003", "0004", "0005", "0006", "0007")

# The version table as Alembic creates it (same column and primary key name), for the one read
# an open makes and the stamp of a new store.
_version_table = sa.Table(
    VERSION_TABLE,
    sa.MetaData(),
    sa.Column("version_num", sa.String(32), nullable=False),
    sa.PrimaryKeyConstraint("version_num", name=f"{VERSION_TABLE}_pkc"),
)


def alembic_config(connection: sa.Connection | None = None) -> "Config":
    """Alembic's configuration for the store's migrations, with ``connection`` (in a
    transaction of the caller's) for env.py to run on."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(Path(__file__).parent))
    config.attributes["connection"] = connection
    return config


@functools.cache
def _scripts() -> "ScriptDirectory":
    # Only script_revisions reads them (db upgrade goes through Alembic's command); an open never does.
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config())


def code_head() -> str:
    """The revision of the schema this code is built for."""
    return REVISIONS[-1]


def known_revisions() -> frozenset[str]:
    """Every revision of the chain this code has, the baseline to the head."""
    return frozenset(REVISIONS)


def script_revisions() -> tuple[str, ...]:
    """The chain as the scripts in versions/ give it, the baseline first (what
    :data:`REVISIONS` must say)."""
    return tuple(reversed([script.revision for script in _scripts().walk_revisions()]))


@dataclass(frozen=True)
class SchemaState:
    """What a store says of its schema: the revision(s) stamped (empty: none) and whether it
    has tables of ours."""

    revisions: tuple[str, ...]
    has_tables: bool
    # The version table exists (it may be empty).
    versioned: bool = True


def _state_by_inspection(conn: sa.Connection, consensus: Consensus) -> SchemaState:
    names = set(sa.inspect(conn).get_table_names())
    revisions: tuple[str, ...] = ()
    if VERSION_TABLE in names:
        revisions = tuple(conn.execute(sa.select(_version_table.c.version_num)).scalars())
    return SchemaState(revisions, bool(names & {t.name for t in consensus.tables}), VERSION_TABLE in names)


def read_schema_state(consensus: Consensus) -> SchemaState:
    """The store's schema state, in one query when the store is versioned (every open but the
    first): the version row. Only when that fails (no version table yet) are the tables listed."""
    try:
        with consensus.read_connection() as conn:
            revisions = tuple(conn.execute(sa.select(_version_table.c.version_num)).scalars())
        return SchemaState(revisions, True)
    except sa.exc.DBAPIError as exc:
        first = exc
    try:
        with consensus.read_connection() as conn:
            state = _state_by_inspection(conn, consensus)
    except sa.exc.DBAPIError as exc:
        raise consensus.store_error(exc, "cannot reach consensus store {where}") from None
    if state.versioned:
        # The version table is there after all: the first read failed for another reason.
        raise consensus.store_error(first, "cannot reach consensus store {where}") from None
    return state


@contextmanager
def _schema_lock(consensus: Consensus) -> Iterator[sa.Connection]:
    """One transaction holding the store's schema lock: SQLite's write lock (the store's
    transactions begin IMMEDIATE), a transaction-scoped advisory lock on PostgreSQL (released
    with the transaction, also when its holder dies)."""
    with consensus.engine.begin() as conn:
        if consensus.dialect == "postgresql":
            conn.execute(sa.select(sa.func.pg_advisory_xact_lock(SCHEMA_LOCK_KEY)))
            # A migration may rewrite a large table: the session's statement_timeout (meant for
            # the short transactions of batches) must not cut it off. lock_timeout stays: an
            # upgrade that cannot get a table's lock fails instead of queueing every writer.
            conn.exec_driver_sql("SET LOCAL statement_timeout = 0")
        yield conn


def _stamp_head(conn: sa.Connection) -> None:
    # As Alembic's stamp would, without its scripts (see REVISIONS); the caller holds the
    # schema lock and found no revision stamped.
    _version_table.create(conn, checkfirst=True)
    conn.execute(sa.insert(_version_table).values(version_num=code_head()))


def prepare_on_open(consensus: Consensus, *, create: bool = True) -> SchemaAction:
    """Check the schema of a store being opened: create a store without tables of ours at the
    code's head (when ``create``), use a current one, refuse any other with
    :class:`SchemaVersionMismatch` (nothing changed). Never migrates."""
    head, known = code_head(), known_revisions()
    state = read_schema_state(consensus)
    action = decide_schema_action(state.revisions, state.has_tables, head, known)
    if action is SchemaAction.CREATE and create:
        try:
            with _schema_lock(consensus) as conn:
                # Decided again under the lock: a peer may have created it meanwhile.
                state = _state_by_inspection(conn, consensus)
                action = decide_schema_action(state.revisions, state.has_tables, head, known)
                if action is SchemaAction.CREATE:
                    # The tables as the code declares them, stamped with the head: the chain from
                    # the baseline builds the same (tests/store/test_migrations.py checks it).
                    metadata.create_all(conn, tables=list(consensus.tables))
                    _stamp_head(conn)
        except sa.exc.DBAPIError as exc:
            raise consensus.store_error(exc, "cannot reach consensus store {where}") from None
    error = schema_mismatch(action, state.revisions, head, redact_url(consensus.url))
    if error is not None:
        raise error
    return action


def refuse_other_revision(conn: sa.Connection, attempt: CommitAttempt) -> None:
    """Commit hook, first of the store's: refuse the commit, inside its transaction, when the
    store's schema revision is no longer the code's head. A process opened the store before a
    ``db upgrade`` (or an upgrade by a newer provider) ran underneath it; it must not go on
    writing rows shaped by the old schema. One read of the version table's only row, by its
    primary key; every migration changes that row, so every migration after this check exists
    refuses the commits of every older binary (docs/upgrading.md)."""
    revisions = tuple(conn.execute(sa.select(_version_table.c.version_num)).scalars())
    head = code_head()
    action = decide_schema_action(revisions, True, head, known_revisions())
    error = schema_mismatch(action, revisions, head, redact_url(str(conn.engine.url)))
    if error is None:
        return
    what = f"batch {attempt.ts}" if attempt.kind == "append" else f"compaction to since {attempt.ts}"
    raise type(error)(
        f"commit of {what} of shard {attempt.shard_id!r} refused: the schema changed after this process "
        f"opened the store: {error.message}",
        shard=attempt.shard_id, ts=attempt.ts, **error.details,
    )


@dataclass(frozen=True)
class UpgradeResult:
    """What ``db upgrade`` did: the store's revision before (None: unversioned or empty) and
    after, and whether it changed anything."""

    from_revision: str | None
    to_revision: str
    upgraded: bool

    def to_dict(self) -> dict[str, Any]:
        return {"from_revision": self.from_revision, "to_revision": self.to_revision, "upgraded": self.upgraded}


def upgrade(consensus: Consensus) -> UpgradeResult:
    """Migrate the store to the code's head, in one transaction under the schema lock (two
    upgrades at once: the second finds the first's result). Idempotent: a store at the head
    is left alone. A store newer than the code, or stamped with several revisions, is refused
    (:class:`SchemaVersionMismatch`)."""
    head, known = code_head(), known_revisions()
    try:
        with _schema_lock(consensus) as conn:
            state = _state_by_inspection(conn, consensus)
            action = decide_schema_action(state.revisions, state.has_tables, head, known)
            if action in (SchemaAction.NEWER, SchemaAction.AMBIGUOUS):
                raise schema_mismatch(action, state.revisions, head, redact_url(consensus.url))
            if action is not SchemaAction.CURRENT:
                from alembic import command

                # The baseline creates what is missing: an empty or unversioned store is upgraded
                # the same way as one at an older revision.
                command.upgrade(alembic_config(conn), "head")
    except sa.exc.DBAPIError as exc:
        raise consensus.store_error(exc, "consensus store {where} failed during the upgrade; nothing was changed") from None
    before = stamped_revisions(state.revisions)
    return UpgradeResult(before, head, action is not SchemaAction.CURRENT)


def schema_status(consensus: Consensus) -> dict[str, Any]:
    """The store's schema revision and the code's, whether ``db upgrade`` is needed, and its
    size: rows and bytes per table (PostgreSQL: ``pg_total_relation_size``, indexes and TOAST
    included; SQLite: the pages of the table and its indexes when SQLite has ``dbstat``, and
    the file's bytes)."""
    head, known = code_head(), known_revisions()
    try:
        with consensus.read_connection() as conn:
            state = _state_by_inspection(conn, consensus)
            present = set(sa.inspect(conn).get_table_names())
            names = [t.name for t in consensus.tables] + [VERSION_TABLE]
            tables = {}
            sizes = _table_bytes(conn, consensus.dialect)
            for name in names:
                if name not in present:
                    continue
                rows = conn.execute(sa.select(sa.func.count()).select_from(sa.table(name))).scalar_one()
                tables[name] = {"rows": rows, "bytes": sizes.get(name)}
    except sa.exc.DBAPIError as exc:
        raise consensus.store_error(exc, "cannot reach consensus store {where}") from None
    action = decide_schema_action(state.revisions, state.has_tables, head, known)
    status: dict[str, Any] = {
        "consensus": redact_url(consensus.url),
        "store_revision": stamped_revisions(state.revisions),
        "code_revision": head,
        "state": action.value,
        "upgrade_needed": action in (SchemaAction.UPGRADE, SchemaAction.UNVERSIONED),
        "tables": tables,
    }
    if consensus.dialect == "sqlite":
        path = consensus.engine.url.database
        status["file_bytes"] = sum(
            os.path.getsize(p) for p in (path, f"{path}-wal") if os.path.exists(p)
        )
    else:
        status["total_bytes"] = sum(t["bytes"] or 0 for t in tables.values())
    return status


def _table_bytes(conn: sa.Connection, dialect: str) -> dict[str, int]:
    if dialect == "postgresql":
        rows = conn.execute(
            sa.text(
                "SELECT c.relname, pg_total_relation_size(c.oid) FROM pg_class c "
                "WHERE c.relkind = 'r' AND c.relnamespace = to_regnamespace(current_schema())"
            )
        )
        return {name: int(size) for name, size in rows}
    try:
        rows = conn.execute(
            sa.text(
                "SELECT m.tbl_name, SUM(d.pgsize) FROM dbstat d JOIN sqlite_master m ON d.name = m.name "
                "GROUP BY m.tbl_name"
            )
        )
        return {name: int(size) for name, size in rows}
    except sa.exc.OperationalError:
        # A SQLite built without dbstat: the file's size only.
        conn.rollback()
        return {}
