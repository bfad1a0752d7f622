"""Runs on an S3 root, end to end: `upsertctl` in this process, on the session's Spark whose
executors get the loopback S3 server's variables (``s3_executors``), writes a shard's batches,
compacts it and reads it while its blob root is on the server. Spark's own Parquet writer and
reader cannot reach it on a stock ``pip install pyspark``: the executors write and read every
run through pyarrow."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from urllib.parse import parse_qs, unquote

import pytest

from airflow_upsert_provider.engine.store.registry import open_consensus
from tests.conftest import REPO_ROOT
from tests.helpers import Upsertctl
from tests.oracle import oracle_table, table_from_rows
from tests.test_runs import write_segment

# The commands run on the session's Spark: its executors reach the S3 server.
pytestmark = pytest.mark.usefixtures("s3_executors")


def upsertctl(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """``upsertctl`` in a process of its own, for the tests about processes (a writer held
    or killed mid-write, racing writers, a cluster's executors)."""
    return subprocess.run([sys.executable, "-m", "airflow_upsert_provider.cli", *args], env=env,
                          capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)


def ok(*args: str, env: dict[str, str]) -> str:
    """``upsertctl`` that must succeed; its stdout."""
    done = upsertctl(*args, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def shard_on_s3(capsys, tmp_path, s3_root: str, landing: str, buckets: int, *options: str):
    """Shard ``s`` over ``landing`` on the S3 root, created with ``upsertctl init`` on a SQLite
    store: (consensus URL, a runner of upsertctl commands that must succeed, bucket, prefix)."""
    url = f"sqlite:///{tmp_path / 'consensus.db'}"
    run = Upsertctl(capsys, url, s3_root).ok
    bucket, prefix = s3_root[len("s3://"):].split("/", 1)
    run("init", "s", "--source", f"dir:{landing}", "--key", "id", "--order-by", "ts", "--delete-marker", "deleted",
        "--buckets", str(buckets), *options, "--schema", "id BIGINT, v STRING, ts BIGINT, deleted BOOLEAN")
    return url, run, bucket, prefix


def stored_objects(s3_server, bucket: str, prefix: str) -> dict[str, bytes]:
    client = s3_server.client()
    return {key: client.get_object(Bucket=bucket, Key=key)["Body"].read()
            for key in s3_server.keys(bucket, prefix) if not key.endswith("/")}


def check_run_is_what_is_stored(s3_server, bucket: str, prefix: str, run: dict) -> None:
    """The run's listed files are exactly the objects under its path (no temporary name,
    no marker), each of the size and SHA-256 its task reported."""
    stored = stored_objects(s3_server, bucket, f"{prefix}/{run['path']}/")
    assert set(stored) == {f"{prefix}/{f['path']}" for f in run["files"]}
    for listed in run["files"]:
        data = stored[f"{prefix}/{listed['path']}"]
        assert listed["bytes"] == len(data) and listed["sha256"] == hashlib.sha256(data).hexdigest()


def shard_requests(s3_server, since: int, bucket: str, prefix: str) -> list[tuple[str, str]]:
    """(method, key) of each request the server answered after the ``since``-th that names
    an object or lists a prefix below ``prefix`` in ``bucket`` (a listing as ``LIST``)."""
    named = []
    for method, target in s3_server.requests()[since:]:
        path, _, query = target.partition("?")
        path_bucket, _, key = unquote(path).lstrip("/").partition("/")
        if path_bucket != bucket:
            continue
        listed = parse_qs(query).get("prefix", [""])[0] if "list-type" in query else None
        if listed is not None and listed.startswith(prefix):
            named.append(("LIST", listed))
        elif key.startswith(prefix):
            named.append((method, key))
    return named


def test_batches_compaction_and_reads_of_a_shard_on_s3(s3_server, s3_root, tmp_path, capsys):
    landing = str(tmp_path / "landing")
    write_segment(landing, "p0", 0, [{"id": i, "v": "a", "ts": 1} for i in range(50)])
    write_segment(landing, "p0", 1, [{"id": i, "v": "b", "ts": 2, "deleted": i % 10 == 0} for i in range(25, 75)])
    write_segment(landing, "p1", 0, [{"id": i, "v": "c", "ts": 0} for i in range(70, 90)])
    expected = oracle_table(landing, order_by="ts", delete_marker="deleted")
    url, run, bucket, prefix = shard_on_s3(capsys, tmp_path, s3_root, landing, 4, "--max-files-per-batch", "2")
    before = len(s3_server.requests())
    run("run-batch", "s", "--until-caught-up")
    batch_requests = shard_requests(s3_server, before, bucket, f"{prefix}/s/")
    assert table_from_rows(json.loads(line) for line in run("read", "s").splitlines()) == expected

    consensus = open_consensus(url)
    try:
        batches = [consensus.get_batch("s", ts) for ts in (0, 1)]
        assert consensus.get_batch("s", 2) is None and all(b.run["rows"] > 0 for b in batches)
        for batch in batches:
            check_run_is_what_is_stored(s3_server, bucket, prefix, batch.run)
        # What a batch costs (docs/storage.md): one PUT per run file, and no other request
        # about the shard's objects: nothing listed, read or checked, whatever the table holds.
        assert sorted(batch_requests) == sorted(
            ("PUT", f"{prefix}/{f['path']}") for batch in batches for f in batch.run["files"])
        run("compact", "s")
        compacted = consensus.get_compaction("s").run
        check_run_is_what_is_stored(s3_server, bucket, prefix, compacted)
        assert compacted["rows"] == 90  # keys 0-89, tombstones kept (the shard has an order column)
    finally:
        consensus.dispose()
    assert table_from_rows(json.loads(line) for line in run("read", "s").splitlines()) == expected


def test_a_quarantining_batch_on_s3_writes_its_rejects_from_the_executors(s3_server, s3_root, tmp_path, capsys):
    """Rejects go where Spark's JSON writer cannot reach on a stock PySpark: each task writes
    its quarantined records as one JSON Lines object at its final name and reports it; the
    batch commits, and the rejects are readable from the bucket as the batch describes them."""
    landing = str(tmp_path / "landing")
    write_segment(landing, "p0", 0, [{"id": i, "v": "a", "ts": 1} for i in range(40)])
    expected = oracle_table(landing, order_by="ts", delete_marker="deleted")
    bad_lines = ['{"id": "seven", "v": "x", "ts": 3}', "not json at all"]
    with open(f"{landing}/p0/1.jsonl", "w") as handle:
        handle.write("\n".join(bad_lines) + "\n" + json.dumps({"id": 99, "v": "z", "ts": 2}) + "\n")
    expected[(99,)] = {"id": 99, "v": "z", "ts": 2}
    url, run, bucket, prefix = shard_on_s3(capsys, tmp_path, s3_root, landing, 2)
    run("run-batch", "s", "--on-bad-record", "quarantine")
    assert table_from_rows(json.loads(line) for line in run("read", "s").splitlines()) == expected

    consensus = open_consensus(url)
    try:
        rejects = consensus.get_batch("s", 0).stats["rejects"]
    finally:
        consensus.dispose()
    assert rejects["rows"] == 2 and rejects["path"].startswith("s/rejects/ts=000000000000/")
    check_run_is_what_is_stored(s3_server, bucket, prefix, rejects)
    quarantined = [json.loads(line) for data in stored_objects(s3_server, bucket, f"{prefix}/{rejects['path']}/").values()
                   for line in data.decode().splitlines()]
    assert sorted((r["file"], r["line"], r["record"]) for r in quarantined) == [
        (f"{landing}/p0/1.jsonl", 1, bad_lines[0]), (f"{landing}/p0/1.jsonl", 2, bad_lines[1])]
    assert all(r["reason"] for r in quarantined)
