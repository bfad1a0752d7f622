"""Determinate vs indeterminate failures (issue 7 item 5), on SQLite and PostgreSQL.

A store that drops while an append commits, or while the writer reads its outcome back, may
have taken the commit: that is exit 5 (outcome unknown, retryable), never exit 2 ("nothing
was changed"); the same token then reports ``already_committed``.
"""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa
from sqlalchemy import event

from airflow_upsert_provider import cli
from airflow_upsert_provider.engine.store import consensus as consensus_module
from airflow_upsert_provider.engine.store import records as records_module
from airflow_upsert_provider.engine.store import registry as registry_module
from airflow_upsert_provider.engine.write import writer as writer_module
from airflow_upsert_provider.engine.errors import (
    BadInputError,
    CommitOutcomeUnknown,
    ConfigurationError,
    ConsensusOutcomeUnknown,
    ConsensusUnavailable,
    IntegrityError,
    UpsertError,
)
from airflow_upsert_provider.engine.write.writer import Writer
from airflow_upsert_provider.sample_data import SampleSpec, generate
from tests.faults import StoreOutage
from tests.helpers import make_shard

SMALL = SampleSpec(records=300, keys=60, partitions=1, segments_per_partition=2, seed=5)


def test_retryable_only_where_a_retry_is_safe_and_may_help():
    assert CommitOutcomeUnknown("x").retryable and CommitOutcomeUnknown("x").exit_code == 5
    assert ConsensusOutcomeUnknown("x").retryable and ConsensusOutcomeUnknown("x").exit_code == 5
    assert ConsensusUnavailable("x").retryable and ConsensusUnavailable("x").exit_code == 2
    for cls in (ConfigurationError, BadInputError, IntegrityError, UpsertError):
        assert not cls("x").retryable
    # An unreachable store is not a configuration mistake.
    assert not issubclass(ConsensusUnavailable, ConfigurationError)
    assert CommitOutcomeUnknown("x").to_dict()["retryable"] is True


def test_store_lost_while_resolving_an_append_is_unknown_then_already_committed(
    spark, consensus, blob, tmp_path, monkeypatch
):
    monkeypatch.setattr(writer_module, "APPEND_RETRY_DELAY_SECONDS", 0)
    shard = make_shard(consensus, blob, tmp_path, spec=SMALL)
    shard.mint_binding(0, minted_by="w")
    writer = Writer(shard, "w", spark_factory=lambda: spark)
    staged = writer.stage(0)
    outage = StoreOutage(consensus)
    # The commit lands, the connection drops; every later attempt finds the upper moved and
    # loses the store while reading back whose batch holds ts 0.
    outage.drop_after_next_append(then_fail_reads=writer_module.APPEND_RETRIES)
    with pytest.raises(CommitOutcomeUnknown) as info:
        writer.append(staged)
    assert info.value.exit_code == 5 and info.value.retryable
    assert outage.failed_reads == writer_module.APPEND_RETRIES
    outage.end()
    assert writer.append(staged) == "already_committed"
    committed = consensus.get_batch(shard.shard_id, 0)
    assert committed.token == staged.token and shard.state().upper == 1


def test_store_back_during_the_retries_reports_already_committed(spark, consensus, blob, tmp_path, monkeypatch):
    monkeypatch.setattr(writer_module, "APPEND_RETRY_DELAY_SECONDS", 0)
    shard = make_shard(consensus, blob, tmp_path, spec=SMALL)
    writer = Writer(shard, "w", spark_factory=lambda: spark)
    # One failed read-back, then the store is back.
    outage = StoreOutage(consensus).drop_after_next_append(then_fail_reads=1)
    result = writer.step()
    assert outage.failed_reads == 1
    assert result.outcome == "already_committed" and result.upper == 1


def test_commit_failure_of_a_write_transaction_is_unknown_not_unavailable(consensus):
    consensus.create_shard("s", "{}")

    def fail_commit(conn):
        lost = consensus.engine.dialect.loaded_dbapi.OperationalError("server closed the connection")
        raise sa.exc.OperationalError("COMMIT", {}, lost)

    event.listen(consensus.engine, "commit", fail_commit)
    try:
        with pytest.raises(ConsensusOutcomeUnknown) as info:
            consensus.mint_binding("s", _binding(0), minted_by="w")
        assert info.value.exit_code == 5
        # A read-only transaction whose commit fails changed nothing: determinate.
        with pytest.raises(ConsensusUnavailable) as read_info:
            consensus.get_shard("s")
        assert not isinstance(read_info.value, ConsensusOutcomeUnknown) and read_info.value.exit_code == 2
    finally:
        event.remove(consensus.engine, "commit", fail_commit)


def _binding(ts):
    return records_module.Binding(ts=ts, ranges={"p0": {"from": 0, "to": 1, "files": [[0, "0.jsonl"]], "count": 1}})


def test_cli_exits_5_when_the_store_drops_while_an_append_is_resolved(
    spark, consensus_url, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(writer_module, "APPEND_RETRY_DELAY_SECONDS", 0)
    landing = tmp_path / "landing"
    generate(str(landing), SMALL)
    monkeypatch.setenv("UPSERT_CONSENSUS_URL", consensus_url)
    monkeypatch.setenv("UPSERT_BLOB_ROOT", str(tmp_path / "blob"))
    assert cli.main(["init", "s", "--source", f"dir:{landing}", "--key", "id", "--max-files-per-batch", "1",
                     "--schema", "id BIGINT, name STRING, amount DOUBLE, updated_at BIGINT, deleted BOOLEAN"]) == 0
    real_open = registry_module.open_consensus
    outages = []

    def open_with_outage(url, **kwargs):
        store = real_open(url, **kwargs)
        outages.append(StoreOutage(store).drop_after_next_append(then_fail_reads=writer_module.APPEND_RETRIES))
        return store

    monkeypatch.setattr(registry_module, "open_consensus", open_with_outage)
    capsys.readouterr()
    code = cli.main(["run-batch", "s", "--json", "--writer-id", "w1"])
    out, err = capsys.readouterr()
    assert code == 5, err
    error = json.loads(out)
    assert error["error"] == "CommitOutcomeUnknown" and error["retryable"] is True and error["ts"] == 0
    assert "unknown outcome" in err and "a retry is safe" in err
    monkeypatch.undo()
    # The commit did land; a rerun goes on from there.
    store = real_open(consensus_url)
    assert store.get_batch("s", 0).writer_id == "w1" and store.get_shard("s").upper == 1
    monkeypatch.setenv("UPSERT_CONSENSUS_URL", consensus_url)
    monkeypatch.setenv("UPSERT_BLOB_ROOT", str(tmp_path / "blob"))
    assert cli.main(["run-batch", "s", "--until-caught-up", "--json"]) == 0
    assert store.get_shard("s").upper == 2
    store.dispose()


# -- compare_and_append splits its failures at the store -------------------------------------------


def _record(ts: int, token: str = "tok") -> records_module.BatchRecord:
    return records_module.BatchRecord(ts, "w", token, {"path": "s/runs/ts=0/w", "files": [], "rows": 0}, {})


def test_compare_and_append_splits_determinate_from_indeterminate_failures(consensus):
    consensus.create_shard("s", "{}")

    def fail_update(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("UPDATE"):
            raise consensus.engine.dialect.loaded_dbapi.OperationalError("server closed the connection")

    event.listen(consensus.engine, "before_cursor_execute", fail_update)
    try:
        with pytest.raises(ConsensusUnavailable) as before:
            consensus.compare_and_append("s", 0, 1, _record(0))
    finally:
        event.remove(consensus.engine, "before_cursor_execute", fail_update)
    # A statement failed before the commit: nothing changed, and the store says so.
    assert not isinstance(before.value, ConsensusOutcomeUnknown) and before.value.exit_code == 2
    assert "server closed the connection" in before.value.message  # the driver's first line, masked
    assert consensus.get_shard("s").upper == 0

    def fail_commit(conn):
        raise sa.exc.OperationalError("COMMIT", {}, consensus.engine.dialect.loaded_dbapi.OperationalError("lost"))

    event.listen(consensus.engine, "commit", fail_commit)
    try:
        with pytest.raises(ConsensusOutcomeUnknown) as during:
            consensus.compare_and_append("s", 0, 1, _record(0))
    finally:
        event.remove(consensus.engine, "commit", fail_commit)
    assert during.value.exit_code == 5 and during.value.details["ts"] == 0


def test_compare_and_append_maps_an_exhausted_pool_to_unavailable(sqlite_url):
    engine = sa.create_engine(sqlite_url, poolclass=sa.pool.QueuePool, pool_size=1, max_overflow=0, pool_timeout=0.01)
    store = consensus_module.Consensus(engine, sqlite_url, registry_module.STORE_SCHEMA)
    store.create_schema()
    store.create_shard("s", "{}")
    with engine.connect():  # the pool's only connection, held
        with pytest.raises(ConsensusUnavailable) as info:
            store.compare_and_append("s", 0, 1, _record(0))
    assert not isinstance(info.value, ConsensusOutcomeUnknown)
    assert "nothing was committed" in info.value.message and isinstance(info.value.__cause__, sa.exc.TimeoutError)
    assert store.get_shard("s").upper == 0
    engine.dispose()


def test_a_catalog_change_whose_lock_release_failed_is_outcome_unknown(sqlite_url):
    from airflow_upsert_provider.engine.store.catalog_lock import catalog_lock

    store = registry_module.open_consensus(sqlite_url)
    changed = []

    def fail_commit(conn):
        raise sa.exc.OperationalError("COMMIT", {}, store.engine.dialect.loaded_dbapi.OperationalError("disk I/O error"))

    event.listen(store.engine, "commit", fail_commit)
    try:
        with pytest.raises(ConsensusOutcomeUnknown) as info:
            with catalog_lock(store, "s"):
                changed.append("catalog rows rewritten")  # the body's change is already made
    finally:
        event.remove(store.engine, "commit", fail_commit)
        store.dispose()
    assert changed and info.value.exit_code == 5 and "may or may not" in info.value.message
