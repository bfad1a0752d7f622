"""``Blob.list_files``: the files below a prefix with their sizes, on local disk and on the S3
server alike; on object storage one flat LIST per page of keys, however many prefixes they
are under (a read's check of its run files, issue 35 item 4). No Spark."""

from __future__ import annotations

import pytest

from tests.blob.test_blob_contract import any_blob, put, relative  # noqa: F401 - the fixture
from tests.s3server import request_kind


def test_list_files_gives_every_file_below_a_prefix_with_its_size_and_nothing_beside_it(any_blob):  # noqa: F811
    contents = {"x/a-b": b"1", "x/a/c/d": b"22", "x/a/b": b"333", "x/a0": b"4444", "x/b": b"", "xy/z": b"55555"}
    for name, data in contents.items():
        put(any_blob, any_blob.path(*name.split("/")), data)

    listed = {relative(any_blob, f.path): f.size for f in any_blob.list_files(any_blob.path("x"))}

    assert listed == {"x/a-b": 1, "x/a/c/d": 2, "x/a/b": 3, "x/a0": 4, "x/b": 0}
    assert listed == {relative(any_blob, f.path): f.size for f in any_blob.walk_files(any_blob.path("x"))}
    assert list(any_blob.list_files(any_blob.path("missing"))) == []


def test_a_flat_listing_on_s3_is_one_request_per_page_whatever_the_prefixes(s3_root, s3_server):
    from airflow_upsert_provider.engine.blob.files import open_blob

    blob = open_blob(s3_root)
    # 1,005 files under 201 prefixes: two pages of keys.
    names = [f"runs/ts={i // 5:03d}/w/part-{i:04d}.parquet" for i in range(1005)]
    client, bucket, prefix = s3_server.client(), s3_root.split("/")[2], s3_root.split("/", 3)[3]
    for name in names:
        client.put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=b"x")
    before = len(s3_server.requests())

    listed = sorted(relative(blob, f.path) for f in blob.list_files(blob.path("runs")))

    assert listed == sorted(names)
    kinds = [request_kind(method, target) for method, target in s3_server.requests()[before:]]
    assert kinds == ["LIST", "LIST"]


@pytest.mark.parametrize("prefix", ["runs", "runs/"])
def test_a_trailing_slash_lists_the_same_files(any_blob, prefix):  # noqa: F811
    put(any_blob, any_blob.path("runs", "a", "f"), b"12")
    listed = [(relative(any_blob, f.path), f.size) for f in any_blob.list_files(any_blob.path(prefix))]
    assert listed == [("runs/a/f", 2)]
