"""The consensus store under load: session timeouts on PostgreSQL, reads beside SQLite's
writer."""

from __future__ import annotations

import sqlite3

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from airflow_upsert_provider.engine.errors import ConfigurationError, ConsensusUnavailable
from airflow_upsert_provider.engine.store.consensus import AppendOutcome, normalize_url
from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.engine.store.streams import read_stream
from airflow_upsert_provider.engine.table.shard import Shard
from tests.helpers import batch, make_shard


def _with_options(url: str, **options: str) -> str:
    return make_url(normalize_url(url)).update_query_dict(options).render_as_string(hide_password=False)


def _session_setting(store, name: str) -> str:
    with store.engine.connect() as conn:
        return conn.exec_driver_sql(f"SHOW {name}").scalar()


# -- PostgreSQL session timeouts ----------------------------------------------------------------


def test_postgres_sessions_get_default_lock_and_statement_timeouts(pg_url):
    store = open_consensus(pg_url)
    try:
        assert (_session_setting(store, "lock_timeout"), _session_setting(store, "statement_timeout")) == ("10s", "1min")
    finally:
        store.dispose()
    store = open_consensus(_with_options(pg_url, lock_timeout="250ms", statement_timeout="2min"))
    try:
        assert (_session_setting(store, "lock_timeout"), _session_setting(store, "statement_timeout")) == ("250ms", "2min")
    finally:
        store.dispose()


@pytest.mark.parametrize("option", ["lock_timeout", "statement_timeout"])
def test_a_held_row_lock_fails_the_append_retryably_until_released(pg_url, option):
    # The other timeout off, so that the one under test is what ends the wait.
    other = {"lock_timeout": "statement_timeout", "statement_timeout": "lock_timeout"}[option]
    store = open_consensus(_with_options(pg_url, **{option: "300ms", other: "0"}))
    holder = sa.create_engine(normalize_url(pg_url), poolclass=sa.pool.NullPool)
    try:
        store.create_shard("s", "{}")
        with holder.connect() as conn:
            with conn.begin():
                conn.exec_driver_sql("SELECT upper FROM upsert_shards WHERE shard_id = 's' FOR UPDATE").all()
                with pytest.raises(ConsensusUnavailable) as info:
                    store.compare_and_append("s", 0, 1, batch(0, "a"))
                # Reads of the row take no lock: they pass while it is held.
                assert store.get_shard("s").upper == 0
        error = info.value
        assert error.retryable and error.exit_code == 2
        assert f"the consensus URL option {option} bounds this wait" in error.message
        assert store.get_batch("s", 0) is None
        result = store.compare_and_append("s", 0, 1, batch(0, "a"))
        assert result.outcome is AppendOutcome.COMMITTED and store.get_shard("s").upper == 1
    finally:
        holder.dispose()
        store.dispose()


@pytest.mark.parametrize("value", ["abc", "-5s", "10h", "1.5s", "99999999s"])
def test_invalid_postgres_timeout_is_refused_naming_the_option(value):
    url = _with_options("postgresql://u:hunter2@127.0.0.1:1/db", lock_timeout=value)
    with pytest.raises(ConfigurationError) as info:
        open_consensus(url)
    assert info.value.details["field"] == "lock_timeout" and info.value.exit_code == 2
    assert "consensus URL option lock_timeout takes one duration" in info.value.message
    assert "hunter2" not in info.value.message


def test_postgres_timeouts_keep_the_urls_own_libpq_options():
    from airflow_upsert_provider.engine.store.consensus import postgres_session_options

    query = make_url("postgresql://h/db?statement_timeout=5s&options=-c%20search_path%3Dx").query
    assert postgres_session_options(query) == "-c lock_timeout=10000 -c statement_timeout=5000 -c search_path=x"


# -- SQLite: reads never take the write lock ---------------------------------------------------


@pytest.mark.parametrize("value", ["soon", "-1", "nan", "inf"])
def test_invalid_sqlite_timeout_is_refused_naming_the_option(tmp_path, value):
    with pytest.raises(ConfigurationError, match="consensus URL option timeout takes one number") as info:
        open_consensus(f"sqlite:///{tmp_path / 'c.db'}?timeout={value}")
    assert info.value.details["field"] == "timeout"


def test_sqlite_reads_pass_while_another_connection_holds_the_write_lock(tmp_path, blob):
    path = tmp_path / "c.db"
    # The URL's timeout bounds the wait for the write lock (by default 60 s).
    store = open_consensus(f"sqlite:///{path}?timeout=0.3")
    shard = make_shard(store, blob, tmp_path)
    store.compare_and_append("orders", 0, 1, batch(0, "a"))
    holder = sqlite3.connect(str(path), isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        assert store.get_shard("orders").upper == 1
        assert [r.shard_id for r in store.list_shards()] == ["orders"]
        assert [b.token for b in store.live_view("orders").batches] == ["a"]
        assert store.snapshot("orders").record.upper == 1
        assert read_stream(store, "orders").status.value == "READY"
        assert Shard.open(store, blob, "orders").status(None).upper == 1
        with pytest.raises(ConsensusUnavailable, match="database is locked") as info:
            store.compare_and_append("orders", 1, 2, batch(1, "b"))
        assert info.value.retryable and info.value.exit_code == 2
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert store.compare_and_append("orders", 1, 2, batch(1, "b")).outcome is AppendOutcome.COMMITTED
    assert shard.state().upper == 2
    store.dispose()
