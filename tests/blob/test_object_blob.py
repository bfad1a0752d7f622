"""What is particular to a blob on object storage (an S3 server on loopback): the requests an
operation costs, prefixes and their ages, pyarrow's directory markers, no rename."""

from __future__ import annotations

import pytest

from airflow_upsert_provider.engine.blob.files import open_blob


def writes(requests):
    return [r for r in requests if r[0] in ("PUT", "POST", "DELETE")]


def lists(requests):
    return [r for r in requests if r[0] == "GET" and "list-type=2" in r[1]]


def test_write_atomic_is_one_put_and_nothing_else(s3_server, s3_root):
    blob = open_blob(s3_root)
    path = blob.path("shard", "checkpoints", "CATALOG.json")
    before = len(s3_server.requests())
    blob.write_atomic(path, b"{}")
    issued = s3_server.requests()[before:]
    bucket = s3_root.split("/")[2]
    assert issued == [("PUT", f"/{bucket}/shards/shard/checkpoints/CATALOG.json")]
    assert s3_server.keys(bucket) == ["shards/shard/checkpoints/CATALOG.json"]


def test_durability_calls_send_no_request(s3_server, s3_root):
    blob = open_blob(s3_root)
    path = blob.path("shard", "runs", "ts=1", "w", "part-0")
    blob.write_file(path, b"x", sync=True)
    before = len(s3_server.requests())
    blob.make_dirs(blob.path("shard", "runs", "ts=2"))
    blob.mkdir(blob.path("shard", "runs", "ts=3"))
    blob.sync_written([path])
    blob.sync_file(path)
    blob.fsync_dir(blob.path("shard", "runs"))
    blob.rmdir(blob.path("shard", "runs", "ts=1"))
    assert s3_server.requests()[before:] == []
    assert blob.read_bytes(path) == b"x"


def test_rename_is_refused(s3_root):
    blob = open_blob(s3_root)
    blob.write_file(blob.path("a"), b"x", sync=True)
    with pytest.raises(NotImplementedError, match="object storage has no rename"):
        blob.rename(blob.path("a"), blob.path("b"))
    assert blob.read_bytes(blob.path("a")) == b"x"


def test_walks_list_one_level_at_a_time_and_follow_every_page(s3_server, s3_root):
    blob = open_blob(s3_root)
    for i in range(1003):
        blob.write_file(blob.path("big", "level", f"f{i:05d}"), b"", sync=True)
    blob.write_file(blob.path("big", "top"), b"", sync=True)
    before = len(s3_server.requests())

    assert len(list(blob.walk_files(blob.path("big")))) == 1004

    listed = lists(s3_server.requests()[before:])
    # A delimiter listing per prefix, never one recursive listing of the whole tree.
    assert all("delimiter=" in query for _, query in listed), listed
    # The level of 1,003 keys took a second page.
    assert any("continuation-token=" in query for _, query in listed), listed


def test_a_prefix_is_as_old_as_the_newest_object_below_it(s3_root):
    blob = open_blob(s3_root)
    for name in ("g/ts=1/w1/part-0", "g/ts=1/w1/sub/part-1", "g/ts=1/w2/part-0", "g/ts=2/w3/part-0"):
        blob.write_file(blob.path(*name.split("/")), b"x", sync=True)
    files = list(blob.walk_files(blob.path("g")))

    for prefix in blob.walk_dirs(blob.path("g")):
        below = [f.mtime for f in files if f.path.startswith(prefix.path + "/")]
        assert below and prefix.mtime == max(below), prefix
        assert blob.mtime(prefix.path) == prefix.mtime


def test_a_prefix_whose_objects_were_deleted_has_no_age(s3_server, s3_root):
    blob = open_blob(s3_root)
    bucket = s3_root.split("/")[2]
    blob.write_file(blob.path("runs", "ts=1", "w", "part-0"), b"x", sync=True)
    blob.write_file(blob.path("runs", "ts=2", "w", "part-0"), b"x", sync=True)

    blob.delete_tree(blob.path("runs", "ts=1", "w"))

    # PyArrow leaves a directory marker behind its deletion (apache/arrow#36275) ...
    assert "shards/runs/ts=1/" in s3_server.keys(bucket)
    # ... which is no file, and gives the prefix no age: GC sees nothing to keep young there.
    assert [f.path for f in blob.walk_files(blob.path("runs"))] == [blob.path("runs", "ts=2", "w", "part-0")]
    assert {d.path for d in blob.walk_dirs(blob.path("runs"))} == {blob.path("runs", "ts=2"),
                                                                   blob.path("runs", "ts=2", "w")}
    assert blob.mtime(blob.path("runs", "ts=1")) is None
    assert blob.listdir(blob.path("runs", "ts=1")) == []


def test_delete_tree_removes_the_markers_below_the_prefix(s3_server, s3_root):
    blob = open_blob(s3_root)
    bucket = s3_root.split("/")[2]
    blob.write_file(blob.path("ckpt", "c1", "a"), b"x", sync=True)
    blob.write_file(blob.path("ckpt", "c1", "sub", "b"), b"x", sync=True)
    blob.delete_file(blob.path("ckpt", "c1", "sub", "b"))  # leaves the marker ckpt/c1/sub/
    blob.write_file(blob.path("ckpt", "c10", "a"), b"x", sync=True)

    blob.delete_tree(blob.path("ckpt", "c1"))

    assert not [k for k in s3_server.keys(bucket) if k.startswith("shards/ckpt/c1/")]
    assert "shards/ckpt/c10/a" in s3_server.keys(bucket)


def test_paths_are_uris_below_the_root(s3_root):
    blob = open_blob(s3_root + "/")
    assert blob.root == s3_root
    assert blob.path("a", "b/c", "d") == f"{s3_root}/a/b/c/d"
    assert blob.path() == s3_root
