"""``Blob.list_tree``: every file and directory below a path from one listing. On object
storage the prefixes are derived from one flat listing (``prefixes_of``) and must be what a
walk of the prefixes yields, dated by their newest object, with no request per prefix (the GC
sweep plans on it, issue 35 item 3). Pure sweeps and the S3 server; no Spark."""

from __future__ import annotations

import random

from airflow_upsert_provider.engine.blob.interface import BlobFile, prefixes_of
from tests.blob.test_blob_contract import any_blob, put, relative  # noqa: F401 - the fixture
from tests.s3server import request_kind


def walked_prefixes(files: list[BlobFile], base: str) -> dict[str, float]:
    """The oracle: every ancestor directory of every file, below ``base``, with its newest mtime."""
    ages: dict[str, float] = {}
    for f in files:
        parent = f.path.rsplit("/", 1)[0]
        while parent != base:
            ages[parent] = max(ages.get(parent, f.mtime), f.mtime)
            parent = parent.rsplit("/", 1)[0]
    return ages


def test_prefixes_of_a_flat_listing_are_every_ancestor_dated_by_its_newest_file():
    rng = random.Random(35)
    for _ in range(2000):
        base = rng.choice(["s3://b/root/shard", "/tmp/x/shard"])
        files = [BlobFile(f"{base}/" + "/".join(rng.choice("abc") for _ in range(rng.randrange(1, 5)))
                          + f"/f{i}", 1, float(rng.randrange(100))) for i in range(rng.randrange(0, 12))]
        derived = prefixes_of(files, base + rng.choice(["", "/"]))
        assert {d.path: d.mtime for d in derived} == walked_prefixes(files, base)
        assert len(derived) == len({d.path for d in derived})
        # Deepest first: a prefix comes after everything below it.
        depths = [d.path.count("/") for d in derived]
        assert depths == sorted(depths, reverse=True)


def test_list_tree_holds_the_walks_files_and_directories(any_blob):  # noqa: F811
    for name in ("s/runs/ts=1/w/_bucket=0/part-0.parquet", "s/runs/ts=1/w/_bucket=1/part-0.parquet",
                 "s/runs/since=2/c/_bucket=0/part-0.parquet", "s/checkpoints/c1/MANIFEST.json", "s/OWNER.json"):
        put(any_blob, any_blob.path(*name.split("/")), b"xy")
    tree = any_blob.list_tree(any_blob.path("s"))
    assert sorted((f.path, f.size) for f in tree.files) == sorted(
        (f.path, f.size) for f in any_blob.walk_files(any_blob.path("s")))
    walked = {relative(any_blob, d.path): d.mtime for d in any_blob.walk_dirs(any_blob.path("s"))}
    assert {relative(any_blob, d.path): d.mtime for d in tree.dirs} == walked
    assert "s/runs/ts=1/w/_bucket=1" in walked and "s/checkpoints/c1" in walked


def test_on_s3_list_tree_is_one_request_per_page_however_many_prefixes(s3_root, s3_server):
    from airflow_upsert_provider.engine.blob.files import open_blob

    blob = open_blob(s3_root)
    client, bucket, prefix = s3_server.client(), s3_root.split("/")[2], s3_root.split("/", 3)[3]
    for i in range(300):  # 300 run directories under 300 ts= groups: one page
        client.put_object(Bucket=bucket, Key=f"{prefix}/s/runs/ts={i:03d}/w/_bucket=0/part-0.parquet", Body=b"x")
    before = len(s3_server.requests())
    tree = blob.list_tree(blob.path("s"))
    assert [request_kind(m, t) for m, t in s3_server.requests()[before:]] == ["LIST"]
    assert len(tree.files) == 300 and len(tree.dirs) == 1 + 300 * 3  # runs/, ts=, w, _bucket=0
