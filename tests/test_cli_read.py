"""`upsertctl read --format parquet|arrow --out PATH`: a path the file cannot be written to is
reported naming --out's path, and leaves nothing behind (no Spark: the Arrow reader)."""

from __future__ import annotations

import os

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
