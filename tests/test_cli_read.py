"""`upsertctl read --format parquet|arrow --out PATH`: a path the file cannot be written to is
reported naming --out's path, and leaves nothing behind (no Spark: the Arrow reader)."""

from __future__ import annotations

import json
import os

import pytest

from tests.helpers import run_cli
from tests.test_arrow_reader import cli_shard  # noqa: F401 - the fixture


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


# -- reads of runs on object storage through Spark's executors ------------------------------------

@pytest.mark.usefixtures("s3_executors")
def test_a_spark_read_on_s3_asks_no_head_per_file_and_a_flipped_page_fails_it_naming_the_file(
        s3_server, s3_root, tmp_path, capsys):
    from airflow_upsert_provider.engine.store.registry import open_consensus
    from tests.helpers import Upsertctl
    from tests.maintenance.test_compaction_integrity import flip_a_bit_that_still_decodes
    from tests.oracle import oracle_table, table_from_rows
    from tests.test_run_io_s3 import shard_on_s3
    from tests.test_runs import write_segment

    landing = str(tmp_path / "landing")
    write_segment(landing, "p0", 0, [{"id": i, "v": f"a{i}", "ts": 1} for i in range(60)])
    write_segment(landing, "p1", 0, [{"id": i, "v": f"b{i}", "ts": 2} for i in range(40, 90)])
    url, run, bucket, prefix = shard_on_s3(capsys, tmp_path, s3_root, landing, 3, "--max-files-per-batch", "1")
    run("run-batch", "s", "--until-caught-up")
    consensus = open_consensus(url)
    try:
        files = [f["path"] for ts in (0, 1) for f in consensus.get_batch("s", ts).run["files"]]
    finally:
        consensus.dispose()
    assert len(files) == 6

    before = len(s3_server.requests())
    rows = table_from_rows(json.loads(line) for line in run("read", "s").splitlines())
    assert rows == oracle_table(landing, order_by="ts", delete_marker="deleted")
    run_files = [(m, p) for m, p in s3_server.requests()[before:] if "/runs/" in p]
    assert [r for r in run_files if r[0] == "HEAD"] == []  # no request per file before reading
    assert {p for _, p in run_files} == {f"/{bucket}/{prefix}/{f}" for f in files}

    # A bit flipped in a page that still decodes, in an object of the store (no .crc there).
    key = f"{prefix}/{sorted(files)[0]}"
    local = tmp_path / "flipped.parquet"
    local.write_bytes(s3_server.client().get_object(Bucket=bucket, Key=key)["Body"].read())
    flip_a_bit_that_still_decodes(str(local))
    s3_server.client().put_object(Bucket=bucket, Key=key, Body=local.read_bytes())
    code, out, err = Upsertctl(capsys, url, s3_root)("read", "s")
    assert (code, out) == (4, "")
    assert f"s3://{bucket}/{key}: checksum mismatch: sha256" in err, err
