"""Refusals that need no Spark come before Spark starts (seconds): a compaction beyond the
upper, and a status or compaction of a shard whose committed run file is missing (issue 34,
bad input). The shard fixture fails the test if a Spark session is asked for."""

from __future__ import annotations

import json
import os

from tests.helpers import run_cli as run
from tests.test_arrow_reader import cli_shard  # noqa: F401 - the fixture

INT64_MAX = 2**63 - 1


def test_compact_beyond_the_upper_is_refused_without_spark(cli_shard, capsys):  # noqa: F811
    shard, _ = cli_shard
    before = shard.state()
    code, out, err = run(capsys, "compact", "orders", "--since", str(INT64_MAX), "--json")
    message = f"cannot compact shard 'orders' to since {INT64_MAX}: its upper is {before.upper}"
    assert (code, err) == (2, f"upsertctl: {message}\n")
    assert json.loads(out)["message"] == message
    after = shard.state()
    assert (after.since, after.upper) == (before.since, before.upper)


def test_status_and_compact_of_a_shard_with_a_missing_run_file_fail_without_spark(cli_shard, capsys):  # noqa: F811
    shard, _ = cli_shard
    runs = shard.live_runs()
    gone = runs[-1]["files"][0]["path"]
    os.unlink(shard.blob.path(gone))
    before = shard.state()
    for argv in (["status", "orders"], ["compact", "orders"]):
        code, out, err = run(capsys, *argv, "--json")
        assert code == 4, err
        error = json.loads(out)
        assert error["error"] == "IntegrityError" and error["file"] == shard.blob.path(gone)
        assert {"file": shard.blob.path(gone), "reason": "missing"} in error["records"]
        assert err.startswith("upsertctl: 1 file(s) of the committed runs of shard 'orders' are damaged; first: "
                              f"{shard.blob.path(gone)}: missing (restore the shard from a checkpoint")
    after = shard.state()
    assert (after.since, after.upper) == (before.since, before.upper)
