"""Every compare-and-append outcome, bindings and store failures, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa

from airflow_upsert_provider.engine.store.records import AppendOutcome, Binding
from airflow_upsert_provider.engine.store.tables import shards_table
from airflow_upsert_provider.engine.store.urls import redact_url
from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.engine.errors import (
    ConfigurationError,
    ConsensusUnavailable,
    IntegrityError,
    ShardExists,
    ShardNotFound,
)
from tests.helpers import batch


@pytest.fixture
def store(consensus):
    consensus.create_shard("s", "{}")
    return consensus


def test_committed_advances_upper_and_seqno(store):
    result = store.compare_and_append("s", 0, 1, batch(0, "a"))
    assert result.outcome is AppendOutcome.COMMITTED and result.upper == 1
    record = store.get_shard("s")
    assert (record.upper, record.seqno, record.since) == (1, 1, 0)
    assert store.get_batch("s", 0).token == "a"


def test_retry_with_own_token_reports_already_committed(store):
    store.compare_and_append("s", 0, 1, batch(0, "a"))
    result = store.compare_and_append("s", 0, 1, batch(0, "a"))
    assert result.outcome is AppendOutcome.ALREADY_COMMITTED
    assert result.upper == 1
    assert store.get_shard("s").seqno == 1  # nothing written twice


def test_peer_token_reports_upper_moved_with_authoritative_upper(store):
    store.compare_and_append("s", 0, 1, batch(0, "peer", "peer-writer"))
    store.compare_and_append("s", 1, 2, batch(1, "peer2", "peer-writer"))
    result = store.compare_and_append("s", 0, 1, batch(0, "mine", "me"))
    assert result.outcome is AppendOutcome.UPPER_MOVED
    assert result.upper == 2  # read from the store, not the caller's expectation
    assert (result.winner_writer_id, result.winner_token) == ("peer-writer", "peer")
    assert store.get_batch("s", 0).token == "peer"


def test_append_ahead_of_upper_is_refused_as_upper_behind(store):
    result = store.compare_and_append("s", 3, 4, batch(3))
    assert result.outcome is AppendOutcome.UPPER_BEHIND and result.upper == 0
    assert store.get_shard("s").upper == 0
    assert store.batches("s") == []


def test_append_must_cover_exactly_one_ts(store):
    with pytest.raises(IntegrityError):
        store.compare_and_append("s", 0, 2, batch(0))


def test_concurrent_appends_of_one_ts_commit_exactly_once(consensus_url):
    # Separate engines, as separate writer processes would have.
    setup = open_consensus(consensus_url)
    setup.create_shard("s", "{}")
    outcomes = []
    barrier = threading.Barrier(8)

    def attempt(n: int) -> None:
        store = open_consensus(consensus_url)
        barrier.wait()
        outcomes.append(store.compare_and_append("s", 0, 1, batch(0, f"tok{n}", f"w{n}")).outcome)
        store.dispose()

    threads = [threading.Thread(target=attempt, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(o.value for o in outcomes) == ["committed"] + ["upper_moved"] * 7
    assert setup.get_shard("s").upper == 1
    assert len(setup.batches("s")) == 1


def test_a_transaction_returns_what_its_function_returns_and_rolls_back_what_it_raises(store):
    def upper(conn):
        return conn.execute(sa.select(shards_table.c.upper).where(shards_table.c.shard_id == "s")).scalar_one()

    def move_then_refuse(conn):
        conn.execute(sa.update(shards_table).where(shards_table.c.shard_id == "s").values(upper=7))
        assert upper(conn) == 7
        raise ShardExists("refused after writing", shard="s")

    # The function's own error comes out unchanged, and nothing it wrote stays.
    with pytest.raises(ShardExists, match="refused after writing"):
        store.run_in_transaction(move_then_refuse)
    assert store.read_in_snapshot(upper) == 0
    assert store.run_in_transaction(lambda conn: conn.execute(
        sa.update(shards_table).where(shards_table.c.shard_id == "s").values(upper=3)
    ).rowcount) == 1
    assert (store.read_in_snapshot(upper), store.get_shard("s").upper) == (3, 3)
    assert not store.in_transaction()


def test_binding_is_minted_once_and_first_wins(store):
    first = store.mint_binding("s", Binding(0, {"p0": {"from": 0, "to": 5, "files": [0], "count": 1}}), "w1")
    second = store.mint_binding("s", Binding(0, {"p0": {"from": 0, "to": 9, "files": [0, 5], "count": 2}}), "w2")
    assert first == second
    assert second.ranges["p0"]["to"] == 5 and second.minted_by == "w1"


def test_binding_must_be_contiguous(store):
    store.mint_binding("s", Binding(0, {"p0": {"from": 0, "to": 5, "files": [0], "count": 1}}), "w")
    with pytest.raises(IntegrityError, match="not contiguous"):
        store.mint_binding("s", Binding(1, {"p0": {"from": 4, "to": 9, "files": [6], "count": 2}}), "w")
    with pytest.raises(IntegrityError, match="does not exist"):
        store.mint_binding("s", Binding(3, {"p0": {"from": 5, "to": 9, "files": [6], "count": 2}}), "w")
    ok = store.mint_binding("s", Binding(1, {"p0": {"from": 5, "to": 9, "files": [6], "count": 2}}), "w")
    assert ok.ranges["p0"]["from"] == 5


def test_losing_binding_does_not_record_its_quarantine(store):
    store.mint_binding("s", Binding(0, {"p0": {"from": 0, "to": 1, "files": [0], "count": 1}}), "w1")
    store.mint_binding(
        "s",
        Binding(0, {"p0": {"from": 0, "to": 1, "files": [], "count": 1}}, [{"file": "/x/0.jsonl", "reason": "r"}]),
        "w2",
    )
    assert store.quarantined_files("s") == {}


def test_shard_create_twice_and_unknown_shard(store):
    with pytest.raises(ShardExists):
        store.create_shard("s", "{}")
    with pytest.raises(ShardNotFound, match="unknown shard 'nope'"):
        store.get_shard("nope")


def test_unreachable_postgres_is_a_clear_error_without_the_password():
    # Nothing listens on port 1 of loopback.
    url = "postgresql://upsert:hunter2secret@127.0.0.1:1/db"
    with pytest.raises(ConsensusUnavailable) as info:
        open_consensus(url)
    assert "hunter2secret" not in str(info.value)
    assert "127.0.0.1:1" in str(info.value)
    assert "hunter2secret" not in redact_url(url)


def test_sqlite_in_memory_is_refused():
    with pytest.raises(ConfigurationError, match="must be a file"):
        open_consensus("sqlite://")


def test_sqlite_store_runs_in_wal_mode(sqlite_url):
    store = open_consensus(sqlite_url)
    with store.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"


def test_upper_never_decreases_under_mixed_outcomes(store):
    uppers = []
    for ts in range(5):
        store.compare_and_append("s", ts, ts + 1, batch(ts, f"t{ts}"))
        if ts:
            late = store.compare_and_append("s", ts - 1, ts, batch(ts - 1, "late"))
            assert late.outcome is AppendOutcome.UPPER_MOVED
        uppers.append(store.get_shard("s").upper)
    assert uppers == sorted(uppers) == [1, 2, 3, 4, 5]
    with store.engine.connect() as conn:
        count = conn.execute(sa.text("SELECT count(*) FROM upsert_batches WHERE shard_id='s'")).scalar()
    assert count == 5


# -- URL helpers (make_url, not string slicing) and store faults (issue 7 items 12, 18) -----------

@pytest.mark.parametrize("url, expected", [
    ("postgresql://u:p@h:5/db", "postgresql+psycopg://u:p@h:5/db"),
    ("postgres://u:p@h/db?sslmode=require", "postgresql+psycopg://u:p@h/db?sslmode=require"),
    ("postgresql+psycopg://u@h/db", "postgresql+psycopg://u@h/db"),
    ("sqlite:////tmp/c.db", "sqlite:////tmp/c.db"),
])
def test_normalize_url_picks_the_psycopg_driver(url, expected):
    from airflow_upsert_provider.engine.store.urls import normalize_url

    assert normalize_url(url) == expected


def test_with_password_sets_a_password_with_special_characters():
    from sqlalchemy.engine import make_url

    from airflow_upsert_provider.engine.store.urls import with_password

    url = with_password("postgres://u@h/db", "p@ss:w/rd%")
    assert make_url(url).password == "p@ss:w/rd%" and make_url(url).drivername == "postgresql+psycopg"
    assert with_password("sqlite:////tmp/c.db", None) == "sqlite:////tmp/c.db"


def test_unparseable_url_is_refused_without_echoing_it():
    from airflow_upsert_provider.engine.store.urls import normalize_url

    with pytest.raises(ConfigurationError) as info:
        normalize_url("not a url with hunter2")
    assert "hunter2" not in info.value.message


def test_driver_error_text_never_shows_the_password():
    from airflow_upsert_provider.engine.store.urls import _short

    error = sa.exc.OperationalError("SELECT 1", {}, Exception("auth failed for pw hunter2secret"))
    assert "hunter2secret" not in _short(error, "postgresql://u:hunter2secret@h/db")


def test_unreachable_store_is_retryable_and_not_a_configuration_error():
    with pytest.raises(ConsensusUnavailable) as info:
        open_consensus("postgresql://upsert:pw@127.0.0.1:1/db")
    assert info.value.retryable and info.value.exit_code == 2
    assert not isinstance(info.value, ConfigurationError)


def test_unknown_sqlite_url_option_is_refused_not_ignored(tmp_path):
    with pytest.raises(ConfigurationError, match="unknown SQLite consensus URL option.s. foo"):
        open_consensus(f"sqlite:///{tmp_path / 'c.db'}?foo=bar")
    open_consensus(f"sqlite:///{tmp_path / 'c.db'}?timeout=30").dispose()
