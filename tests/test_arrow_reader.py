"""The Arrow reader without Spark (engine/table/arrow_reader.py): the engine's merge rule on
runs written with pyarrow, bounded memory, damaged files, object storage and the
``read --format parquet|arrow`` command. No Spark is started in this module."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_upsert_provider.engine.config import ShardConfig
from airflow_upsert_provider.engine.errors import ConfigurationError, IntegrityError
from airflow_upsert_provider.engine.table import arrow_reader
from airflow_upsert_provider.engine.table.arrow_reader import bucket_groups, merge_bucket, read_table
from airflow_upsert_provider.engine.table.shard import Shard
from tests.arrow_runs import (
    arrow_run_schema,
    arrow_table,
    commit_batch,
    compact_batches,
    expected_table,
)
from tests.conftest import sqlite_only
from tests.helpers import make_shard, run_cli


def random_rows(rng: random.Random, keys: int, count: int, *, order: bool) -> list[dict]:
    """Change rows of one batch, one per key as a batch's run holds them: order values from a
    small range (ties across batches), some null, some tombstones."""
    rows = []
    for key in rng.sample(range(keys), min(count, keys)):
        deleted = rng.random() < 0.2
        rows.append({
            "id": key,
            "name": None if deleted else f"n{key}-{rng.randrange(100)}",
            "amount": None if deleted else float(rng.randrange(1000)),
            "updated_at": (None if rng.random() < 0.15 else rng.randrange(4)) if order else rng.randrange(4),
            "_deleted": deleted,
        })
    return rows


def commit_random_batches(shard, rng: random.Random, batches: int, *, keys: int, rows: int) -> list[dict]:
    """``batches`` batches of ``rows`` random rows over ``keys`` keys (with order values),
    committed in turn: every row written, stamped with its batch's ``_ts``."""
    history = []
    for _ in range(batches):
        written = random_rows(rng, keys, rows, order=True)
        ts = commit_batch(shard, written)
        history += [{**r, "_ts": ts} for r in written]
    return history


def build_history(shard: Shard, rng: random.Random, *, batches: int, keys: int) -> list[dict]:
    """Commit ``batches`` random batches (some empty), compacting at random points; every row
    committed, with its ``_ts``."""
    history: list[dict] = []
    order = shard.config.order_by is not None
    for _ in range(batches):
        rows = [] if rng.random() < 0.1 else random_rows(rng, keys, rng.randrange(1, keys + 1), order=order)
        ts = commit_batch(shard, rows)
        history += [{**r, "_ts": ts} for r in rows]
        state = shard.state()
        if rng.random() < 0.3 and state.upper > state.since:
            compact_batches(shard, history, rng.randrange(state.since + 1, state.upper + 1))
    return history


@sqlite_only
@pytest.mark.parametrize("seed", range(8))
def test_random_histories_read_as_the_engine_merges(consensus, blob, tmp_path, seed):
    """Every as_of from since to upper: the engine's rule (order value, null lowest, then
    batch ts; tombstones removed), whatever the compactions, with and without an order column."""
    rng = random.Random(seed)
    order_by = "updated_at" if seed % 4 else None
    shard = make_shard(consensus, blob, tmp_path, buckets=rng.choice([1, 3, 5]), order_by=order_by)
    history = build_history(shard, rng, batches=rng.randrange(3, 9), keys=rng.randrange(4, 40))
    state = shard.state()
    for as_of in range(state.since, state.upper + 1):
        got = arrow_table(read_table(shard, as_of, batch_rows=rng.choice([1, 7, 1000])))
        assert got == expected_table(shard.config, history, as_of), f"seed {seed}, as_of {as_of}"


def test_merge_ranks_nan_above_numbers_and_null_below(tmp_path):
    """A floating order column: NaN wins over every number and null loses to every value, as
    Spark orders them; equal order values go to the later batch."""
    from pyspark.sql.types import BooleanType, DoubleType, LongType, StructField, StructType

    schema = StructType([StructField("id", LongType()), StructField("score", DoubleType()),
                         StructField("deleted", BooleanType())])
    config = ShardConfig(source=f"dir:{tmp_path}", keys=("id",), schema=schema.json(), order_by="score",
                         delete_marker="deleted", buckets=1)
    nan = float("nan")
    rows = pa.Table.from_pylist([
        {"id": 1, "score": 5.0, "_deleted": False, "_ts": 0},
        {"id": 1, "score": nan, "_deleted": False, "_ts": 1},
        {"id": 1, "score": 9.0, "_deleted": False, "_ts": 2},
        {"id": 2, "score": None, "_deleted": False, "_ts": 3},
        {"id": 2, "score": -1.0, "_deleted": False, "_ts": 0},
        {"id": 3, "score": 2.0, "_deleted": False, "_ts": 0},
        {"id": 3, "score": 2.0, "_deleted": True, "_ts": 1},
        {"id": 4, "score": 2.0, "_deleted": True, "_ts": 0},
        {"id": 4, "score": 2.0, "_deleted": False, "_ts": 1},
    ], schema=arrow_run_schema(config))
    out = merge_bucket(rows, config, ["id", "score"]).to_pylist()
    assert [r["id"] for r in out] == [1, 2, 4]
    assert out[0]["score"] != out[0]["score"]  # NaN
    assert out[1:] == [{"id": 2, "score": -1.0}, {"id": 4, "score": 2.0}]


def test_bucket_groups_by_directory_else_one_group():
    files = [{"path": f"s/runs/ts=1/w/_bucket={b}/part-{i}.parquet"} for b, i in [(2, 0), (10, 1), (2, 2)]]
    assert [(b, [f["path"][-14:] for f in g]) for b, g in bucket_groups(files)] == [
        (2, ["part-0.parquet", "part-2.parquet"]), (10, ["part-1.parquet"])
    ]
    odd = files + [{"path": "s/runs/ts=2/w/part-9.parquet"}]
    assert bucket_groups(odd) == [(None, odd)]
    assert bucket_groups([]) == []


@sqlite_only
def test_columns_are_chosen_and_checked(consensus, blob, tmp_path):
    shard = make_shard(consensus, blob, tmp_path, buckets=2)
    commit_batch(shard, [{"id": 1, "name": "a", "amount": 1.0, "updated_at": 1, "_deleted": False}])
    assert read_table(shard, columns=["amount", "id"]).read_all().to_pylist() == [{"amount": 1.0, "id": 1}]
    assert read_table(shard).schema.names == ["id", "name", "amount", "updated_at"]
    with pytest.raises(ConfigurationError, match="unknown column 'deleted'") as raised:
        read_table(shard, columns=["id", "deleted"])
    assert raised.value.details["field"] == "columns"
    with pytest.raises(ConfigurationError, match="upper is 1"):
        read_table(shard, as_of=2)


@sqlite_only
@pytest.mark.parametrize("seed", range(3))
def test_a_filter_keeps_the_merged_rows_that_satisfy_it(consensus, blob, tmp_path, seed):
    """The filter applies to the table, never to the runs: a key whose older version
    satisfies it but whose current one does not is left out (a filter before the merge would
    bring the older version back). Filters may name columns that are not returned."""
    import pyarrow.compute as pc

    rng = random.Random(seed)
    shard = make_shard(consensus, blob, tmp_path, buckets=3)
    history = build_history(shard, rng, batches=6, keys=30)
    state = shard.state()
    for as_of in range(state.since, state.upper + 1):
        expected = expected_table(shard.config, history, as_of)
        got = arrow_table(read_table(shard, as_of, filter=pc.field("amount") >= 500))
        assert got == {k: r for k, r in expected.items() if r["amount"] is not None and r["amount"] >= 500}, as_of
        names = arrow_table(read_table(shard, as_of, columns=["id", "name"], filter=pc.field("updated_at") == 2))
        assert names == {k: {"id": r["id"], "name": r["name"]} for k, r in expected.items() if r["updated_at"] == 2}
    # The case a filter before the merge gets wrong, made certain: key 1's old row matches.
    commit_batch(shard, [{"id": 1, "name": "old", "amount": 900.0, "updated_at": 1000, "_deleted": False}])
    commit_batch(shard, [{"id": 1, "name": "new", "amount": 1.0, "updated_at": 1001, "_deleted": False}])
    assert (1,) not in arrow_table(read_table(shard, filter=pc.field("amount") >= 500))


@sqlite_only
def test_a_filter_that_does_not_apply_is_refused_naming_it(consensus, blob, tmp_path):
    import pyarrow.compute as pc

    shard = make_shard(consensus, blob, tmp_path, buckets=2)
    commit_batch(shard, [{"id": 1, "name": "a", "amount": 1.0, "updated_at": 1, "_deleted": False}])
    for bad, words in [(pc.field("price") > 1, "price"), (pc.field("amount") + 1, "amount"),
                       ("amount > 1", "not a str")]:
        with pytest.raises(ConfigurationError, match="filter") as raised:
            read_table(shard, filter=bad)
        assert words in str(raised.value) and raised.value.details["field"] == "filter"


@sqlite_only
def test_memory_holds_one_bucket_at_a_time(consensus, blob, tmp_path, monkeypatch):
    """The reader reads the files of one bucket, hands out that bucket's rows, and only then
    reads the next bucket: what it has read and not yet handed out is never more than one
    bucket's rows, and the bytes pyarrow holds stay within a few buckets, far below the table."""
    buckets = 16
    shard = make_shard(consensus, blob, tmp_path, buckets=buckets)
    rng = random.Random(7)
    history = commit_random_batches(shard, rng, 3, keys=20_000, rows=20_000)
    bucket_rows = {b: sum(1 for r in history if r["id"] % buckets == b) for b in range(buckets)}

    events: list[tuple[str, int, int]] = []
    allocated: list[int] = []
    real_read = arrow_reader._read_run_file

    def observed_read(root, listed, schema):
        bucket = int(listed["path"].split("_bucket=")[1].split("/")[0])
        batches = list(real_read(root, listed, schema))
        events.append(("read", bucket, sum(b.num_rows for b in batches)))
        allocated.append(pa.total_allocated_bytes())
        return iter(batches)

    monkeypatch.setattr(arrow_reader, "_read_run_file", observed_read)
    baseline = pa.total_allocated_bytes()
    reader = read_table(shard, batch_rows=500)
    out_rows = 0
    while True:
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            break
        ids = batch.column("id").to_pylist()
        assert len({i % buckets for i in ids}) == 1, "a batch mixes buckets"
        events.append(("out", ids[0] % buckets, batch.num_rows))
        out_rows += batch.num_rows
        allocated.append(pa.total_allocated_bytes())
        del batch

    assert out_rows == len(expected_table(shard.config, history, 3))
    # Reads and outputs alternate bucket by bucket, in bucket order: read all of b, hand out b.
    seen = [(kind, bucket) for kind, bucket, _ in events]
    collapsed = [step for i, step in enumerate(seen) if i == 0 or step != seen[i - 1]]
    assert collapsed == [step for b in range(buckets) for step in (("read", b), ("out", b))]
    # Rows read and not yet handed out never exceed one bucket's rows of the live runs.
    for b in range(buckets):
        assert sum(n for kind, bucket, n in events if kind == "read" and bucket == b) == bucket_rows[b]
    # Bytes pyarrow holds at the peak: a few of the largest bucket's decoded rows (read, ranked,
    # merged), a fraction of the whole table's.
    decoded = {b: 0 for b in range(buckets)}
    for run in shard.live_runs():
        for f in run["files"]:
            decoded[int(f["path"].split("_bucket=")[1].split("/")[0])] += pq.read_table(blob.path(f["path"])).nbytes
    peak = max(allocated) - baseline
    assert peak <= 3 * max(decoded.values()) and peak < sum(decoded.values()) / 4, (peak, decoded)


@sqlite_only
def test_a_damaged_run_file_is_an_integrity_error_naming_it(consensus, blob, tmp_path):
    shard = make_shard(consensus, blob, tmp_path, buckets=2)
    commit_batch(shard, [{"id": i, "name": "a", "amount": 1.0, "updated_at": 1, "_deleted": False} for i in range(6)])
    victim = blob.path(shard.live_runs()[0]["files"][1]["path"])
    with open(victim, "r+b") as handle:
        handle.truncate(os.path.getsize(victim) - 9)  # the footer is gone
    reader = read_table(shard)  # present: the read starts
    with pytest.raises(IntegrityError, match="damaged") as raised:
        reader.read_all()
    assert raised.value.details["file"] == victim
    assert victim in raised.value.message and "size" in raised.value.message
    assert raised.value.details["shard"] == "orders"


@sqlite_only
def test_a_missing_run_file_is_refused_before_reading(consensus, blob, tmp_path):
    shard = make_shard(consensus, blob, tmp_path, buckets=2)
    commit_batch(shard, [{"id": i, "name": "a", "amount": 1.0, "updated_at": 1, "_deleted": False} for i in range(4)])
    victim = blob.path(shard.live_runs()[0]["files"][0]["path"])
    os.unlink(victim)
    with pytest.raises(IntegrityError, match="missing") as raised:
        read_table(shard)
    assert raised.value.details["file"] == victim


def test_reads_from_store_urls_on_object_storage(s3_root, tmp_path):
    """Consensus URL + blob root + shard id, no Airflow and no Spark: runs on an S3 store."""
    from airflow_upsert_provider import read_table_from_store
    from airflow_upsert_provider.engine.blob.files import open_blob
    from airflow_upsert_provider.engine.store.registry import open_consensus

    url = f"sqlite:///{tmp_path / 'c.db'}"
    consensus, s3_blob = open_consensus(url), open_blob(s3_root)
    try:
        shard = make_shard(consensus, s3_blob, tmp_path, buckets=3)
        rng = random.Random(3)
        history = commit_random_batches(shard, rng, 3, keys=30, rows=20)
    finally:
        consensus.dispose()
    for as_of in (1, 3):
        got = arrow_table(read_table_from_store(url, s3_root, "orders", as_of=as_of))
        assert got == expected_table(shard.config, history, as_of)
    with pytest.raises(Exception, match="unknown shard 'nope'"):
        read_table_from_store(url, s3_root, "nope")


@sqlite_only
def test_a_read_on_object_storage_asks_for_no_head_per_file_and_explains_a_missing_file_after(
        consensus, s3_root, s3_server, tmp_path):
    """What a read costs the store: the GETs of the files it reads, no HEAD per listed file
    before reading (nor when opening one: the state records each file's size). A file that is
    gone fails the read, which then names it."""
    from airflow_upsert_provider.engine.blob.files import open_blob

    s3_blob = open_blob(s3_root)
    shard = make_shard(consensus, s3_blob, tmp_path, buckets=4)
    history = commit_random_batches(shard, random.Random(4), 3, keys=200, rows=120)
    files = [f["path"] for run in shard.live_runs() for f in run["files"]]
    assert len(files) == 12

    def run_file_requests(since: int) -> list[tuple[str, str]]:
        return [(method, path) for method, path in s3_server.requests()[since:] if "/runs/" in path]

    before = len(s3_server.requests())
    assert arrow_table(read_table(shard)) == expected_table(shard.config, history, 3)
    requests = run_file_requests(before)
    assert [r for r in requests if r[0] == "HEAD"] == []
    assert {path for _, path in requests} == {f"/{s3_root.split('/')[2]}/shards/{f}" for f in files}

    victim = sorted(files)[-1]  # the last bucket's: the read starts, then fails on it
    s3_server.client().delete_object(Bucket=s3_root.split("/")[2], Key=f"shards/{victim}")
    with pytest.raises(IntegrityError, match="is missing") as raised:
        read_table(shard).read_all()
    assert raised.value.details["file"] == s3_blob.path(victim) and raised.value.exit_code == 4


def test_importing_the_package_imports_neither_pyarrow_nor_pyspark():
    code = ("import sys, airflow_upsert_provider as m; assert callable(m.__getattr__); "
            "print(json.dumps(sorted(n for n in ('pyarrow', 'pyspark') if n in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", "import json; " + code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


# -- upsertctl read --format parquet|arrow ------------------------------------------------


@pytest.fixture
def cli_shard(tmp_path, monkeypatch):
    """A shard with three batches and a compaction in a store `upsertctl` (in this process)
    uses; Spark refused for the command's duration."""
    from airflow_upsert_provider.cli.context import Context
    from tests.helpers import cli_store

    consensus, cli_blob = cli_store(tmp_path, monkeypatch, f"sqlite:///{tmp_path / 'c.db'}")
    shard = make_shard(consensus, cli_blob, tmp_path, buckets=4)
    rng = random.Random(5)
    history = commit_random_batches(shard, rng, 3, keys=50, rows=40)
    compact_batches(shard, history, 1)

    def no_spark(self):
        raise AssertionError("read --format parquet|arrow started Spark")

    monkeypatch.setattr(Context, "spark", no_spark)
    yield shard, history
    consensus.dispose()


def test_read_writes_parquet_and_arrow_without_spark(cli_shard, capsys, tmp_path):
    shard, history = cli_shard
    parquet_path, arrow_path = tmp_path / "t.parquet", tmp_path / "t.arrow"
    code, out, err = run_cli(capsys, "read", "orders", "--format", "parquet", "--out", str(parquet_path))
    assert (code, out) == (0, ""), err
    code, _, err = run_cli(capsys, "read", "orders", "--as-of", "2", "--format", "arrow", "--out", str(arrow_path))
    assert code == 0, err

    # What another engine sees: pyarrow's Parquet and dataset scans, and an Arrow IPC file.
    import pyarrow.dataset as ds

    parquet = pq.read_table(parquet_path)
    assert parquet.schema.names == ["id", "name", "amount", "updated_at"]
    expected = expected_table(shard.config, history, 3)
    assert {(r["id"],): r for r in parquet.to_pylist()} == expected and parquet.num_rows == len(expected)
    scanned = ds.dataset(str(parquet_path)).to_table(filter=ds.field("amount") > 500, columns=["id"])
    assert sorted(scanned.column("id").to_pylist()) == sorted(
        k[0] for k, r in expected.items() if r["amount"] is not None and r["amount"] > 500
    )
    with pa.ipc.open_file(arrow_path) as arrow_file:
        assert arrow_table(arrow_file) == expected_table(shard.config, history, 2)
    # DuckDB scans the file directly, as docs/readers.md shows.
    import duckdb

    [(counted,)] = duckdb.sql(f"SELECT count(*) FROM read_parquet('{parquet_path}') WHERE amount > 500").fetchall()
    assert counted == sum(1 for r in expected.values() if r["amount"] is not None and r["amount"] > 500)
    rows = duckdb.sql(f"SELECT id, name, amount, updated_at FROM '{parquet_path}'").fetchall()
    assert {(row[0],): dict(zip(("id", "name", "amount", "updated_at"), row)) for row in rows} == expected
    # And Polars scans both files lazily, as docs/readers.md shows.
    import polars as pl

    ids = pl.scan_parquet(str(parquet_path)).filter(pl.col("amount") > 500).select("id").collect()
    assert sorted(ids["id"].to_list()) == sorted(scanned.column("id").to_pylist())
    as_of_2 = expected_table(shard.config, history, 2)
    sums = pl.scan_ipc(str(arrow_path)).group_by("name").agg(pl.col("amount").sum()).collect()
    expected_sums: dict = {}
    for r in as_of_2.values():
        expected_sums[r["name"]] = expected_sums.get(r["name"], 0.0) + (r["amount"] or 0.0)
    assert {row["name"]: row["amount"] for row in sums.to_dicts()} == pytest.approx(expected_sums)
    assert sorted(os.listdir(tmp_path)) == sorted({"blob", "c.db", "landing", "t.arrow", "t.parquet"})


def test_read_parquet_needs_out_and_leaves_nothing_on_failure(cli_shard, capsys, tmp_path):
    shard, _ = cli_shard
    code, out, err = run_cli(capsys, "read", "orders", "--format", "parquet")
    assert code == 2 and "give --out PATH" in err
    victim = shard.blob.path(shard.live_runs()[-1]["files"][0]["path"])
    with open(victim, "r+b") as handle:
        handle.seek(0)
        handle.write(b"garbage!" * 8)  # same size, its first pages broken
    target = tmp_path / "t.parquet"
    code, out, err = run_cli(capsys, "read", "orders", "--format", "parquet", "--out", str(target))
    assert code == 4 and victim in err and "checksum mismatch" in err
    assert not target.exists() and not [n for n in os.listdir(tmp_path) if n.startswith(".t.parquet")]
