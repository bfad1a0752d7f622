"""Schema evolution applied by a batch, without Spark: the shard's policy (stored, set at init and
by `schema policy`, shown by `schema` and `status`), ``evolve_batch`` minting one version for
writers racing through one batch (SQLite and PostgreSQL), refusals minting nothing, and the
observations a directory batch makes (Parquet footers, overflowing JSON numbers)."""

from __future__ import annotations

import json
import random
import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import sqlalchemy as sa

from airflow_upsert_provider.engine.errors import BatchSchemaRefused, SchemaVersionConflict
from airflow_upsert_provider.engine.sources import Segment
from airflow_upsert_provider.engine.store.schema_policies import schema_policies_table
from airflow_upsert_provider.engine.store.table_schemas import schema_history
from airflow_upsert_provider.engine.table import schema_apply
from airflow_upsert_provider.engine.table.schema_apply import DEFAULT_POLICY, evolve_batch, schema_policy, set_schema_policy
from airflow_upsert_provider.engine.table.schema_evolution import ADD_AND_WIDEN, ADD_COLUMNS, NONE, POLICIES, ObservedField
from airflow_upsert_provider.engine.table.shard import Shard
from airflow_upsert_provider.engine.write.records import (
    FLOAT_MAX,
    observed_parquet_fields,
    value_overflows,
    widenable_columns,
)
from tests.conftest import sqlite_only
from tests.helpers import Upsertctl, make_shard, sample_config

EMAIL = ObservedField("email", "string", "/landing/p0/1.jsonl")


# -- the policy --------------------------------------------------------------------------------


@sqlite_only
def test_the_policy_is_set_at_init_changed_later_and_shown_an_invalid_one_exits_2_naming_the_choices(
    consensus, consensus_url, blob, tmp_path, capsys
):
    upsertctl = Upsertctl(capsys, consensus_url, blob.root)
    (tmp_path / "landing").mkdir()
    init = ("init", "--source", f"dir:{tmp_path / 'landing'}", "--key", "id", "--schema", "id BIGINT, v INT")

    with pytest.raises(SystemExit) as exited:  # argparse's usage error
        upsertctl(*init[:1], "strict", *init[1:], "--schema-evolution", "strict")
    assert exited.value.code == 2
    assert "invalid choice: 'strict' (choose from 'none', 'add_columns', 'add_and_widen')" in capsys.readouterr().err
    assert consensus.list_shards() == []  # nothing created
    assert json.loads(upsertctl.ok(*init[:1], "plain", *init[1:], "--json"))["schema_evolution"] == "add_columns"
    assert json.loads(upsertctl.ok(*init[:1], "strict", *init[1:], "--schema-evolution", "none", "--json"))[
        "schema_evolution"] == "none"

    assert upsertctl.ok("schema", "strict").rstrip().endswith("shard strict: schema version 1, schema evolution none")
    assert upsertctl.ok("schema", "policy", "strict", "add_and_widen", "--actor", "ops").strip() \
        == "shard strict: schema evolution add_and_widen"
    assert json.loads(upsertctl.ok("schema", "strict", "--json"))["schema_evolution"] == "add_and_widen"
    assert json.loads(upsertctl.ok("status", "strict", "--no-rows", "--json"))["schema_evolution"] == "add_and_widen"

    code, _, err = upsertctl("schema", "policy", "strict", "widen")
    assert code == 2 and "unknown schema evolution policy 'widen'; expected one of none, add_columns, add_and_widen" in err
    code, _, err = upsertctl("schema", "policy", "nosuch", "none")
    assert code == 2 and "unknown shard 'nosuch'" in err
    with consensus.engine.connect() as conn:
        rows = conn.execute(sa.select(schema_policies_table.c.shard_id, schema_policies_table.c.policy,
                                      schema_policies_table.c.changed_by).order_by("shard_id")).all()
    assert [tuple(r) for r in rows] == [("plain", "add_columns", rows[0][2]), ("strict", "add_and_widen", "ops")]


@sqlite_only
def test_a_shard_without_a_stored_policy_has_the_default_and_a_stored_unknown_one_is_an_error(consensus, blob, tmp_path):
    shard = make_shard(consensus, blob, tmp_path)  # as a shard created before policies: no row
    assert schema_policy(shard) == DEFAULT_POLICY == ADD_COLUMNS
    with consensus.engine.begin() as conn:
        conn.execute(sa.insert(schema_policies_table).values(shard_id="orders", policy="sometimes", changed_by="x",
                                                             changed_at=0.0))
    with pytest.raises(Exception, match="unknown schema evolution policy 'sometimes'"):
        schema_policy(shard)
    for policy in POLICIES:
        assert set_schema_policy(shard, policy, "t") == policy and schema_policy(shard) == policy


# -- evolve_batch on both stores -----------------------------------------------------------------


def _versions(shard: Shard) -> list[int]:
    return [v.version for v in schema_history(shard.consensus, shard.shard_id, shard.config.schema)]


def test_writers_racing_through_one_batch_mint_one_version_and_write_with_it(consensus, blob, tmp_path, monkeypatch):
    """Both writers plan on version 1 before either mints (a barrier inside the mint): one
    inserts version 2, the other finds the same schema there and takes it."""
    make_shard(consensus, blob, tmp_path)
    writers = [Shard.open(consensus, blob, "orders") for _ in range(2)]
    real_mint = schema_apply.mint_schema_version
    planned = threading.Barrier(2, timeout=120)

    def mint_after_both_planned(*args, **kwargs):
        planned.wait()
        return real_mint(*args, **kwargs)

    monkeypatch.setattr(schema_apply, "mint_schema_version", mint_after_both_planned)
    results: dict[int, object] = {}

    def run(index: int) -> None:
        try:
            results[index] = evolve_batch(writers[index], [EMAIL], ts=0)
        except BaseException as exc:  # reported below
            results[index] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results[0] == results[1] and [a["name"] for a in results[0].added] == ["email"]
    assert _versions(writers[0]) == [1, 2]
    for shard in writers:
        assert shard.config.schema_version == 2
        assert json.loads(shard.config.schema)["fields"][-1] == {"name": "email", "type": "string", "nullable": True,
                                                                 "metadata": {}}
    history = schema_history(consensus, "orders", writers[0].config.schema)
    assert history[1].change == {"add": [{"name": "email", "type": "string"}]} and history[1].created_by == "batch ts=0"

    # A writer that planned another change on version 1 (a field of another type) conflicts.
    monkeypatch.setattr(schema_apply, "mint_schema_version", real_mint)
    stale = Shard.open(consensus, blob, "orders")
    monkeypatch.setattr(stale, "refresh_schema", lambda: stale.config)
    stale.config = sample_config(str(tmp_path / "landing"))
    with pytest.raises(SchemaVersionConflict, match="planned on version 1"):
        evolve_batch(stale, [ObservedField("email", "long", "/landing/p0/1.jsonl")], ts=0)
    assert _versions(writers[0]) == [1, 2]


def test_a_refused_batch_mints_nothing(consensus, blob, tmp_path):
    shard = make_shard(consensus, blob, tmp_path, order_by=None, delete_marker=None, schema=json.dumps(
        {"type": "struct", "fields": [{"name": n, "type": t, "nullable": True, "metadata": {}}
                                      for n, t in (("id", "long"), ("quantity", "integer"))]}))
    disagree = [ObservedField("email", "string", "/l/p0/1.jsonl"), ObservedField("email", "long", "/l/p1/1.jsonl")]
    with pytest.raises(BatchSchemaRefused) as refused:
        evolve_batch(shard, disagree, ts=0)
    assert refused.value.details["files"] == ["/l/p0/1.jsonl", "/l/p1/1.jsonl"]
    assert "/l/p0/1.jsonl" in str(refused.value) and "/l/p1/1.jsonl" in str(refused.value)
    set_schema_policy(shard, ADD_COLUMNS, "t")
    with pytest.raises(BatchSchemaRefused, match="policy add_columns does not widen"):
        evolve_batch(shard, [ObservedField("quantity", "long", "/l/p0/1.jsonl")], ts=0)
    set_schema_policy(shard, NONE, "t")
    assert evolve_batch(shard, [ObservedField("email", None, "/l/p0/1.jsonl")], ts=0).unknown == ("email",)
    assert _versions(shard) == [1] and shard.config.schema_version == 1


# -- what a directory batch observes -------------------------------------------------------------


def test_value_overflows_exactly_the_numbers_out_of_the_columns_range():
    """Seeded sweep over every type that can overflow and numbers around each bound."""
    rng = random.Random(36)
    bounds = {"byte": 8, "short": 16, "integer": 32}
    for column_type, bits in bounds.items():
        low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
        for value in [low, high, low - 1, high + 1, 0, *(rng.randint(-2 ** 70, 2 ** 70) for _ in range(500))]:
            assert value_overflows(column_type, value) == (not low <= value <= high), (column_type, value)
        # Not numbers, or not integers: a bad record as it is, never a widening.
        for value in (True, False, None, "9" * 20, 1.5, float(high + 1), [high + 1], {"v": high + 1}):
            assert not value_overflows(column_type, value), (column_type, value)
    for value in [FLOAT_MAX, -FLOAT_MAX, 0.0, 1e38, *(rng.uniform(-1e39, 1e39) for _ in range(500))]:
        assert value_overflows("float", value) == (abs(value) > FLOAT_MAX), value
    for value in (float("inf"), float("-inf"), 10 ** 400, True, "1e39"):
        assert not value_overflows("float", value)
    assert not any(value_overflows(t, 2 ** 80) for t in ("long", "double", "string", "decimal(10,2)"))


def test_values_are_checked_in_narrow_columns_never_of_a_key_or_the_order_column(tmp_path):
    config = sample_config(str(tmp_path), schema=json.dumps({"type": "struct", "fields": [
        {"name": n, "type": t, "nullable": True, "metadata": {}}
        for n, t in (("id", "integer"), ("updated_at", "short"), ("qty", "integer"), ("w", "float"), ("n", "long"),
                     ("s", "string"), ("deleted", "boolean"))]}))
    assert widenable_columns(config) == {"qty": "integer", "w": "float"}


def test_a_parquet_batch_observes_new_columns_from_the_footers(tmp_path):
    config = sample_config(str(tmp_path), schema=json.dumps({"type": "struct", "fields": [
        {"name": "id", "type": "long", "nullable": True, "metadata": {}}]}), order_by=None, delete_marker=None)
    files = {
        "a": pa.table({"id": pa.array([1], pa.int64()), "qty": pa.array([2], pa.int32()),
                       "at": pa.array([0], pa.timestamp("us", tz="UTC")),
                       "tags": pa.array([["x"]], pa.list_(pa.string()))}),
        "b": pa.table({"id": pa.array([3], pa.int64()), "price": pa.array([1.5], pa.float64())}),
        "c": pa.table({"id": pa.array([4], pa.int64())}),
    }
    segments = []
    for seq, (name, data) in enumerate(files.items()):
        path = tmp_path / f"{name}.parquet"
        pq.write_table(data, str(path))
        segments.append(Segment(seq, "p0", str(path)))
    a, b = str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")
    assert observed_parquet_fields(config, segments, ADD_COLUMNS) == [
        ObservedField("qty", "integer", a), ObservedField("at", "timestamp", a),
        ObservedField("tags", {"type": "array", "elementType": "string", "containsNull": True}, a),
        ObservedField("price", "double", b)]
    assert observed_parquet_fields(config, segments, NONE) == [
        ObservedField("qty", None, a), ObservedField("at", None, a), ObservedField("tags", None, a),
        ObservedField("price", None, b)]
    odd = tmp_path / "odd.parquet"
    pq.write_table(pa.table({"id": pa.array([1], pa.int64()), "big": pa.array([1], pa.uint64())}), str(odd))
    with pytest.raises(BatchSchemaRefused) as refused:
        observed_parquet_fields(config, [Segment(9, "p0", str(odd))], ADD_AND_WIDEN)
    assert str(odd) in str(refused.value) and "'big'" in str(refused.value)
    assert refused.value.details["file"] == str(odd)
