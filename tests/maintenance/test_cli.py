"""`upsertctl compact | checkpoint create|list|verify|restore | gc` with --json, and their exit codes."""

from __future__ import annotations

import json
import os

import pytest

from airflow_upsert_provider.cli import main
from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.engine.table.shard import Shard
from tests.helpers import table
from tests.maintenance.support import age_compaction, age_files, as_legacy_catalog, oracle, tree, written_shard


@pytest.fixture
def cli(monkeypatch, capsys, sqlite_url, blob):
    monkeypatch.setenv("UPSERT_CONSENSUS_URL", sqlite_url)
    monkeypatch.setenv("UPSERT_BLOB_ROOT", blob.root)

    def run(*argv: str) -> tuple[int, dict]:
        capsys.readouterr()
        code = main(list(argv))
        out = capsys.readouterr().out.strip().splitlines()
        return code, json.loads(out[-1]) if out else {}

    return run


def test_maintenance_commands_end_to_end(spark, sqlite_url, blob, tmp_path, cli):
    consensus = open_consensus(sqlite_url)
    shard = written_shard(spark, consensus, blob, tmp_path, batches=4)
    expected = table(shard)

    code, out = cli("compact", "orders", "--since", "3", "--json")
    assert code == 0 and (out["outcome"], out["since"], out["runs_merged"]) == ("compacted", 3, 3)
    code, out = cli("checkpoint", "create", "orders", "--keep-last", "1", "--json")
    assert code == 0 and (out["checkpoint"]["upper"], out["checkpoint"]["since"]) == (4, 3)
    checkpoint_id = out["checkpoint"]["id"]
    code, out = cli("checkpoint", "list", "orders", "--json")
    assert code == 0 and [c["id"] for c in out["checkpoints"]] == [checkpoint_id]
    code, out = cli("checkpoint", "verify", "orders", "--json")
    assert code == 0 and out["verified"] == [{"id": checkpoint_id, "files": out["verified"][0]["files"], "ok": True}]

    age_files(blob.root)
    age_compaction(consensus, "orders")
    code, out = cli("gc", "orders", "--dry-run", "--grace", "60", "--json")
    assert code == 0 and out["dry_run"] and out["would_delete"]["items"] == 3
    assert out["would_delete"]["bytes"] == sum(i["bytes"] for i in out["items"]) > 0
    code, out = cli("gc", "orders", "--grace", "60", "--json")
    assert code == 0 and out["deleted"]["items"] == 3
    assert not any(os.path.exists(blob.path(i["path"])) for i in out["items"])
    assert table(shard) == expected == oracle(shard)

    code, out = cli("checkpoint", "restore", "orders", "--as", "orders-copy", "--json")
    assert code == 0 and (out["shard"], out["upper"], out["since"]) == ("orders-copy", 4, 3)
    assert table(Shard.open(consensus, blob, "orders-copy")) == expected
    code, out = cli("checkpoint", "restore", "orders", checkpoint_id, "--json")
    assert code == 2 and out["error"] == "ShardExists"

    # Exit codes: 2 for usage (unknown checkpoint or shard), 4 for a corrupt catalog.
    code, out = cli("checkpoint", "verify", "orders", "nope", "--json")
    assert code == 2 and "no checkpoint 'nope'" in out["message"]
    code, out = cli("gc", "missing-shard", "--json")
    assert code == 2 and out["error"] == "ShardNotFound"
    # A catalog file of a release before the store held catalogs, not imported yet, damaged.
    catalog = as_legacy_catalog(consensus, blob, "orders")
    open(catalog, "wb").close()
    before = tree(blob.root)
    for argv in (("checkpoint", "list", "orders"), ("gc", "orders", "--grace", "0"), ("checkpoint", "create", "orders")):
        code, out = cli(*argv, "--json")
        assert code == 4 and out["error"] == "CheckpointCorrupt" and out["file"] == catalog, argv
    assert tree(blob.root) == before
    consensus.dispose()


def test_human_output_of_gc_dry_run(spark, sqlite_url, blob, tmp_path, monkeypatch, capsys):
    consensus = open_consensus(sqlite_url)
    written_shard(spark, consensus, blob, tmp_path, batches=2)
    monkeypatch.setenv("UPSERT_CONSENSUS_URL", sqlite_url)
    monkeypatch.setenv("UPSERT_BLOB_ROOT", blob.root)
    assert main(["compact", "orders"]) == 0
    age_files(blob.root)
    capsys.readouterr()
    assert main(["gc", "orders", "--dry-run", "--grace", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len([line for line in lines if line.startswith("would delete run orders/runs/ts=")]) == 2
    assert lines[-1].startswith("would delete 2 item(s)")
    consensus.dispose()


def test_read_of_a_run_damaged_in_place_exits_4_naming_it(spark, sqlite_url, blob, tmp_path, monkeypatch, capsys):
    """A committed run file overwritten in place (same size) fails inside Spark; ``read``
    names it with exit 4, as it does a missing one."""
    consensus = open_consensus(sqlite_url)
    shard = written_shard(spark, consensus, blob, tmp_path, batches=2)
    damaged = blob.path(shard.batches()[1].run["files"][0]["path"])
    size = os.path.getsize(damaged)
    with open(damaged, "r+b") as handle:
        handle.seek(4)
        handle.write(b"\0" * (size - 12))  # keep the magic and the footer length: Spark opens it
    assert os.path.getsize(damaged) == size
    monkeypatch.setenv("UPSERT_CONSENSUS_URL", sqlite_url)
    monkeypatch.setenv("UPSERT_BLOB_ROOT", blob.root)

    capsys.readouterr()
    code = main(["read", shard.shard_id])
    printed = capsys.readouterr()
    assert code == 4
    assert f"1 file(s) of the committed runs of shard 'orders' are damaged; first: {damaged}: checksum mismatch" \
        in printed.err
    assert printed.out == ""
    consensus.dispose()
