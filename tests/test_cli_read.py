"""`upsertctl read --format parquet|arrow --out PATH`: a path the file cannot be written to is
reported naming --out's path, and leaves nothing behind (no Spark: the Arrow reader)."""

from __future__ import annotations

import json
import os

import pytest

from tests.helpers import run_cli
from tests.test_arrow_reader import cli_shard  # noqa: F401 - the fixture
from tests.test_cli_errors import tmpfs  # noqa: F401 - the fixture


def test_read_into_an_existing_directory_is_a_configuration_error_naming_it(cli_shard, capsys, tmp_path):  # noqa: F811
    target = tmp_path / "adir"
    target.mkdir()
    (target / "inside").write_text("kept")
    for output_format in ("arrow", "parquet"):
        code, out, err = run_cli(capsys, "read", "orders", "--format", output_format, "--out", str(target))
        assert (code, out, err) == (2, "", f"upsertctl: cannot write --out {target}: it is a directory; "
                                           "give a file's path\n")
    assert os.listdir(target) == ["inside"] and (target / "inside").read_text() == "kept"
    assert not [name for name in os.listdir(tmp_path) if ".tmp-" in name]


def test_read_onto_a_full_filesystem_names_out_and_leaves_the_old_file(cli_shard, capsys, tmpfs):  # noqa: F811
    full = tmpfs("4k", name="full")
    target = full / "keep.parquet"
    target.write_bytes(b"o" * 4096)  # the filesystem's one page: every further write fails
    code, out, err = run_cli(capsys, "read", "orders", "--format", "parquet", "--out", str(target))
    assert (code, out) == (2, ""), err
    assert err == (f"upsertctl: writing {target} failed: No space left on device; nothing was committed: "
                   "free space or fix the mount, then run again\n")
    assert "blob root" not in err and "Spark" not in err
    assert os.listdir(full) == ["keep.parquet"] and target.read_bytes() == b"o" * 4096


# -- read --format jsonl|csv --out: the same replace-into-place as parquet and arrow ---------------

@pytest.fixture
def spark_cli_shard(cli_shard, spark, monkeypatch):  # noqa: F811
    """cli_shard with the test session allowed: jsonl and csv are read on Spark."""
    from airflow_upsert_provider.cli.context import Context

    monkeypatch.setattr(Context, "spark", lambda self: spark)
    return cli_shard


def test_read_text_onto_a_full_filesystem_names_out_and_leaves_the_old_file(spark_cli_shard, capsys, tmpfs):  # noqa: F811
    full = tmpfs("4k", name="full")
    for output_format in ("jsonl", "csv"):
        target = full / f"keep.{output_format}"
        target.write_bytes(b"o" * 4096)  # the filesystem's one page: every further write fails
        code, out, err = run_cli(capsys, "read", "orders", "--format", output_format, "--out", str(target))
        assert (code, out) == (2, ""), err
        assert err == (f"upsertctl: writing {target} failed: No space left on device; nothing was committed: "
                       "free space or fix the mount, then run again\n")
        assert os.listdir(full) == [target.name] and target.read_bytes() == b"o" * 4096
        target.unlink()


def test_read_text_out_replaces_the_file_whole_and_dash_is_stdout(spark_cli_shard, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "t.jsonl"
    target.write_text("old\n")
    code, out, err = run_cli(capsys, "read", "orders", "--out", str(target))
    assert (code, out, err) == (0, "", "")
    written = target.read_text()
    code, out, err = run_cli(capsys, "read", "orders", "--out", "-")
    assert (code, err) == (0, "") and out == written and len(written.splitlines()) > 1
    assert all(json.loads(line)["id"] is not None for line in written.splitlines())
    assert not [name for name in os.listdir(tmp_path) if ".tmp-" in name]
    assert not os.path.exists("-")


def test_read_binary_out_dash_is_refused(cli_shard, capsys, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    for output_format in ("arrow", "parquet"):
        code, out, err = run_cli(capsys, "read", "orders", "--format", output_format, "--out", "-")
        assert (code, out) == (2, ""), err
        assert err == (f"upsertctl: read --format {output_format} writes a file, not stdout: --out - is refused; "
                       "give a file's path (./- for a file named -)\n")
    assert not (tmp_path / "-").exists()
