"""The consensus store under load: session timeouts on PostgreSQL, reads beside SQLite's
writer."""

from __future__ import annotations

import sqlite3
import traceback

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from airflow_upsert_provider.engine.errors import ConfigurationError, ConsensusUnavailable
from airflow_upsert_provider.engine.store.records import AppendOutcome
from airflow_upsert_provider.engine.store.urls import normalize_url
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
    from airflow_upsert_provider.engine.store.urls import postgres_session_options

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
        # Opening the store reads its schema version: also beside the writer.
        open_consensus(f"sqlite:///{path}?timeout=0.3").dispose()
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


# -- no blob I/O inside a consensus transaction ------------------------------------------------

# Every Blob method that reaches the store (the path helpers only compute names).
BLOB_IO = ("ensure_root", "check_root", "write_file", "rename", "fsync_dir", "sync_file", "mkdir", "unlink", "rmdir",
           "make_dirs", "write_atomic", "sync_written", "read_bytes", "checksum", "exists", "is_dir", "listdir",
           "walk_files", "walk_dirs", "mtime", "size", "delete_tree", "delete_file")


def guard_blob(blob, consensus, *, allow=lambda stack: False) -> list[tuple[str, str]]:
    """Make every I/O call of ``blob`` note itself (method, first argument) when this thread
    has a transaction of ``consensus`` open, unless ``allow(stack)`` says the caller is a
    known holder; the list of such calls."""
    inside: list[tuple[str, str]] = []
    for name in BLOB_IO:
        method = getattr(blob, name)

        def guarded(*args, _method=method, _name=name, **kwargs):
            if consensus.in_transaction() and not allow(traceback.extract_stack()):
                inside.append((_name, str(args[0]) if args else ""))
            return _method(*args, **kwargs)

        setattr(blob, name, guarded)
    return inside


def test_the_guard_sees_a_transaction_of_its_store_on_its_thread_only(sqlite_url, blob):
    store = open_consensus(sqlite_url)
    inside = guard_blob(blob, store)
    store.run_in_transaction(lambda conn: blob.exists(blob.path("x")))
    blob.exists(blob.path("y"))
    store.read_in_snapshot(lambda conn: blob.exists(blob.path("read")))
    import threading

    # A thread without a transaction, while this one has one open.
    other = threading.Thread(target=lambda: blob.exists(blob.path("z")))
    store.run_in_transaction(lambda conn: (other.start(), other.join()))
    store.dispose()
    assert inside == [("exists", blob.path("x")), ("exists", blob.path("read"))]


def test_gc_claims_only_checkpoint_directories_the_stores_catalog_does_not_list(consensus, blob):
    from airflow_upsert_provider.engine.store.catalog_rows import write_catalog_in
    from airflow_upsert_provider.engine.store.gc_claims import claim_for_deletion, claims

    consensus.create_shard("orders", "{}")
    listed = {"id": "listed", "upper": 1, "since": 0, "created_at": 1.0, "files": 1, "bytes": 1, "manifest_sha256": "0" * 64}
    # Listed by a catalog change that committed before the claim (read under the catalog lock).
    consensus.run_in_transaction(lambda conn: write_catalog_in(conn, "orders", None, [listed], 1))
    runs, checkpoints = claim_for_deletion(
        consensus, "orders", [], 0, checkpoint_candidates=["orders/checkpoints/listed", "orders/checkpoints/old"],
    )
    assert (runs, checkpoints) == ([], ["orders/checkpoints/old"])
    # The other's claim refuses a late listing.
    assert claims(consensus, "orders") == ["orders/checkpoints/old"]


def test_no_blob_io_inside_a_consensus_transaction(spark, consensus, blob, tmp_path):
    """A batch, a compaction, a checkpoint create and GC on a blob that notes every call made
    while a consensus transaction is open on the caller's thread."""
    from airflow_upsert_provider.engine.maintenance.checkpoint import create_checkpoint
    from airflow_upsert_provider.engine.maintenance.compaction import compact
    from airflow_upsert_provider.engine.maintenance.gc import collect_garbage
    from airflow_upsert_provider.engine.write.writer import Writer
    from tests.helpers import table
    from tests.maintenance.support import SPEC, age_compaction, age_files, oracle

    shard = make_shard(consensus, blob, tmp_path, spec=SPEC, max_files_per_batch=2)
    inside = guard_blob(blob, consensus)
    Writer(shard, "w", spark_factory=lambda: spark).run(max_batches=3, with_lag=False)
    compact(spark, shard)
    create_checkpoint(shard, keep_last=1)
    Writer(shard, "w", spark_factory=lambda: spark).run(max_batches=1, with_lag=False)
    create_checkpoint(shard, keep_last=1)  # retention drops the first
    # A create that crashed before its catalog entry: GC claims its directory, then deletes it.
    abandoned = blob.path(shard.shard_id, "checkpoints", "abandoned")
    blob.write_atomic(blob.join(abandoned, "MANIFEST.json"), b"{}")
    age_files(blob.root)
    age_compaction(consensus, shard.shard_id)
    report = collect_garbage(consensus, blob, shard.shard_id, grace_seconds=0)
    assert {i.kind for i in report.items} >= {"run", "abandoned_checkpoint"}
    assert not blob.exists(abandoned)
    assert inside == []
    assert table(shard) == oracle(shard)


def test_a_schema_upgrade_is_not_cut_off_by_the_sessions_statement_timeout(pg_url):
    from airflow_upsert_provider.engine.store.migrations import _schema_lock

    store = open_consensus(_with_options(pg_url, statement_timeout="5s"))
    try:
        with _schema_lock(store) as conn:
            assert conn.exec_driver_sql("SHOW statement_timeout").scalar() == "0"
            assert conn.exec_driver_sql("SHOW lock_timeout").scalar() == "10s"
        assert _session_setting(store, "statement_timeout") == "5s"  # SET LOCAL: that transaction only
    finally:
        store.dispose()


def test_an_exhausted_pool_is_a_retryable_store_error(pg_url, monkeypatch):
    store = open_consensus(pg_url)
    store.create_shard("s", "{}")
    monkeypatch.setattr(store.engine.pool, "_timeout", 0.2)  # instead of 30 s
    held = [store.engine.connect() for _ in range(4)]  # pool_size 2 + max_overflow 2
    try:
        for call in (lambda: store.get_shard("s"), lambda: store.create_shard("t", "{}")):
            with pytest.raises(ConsensusUnavailable, match="gave no connection in time") as info:
                call()
            assert info.value.retryable and info.value.exit_code == 2
    finally:
        for conn in held:
            conn.close()
    assert store.get_shard("s").upper == 0
    store.dispose()
