"""Checks before a read without a request per file (issue 35 item 4).

``Shard.read(spark)`` hands out a lazy frame that its caller collects outside
``Shard.reading``, and ``upsertctl status`` and ``compact`` refuse a missing run file before
Spark starts: each compares one flat listing of the shard's run prefix with the files its state
lists (``Shard.check_run_files_listed``). On object storage that is one LIST per page of keys
where it was one HEAD per live file; a missing file, or one of another size than recorded, is
still named.
"""

from __future__ import annotations

import json
import os
import random

import pytest

from airflow_upsert_provider.engine.blob.files import open_blob
from airflow_upsert_provider.engine.errors import IntegrityError
from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.engine.table.shard import run_listing_prefixes, unlisted_run_files
from tests.arrow_runs import expected_table
from tests.helpers import Upsertctl, make_shard
from tests.s3server import request_kind
from tests.test_arrow_reader import commit_random_batches

# -- the rule, pure ---------------------------------------------------------------------------


def random_runs(rng: random.Random) -> list[dict]:
    """Runs of one to three shards' run prefixes (a restored shard may list another's files),
    a few shallow paths among them, with random sizes."""
    shards = rng.sample(["orders", "copy", "orders-2", "o"], rng.randint(1, 3))
    runs = []
    for n in range(rng.randint(0, 8)):
        shard = rng.choice(shards)
        directory = rng.choice([f"{shard}/runs/ts={n:012d}/w-{n}", f"{shard}/runs/since={n:012d}/compaction-{n}",
                                shard, ""])
        files = [{"path": "/".join(p for p in (directory, f"bucket={b:03d}", f"part-{n}.parquet") if p),
                  "bytes": rng.randint(1, 5000)} for b in range(rng.randint(1, 5))]
        if directory in (shard, ""):
            files = [{**f, "path": "/".join(p for p in (directory, f"f-{n}-{i}.parquet") if p)}
                     for i, f in enumerate(files)]
        runs.append({"path": directory, "files": files})
    return runs


def test_a_listing_names_exactly_the_missing_and_resized_files_in_order():
    for seed in range(600):
        rng = random.Random(seed)
        runs = random_runs(rng)
        files = [f for run in runs for f in run["files"]]
        listed = {f["path"]: f["bytes"] for f in files}
        expected = []
        for f in files:
            fate = rng.choice(["kept", "kept", "missing", "resized"])
            if fate == "missing":
                del listed[f["path"]]
                expected.append({"path": f["path"], "reason": "missing"})
            elif fate == "resized":
                listed[f["path"]] = f["bytes"] + rng.choice([-1, 1, 100])
                expected.append({"path": f["path"],
                                 "reason": f"size {listed[f['path']]} bytes, the shard's state says {f['bytes']}"})
        # Garbage beside the live files (replaced runs, staged files of writers) is not looked at.
        for i in range(rng.randint(0, 5)):
            listed[f"orders/runs/ts={i:012d}/lost-{i}/part.parquet"] = i
        assert unlisted_run_files(runs, listed) == expected, seed

        prefixes = run_listing_prefixes(runs)
        assert prefixes == sorted(set(prefixes))
        for f in files:
            # Every file is under a listed prefix (the root, "", holds everything).
            assert any(p == "" or f["path"].startswith(p + "/") for p in prefixes), (seed, f)
        # One listing per shard's run prefix, whatever the number of its runs and files.
        shards_with_runs = {f["path"].split("/")[0] for f in files if "/runs/" in f["path"]}
        assert {p for p in prefixes if p.endswith("/runs")} == {f"{s}/runs" for s in shards_with_runs}, seed
        # And no prefix that holds none of the files.
        for p in prefixes:
            assert any(p == "" or f["path"].startswith(p + "/") for f in files), (seed, p)


# -- on object storage: requests counted by the loopback S3 server ------------------------------


@pytest.fixture
def s3_shard(s3_executors, s3_server, sqlite_url, tmp_path):
    """A shard of 3 batches in 4 buckets (12 run files) on the S3 server, written without Spark."""
    consensus = open_consensus(sqlite_url)
    shard = make_shard(consensus, open_blob(s3_executors), tmp_path, buckets=4)
    history = commit_random_batches(shard, random.Random(7), 3, keys=200, rows=120)
    assert len([f for run in shard.live_runs() for f in run["files"]]) == 12
    yield shard, history
    consensus.dispose()


def request_kinds(s3_server, since: int, *, about_runs: bool = False) -> list[str]:
    """The kinds of the requests the server answered since the ``since``-th; with
    ``about_runs`` only those naming the run prefix (a LIST's prefix, an object's key), not a
    command's check of the blob root."""
    return [request_kind(method, target) for method, target in s3_server.requests()[since:]
            if not about_runs or "runs" in target]


def delete_object(s3_server, shard, path: str) -> None:
    bucket, _, key = shard.blob.path(path).removeprefix("s3://").partition("/")
    s3_server.client().delete_object(Bucket=bucket, Key=key)


def test_a_spark_read_on_s3_lists_once_instead_of_a_head_per_file_and_names_a_missing_file(
        spark, s3_shard, s3_server):
    shard, history = s3_shard
    before = len(s3_server.requests())
    frame = shard.read(spark)
    kinds = request_kinds(s3_server, before)
    assert (kinds.count("HEAD"), kinds.count("LIST")) == (0, 1), kinds
    rows = {(r["id"],): r.asDict() for r in frame.collect()}
    assert rows == expected_table(shard.config, history, 3)

    gone = shard.live_runs()[1]["files"][2]["path"]
    delete_object(s3_server, shard, gone)
    before = len(s3_server.requests())
    with pytest.raises(IntegrityError) as raised:
        shard.read(spark)
    assert raised.value.exit_code == 4 and raised.value.details["file"] == shard.blob.path(gone)
    assert f"{shard.blob.path(gone)}: missing" in raised.value.message
    kinds = request_kinds(s3_server, before)
    assert (kinds.count("HEAD"), kinds.count("LIST")) == (0, 1), kinds


def test_status_and_compact_on_s3_check_with_one_listing_before_spark_and_name_a_missing_file(
        s3_shard, s3_server, sqlite_url, capsys, monkeypatch):
    from airflow_upsert_provider.cli.context import Context

    shard, _ = s3_shard
    asked: list[list[str]] = []

    class SparkAsked(Exception):
        pass

    def spark_asked(self):
        asked.append(request_kinds(s3_server, start, about_runs=True))
        raise SparkAsked("Spark would start here")

    monkeypatch.setattr(Context, "spark", spark_asked)
    upsertctl = Upsertctl(capsys, sqlite_url, shard.blob.root)
    for asks, argv in enumerate((["status", "orders"], ["compact", "orders"]), start=1):
        start = len(s3_server.requests())
        code, _, err = upsertctl(*argv, "--json")
        assert code != 0 and "Spark would start here" in err and len(asked) == asks, err
        # Up to Spark: the run files' check was one listing and no HEAD.
        kinds = asked[-1]
        assert (kinds.count("HEAD"), kinds.count("LIST")) == (0, 1), (argv, kinds)

    gone = shard.live_runs()[2]["files"][0]["path"]
    delete_object(s3_server, shard, gone)
    for argv in (["status", "orders"], ["compact", "orders"]):
        start = len(s3_server.requests())
        code, out, err = upsertctl(*argv, "--json")
        assert code == 4, err
        error = json.loads(out)
        assert error["error"] == "IntegrityError" and error["file"] == shard.blob.path(gone)
        assert {"file": shard.blob.path(gone), "reason": "missing"} in error["records"]
        kinds = request_kinds(s3_server, start, about_runs=True)
        assert (kinds.count("HEAD"), kinds.count("LIST")) == (0, 1), (argv, kinds)
    assert len(asked) == 2  # Spark was never asked for once a file was missing


# -- on local disk ------------------------------------------------------------------------------


def test_a_spark_read_on_local_disk_names_a_missing_file_and_a_file_of_another_size(
        spark, sqlite_url, blob, tmp_path):
    consensus = open_consensus(sqlite_url)
    try:
        shard = make_shard(consensus, blob, tmp_path, buckets=4)
        history = commit_random_batches(shard, random.Random(8), 3, keys=100, rows=80)
        rows = {(r["id"],): r.asDict() for r in shard.read(spark).collect()}
        assert rows == expected_table(shard.config, history, 3)
        runs = shard.live_runs()

        truncated = blob.path(runs[0]["files"][1]["path"])
        recorded = runs[0]["files"][1]["bytes"]
        with open(truncated, "r+b") as handle:
            handle.truncate(recorded - 10)
        with pytest.raises(IntegrityError) as raised:
            shard.read(spark)
        assert raised.value.details["file"] == truncated and raised.value.exit_code == 4
        assert f"{truncated}: size {recorded - 10} bytes, the shard's state says {recorded}" in raised.value.message

        gone = blob.path(runs[2]["files"][3]["path"])
        os.unlink(gone)
        with pytest.raises(IntegrityError) as raised:
            shard.read(spark)
        # Both named, in the order of the runs; the first is the message's.
        assert raised.value.details["records"] == [
            {"file": truncated, "reason": f"size {recorded - 10} bytes, the shard's state says {recorded}"},
            {"file": gone, "reason": "missing"},
        ]
        assert raised.value.details["count"] == 2
    finally:
        consensus.dispose()
