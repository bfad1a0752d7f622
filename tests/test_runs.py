"""The run format (engine/table/runs.py): ordering across batches, durability before commit,
missing files, and the one snapshot reads are planned on. Real Spark, SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
import json
import os
import random

import pytest

from airflow_upsert_provider.engine.blob.files import LocalBlob
from airflow_upsert_provider.engine.maintenance.compaction import compact
from airflow_upsert_provider.engine.config import ShardConfig
from airflow_upsert_provider.engine.errors import IntegrityError
from airflow_upsert_provider.engine.table.shard import Shard
from airflow_upsert_provider.engine.write.writer import Writer
from tests.conftest import sqlite_only
from tests.maintenance.crashfs import CrashingBlob
from tests.oracle import oracle_table, table_from_rows

SCHEMA = json.dumps(
    {
        "type": "struct",
        "fields": [
            {"name": "id", "type": "long", "nullable": True, "metadata": {}},
            {"name": "v", "type": "string", "nullable": True, "metadata": {}},
            {"name": "ts", "type": "long", "nullable": True, "metadata": {}},
            {"name": "deleted", "type": "boolean", "nullable": True, "metadata": {}},
        ],
    }
)


def write_segment(landing: str, partition: str, seq: int, records: list[dict]) -> None:
    os.makedirs(os.path.join(landing, partition), exist_ok=True)
    with open(os.path.join(landing, partition, f"{seq}.jsonl"), "w") as handle:
        handle.writelines(json.dumps(r) + "\n" for r in records)


def new_shard(consensus, blob, landing: str, shard_id: str, **overrides) -> Shard:
    values = dict(
        source=f"dir:{landing}", keys=("id",), schema=SCHEMA, order_by="ts", delete_marker="deleted",
        buckets=2, max_files_per_batch=64,
    )
    values.update(overrides)
    return Shard.create(consensus, blob, shard_id, ShardConfig(**values))


def run_all(spark, shard: Shard, **writer_args) -> None:
    Writer(shard, "w", spark_factory=lambda: spark, **writer_args).run(until_caught_up=True, with_lag=False)


def table(spark, shard: Shard) -> dict:
    return table_from_rows(shard.read(spark).collect())


# -- the order column wins across batches (issue 7 item 9, finding D19) --------------------


@sqlite_only
def test_order_column_wins_across_batches(spark, consensus, blob, tmp_path):
    """ts=9 in segment 0, ts=5 in segment 1: ts=9 wins whether one batch holds both or not."""
    landing = str(tmp_path / "landing")
    write_segment(landing, "p0", 0, [{"id": 7, "v": "new", "ts": 9}])
    write_segment(landing, "p0", 1, [{"id": 7, "v": "old", "ts": 5}])
    one = new_shard(consensus, blob, landing, "one")
    split = new_shard(consensus, blob, landing, "split", max_files_per_batch=1)
    run_all(spark, one)
    run_all(spark, split)
    assert split.state().upper == 2
    expected = {(7,): {"id": 7, "v": "new", "ts": 9}}
    assert table(spark, one) == table(spark, split) == expected


@sqlite_only
def test_a_tombstone_with_a_higher_order_value_survives_compaction(spark, consensus, blob, tmp_path):
    """A delete at ts=9, compacted away from its batch, still beats a later record at ts=5."""
    landing = str(tmp_path / "landing")
    write_segment(landing, "p0", 0, [{"id": 1, "v": "a", "ts": 1}, {"id": 2, "v": "b", "ts": 1}])
    write_segment(landing, "p0", 1, [{"id": 1, "v": "gone", "ts": 9, "deleted": True}])
    write_segment(landing, "p0", 2, [{"id": 1, "v": "late", "ts": 5}, {"id": 2, "v": "c", "ts": None}])
    shard = new_shard(consensus, blob, landing, "s", max_files_per_batch=1)
    Writer(shard, "w", spark_factory=lambda: spark).run(max_batches=2, with_lag=False)
    assert compact(spark, shard).since == 2
    run_all(spark, shard)
    # id 2: a null order value ranks below every value, so ts=1 stays.
    assert table(spark, shard) == {(2,): {"id": 2, "v": "b", "ts": 1}}


def test_without_an_order_column_compaction_drops_tombstones(spark, sqlite_url, tmp_path):
    from airflow_upsert_provider.engine.store.registry import open_consensus

    consensus = open_consensus(sqlite_url)
    blob = LocalBlob(str(tmp_path / "blob"))
    blob.ensure_root()
    landing = str(tmp_path / "landing")
    write_segment(landing, "p0", 0, [{"id": 1, "v": "a", "ts": 9}, {"id": 2, "v": "b", "ts": 1}])
    write_segment(landing, "p0", 1, [{"id": 1, "ts": 1, "deleted": True}])
    write_segment(landing, "p0", 2, [{"id": 2, "v": "c", "ts": 0}])
    shard = new_shard(consensus, blob, landing, "s", order_by=None, max_files_per_batch=1)
    run_all(spark, shard)
    compact(spark, shard)
    run = consensus.get_compaction("s").run
    rows = spark.read.parquet(*[blob.path(f["path"]) for f in run["files"]])
    assert rows.where("_deleted").count() == 0 and run["rows"] == 1
    # The latest batch wins: the delete hides ts=9, and "c" replaces "b".
    assert table(spark, shard) == {(2,): {"id": 2, "v": "c", "ts": 0}}
    consensus.dispose()


def random_source(landing: str, rng: random.Random, *, partitions: int, segments: int, keys: int,
                  key_per_partition: bool) -> None:
    """Random upserts and deletes. With ``key_per_partition`` a key lives in one partition
    (as Kafka places keys) and order values repeat and may be null; otherwise a key spreads
    over partitions and each of its order values is unique (see docs/overlap.md: ties of
    one key across partitions follow the order batches were cut in)."""
    used: dict[int, set] = {}
    for p in range(partitions):
        for seq in range(segments):
            records = []
            for _ in range(rng.randint(0, 6)):
                if key_per_partition:
                    key = rng.randrange(keys) * partitions + p
                    order = rng.choice([None, 0, 1, 2, 3])
                else:
                    key = rng.randrange(keys)
                    order = rng.randrange(1000)
                    while order in used.setdefault(key, set()):
                        order = rng.randrange(1000)
                    used[key].add(order)
                record = {"id": key, "v": f"p{p}-{seq}-{len(records)}", "ts": order}
                if rng.random() < 0.2:
                    record["deleted"] = True
                records.append(record)
            write_segment(landing, f"p{p}", seq, records)


@pytest.mark.parametrize("key_per_partition", [True, False], ids=["kafka-keys", "spread-keys"])
def test_every_batching_gives_the_same_table(spark, sqlite_url, tmp_path, key_per_partition):
    """Random records, batches of 1, 5 and all files, with a compaction half way: every
    batching gives the table of the Python oracle, before and after compacting. (Batches of 2
    files added the same merges again; tests/test_arrow_reader.py checks many more histories
    without Spark.)"""
    from airflow_upsert_provider.engine.store.registry import open_consensus

    consensus = open_consensus(sqlite_url)
    blob = LocalBlob(str(tmp_path / "blob"))
    blob.ensure_root()
    landing = str(tmp_path / "landing")
    random_source(landing, random.Random(7 if key_per_partition else 8), partitions=3, segments=4, keys=6,
                  key_per_partition=key_per_partition)
    expected = oracle_table(landing, order_by="ts", delete_marker="deleted")
    for records in expected.values():
        records.setdefault("ts", None)
    for max_files in (1, 5, 64):
        shard = new_shard(consensus, blob, landing, f"s{max_files}", max_files_per_batch=max_files)
        writer = Writer(shard, "w", spark_factory=lambda: spark)
        writer.run(max_batches=max(1, 6 // max_files), with_lag=False)
        compact(spark, shard)
        run_all(spark, shard)
        assert table(spark, shard) == expected, f"max_files_per_batch={max_files}"
        compact(spark, shard)
        assert table(spark, shard) == expected, f"max_files_per_batch={max_files}, compacted"
    consensus.dispose()


@sqlite_only
def test_a_batch_of_empty_segments_commits_an_empty_run(spark, consensus, blob, tmp_path):
    """Empty segment files (a producer that rolled a file without writing) bind and commit."""
    landing = str(tmp_path / "landing")
    write_segment(landing, "p0", 0, [])
    write_segment(landing, "p0", 1, [{"id": 1, "v": "a", "ts": 1}])
    shard = new_shard(consensus, blob, landing, "s", max_files_per_batch=1)
    run_all(spark, shard)
    assert shard.state().upper == 2 and consensus.get_batch("s", 0).run["files"] == []
    assert table(spark, shard) == {(1,): {"id": 1, "v": "a", "ts": 1}}


@sqlite_only
def test_a_run_carries_its_batch_ts_and_a_new_ts_compiles_no_code(spark, consensus, blob, tmp_path):
    """Every row of a batch's run holds the batch's ts; and the next batches of the same shape
    compile no class of generated code: the ts reaches that code by reference (a long literal
    would be compiled into it, and every batch would compile its last stage again)."""
    import pyarrow.parquet as pq

    landing = str(tmp_path / "landing")
    os.makedirs(landing)
    # Three buckets, which no other test here uses: a shape this session has not compiled.
    shard = new_shard(consensus, blob, landing, "s", max_files_per_batch=1, buckets=3)
    compilations = spark._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()
    writer = Writer(shard, "w", spark_factory=lambda: spark)
    compiled = []
    for seq in range(3):
        write_segment(landing, "p0", seq, [{"id": i, "v": f"v{seq}", "ts": seq, "deleted": False} for i in range(40)])
        before = compilations.getCount()
        assert writer.step().outcome == "committed"
        compiled.append(compilations.getCount() - before)
    assert compiled[1:] == [0, 0], compiled  # the first may compile what this session had not run yet
    for ts in range(3):
        files = consensus.get_batch("s", ts).run["files"]
        stamps = set()
        for f in files:
            stamps |= set(pq.read_table(blob.path(f["path"]), columns=["_ts"]).column("_ts").to_pylist())
        assert files and stamps == {ts}


# -- a committed run file deleted (finding F5) -----------------------------------------------


@sqlite_only
def test_a_missing_run_file_is_an_integrity_error_naming_it(spark, consensus, blob, tmp_path):
    landing = str(tmp_path / "landing")
    write_segment(landing, "p0", 0, [{"id": i, "v": "a", "ts": 1} for i in range(20)])
    write_segment(landing, "p0", 1, [{"id": i, "v": "b", "ts": 2} for i in range(10)])
    shard = new_shard(consensus, blob, landing, "s", max_files_per_batch=1)
    run_all(spark, shard)
    lost = blob.path(consensus.get_batch("s", 0).run["files"][0]["path"])
    os.unlink(lost)
    for action in (lambda: shard.read(spark).collect(), lambda: shard.status(spark), lambda: compact(spark, shard)):
        with pytest.raises(IntegrityError, match="missing") as caught:
            action()
        assert caught.value.exit_code == 4
        assert lost in caught.value.message and caught.value.details["file"] == lost
    assert shard.state().since == 0


def test_upsertctl_exits_4_naming_a_deleted_run_file(spark, tmp_path, monkeypatch, capsys):
    from airflow_upsert_provider import cli
    from airflow_upsert_provider.engine.store.registry import open_consensus

    url = f"sqlite:///{tmp_path / 'c.db'}"
    monkeypatch.setenv("UPSERT_CONSENSUS_URL", url)
    monkeypatch.setenv("UPSERT_BLOB_ROOT", str(tmp_path / "blob"))
    landing = str(tmp_path / "landing")
    write_segment(landing, "p0", 0, [{"id": i, "v": "a", "ts": 1} for i in range(20)])
    assert cli.main(["init", "s", "--source", f"dir:{landing}", "--key", "id", "--order-by", "ts",
                     "--schema", "id BIGINT, v STRING, ts BIGINT"]) == 0
    assert cli.main(["run-batch", "s"]) == 0
    consensus = open_consensus(url)
    lost = os.path.join(str(tmp_path / "blob"), consensus.get_batch("s", 0).run["files"][0]["path"])
    consensus.dispose()
    os.unlink(lost)
    capsys.readouterr()
    for command in (["read", "s"], ["status", "s"], ["compact", "s"]):
        assert cli.main(command) == 4, command
        out, err = capsys.readouterr()
        assert lost in out + err and "Traceback" not in out + err, command


# -- data fsynced before the commit that names it (issue 7 item 3, invariant 17) ------------


@sqlite_only
def test_every_file_a_commit_names_is_synced_with_its_directories_first(spark, consensus, tmp_path):
    os.makedirs(tmp_path / "blob")
    blob = CrashingBlob(str(tmp_path / "blob"), str(tmp_path / "stash"))
    landing = str(tmp_path / "landing")
    write_segment(landing, "p0", 0, [{"id": i, "v": "a", "ts": 1} for i in range(30)])
    with open(os.path.join(landing, "p0", "1.jsonl"), "w") as handle:
        handle.write('{"id": 1, "v": "b", "ts": 2}\n{"id": 2,\n')
    shard = new_shard(consensus, blob, landing, "s", max_files_per_batch=1)

    commits = []
    real_append, real_swap = consensus.compare_and_append, consensus.compare_and_set_since

    def append(shard_id, expected, new, batch, **fencing):
        commits.append((len(blob.ops), batch.run, (batch.stats or {}).get("rejects")))
        return real_append(shard_id, expected, new, batch, **fencing)

    def swap(shard_id, expected, new, run):
        commits.append((len(blob.ops), run, None))
        return real_swap(shard_id, expected, new, run)

    consensus.compare_and_append, consensus.compare_and_set_since = append, swap
    run_all(spark, shard, on_bad_record="quarantine")
    compact(spark, shard)
    assert len(commits) == 3

    set_aside = 0
    for at, run, rejects in commits:
        synced_before = blob.ops[:at]
        files = [blob.path(f["path"]) for f in run["files"]]
        if rejects:
            directory = blob.path(rejects["path"])
            files += [
                os.path.join(d, name) for d, _, names in os.walk(directory) for name in names
                if not name.startswith((".", "_"))
            ]
            set_aside += 1
        assert files
        for path in files:
            assert ("fsync", path) in synced_before, path
            directory = os.path.dirname(path)
            while directory != os.path.dirname(blob.root):
                assert ("fsync_dir", directory) in synced_before, directory
                directory = os.path.dirname(directory)
    assert set_aside == 1, "the bad record was set aside in a rejects file"


def test_checksum_is_sha256(tmp_path):
    blob = LocalBlob(str(tmp_path))
    path = str(tmp_path / "f")
    data = os.urandom(3 << 20)
    with open(path, "wb") as handle:
        handle.write(data)
    assert blob.checksum(path) == hashlib.sha256(data).hexdigest()


# -- reads are planned on one snapshot (issue 7 item 18) -------------------------------------


def test_live_view_reads_one_snapshot(pg_url):
    """On PostgreSQL a commit landing between the view's SELECTs is not seen half: the
    state row and the batches agree (REPEATABLE READ)."""
    import sqlalchemy as sa

    from airflow_upsert_provider.engine.store import tables as tables_module
    from airflow_upsert_provider.engine.store.records import BatchRecord
    from airflow_upsert_provider.engine.store.registry import open_consensus

    store = open_consensus(pg_url)
    other = open_consensus(pg_url)
    store.create_shard("s", "{}")
    appended = []
    real_select = sa.select

    def select_then_commit(*args, **kwargs):
        # After the view's first SELECT (the state row), a peer commits batch 0.
        if args and args[0] is tables_module.compactions_table and not appended:
            appended.append(other.compare_and_append("s", 0, 1, BatchRecord(0, "w", "t", {"path": "x", "files": []}, {})))
        return real_select(*args, **kwargs)

    sa.select = select_then_commit
    try:
        view = store.live_view("s", as_of=1)
    finally:
        sa.select = real_select
    assert appended and appended[0].outcome.value == "committed"
    # The state said upper 0: the batch committed after it must not be in the same view.
    assert view.record.upper == 0 and view.batches == []
    assert store.live_view("s").record.upper == 1 and len(store.live_view("s").runs) == 1
    store.dispose()
    other.dispose()
