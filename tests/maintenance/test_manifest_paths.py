"""Blob paths a checkpoint manifest records are checked when it is parsed: an absolute one
or one that climbs out of the blob root is corruption naming the manifest and the field."""

from __future__ import annotations

import copy
import json
import random

import pytest

from airflow_upsert_provider.engine.maintenance.checkpoint_catalog import (
    FORMAT,
    MANIFEST_NAME,
    CheckpointCorrupt,
    checkpoint_path,
)
from airflow_upsert_provider.engine.maintenance.checkpoint_manifest import (
    blob_path_problem,
    manifest_paths,
    read_manifest,
)

GOOD = "orders/runs/ts=000000000003/w-1a2b/bucket=0/part-0.parquet"


def _manifest(checkpoint_id: str) -> dict:
    run = {"path": "orders/runs/ts=000000000000/w-1", "files": [{"path": GOOD, "bytes": 10, "sha256": "ab"}]}
    return {
        "format": FORMAT,
        "checkpoint": checkpoint_id,
        "shard": "orders",
        "files": [{"path": GOOD, "bytes": 10, "sha256": "ab"}],
        "batches": [{"ts": 0, "run": run, "stats": {"rejects": {"path": "orders/rejects/ts=000000000000/w-1"}}}],
        "compaction": {"since": 1, "run": copy.deepcopy(run), "compacted_at": 0.0},
    }


def test_a_relative_path_below_the_root_is_accepted_and_every_escape_is_refused():
    rng = random.Random(34)
    parts = ["orders", "runs", "ts=000000000001", "w-1", "bucket=0", "part-0.parquet", "a.b", "..x", "x.."]
    for _ in range(500):
        path = "/".join(rng.choice(parts) for _ in range(rng.randint(1, 6)))
        assert blob_path_problem(path) is None, path
        # Every way out of the root, wherever it sits in the path, is refused.
        pieces = path.split("/")
        at = rng.randint(0, len(pieces))
        for bad in ("..", ".", ""):
            assert blob_path_problem("/".join(pieces[:at] + [bad] + pieces[at:])) is not None
        for absolute in ("/" + path, "\\" + path, "C:/" + path, "s3://bucket/" + path, path.replace("/", "\\") + "\\x"):
            assert blob_path_problem(absolute) is not None, absolute
    for not_a_path in (None, 3, "", ["a"]):
        assert blob_path_problem(not_a_path) is not None


def test_manifest_paths_names_every_path_field():
    fields = dict(manifest_paths(_manifest("c1")))
    assert set(fields) == {
        "files[0].path", "batches[0].run.path", "batches[0].run.files[0].path",
        "batches[0].stats.rejects.path", "compaction.run.path", "compaction.run.files[0].path",
    }


@pytest.mark.parametrize("field", ["files", "batch_run", "batch_file", "rejects", "compaction"])
@pytest.mark.parametrize("bad", ["../../../etc/passwd", "/etc/passwd", "orders/../../outside/x.parquet"])
def test_a_manifest_with_a_path_out_of_the_blob_root_is_corrupt_naming_manifest_and_field(blob, field, bad):
    manifest = _manifest("c1")
    where = {
        "files": (lambda m: m["files"][0], "files[0].path"),
        "batch_run": (lambda m: m["batches"][0]["run"], "batches[0].run.path"),
        "batch_file": (lambda m: m["batches"][0]["run"]["files"][0], "batches[0].run.files[0].path"),
        "rejects": (lambda m: m["batches"][0]["stats"]["rejects"], "batches[0].stats.rejects.path"),
        "compaction": (lambda m: m["compaction"]["run"], "compaction.run.path"),
    }
    pick, name = where[field]
    pick(manifest)["path"] = bad
    path = checkpoint_path(blob, "orders", "c1", MANIFEST_NAME)
    blob.make_dirs(blob.parent(path))
    blob.write_atomic(path, json.dumps(manifest).encode())
    with pytest.raises(CheckpointCorrupt) as caught:
        read_manifest(blob, "orders", "c1")
    assert caught.value.details["file"] == path
    assert path in caught.value.message and name in caught.value.message and repr(bad) in caught.value.message
    assert caught.value.exit_code == 4


def test_a_manifest_of_paths_below_the_root_parses(blob):
    path = checkpoint_path(blob, "orders", "c1", MANIFEST_NAME)
    blob.make_dirs(blob.parent(path))
    blob.write_atomic(path, json.dumps(_manifest("c1")).encode())
    assert read_manifest(blob, "orders", "c1")["files"][0]["path"] == GOOD
