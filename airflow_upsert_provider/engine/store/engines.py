"""Opening a consensus store: the SQLAlchemy engine a URL stands for, set up per backend (SQLite's
pragmas and BEGIN, PostgreSQL's pool and session timeouts)."""

from __future__ import annotations

import os
import sqlite3
import time

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.engine.url import make_url

from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.engine.store.consensus import _READ_ONLY, Consensus, _note_write
from airflow_upsert_provider.engine.store.records import StoreSchema
from airflow_upsert_provider.engine.store.urls import (
    POSTGRES_TIMEOUT_DEFAULTS,
    SQLITE_URL_OPTIONS,
    normalize_url,
    postgres_session_options,
    sqlite_busy_timeout_ms,
)


# The longest SQLite waits for its write lock in one go. Its busy handler sleeps inside SQLite,
# where a Ctrl-C only lands once it gives up; the URL's whole timeout is waited in slices of
# this, and Python raises KeyboardInterrupt between two.
LOCK_WAIT_SLICE_MS = 100


def _begin_immediate(conn: sa.Connection, busy_timeout_ms: int) -> None:
    """BEGIN IMMEDIATE, waiting for the write lock up to ``busy_timeout_ms`` in slices of
    :data:`LOCK_WAIT_SLICE_MS`. The last attempt goes through SQLAlchemy, which wraps what it
    raises (``database is locked`` after the whole wait) as every other statement's error."""
    raw = conn.connection.dbapi_connection
    deadline = time.monotonic() + busy_timeout_ms / 1000
    try:
        raw.execute(f"PRAGMA busy_timeout={LOCK_WAIT_SLICE_MS}")
        while (left_ms := int((deadline - time.monotonic()) * 1000)) > LOCK_WAIT_SLICE_MS:
            try:
                raw.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if not exc.sqlite_errorname.startswith("SQLITE_BUSY"):
                    break
        raw.execute(f"PRAGMA busy_timeout={max(left_ms, 0)}")
        conn.exec_driver_sql("BEGIN IMMEDIATE")
    finally:
        # The transaction's other statements wait as the URL says.
        raw.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")


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
        if conn.get_execution_options().get(_READ_ONLY):
            conn.exec_driver_sql("BEGIN")
        else:
            _begin_immediate(conn, busy_timeout_ms)


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
