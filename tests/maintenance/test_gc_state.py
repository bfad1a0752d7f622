"""GC from state (``collect_garbage(sweep=False)``) on a real store and blob, without Spark:
runs written with pyarrow in the writers' layout and committed through the engine's commit
API (tests/arrow_runs.py). What it deletes, what it keeps pending, its crash points, and the
requests it sends on the S3 server as the history grows."""

from __future__ import annotations

import collections
import json
import os
import random

import pytest

from airflow_upsert_provider.engine.blob.files import open_blob
from airflow_upsert_provider.engine.maintenance.checkpoint import create_checkpoint
from airflow_upsert_provider.engine.maintenance.gc import collect_garbage
from airflow_upsert_provider.engine.maintenance.gc_plan import PINNED, REPLACED_IN_GRACE
from airflow_upsert_provider.engine.store.gc_claims import replacements_of
from airflow_upsert_provider.engine.table.arrow_reader import read_table
from tests.arrow_runs import arrow_table, commit_batch, compact_batches, expected_table
from tests.conftest import sqlite_only
from tests.helpers import make_shard
from tests.maintenance.support import age_compaction, age_files
from tests.s3server import REQUEST_KINDS, request_kind

GRACE = 600


def rows(rng: random.Random, ts: int) -> list[dict]:
    return [
        {"id": rng.randrange(40), "name": f"n{ts}", "amount": float(ts), "updated_at": ts, "_deleted": rng.random() < 0.1}
        for _ in range(6)
    ]


def commit(shard, rng: random.Random, history: list[dict], batches: int) -> None:
    for _ in range(batches):
        ts = shard.state().upper
        written = rows(rng, ts)
        commit_batch(shard, written)
        history += [{**r, "_ts": ts} for r in written]


def replaced_runs(shard) -> set[str]:
    return {path for path, _ in replacements_of(shard.consensus, shard.shard_id)}


def live_files(shard) -> list[str]:
    return [f["path"] for run in shard.live_runs() for f in run["files"]]


def assert_intact(shard, history: list[dict]) -> None:
    """Every live file is on the blob and the table reads as the history says."""
    missing = [p for p in live_files(shard) if not shard.blob.exists(shard.blob.path(p))]
    assert missing == []
    upper = shard.state().upper
    assert arrow_table(read_table(shard)) == expected_table(shard.config, history, upper)


def compacted_shard(consensus, blob, tmp_path, *, batches: int = 6, since: int = 4, shard_id: str = "orders"):
    """A shard of ``batches`` batches compacted to ``since``, every file and the compaction
    older than the grace period, and an old staged directory of a writer that never committed."""
    shard = make_shard(consensus, blob, tmp_path, shard_id=shard_id, buckets=2)
    rng, history = random.Random(7), []
    commit(shard, rng, history, batches)
    before = {b.run["path"] for b in shard.batches(below=since)}
    compact_batches(shard, history, since)
    orphan = blob.path(shard_id, "runs", f"ts={batches:012d}", "w-failed", "_bucket=0", "part-00000.parquet")
    blob.make_dirs(blob.parent(orphan))
    blob.write_file(orphan, b"staged by a writer that died", sync=False)
    age_files(blob.root)
    age_compaction(consensus, shard_id)
    return shard, history, before, orphan


def test_gc_from_state_deletes_the_replaced_runs_and_leaves_orphans_to_the_sweep(consensus, blob, tmp_path):
    shard, history, replaced, orphan = compacted_shard(consensus, blob, tmp_path)
    assert replaced_runs(shard) == replaced and len(replaced) == 4

    planned = collect_garbage(consensus, blob, "orders", grace_seconds=GRACE, dry_run=True, sweep=False)
    assert {i.path for i in planned.items} == replaced and planned.files == 8 and planned.bytes > 0
    assert all(os.path.isdir(blob.path(p)) for p in replaced) and replaced_runs(shard) == replaced

    report = collect_garbage(consensus, blob, "orders", grace_seconds=GRACE, sweep=False)
    assert {i.path for i in report.items} == replaced and report.to_dict()["deleted"]["files"] == 8
    assert not any(os.path.exists(blob.path(p)) for p in replaced)
    assert replaced_runs(shard) == set()  # handled: the next GC has nothing to read
    assert os.path.exists(orphan)  # no listing: an orphan waits for the sweep
    assert_intact(shard, history)

    again = collect_garbage(consensus, blob, "orders", grace_seconds=GRACE, sweep=False)
    assert again.items == [] and again.pending == {}
    swept = collect_garbage(consensus, blob, "orders", grace_seconds=GRACE, sweep=True)
    assert [i.path for i in swept.items] == [blob.relative(os.path.dirname(os.path.dirname(orphan)))]
    assert not os.path.exists(orphan)
    assert_intact(shard, history)


def test_replaced_runs_in_grace_or_pinned_by_a_checkpoint_stay_recorded_until_free(consensus, blob, tmp_path):
    shard = make_shard(consensus, blob, tmp_path, buckets=2)
    rng, history = random.Random(3), []
    commit(shard, rng, history, 3)
    create_checkpoint(shard)
    pinned = {b.run["path"] for b in shard.batches(below=3)}
    compact_batches(shard, history, 3)
    commit(shard, rng, history, 2)
    compact_batches(shard, history, 5)
    young = {b.run["path"] for b in shard.batches(below=5)} - pinned
    age_files(blob.root)

    # The second compaction is inside the grace period: its replacements wait, as do pinned ones.
    report = collect_garbage(consensus, blob, "orders", grace_seconds=GRACE, sweep=False)
    first_output = {p for p in replaced_runs(shard) if "/since=" in p}
    assert report.pending == {PINNED: len(pinned), REPLACED_IN_GRACE: len(young | first_output)}
    assert report.items == [] and replaced_runs(shard) == pinned | young | first_output
    age_compaction(consensus, "orders")
    report = collect_garbage(consensus, blob, "orders", grace_seconds=GRACE, sweep=False)
    assert {i.path for i in report.items} == young | first_output and report.pending == {PINNED: len(pinned)}
    assert all(os.path.isdir(blob.path(p)) for p in pinned) and replaced_runs(shard) == pinned
    assert_intact(shard, history)

    # Retention drops the checkpoint: the next GC finds the runs it pinned free.
    create_checkpoint(shard, keep_last=1)
    report = collect_garbage(consensus, blob, "orders", grace_seconds=GRACE, sweep=False)
    assert {i.path for i in report.items} == pinned and replaced_runs(shard) == set()
    assert not any(os.path.exists(blob.path(p)) for p in pinned)
    assert_intact(shard, history)


class Crash(Exception):
    pass


def crash_at(name: str):
    def on_step(step: str) -> None:
        if step == name:
            raise Crash(step)
    return on_step


@pytest.mark.parametrize("step", ["checkpoints", "claimed", "deleting", "deleted", "truncating"])
def test_a_gc_from_state_that_stops_at_any_step_leaves_the_next_one_to_finish(consensus, blob, tmp_path, step):
    shard, history, replaced, _ = compacted_shard(consensus, blob, tmp_path)
    with pytest.raises(Crash):
        collect_garbage(consensus, blob, "orders", grace_seconds=GRACE, sweep=False, on_step=crash_at(step))
    assert_intact(shard, history)
    gone = {p for p in replaced if not os.path.exists(blob.path(p))}
    assert gone == (replaced if step in ("deleted", "truncating") else set())
    # Nothing is forgotten before it is gone: a row for every replaced run still on disk.
    assert replaced - gone <= replaced_runs(shard)
    assert replaced_runs(shard) == (set() if step == "truncating" else replaced)

    report = collect_garbage(consensus, blob, "orders", grace_seconds=GRACE, sweep=False)
    assert {i.path for i in report.items} == (set() if step == "truncating" else replaced)
    assert not any(os.path.exists(blob.path(p)) for p in replaced) and replaced_runs(shard) == set()
    assert_intact(shard, history)


def test_a_sweep_that_stops_midway_through_its_deletions_is_finished_by_the_next(consensus, blob, tmp_path):
    from airflow_upsert_provider.engine.blob.files import LocalBlob

    class StopsAfterOneDeletion(LocalBlob):
        deletions = 0

        def delete_tree(self, path: str) -> None:
            if self.deletions == 1:
                raise Crash(path)
            self.deletions += 1
            super().delete_tree(path)

    shard, history, replaced, orphan = compacted_shard(consensus, blob, tmp_path)
    crashing = StopsAfterOneDeletion(blob.root)
    with pytest.raises(Crash):
        collect_garbage(consensus, crashing, "orders", grace_seconds=GRACE, sweep=True)
    gone = {p for p in replaced if not os.path.exists(blob.path(p))}
    assert len(gone) + (not os.path.exists(orphan)) == 1  # one directory went, then it stopped
    assert replaced - gone <= replaced_runs(shard)
    assert_intact(shard, history)

    collect_garbage(consensus, blob, "orders", grace_seconds=GRACE, sweep=True)
    assert not any(os.path.exists(blob.path(p)) for p in replaced) and not os.path.exists(orphan)
    assert replaced_runs(shard) == set()
    assert_intact(shard, history)


def gc_requests(s3_server, consensus, blob, shard_id: str, *, sweep: bool) -> tuple[dict[str, int], int]:
    """The requests of one GC by kind, and how many groups' markers it removed."""
    before = len(s3_server.requests())
    report = collect_garbage(consensus, blob, shard_id, grace_seconds=GRACE, sweep=sweep)
    assert len(report.items) == 5, report.to_dict()  # four batches and the compaction they replaced
    counts = collections.Counter(request_kind(m, t) for m, t in s3_server.requests()[before:])
    return {kind: counts.get(kind, 0) for kind in REQUEST_KINDS}, report.groups_removed


@sqlite_only
def test_on_s3_gc_from_state_sends_as_many_requests_after_a_long_history_as_after_a_short_one(
        consensus, s3_server, s3_root, tmp_path):
    """The same garbage (four batches and a compacted run) after 4 and after 24 earlier batches, each
    earlier block compacted and collected: GC from state sends the same requests, and so does
    a sweep, whose one flat listing of the shard is a request per page of keys, not one per
    ``ts=`` prefix the history left. The sweep also removes, once, the directory markers the
    earlier GCs from state left below the upper (one per deleted run's group): a HEAD, a LIST,
    a DELETE and a PUT each, so beyond those its requests are the same too (the groups its own
    garbage empties it deletes whole, at the cost of deleting their run directories)."""
    requests: dict[tuple[int, bool], dict[str, int]] = {}
    markers: dict[tuple[int, bool], int] = {}
    for earlier in (4, 24):
        for sweep in (False, True):
            bucket = s3_server.create_bucket()  # one shard per bucket: the root lists alike
            s3_blob = open_blob(f"s3://{bucket}/upsert")
            shard_id = f"h{earlier}-{'sweep' if sweep else 'state'}"
            shard = make_shard(consensus, s3_blob, tmp_path / shard_id, shard_id=shard_id, buckets=2)
            rng, history = random.Random(earlier), []
            for block in range(earlier // 4):
                commit(shard, rng, history, 4)
                compact_batches(shard, history, shard.state().upper)
                s3_server.age(bucket, seconds=3 * 3600)
                age_compaction(consensus, shard_id)
                collect_garbage(consensus, s3_blob, shard_id, grace_seconds=GRACE, sweep=False)
            commit(shard, rng, history, 4)
            compact_batches(shard, history, shard.state().upper)
            s3_server.age(bucket, seconds=3 * 3600)
            age_compaction(consensus, shard_id)
            requests[earlier, sweep], markers[earlier, sweep] = gc_requests(
                s3_server, consensus, s3_blob, shard_id, sweep=sweep)
            assert_intact(shard, history)
    assert requests[24, False] == requests[4, False], requests
    # The sweep deletes whole the 5 groups its garbage empties (no marker left behind), and the
    # groups of the markers the earlier GCs from state left: 4 ts= per earlier block of 4
    # batches, and a since= per compacted run replaced before the last. GC from state removes none.
    assert (markers[4, False], markers[4, True], markers[24, False], markers[24, True]) == (0, 9, 0, 34), markers
    assert {kind: requests[24, True][kind] - requests[4, True][kind] for kind in REQUEST_KINDS} == {
        "PUT": 25, "GET": 0, "LIST": 25, "DELETE": 25, "HEAD": 25, "other": 0}, requests
    # No HEAD per listed object: beyond the one per marker-only group removed, no more than GC from state.
    assert requests[4, True]["HEAD"] - (markers[4, True] - 5) <= requests[4, False]["HEAD"], requests


def marker_keys(s3_server, bucket: str, prefix: str) -> set[str]:
    """The directory marker keys (``…/``) below ``prefix``, relative to it."""
    return {k[len(prefix):] for k in s3_server.keys(bucket, prefix) if k.endswith("/")}


@sqlite_only
def test_on_s3_a_sweep_removes_the_markers_below_the_upper_and_none_a_racing_writer_uses(
        consensus, s3_server, s3_root, tmp_path):
    """GC from state leaves a ``ts=`` marker per deleted run (apache/arrow#36275). The sweep
    removes those of groups below the upper that hold nothing. Racing it after its listing: a
    commit of batch 4 into a group the listing showed empty (so below the upper GC then
    reads, but referenced), and a writer staging into the group at the new upper: both kept,
    as are markers above the upper."""
    bucket = s3_server.create_bucket()
    s3_blob = open_blob(f"s3://{bucket}/upsert")
    shard = make_shard(consensus, s3_blob, tmp_path, shard_id="marked", buckets=1)
    rng, history = random.Random(11), []
    commit(shard, rng, history, 4)
    compact_batches(shard, history, 4)
    s3_server.age(bucket, seconds=3 * 3600)
    age_compaction(consensus, "marked")
    recorded = {b.run["path"]: b.run["files"] for b in shard.batches(below=4)}
    before = len(s3_server.requests())
    report = collect_garbage(consensus, s3_blob, "marked", grace_seconds=GRACE, sweep=False)
    # Each run's files and bytes come from its batch row: the one LIST naming a run's prefix
    # is the deletion's own.
    assert {(i.path, i.files, i.bytes) for i in report.items} == {
        (path, len(files), sum(f["bytes"] for f in files)) for path, files in recorded.items()}
    listed = collections.Counter(
        target.partition("prefix=")[2].split("&")[0] for method, target in s3_server.requests()[before:]
        if request_kind(method, target) == "LIST")
    assert {path: listed[f"upsert%2F{path.replace('/', '%2F').replace('=', '%3D')}%2F"] for path in recorded} == {
        path: 1 for path in recorded}, listed
    runs = "upsert/marked/runs/"
    # Markers a writer of batches 4, 5 and 6 left (a staged file written, then deleted).
    for ts in (4, 5, 6):
        staged = s3_blob.path("marked", "runs", f"ts={ts:012d}", "w-gone", "_bucket=0", "part-00000.parquet")
        s3_blob.write_file(staged, b"x", sync=True)
        s3_blob.delete_tree(s3_blob.parent(s3_blob.parent(staged)))
    assert marker_keys(s3_server, bucket, runs) == {f"ts={ts:012d}/" for ts in range(7)}
    racer = s3_blob.path("marked", "runs", f"ts={5:012d}", "w-racer", "_bucket=0", "part-00000.parquet")

    def race(step: str) -> None:
        if step == "listed":
            commit(shard, rng, history, 1)  # batch 4, into the group ts=4: upper 5
            s3_blob.write_file(racer, b"staging", sync=True)  # a writer of batch 5

    report = collect_garbage(consensus, s3_blob, "marked", grace_seconds=GRACE, sweep=True, on_step=race)

    assert report.groups_removed == 4, report.to_dict()
    assert marker_keys(s3_server, bucket, runs) >= {f"ts={ts:012d}/" for ts in (4, 5, 6)}
    assert not marker_keys(s3_server, bucket, runs) & {f"ts={ts:012d}/" for ts in range(4)}
    assert s3_blob.read_bytes(racer) == b"staging"
    assert_intact(shard, history)
    # Nothing left to remove: the next sweep lists no marker below the upper but ts=4's, which
    # holds batch 4's run.
    assert collect_garbage(consensus, s3_blob, "marked", grace_seconds=GRACE, sweep=True).groups_removed == 0


@sqlite_only
def test_upsertctl_gc_no_sweep_deletes_the_replaced_runs_and_reports_what_stays(
        consensus, consensus_url, blob, tmp_path, monkeypatch, capsys):
    from tests.helpers import run_cli

    shard, history, replaced, orphan = compacted_shard(consensus, blob, tmp_path)
    monkeypatch.setenv("UPSERT_CONSENSUS_URL", consensus_url)
    monkeypatch.setenv("UPSERT_BLOB_ROOT", blob.root)
    code, out, err = run_cli(capsys, "gc", "orders", "--no-sweep", "--grace", str(GRACE), "--json")
    assert code == 0, err
    report = json.loads(out)
    assert (report["swept"], report["deleted"]["items"], report["deleted"]["files"]) == (False, 4, 8)
    assert sorted(i["path"] for i in report["items"]) == sorted(replaced) and os.path.exists(orphan)
    code, out, err = run_cli(capsys, "gc", "orders", "--grace", str(GRACE))  # the default sweeps
    assert code == 0, err
    assert any(line.startswith("deleted run orders/runs/ts=000000000006/w-failed") for line in out.splitlines())
    assert not os.path.exists(orphan)
    assert_intact(shard, history)
