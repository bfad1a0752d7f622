"""Atomic file writes, in one place (engine/common/atomic_file.py)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from airflow_upsert_provider.engine.common import atomic_file
from airflow_upsert_provider.engine.common.atomic_file import write_atomically


def test_a_write_replaces_the_whole_file_and_leaves_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    target.write_text("old")
    write_atomically(str(target), '{"new": 1}')
    write_atomically(str(target), b"bytes too", durable=False)
    assert target.read_bytes() == b"bytes too"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_a_private_file_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    target = tmp_path / "session.json"
    write_atomically(str(target), "{}", mode=0o600)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


def test_a_failed_write_keeps_the_old_content(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "state.json"
    target.write_text("old")

    def refuse(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic_file.os, "replace", refuse)
    with pytest.raises(OSError, match="No space left"):
        write_atomically(str(target), "new")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_a_durable_write_syncs_the_file_and_its_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def record(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(atomic_file.os, "fsync", record)
    write_atomically(str(tmp_path / "a.json"), "{}")
    assert len(synced) == 2 and synced[1] == str(tmp_path)
    synced.clear()
    write_atomically(str(tmp_path / "b.json"), "{}", durable=False)
    assert synced == []
