"""What every blob store promises the engine, checked on local disk and on an S3 server alike
(moto on loopback): the same calls give the same answers. No Spark."""

from __future__ import annotations

import hashlib
import os
import time

import pytest

from airflow_upsert_provider.engine.blob.files import LocalBlob, open_blob
from airflow_upsert_provider.engine.blob.objects import ObjectBlob


@pytest.fixture(params=["local", "s3"])
def any_blob(request, tmp_path):
    if request.param == "local":
        blob = open_blob(str(tmp_path / "blob"))
        assert isinstance(blob, LocalBlob)
    else:
        blob = open_blob(request.getfixturevalue("s3_root"))
        assert isinstance(blob, ObjectBlob)
    blob.ensure_root()
    blob.check_root()
    return blob


def put(blob, path: str, data: bytes) -> None:
    """Write one file as the engine does: its directories first (nothing to do on S3)."""
    blob.make_dirs(os.path.dirname(path))
    blob.write_file(path, data, sync=True)


def relative(blob, path: str) -> str:
    assert path.startswith(blob.root + "/"), path
    return path[len(blob.root) + 1 :]


def test_write_atomic_then_read_bytes_gives_the_last_content(any_blob):
    path = any_blob.path("shard", "checkpoints", "CATALOG.json")
    any_blob.write_atomic(path, b'{"entries": []}')
    assert any_blob.read_bytes(path) == b'{"entries": []}'
    any_blob.write_atomic(path, b'{"entries": [1]}')
    assert any_blob.read_bytes(path) == b'{"entries": [1]}'
    assert any_blob.size(path) == len(b'{"entries": [1]}')
    # Nothing else was left beside it (no temporary object or file).
    assert any_blob.listdir(any_blob.path("shard", "checkpoints")) == ["CATALOG.json"]


def test_read_bytes_of_a_missing_object_raises_file_not_found(any_blob):
    with pytest.raises(FileNotFoundError):
        any_blob.read_bytes(any_blob.path("nothing", "here"))


def test_checksum_equals_hashlibs_sha256(any_blob):
    # Larger than the chunk an object is hashed in, and not a multiple of it.
    data = os.urandom((1 << 20) * 2 + 12345)
    path = any_blob.path("shard", "runs", "ts=1", "w", "part-0.parquet")
    put(any_blob, path, data)
    assert any_blob.checksum(path) == hashlib.sha256(data).hexdigest()
    assert any_blob.read_bytes(path) == data


def test_walk_files_yields_every_file_in_name_order_with_size_and_last_modified(any_blob):
    started = time.time()
    # "a-b" sorts before "a/..." as a key, after "a" as a name: the walk goes by names.
    contents = {"x/a-b": b"1", "x/a/c/d": b"22", "x/a/b": b"333", "x/a0": b"4444", "x/b": b"", "y/z": b"55555"}
    for name, data in contents.items():
        put(any_blob, any_blob.path(*name.split("/")), data)
    finished = time.time()

    files = list(any_blob.walk_files(any_blob.path("x")))

    assert [relative(any_blob, f.path) for f in files] == ["x/a/b", "x/a/c/d", "x/a-b", "x/a0", "x/b"]
    assert [f.size for f in files] == [3, 2, 1, 4, 0]
    for f in files:
        # Stores keep last-modified times to the second.
        assert started - 1 <= f.mtime <= finished + 1, f
        assert any_blob.mtime(f.path) == pytest.approx(f.mtime, abs=1e-6)
        assert any_blob.size(f.path) == f.size
    assert list(any_blob.walk_files(any_blob.path("missing"))) == []


def test_walk_dirs_yields_every_directory_holding_files_with_a_recent_age(any_blob):
    started = time.time()
    for name in ("g/ts=1/w1/part-0", "g/ts=1/w1/sub/part-1", "g/ts=2/w2/part-0"):
        put(any_blob, any_blob.path(*name.split("/")), b"x")
    finished = time.time()

    dirs = {relative(any_blob, d.path): d.mtime for d in any_blob.walk_dirs(any_blob.path("g"))}

    assert set(dirs) == {"g/ts=1", "g/ts=1/w1", "g/ts=1/w1/sub", "g/ts=2", "g/ts=2/w2"}
    for name, mtime in dirs.items():
        assert started - 1 <= mtime <= finished + 1, name
    assert any_blob.mtime(any_blob.path("g", "ts=1")) >= started - 1


def test_listdir_names_the_entries_one_level_down(any_blob):
    for name in ("d/b", "d/a/x", "d/c/y/z", "d0/q"):
        put(any_blob, any_blob.path(*name.split("/")), b"x")
    assert any_blob.listdir(any_blob.path("d")) == ["a", "b", "c"]
    assert any_blob.listdir(any_blob.path("missing")) == []
    assert any_blob.is_dir(any_blob.path("d", "a"))
    assert not any_blob.is_dir(any_blob.path("d", "b"))
    assert any_blob.exists(any_blob.path("d", "b")) and any_blob.exists(any_blob.path("d", "c"))


def test_delete_tree_removes_everything_below_a_prefix_and_nothing_beside_it(any_blob):
    names = ["runs/1/part-0", "runs/1/sub/part-1", "runs/10/part-0", "runs/1x", "runs/2/part-0"]
    for name in names:
        put(any_blob, any_blob.path(*name.split("/")), b"x")

    any_blob.delete_tree(any_blob.path("runs", "1"))

    remaining = sorted(relative(any_blob, f.path) for f in any_blob.walk_files(any_blob.path("runs")))
    assert remaining == ["runs/10/part-0", "runs/1x", "runs/2/part-0"]
    assert not any_blob.exists(any_blob.path("runs", "1", "part-0"))
    assert not any_blob.exists(any_blob.path("runs", "1"))
    assert "1" not in any_blob.listdir(any_blob.path("runs"))
    # Deleting what is not there is no error.
    any_blob.delete_tree(any_blob.path("runs", "1"))
    any_blob.delete_tree(any_blob.path("never"))


def test_missing_objects_do_not_exist_have_no_mtime_and_no_size(any_blob):
    missing = any_blob.path("shard", "runs", "nothing")
    assert not any_blob.exists(missing)
    assert not any_blob.is_dir(missing)
    assert any_blob.mtime(missing) is None
    with pytest.raises(FileNotFoundError):
        any_blob.size(missing)
    any_blob.delete_file(missing)  # no error


def test_delete_file_removes_one_object(any_blob):
    keep, gone = any_blob.path("d", "keep"), any_blob.path("d", "gone")
    put(any_blob, keep, b"k")
    put(any_blob, gone, b"g")
    any_blob.delete_file(gone)
    assert not any_blob.exists(gone)
    assert [relative(any_blob, f.path) for f in any_blob.walk_files(any_blob.path("d"))] == ["d/keep"]


def test_a_listing_of_more_than_a_thousand_objects_is_complete(any_blob):
    # S3 answers a listing 1,000 keys a page: a walk that followed only the first page would
    # miss the rest.
    names = [f"f{i:05d}" for i in range(1005)]
    for name in names:
        put(any_blob, any_blob.path("many", "level", name), b"")

    assert [os.path.basename(f.path) for f in any_blob.walk_files(any_blob.path("many"))] == names
    assert any_blob.listdir(any_blob.path("many", "level")) == names
    assert len(list(any_blob.walk_dirs(any_blob.path("many")))) == 1


@pytest.mark.parametrize("store", [LocalBlob, ObjectBlob])
def test_both_stores_offer_every_method_of_the_blob_protocol_with_its_parameters(store):
    import inspect

    from airflow_upsert_provider.engine.blob.interface import Blob

    for name, member in vars(Blob).items():
        if name.startswith("_") or not callable(member):
            continue
        wanted = [(p.name, p.kind) for p in inspect.signature(member).parameters.values()]
        offered = [(p.name, p.kind) for p in inspect.signature(getattr(store, name)).parameters.values()]
        assert offered == wanted, f"{store.__name__}.{name}"


@pytest.mark.parametrize("blob", [LocalBlob("/srv/blob"), ObjectBlob("s3://lake/shards")], ids=["local", "s3"])
def test_path_arithmetic_gives_the_same_relative_paths_on_every_store(blob):
    """Paths recorded in consensus are relative to the root and '/'-separated on every store;
    the engine derives them, and parents and names, only through the blob. No I/O."""
    directory = blob.path("orders", "runs", "ts=000000000001", "w-0123")
    path = blob.join(directory, "_bucket=0", "part-0.parquet")
    assert path == blob.path("orders", "runs", "ts=000000000001", "w-0123", "_bucket=0", "part-0.parquet")
    assert blob.relative(path) == "orders/runs/ts=000000000001/w-0123/_bucket=0/part-0.parquet"
    assert blob.path(blob.relative(path)) == path
    assert blob.name(path) == "part-0.parquet"
    assert blob.parent(blob.parent(path)) == directory
    assert blob.relative(blob.root) == ""
    # A sibling of the root sharing its first characters is not below it.
    for outside in (blob.root + "0/orders/x", blob.parent(blob.root) + "/other/x"):
        with pytest.raises(ValueError, match="not below the blob root"):
            blob.relative(outside)
