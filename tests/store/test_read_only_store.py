"""A SQLite store on a file system that is mounted read-only: a configuration error naming the
file, not a retryable outage (issue 34, note D9). Real read-only mounts (a tmpfs remounted
``ro``): a chmod does not stop root, which CI runs as."""

from __future__ import annotations

import shutil
import sqlite3

import pytest

from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.engine.store.registry import open_consensus
from tests.helpers import run_cli_json
from tests.helpers import remount


def files_of(directory) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def assert_names_the_file(error: ConfigurationError, path, cannot: str) -> None:
    assert not error.retryable and error.exit_code == 2
    assert error.details["field"] == "consensus" and error.details["file"] == str(path)
    assert f"SQLite cannot {cannot} its file {path}" in error.message
    assert f"the file system holding {path.parent} is mounted read-only" in error.message
    assert error.message.endswith("nothing was changed")


def test_a_store_on_a_read_only_mount_is_a_configuration_error_naming_the_file(
    tmpfs, capsys, monkeypatch
):
    mount = tmpfs("4m", "store")
    path = mount / "consensus.db"
    url = f"sqlite:///{path}"
    store = open_consensus(url)
    store.create_shard("orders", "{}")
    store.dispose()
    remount(mount, "ro")
    before = files_of(mount)

    # SQLite cannot set the store up (WAL needs its -shm file): SQLITE_CANTOPEN.
    with pytest.raises(ConfigurationError) as refused:
        open_consensus(url)
    assert_names_the_file(refused.value, path, "open")

    monkeypatch.setenv("UPSERT_CONSENSUS_URL", url)
    for argv in (["db", "status"], ["status", "orders", "--no-rows"]):
        code, error, err = run_cli_json(capsys, *argv)
        assert code == 2, (argv, err)
        assert error["error"] == "ConfigurationError" and error["retryable"] is False, argv
        assert f"SQLite cannot open its file {path}" in err and "mounted read-only" in err, argv
    assert files_of(mount) == before


def test_a_store_a_writer_left_with_its_log_on_a_read_only_mount_reads_and_refuses_writes(
    tmpfs, tmp_path
):
    # The store as a writer that died leaves it: the file with its -wal and -shm beside it.
    # With them SQLite opens it and reads; the first write fails with SQLITE_READONLY.
    built = tmp_path / "built.db"
    store = open_consensus(f"sqlite:///{built}")
    store.create_shard("orders", "{}")
    mount = tmpfs("4m", "store")
    path = mount / "consensus.db"
    held = sqlite3.connect(built)
    held.execute("SELECT count(*) FROM upsert_shards").fetchall()
    for suffix in ("", "-wal", "-shm"):
        shutil.copyfile(f"{built}{suffix}", f"{path}{suffix}")
    held.close()
    store.dispose()
    remount(mount, "ro")
    before = files_of(mount)

    store = open_consensus(f"sqlite:///{path}")
    try:
        assert [r.shard_id for r in store.list_shards()] == ["orders"]
        with pytest.raises(ConfigurationError) as refused:
            store.create_shard("payments", "{}")
        assert_names_the_file(refused.value, path, "write")
        assert [r.shard_id for r in store.list_shards()] == ["orders"]
    finally:
        store.dispose()
    assert files_of(mount) == before
