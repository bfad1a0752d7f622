"""``upsertctl changes`` and ``changes retention``, run in this process against a shard whose
batches are written with pyarrow: the feed in each format, refusals with exit 2 naming the
range or the option, and the retention set at init, changed, shown by status. No Spark."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_upsert_provider.engine.store.change_feed import change_retention
from tests.arrow_runs import commit_batch
from tests.conftest import sqlite_only
from tests.helpers import make_shard, run_cli

SCHEMA = "id BIGINT, name STRING, amount DOUBLE, updated_at BIGINT, deleted BOOLEAN"


def row(key: int, name: str, *, deleted: bool = False) -> dict:
    return {"id": key, "name": name, "amount": 1.0, "updated_at": 0, "_deleted": deleted}


@pytest.fixture
def shard(consensus, blob, tmp_path, monkeypatch):
    monkeypatch.setenv("UPSERT_CONSENSUS_URL", consensus.url)
    monkeypatch.setenv("UPSERT_BLOB_ROOT", blob.root)
    shard = make_shard(consensus, blob, tmp_path, buckets=2, order_by=None)
    commit_batch(shard, [row(1, "a"), row(2, "b")])
    commit_batch(shard, [row(1, "a2"), row(2, "b", deleted=True), row(3, "c")])
    return shard


@sqlite_only
def test_the_feed_in_each_format(shard, tmp_path, capsys):
    code, out, err = run_cli(capsys, "changes", "orders", "--from", "1", "--preimages")
    assert code == 0, err
    # Sorted by key within a bucket, buckets one after the other.
    rows = sorted((json.loads(line) for line in out.splitlines()), key=lambda r: (r["id"], r["_change_type"] != "update_preimage"))
    assert [(r["id"], r["name"], r["_change_type"], r["_commit_version"]) for r in rows] == [
        (1, "a", "update_preimage", 1), (1, "a2", "update_postimage", 1), (2, "b", "delete", 1),
        (3, "c", "insert", 1)]
    assert rows[0]["_commit_timestamp"].endswith("+00:00")
    # Without --preimages: no pre-image, and a delete carries the key alone.
    code, out, err = run_cli(capsys, "changes", "orders", "--from", "1")
    assert code == 0, err
    rows = sorted((json.loads(line) for line in out.splitlines()), key=lambda r: r["id"])
    assert [(r["id"], r["name"], r["amount"], r["_change_type"]) for r in rows] == [
        (1, "a2", 1.0, "update_postimage"), (2, None, None, "delete"), (3, "c", 1.0, "insert")]
    code, out, err = run_cli(capsys, "changes", "orders", "--from", "0", "--to", "1", "--format", "parquet",
                             "--out", str(tmp_path / "f.parquet"), "--json")
    assert code == 0, err
    assert json.loads(out) == {"shard": "orders", "from_ts": 0, "to_ts": 1, "rows": 2,
                               "out": str(tmp_path / "f.parquet")}
    table = pq.read_table(tmp_path / "f.parquet")
    assert table.column("_change_type").to_pylist() == ["insert", "insert"]
    assert table.schema.field("_commit_version").type == pa.int64()
    code, _, err = run_cli(capsys, "changes", "orders", "--from", "0", "--format", "arrow",
                           "--out", str(tmp_path / "f.arrow"))
    assert code == 0, err
    with pa.ipc.open_file(tmp_path / "f.arrow") as reader:
        assert sorted(reader.read_all().column("id").to_pylist()) == [1, 3]


@sqlite_only
def test_refusals_exit_2_naming_what_is_wrong(shard, tmp_path, capsys):
    code, _, err = run_cli(capsys, "changes", "orders", "--from", "1", "--to", "5")
    assert code == 2 and "[1, 5) of shard 'orders' ends past its upper 2" in err
    code, _, err = run_cli(capsys, "changes", "orders")
    assert code == 2 and "--from" in err
    code, _, err = run_cli(capsys, "changes", "orders", "--from", "0", "--format", "parquet")
    assert code == 2 and "give --out PATH" in err
    assert not list(tmp_path.glob("*.parquet"))
    code, _, err = run_cli(capsys, "changes", "retention", "orders", "--keep", "7x")
    assert code == 2 and "--keep" in err and "'7x'" in err
    assert change_retention(shard.consensus, "orders") is None
    code, _, err = run_cli(capsys, "changes", "retention", "orders", "--preimages")
    assert code == 2 and "--preimages goes with a feed" in err


@sqlite_only
def test_retention_is_set_shown_and_removed(shard, capsys):
    code, out, err = run_cli(capsys, "changes", "retention", "orders", "--keep", "7d", "--json")
    assert code == 0, err
    shown = json.loads(out)
    assert shown["keep_seconds"] == 7 * 86400 and shown["held_from"] == 0 and shown["runs"] == 2
    assert shown["bytes"] == sum(f["bytes"] for b in shard.batches() for f in b.run["files"])
    code, out, err = run_cli(capsys, "status", "orders", "--no-rows", "--json")
    assert code == 0, err
    assert {"shard": "orders", **json.loads(out)["change_retention"]} == shown
    code, out, _ = run_cli(capsys, "changes", "retention", "orders", "--off", "--json")
    assert json.loads(out)["keep_seconds"] is None and change_retention(shard.consensus, "orders") is None
    code, out, _ = run_cli(capsys, "status", "orders", "--no-rows", "--json")
    assert "change_retention" not in json.loads(out)


@sqlite_only
def test_init_sets_the_retention_and_refuses_a_bad_one_before_creating(consensus, blob, tmp_path, monkeypatch,
                                                                       capsys):
    monkeypatch.setenv("UPSERT_CONSENSUS_URL", consensus.url)
    monkeypatch.setenv("UPSERT_BLOB_ROOT", blob.root)
    (tmp_path / "landing").mkdir()
    base = ["init", "s1", "--source", f"dir:{tmp_path / 'landing'}", "--key", "id", "--schema", SCHEMA]
    code, _, err = run_cli(capsys, *base, "--change-retention", "soon")
    assert code == 2 and "--change-retention" in err and "'soon'" in err
    assert [s.shard_id for s in consensus.list_shards()] == []
    code, _, err = run_cli(capsys, *base, "--change-retention", "2w")
    assert code == 0, err
    assert change_retention(consensus, "s1") == 14 * 86400
