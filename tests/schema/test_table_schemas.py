"""Schema versions of a shard (engine/store/table_schemas.py, engine/table/schema_changes.py):
version 1 is the schema of ``init``, later versions are minted by compare-and-set, every run
records its version, and reads of runs of several versions fill what an older run lacks with
nulls. No Spark is started in this module (runs are written with pyarrow, the Arrow reader
reads them; the Spark read and compaction are in test_schema_spark.py)."""

from __future__ import annotations

import json
import random

import pytest

from airflow_upsert_provider.engine.errors import IntegrityError, SchemaVersionConflict, ShardNotFound
from airflow_upsert_provider.engine.store.records import BatchRecord
from airflow_upsert_provider.engine.store.table_schemas import (
    mint_schema_version,
    newest_run_version,
    run_schema_version,
    schema_history,
)
from airflow_upsert_provider.engine.table.arrow_reader import read_table
from airflow_upsert_provider.engine.table.schema_changes import add_column
from airflow_upsert_provider.engine.table.shard import Shard
from tests.arrow_runs import arrow_table, write_run
from tests.conftest import sqlite_only
from tests.helpers import make_shard

DISCOUNT = {"name": "discount", "type": "double", "nullable": True, "metadata": {}}


def commit_rows(shard: Shard, rows: list[dict], *, record_version: bool = True) -> int:
    """Commit ``rows`` (table columns and ``_deleted``) as the batch at the upper, written with
    the handle's schema; the run records its version unless ``record_version`` is false (a run
    written before versions)."""
    ts = shard.state().upper
    run = write_run(shard, f"ts={ts:012d}", [{**r, "_ts": ts} for r in rows])
    if record_version:
        run["schema_version"] = shard.config.schema_version
    result = shard.compare_and_append(ts, ts + 1, BatchRecord(ts=ts, writer_id="w", token=f"t{ts}", run=run, stats={}))
    assert result.upper == ts + 1, result
    return ts


def row(key: int, **values) -> dict:
    return {"id": key, "name": f"n{key}", "amount": float(key), "updated_at": 1, "_deleted": False, **values}


def test_an_existing_shard_is_at_version_1_and_an_added_column_is_version_2(consensus, blob, tmp_path):
    shard = make_shard(consensus, blob, tmp_path)
    init_schema = shard.config.schema
    assert [v.version for v in schema_history(consensus, "orders", init_schema)] == [1]
    assert Shard.open(consensus, blob, "orders").config.schema_version == 1

    version, added = add_column(shard, DISCOUNT, "tester")
    assert (version.version, added) == (2, True)
    assert version.change == {"add": [{"name": "discount", "type": "double"}]}

    reopened = Shard.open(consensus, blob, "orders")
    assert reopened.config.schema_version == 2
    assert reopened.config.column_names() == [*(f["name"] for f in json.loads(init_schema)["fields"]), "discount"]
    # The config in the shard's row is untouched: version 1 stays what it was.
    assert json.loads(consensus.get_shard("orders").config)["schema"] == init_schema
    history = schema_history(consensus, "orders", init_schema)
    assert [(v.version, v.created_by) for v in history] == [(1, None), (2, "tester")]
    # The same column again is no change.
    again, added = add_column(reopened, DISCOUNT, "tester")
    assert (again.version, added) == (2, False)
    assert len(schema_history(consensus, "orders", init_schema)) == 2


def test_racing_changes_planned_on_one_version_mint_one_version_or_lose_with_nothing_changed(consensus, blob, tmp_path):
    shard = make_shard(consensus, blob, tmp_path)
    init_schema = shard.config.schema
    with_discount = json.dumps({**json.loads(init_schema), "fields": [*json.loads(init_schema)["fields"], DISCOUNT]})
    other = {**DISCOUNT, "name": "tax"}
    with_tax = json.dumps({**json.loads(init_schema), "fields": [*json.loads(init_schema)["fields"], other]})
    # Two writers planned the same change on version 1; both commit it: one version, the same.
    first = mint_schema_version(consensus, "orders", 1, with_discount, {"add": ["discount"]}, "writer-a")
    second = mint_schema_version(consensus, "orders", 1, with_discount, {"add": ["discount"]}, "writer-b")
    assert (first.version, second.version) == (2, 2)
    assert second.created_by == "writer-a"
    # A third planned another change on version 1: refused, nothing recorded.
    with pytest.raises(SchemaVersionConflict) as refused:
        mint_schema_version(consensus, "orders", 1, with_tax, {"add": ["tax"]}, "writer-c")
    assert refused.value.details["schema_version"] == 2 and refused.value.details["expected_version"] == 1
    assert refused.value.retryable and refused.value.exit_code == 2
    assert [v.version for v in schema_history(consensus, "orders", init_schema)] == [1, 2]
    with pytest.raises(ShardNotFound):
        mint_schema_version(consensus, "no-such-shard", 1, with_tax, {}, "w")


def test_run_versions_default_to_1():
    assert run_schema_version({"path": "p", "files": []}) == 1
    assert run_schema_version({"path": "p", "files": [], "schema_version": 3}) == 3
    assert newest_run_version([]) == 1
    assert newest_run_version([{"files": []}, {"files": [], "schema_version": 4}, {"files": [], "schema_version": 2}]) == 4


@sqlite_only
def test_runs_of_several_versions_read_with_the_newest_schema_and_nulls_for_what_older_runs_lack(
    consensus, blob, tmp_path
):
    rng = random.Random(7)
    shard = make_shard(consensus, blob, tmp_path)
    # Written before versions existed: the run records none.
    commit_rows(shard, [row(k) for k in range(0, 40)], record_version=False)
    stale = Shard.open(consensus, blob, "orders")  # a handle opened before the change
    add_column(shard, DISCOUNT, "tester")
    shard = Shard.open(consensus, blob, "orders")
    discounts = {k: rng.choice([None, float(rng.randrange(100))]) for k in range(20, 60)}
    commit_rows(shard, [row(k, discount=discounts[k]) for k in range(20, 60)])
    assert [run_schema_version(b.run) for b in shard.batches()] == [1, 2]

    for handle in (shard, stale):
        reader = read_table(handle)
        assert reader.schema.names == ["id", "name", "amount", "updated_at", "discount"]
        table = arrow_table(reader)
        assert sorted(table) == [(k,) for k in range(60)]
        assert {k: table[(k,)]["discount"] for k in range(60)} == {k: discounts.get(k) for k in range(60)}
    # As of the first batch: its rows, in the newest schema.
    old = arrow_table(read_table(shard, as_of=1))
    assert sorted(old) == [(k,) for k in range(40)] and {r["discount"] for r in old.values()} == {None}


@sqlite_only
def test_a_run_naming_a_version_the_store_does_not_hold_is_an_integrity_error(consensus, blob, tmp_path):
    shard = make_shard(consensus, blob, tmp_path)
    ts = shard.state().upper
    run = {**write_run(shard, f"ts={ts:012d}", [{**row(1), "_ts": ts}]), "schema_version": 5}
    shard.compare_and_append(ts, ts + 1, BatchRecord(ts=ts, writer_id="w", token="t", run=run, stats={}))
    with pytest.raises(IntegrityError) as failed:
        read_table(shard)
    assert failed.value.details == {"shard": "orders", "schema_version": 5}
    assert "has no schema version 5" in failed.value.message


def test_a_store_at_revision_0005_upgrades_without_touching_a_run_and_its_shards_are_at_version_1(
    consensus_url, blob, tmp_path
):
    from airflow_upsert_provider.engine.errors import SchemaVersionMismatch
    from airflow_upsert_provider.engine.store.migrations import REVISIONS, VERSION_TABLE, upgrade
    from airflow_upsert_provider.engine.store.registry import open_consensus

    store = open_consensus(consensus_url)
    shard = make_shard(store, blob, tmp_path)
    commit_rows(shard, [row(k) for k in range(10)], record_version=False)
    runs_before = [b.run for b in shard.batches()]
    # Back to the store as revision 0005 left it: no table of schema versions.
    with store.engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE upsert_table_schemas")
        conn.exec_driver_sql(f"UPDATE {VERSION_TABLE} SET version_num = '0005'")
    store.dispose()
    with pytest.raises(SchemaVersionMismatch):
        open_consensus(consensus_url)
    store = open_consensus(consensus_url, check_schema=False)
    assert upgrade(store).to_revision == REVISIONS[-1]
    store.dispose()

    store = open_consensus(consensus_url)
    try:
        shard = Shard.open(store, blob, "orders")
        assert shard.config.schema_version == 1
        assert [b.run for b in shard.batches()] == runs_before
        assert sorted(arrow_table(read_table(shard))) == [(k,) for k in range(10)]
        assert add_column(shard, DISCOUNT, "tester")[0].version == 2
    finally:
        store.dispose()


@sqlite_only
def test_status_shows_the_schema_version_now(consensus, consensus_url, blob, tmp_path, capsys):
    from tests.helpers import Upsertctl

    shard = make_shard(consensus, blob, tmp_path)
    upsertctl = Upsertctl(capsys, consensus_url, blob.root)
    assert json.loads(upsertctl.ok("status", "orders", "--no-rows", "--json"))["schema_version"] == 1
    add_column(Shard.open(consensus, blob, "orders"), DISCOUNT, "ops")
    # A handle opened before the change reports the version now.
    assert shard.status().to_dict()["schema_version"] == 2
    assert json.loads(upsertctl.ok("status", "orders", "--no-rows", "--json"))["schema_version"] == 2
    assert "schema_version: 2" in upsertctl.ok("status", "orders", "--no-rows")


@sqlite_only
def test_a_checkpoint_carries_the_schema_versions_and_one_from_before_a_change_restores_to_version_1(
    consensus, blob, tmp_path
):
    from airflow_upsert_provider.engine.maintenance.checkpoint import create_checkpoint
    from airflow_upsert_provider.engine.maintenance.checkpoint_restore import restore_checkpoint

    shard = make_shard(consensus, blob, tmp_path)
    commit_rows(shard, [row(k) for k in range(10)], record_version=False)
    before = create_checkpoint(shard)
    add_column(shard, DISCOUNT, "ops")
    shard = Shard.open(consensus, blob, "orders")
    commit_rows(shard, [row(k, discount=float(k)) for k in range(5, 15)])
    after = create_checkpoint(shard)

    restore_checkpoint(consensus, blob, "orders", before.id, target_shard_id="orders-before")
    then = Shard.open(consensus, blob, "orders-before")
    assert then.config.schema_version == 1
    table = arrow_table(read_table(then))
    assert sorted(table) == [(k,) for k in range(10)] and "discount" not in next(iter(table.values()))

    restore_checkpoint(consensus, blob, "orders", after.id, target_shard_id="orders-after")
    now = Shard.open(consensus, blob, "orders-after")
    assert now.config.schema_version == 2
    assert [(v.version, v.created_by) for v in schema_history(consensus, "orders-after", now.config.schema)][1:] == \
        [(2, "ops")]
    table = arrow_table(read_table(now))
    assert {k: table[(k,)]["discount"] for k in range(15)} == {k: (float(k) if k >= 5 else None) for k in range(15)}
