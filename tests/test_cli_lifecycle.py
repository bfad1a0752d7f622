"""`upsertctl stream | recover | source prune`, the stream in `checkpoint restore` and
`run-batch`: JSON shapes, human lines and exit codes (docs/recovery.md).

Most cases need no Spark: the shard is made in the store and its batches committed with
empty runs, which is all the lifecycle, a checkpoint, a prune and a seek look at. One test
runs real batches to show that a stopped shard's table does not move and that the disaster
runbook catches up to the source.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import pytest

from airflow_upsert_provider.engine.store import streams
from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.engine.errors import StreamFenced
from airflow_upsert_provider.engine.maintenance.retention import lowest_bounds, plan_prune, read_log
from airflow_upsert_provider.engine.write.writer import Writer
from airflow_upsert_provider.sample_data import SAMPLE_SCHEMA_DDL, SampleSpec
from tests.helpers import batch, cli_store, landing_env, make_shard
from tests.helpers import run_cli as run
from tests.helpers import run_cli_json as cli
from tests.maintenance.support import tree
from tests.oracle import oracle_table

# Offsets 0, 10, 20, 30 in p0 and p1; two files a batch: batch ts binds offset 10*ts in both.
SPEC = SampleSpec(records=160, keys=40, partitions=2, segments_per_partition=4, seed=5)


@pytest.fixture
def store_shard(tmp_path, monkeypatch, sqlite_url):
    """A shard in a SQLite store that `upsertctl` in this process also uses; no Spark."""
    consensus, blob = cli_store(tmp_path, monkeypatch, sqlite_url)
    shard = make_shard(consensus, blob, tmp_path, spec=SPEC, max_files_per_batch=2)
    yield shard
    consensus.dispose()


def commit(shard, ts: int, epoch: int | None = 0) -> None:
    """Bind batch ``ts`` and commit it with an empty run, as a writer of ``epoch`` would."""
    assert shard.mint_binding(ts, minted_by="test") is not None
    result = shard.compare_and_append(ts, ts + 1, batch(ts, token=f"t{ts}"), epoch=epoch)
    assert result.upper == ts + 1


def history(shard) -> list[tuple[str, str | None, str]]:
    return [(h["action"], h["from"], h["to"]) for h in streams.stream_history(shard.consensus, shard.shard_id)]


STREAM_KEYS = {"shard", "status", "version", "epoch", "seeked_epoch", "seek_position", "changed_by", "changed_at",
               "reason"}
TRANSITION_KEYS = STREAM_KEYS | {"action", "changed", "from"}


def drain_waits(monkeypatch, on_wait) -> list[float]:
    """Replace time.sleep so that the drain's waits (this thread's) are recorded and call
    ``on_wait``; the list of waits is returned. time.sleep is replaced process-wide, and
    another thread's sleep (a connection pool, the JVM's callback server) is not a wait of the
    drain: it sleeps for real and is not counted."""
    waits: list[float] = []
    real_sleep, drain_thread = time.sleep, threading.current_thread()

    def sleep(seconds: float) -> None:
        if threading.current_thread() is not drain_thread:
            return real_sleep(seconds)
        waits.append(seconds)
        on_wait(seconds)

    monkeypatch.setattr(time, "sleep", sleep)
    return waits


def test_stop_status_resume_history(store_shard, capsys):
    code, out, _ = cli(capsys, "stream", "stop", "orders", "--reason", "maintenance", "--actor", "ops")
    assert code == 0 and set(out) == TRANSITION_KEYS | {"finalized", "batch_in_hand"}
    assert (out["action"], out["changed"], out["from"], out["status"]) == ("stop", True, "READY", "STOPPED")
    assert (out["finalized"], out["batch_in_hand"], out["changed_by"], out["reason"]) == (True, False, "ops", "maintenance")

    code, out, _ = cli(capsys, "stream", "status", "orders")
    assert code == 0 and set(out) == STREAM_KEYS and (out["status"], out["epoch"]) == ("STOPPED", 0)
    code, text, _ = run(capsys, "stream", "status", "orders")
    assert code == 0
    assert text.startswith("shard orders: STOPPED (epoch 0), set by ops at 20") and text.rstrip().endswith(": maintenance")

    code, text, _ = run(capsys, "stream", "stop", "orders")
    assert code == 0 and "stop: nothing changed, the stream already was STOPPED" in text
    code, out, _ = cli(capsys, "stream", "resume", "orders", "--reason", "done")
    assert code == 0 and (out["from"], out["status"], out["reason"]) == ("STOPPED", "READY", "done")
    assert out["changed_by"].startswith("upsertctl:") and out["changed_by"].endswith(f":{os.getpid()}")

    code, out, _ = cli(capsys, "stream", "history", "orders")
    assert code == 0 and out["shard"] == "orders"
    assert [(h["action"], h["from"], h["to"], h["reason"]) for h in out["history"]] == [
        ("stop", "READY", "STOPPING", "maintenance"),
        ("finalize", "STOPPING", "STOPPED", "maintenance"),
        ("resume", "STOPPED", "READY", "done"),
    ]
    assert [h["version"] for h in out["history"]] == [1, 2, 3]
    code, out, _ = cli(capsys, "stream", "history", "orders", "--limit", "1")
    assert [h["action"] for h in out["history"]] == ["resume"]
    code, text, _ = run(capsys, "stream", "history", "orders")
    lines = text.splitlines()
    assert len(lines) == 4 and "v1  stop: READY -> STOPPING (epoch 0) by ops: maintenance" in lines[0]
    assert lines[-1] == "3 change(s)"

    code, out, err = cli(capsys, "stream", "history", "orders", "--limit", "0")
    assert code == 2 and out["field"] == "limit" and "--limit takes an integer from 1 to 2**63-1, not '0'" in err
    code, out, _ = cli(capsys, "stream", "status", "nope")
    assert code == 2 and out["error"] == "ShardNotFound"
    code, out, _ = cli(capsys, "stream", "stop", "orders", "--drain", "-1")
    assert code == 2 and out["field"] == "drain"


def test_stop_drains_the_batch_in_hand_and_fences_a_writer_still_working(store_shard, capsys, monkeypatch):
    shard = store_shard
    # A writer holds batch 0 (bound, not committed). The drain's first wait is where it commits.
    shard.mint_binding(0, minted_by="w")

    def writer_commits_while_we_wait(seconds: float) -> None:
        shard.compare_and_append(0, 1, batch(0), epoch=0)

    waits = drain_waits(monkeypatch, writer_commits_while_we_wait)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    code, out, err = cli(capsys, "stream", "stop", "orders", "--drain", "30")
    assert code == 0 and len(waits) == 1
    assert "waiting up to 30s for the batch in hand" in err
    assert (out["status"], out["finalized"], out["batch_in_hand"]) == ("STOPPED", True, False)
    assert shard.state().upper == 1  # the batch in hand committed while STOPPING
    assert history(shard) == [("stop", "READY", "STOPPING"), ("finalize", "STOPPING", "STOPPED")]

    assert cli(capsys, "stream", "resume", "orders")[0] == 0
    code, out, _ = cli(capsys, "stream", "stop", "orders", "--no-wait")
    assert code == 0 and (out["status"], out["finalized"]) == ("STOPPING", False)
    code, text, _ = run(capsys, "stream", "status", "orders")
    assert text.startswith("shard orders: STOPPING (epoch 0)")

    # A writer that started before the stop binds batch 1 and is still working when the
    # drain (0 s) ends: the stop finalizes, and the writer's commit is fenced, nothing lost.
    shard.mint_binding(1, minted_by="w")
    code, text, _ = run(capsys, "stream", "stop", "orders", "--drain", "0")
    assert code == 0 and text.startswith("shard orders: STOPPED (epoch 0)")
    assert "a batch was still in hand when the drain ended: its commit will be fenced" in text
    with pytest.raises(StreamFenced, match="fenced: the stream is STOPPED"):
        shard.compare_and_append(1, 2, batch(1), epoch=0)
    assert shard.state().upper == 1 and shard.binding(1) is not None


def test_recovery_order_is_enforced_with_exit_7(store_shard, capsys):
    shard = store_shard
    commit(shard, 0)
    code, out, _ = cli(capsys, "recover", "begin", "orders", "--reason", "drill", "--actor", "ops")
    assert code == 0 and set(out) == TRANSITION_KEYS | {"next_step"}
    epoch = out["epoch"]
    assert out["status"] == "RECOVERING" and epoch > 10**12  # milliseconds since 1970
    assert out["next_step"] == "upsertctl recover seek orders"

    code, out, err = cli(capsys, "recover", "resume", "orders")
    assert code == 7 and out["error"] == "TransitionRefused" and out["status"] == "RECOVERING"
    assert f"recovery epoch {epoch} has no seek: run recover seek first" in err
    code, out, _ = cli(capsys, "recover", "status", "orders")
    assert code == 0 and set(out) == STREAM_KEYS | {"upper", "recovering", "next_step"}
    assert (out["upper"], out["recovering"], out["next_step"]) == (1, True, "seek")

    code, out, err = cli(capsys, "recover", "seek", "orders", "--epoch", str(epoch - 1))
    assert code == 7 and f"it was asked for epoch {epoch - 1}, but the open recovery is epoch {epoch}" in err
    assert streams.read_stream(shard.consensus, "orders").seeked_epoch is None
    code, out, err = cli(capsys, "run-batch", "orders")
    assert code == 6 and out["error"] == "StreamNotReady" and "RECOVERING" in err

    code, out, _ = cli(capsys, "recover", "seek", "orders", "--epoch", str(epoch))
    assert code == 0 and set(out) == {"shard", "epoch", "upper", "position", "segments_ahead", "checked", "stream",
                                      "next_step"}
    assert (out["epoch"], out["upper"], out["position"]) == (epoch, 1, {"p0": 1, "p1": 1})
    assert out["segments_ahead"] == 6 and out["stream"]["seeked_epoch"] == epoch
    code, text, _ = run(capsys, "recover", "status", "orders")
    assert text.splitlines()[1:] == ["upper: 1", "next: upsertctl recover resume orders"]

    code, out, err = cli(capsys, "recover", "resume", "orders", "--epoch", "7")
    assert code == 7 and f"open recovery is epoch {epoch}" in err
    code, text, _ = run(capsys, "recover", "resume", "orders")
    assert code == 0 and text.startswith(f"shard orders: READY (epoch {epoch}), set by upsertctl:")
    assert text.splitlines()[-1] == "next: upsertctl run-batch orders --until-caught-up"
    code, out, _ = cli(capsys, "recover", "status", "orders")
    assert (out["status"], out["next_step"]) == ("READY", None)
    code, out, err = cli(capsys, "recover", "seek", "orders")
    assert code == 7 and "no recovery is open" in err
    assert [a for a, _, _ in history(shard)] == ["recover begin", "recover seek", "recover resume"]


def test_prune_keeps_what_checkpoints_need_and_a_seek_names_what_it_deleted(store_shard, capsys, tmp_path):
    shard = store_shard
    landing = shard.source.root
    code, out, err = cli(capsys, "source", "prune", "orders")
    assert code == 2 and out["field"] == "below" and "--below committed" in err and "no checkpoint" in err

    commit(shard, 0)
    code, out, _ = cli(capsys, "checkpoint", "create", "orders")
    assert code == 0
    checkpoint_id = out["checkpoint"]["id"]
    commit(shard, 1)
    commit(shard, 2)  # upper 3: offsets 0, 10, 20 committed in both partitions

    before = tree(landing)
    code, out, _ = cli(capsys, "source", "prune", "orders", "--dry-run")
    assert code == 0 and tree(landing) == before
    assert set(out) == {"shard", "below", "dry_run", "checkpoint", "shared_with", "bound", "partitions", "files", "bytes"}
    assert (out["below"], out["dry_run"], out["checkpoint"], out["bound"]) == ("checkpoint", True, checkpoint_id,
                                                                               {"p0": 1, "p1": 1})
    sizes = {p: os.path.getsize(os.path.join(landing, p, "0.jsonl")) for p in ("p0", "p1")}
    assert out["partitions"] == {p: {"bound": 1, "files": 1, "bytes": sizes[p], "kept_unbound": 0,
                                     "deleted": ["0.jsonl"]} for p in ("p0", "p1")}
    assert (out["files"], out["bytes"]) == (2, sum(sizes.values()))

    code, text, _ = run(capsys, "source", "prune", "orders")
    assert code == 0 and f"deleted 1 files, {sizes['p0']} bytes of partition p0 below offset 1" in text
    assert f"below the bound offsets of the oldest retained checkpoint, {checkpoint_id}" in text
    for p in ("p0", "p1"):
        assert sorted(os.listdir(os.path.join(landing, p))) == [".retention.jsonl", "10.jsonl", "20.jsonl", "30.jsonl"]
        assert [(d.offset, d.name) for d in read_log(p, os.path.join(landing, p))] == [(0, "0.jsonl")]

    # Disaster: the store is lost. The checkpoint restores into a new one; since the prune
    # kept what the checkpoint needs, its seek finds everything.
    first_store = f"sqlite:///{tmp_path / 'restored-1.db'}"
    code, text, _ = run(capsys, "checkpoint", "restore", "orders", "--consensus", first_store, "--actor", "ops")
    assert code == 0
    lines = text.splitlines()
    assert lines[0] == f"restored shard orders from checkpoint {checkpoint_id} of shard orders: upper 1, since 0"
    assert lines[1].startswith("shard orders: RECOVERING (epoch ") and "set by ops" in lines[1]
    assert lines[2].startswith("next: upsertctl recover seek orders")
    code, out, _ = cli(capsys, "recover", "seek", "orders", "--consensus", first_store)
    assert code == 0 and out["position"] == {"p0": 1, "p1": 1}

    # The shard prunes what it committed: now a restore of that checkpoint cannot resume.
    code, out, _ = cli(capsys, "source", "prune", "orders", "--below", "committed")
    assert code == 0 and out["bound"] == {"p0": 21, "p1": 21} and out["files"] == 4 and out["checkpoint"] is None
    assert [d.name for d in read_log("p0", os.path.join(landing, "p0"))] == ["0.jsonl", "10.jsonl", "20.jsonl"]
    second_store = f"sqlite:///{tmp_path / 'restored-2.db'}"
    code, out, _ = cli(capsys, "checkpoint", "restore", "orders", checkpoint_id, "--consensus", second_store)
    assert code == 0 and set(out) == {"shard", "checkpoint", "upper", "since", "stream", "next_step"}
    assert (out["stream"]["status"], out["next_step"]) == ("RECOVERING", "upsertctl recover seek orders")
    restored = open_consensus(second_store)
    stream_before = streams.read_stream(restored, "orders")
    code, out, err = cli(capsys, "recover", "seek", "orders", "--consensus", second_store)
    missing = os.path.join(landing, "p0", "10.jsonl")
    assert code == 4 and out["error"] == "SourceSegmentsMissing" and out["missing"][0]["file"] == missing
    assert f"segment {missing}" in err and "nothing was changed" in err
    assert streams.read_stream(restored, "orders") == stream_before
    code, _, err = cli(capsys, "recover", "resume", "orders", "--consensus", second_store)
    assert code == 7 and "run recover seek first" in err
    restored.dispose()

    # A shard of the same store reading the same directory holds a prune back at its bound.
    commit(shard, 3)
    code, out, _ = cli(capsys, "source", "prune", "orders", "--below", "committed", "--dry-run")
    assert out["bound"] == {"p0": 31, "p1": 31} and out["files"] == 2
    assert cli(capsys, "checkpoint", "restore", "orders", checkpoint_id, "--as", "orders_r")[0] == 0
    code, out, _ = cli(capsys, "source", "prune", "orders", "--below", "committed")
    assert code == 0 and out["shared_with"] == ["orders_r"] and out["bound"] == {"p0": 1, "p1": 1}
    assert out["files"] == 0 and os.path.exists(os.path.join(landing, "p0", "30.jsonl"))


def test_prune_plan_deletes_only_bound_segments_below_the_lowest_bound():
    assert lowest_bounds([{"p0": 30, "p1": 20}, {"p0": 10}]) == {"p0": 10, "p1": 0}
    assert lowest_bounds([]) == {}
    segments = {"p0": [(10, "10.jsonl", 5), (0, "0.jsonl", 3), (5, "5.jsonl", 9), (20, "20.jsonl", 1)],
                "p1": [(0, "0.jsonl", 4)]}
    plans = plan_prune({"p0": 20}, segments, {"p0": {"0.jsonl", "10.jsonl", "20.jsonl"}, "p1": {"0.jsonl"}})
    # 5.jsonl lies below the bound but no batch bound it (a late arrival): retention keeps it.
    assert [(p.partition, p.delete, p.kept_unbound, p.bytes) for p in plans] == [
        ("p0", ((0, "0.jsonl", 3), (10, "10.jsonl", 5)), 1, 8),
        ("p1", (), 0, 0),
    ]


def test_lifecycle_commands_on_postgresql(pg_url, tmp_path, capsys, monkeypatch):
    consensus, blob = cli_store(tmp_path, monkeypatch, pg_url)
    shard = make_shard(consensus, blob, tmp_path, spec=SPEC, max_files_per_batch=2)
    commit(shard, 0)
    assert cli(capsys, "stream", "stop", "orders", "--reason", "pg")[1]["status"] == "STOPPED"
    code, out, err = cli(capsys, "run-batch", "orders")
    assert code == 6 and out["status"] == "STOPPED" and "is not READY" in err
    code, out, _ = cli(capsys, "recover", "begin", "orders")
    assert code == 0 and out["from"] == "STOPPED"
    assert cli(capsys, "recover", "resume", "orders")[0] == 7
    assert cli(capsys, "recover", "seek", "orders")[1]["position"] == {"p0": 1, "p1": 1}
    assert cli(capsys, "recover", "resume", "orders")[1]["status"] == "READY"
    code, out, _ = cli(capsys, "stream", "history", "orders")
    assert [h["action"] for h in out["history"]] == ["stop", "finalize", "recover begin", "recover seek",
                                                     "recover resume"]
    consensus.dispose()


def test_run_batch_on_a_stopped_shard_and_the_disaster_runbook(spark, tmp_path, capsys, monkeypatch):
    landing = landing_env(tmp_path, monkeypatch, SPEC)
    url = os.environ["UPSERT_CONSENSUS_URL"]
    code, _, _ = cli(capsys, "init", "orders", "--source", f"dir:{landing}", "--key", "id", "--order-by",
                     "updated_at", "--delete-marker", "deleted", "--max-files-per-batch", "2",
                     "--schema", SAMPLE_SCHEMA_DDL)
    assert code == 0
    assert cli(capsys, "run-batch", "orders", "--writer-id", "w")[1]["upper"] == 1
    assert cli(capsys, "checkpoint", "create", "orders")[0] == 0
    table_at_1 = run(capsys, "read", "orders")[1]

    assert cli(capsys, "stream", "stop", "orders", "--reason", "maintenance", "--actor", "ops")[0] == 0
    code, out, err = cli(capsys, "run-batch", "orders")
    assert code == 6 and out["error"] == "StreamNotReady"
    assert (out["status"], out["changed_by"], out["reason"]) == ("STOPPED", "ops", "maintenance")
    assert "not READY: the stream is STOPPED (epoch 0), set by ops at 20" in err and ": maintenance" in err
    assert cli(capsys, "status", "orders", "--no-rows")[1]["upper"] == 1
    assert run(capsys, "read", "orders")[1] == table_at_1

    # A stop that lands while a run is going: the batch in hand commits, no other starts.
    assert cli(capsys, "stream", "resume", "orders")[0] == 0
    consensus = open_consensus(url)
    step = Writer.step

    def step_then_stop(self):
        result = step(self)
        streams.stop(consensus, "orders", "ops", "deploy")
        return result

    monkeypatch.setattr(Writer, "step", step_then_stop)
    code, text, _ = run(capsys, "run-batch", "orders", "--until-caught-up")
    monkeypatch.setattr(Writer, "step", step)
    assert code == 0 and "upper: 2 (1 committed, 1 step(s))" in text
    assert "stopped early: the stream is STOPPING (epoch 0), set by ops at " in text and ": deploy" in text

    # Disaster: the store is lost. Restore, seek, resume, catch up; the table is the source's.
    consensus.dispose()
    os.replace(tmp_path / "c.db", tmp_path / "lost.db")
    assert cli(capsys, "checkpoint", "restore", "orders")[1]["stream"]["status"] == "RECOVERING"
    assert cli(capsys, "run-batch", "orders")[0] == 6
    assert cli(capsys, "recover", "seek", "orders")[0] == 0
    assert cli(capsys, "recover", "resume", "orders")[0] == 0
    code, out, _ = cli(capsys, "run-batch", "orders", "--until-caught-up")
    assert code == 0 and out["upper"] == 4 and out["stopped_because"] is None
    rows = [json.loads(line) for line in run(capsys, "read", "orders")[1].splitlines()]
    assert {(r["id"],): r for r in rows} == oracle_table(str(landing))


def test_a_stop_superseded_by_a_resume_exits_7_and_stops_waiting(store_shard, capsys, monkeypatch):
    shard = store_shard
    shard.mint_binding(0, minted_by="w")  # a writer holds batch 0

    def resumed_by_someone_else(seconds: float) -> None:
        assert len(waits) == 1, "the drain went on waiting after the stream was resumed"
        streams.finalize_stop(shard.consensus, streams.read_stream(shard.consensus, "orders"), "other")
        streams.resume(shard.consensus, "orders", "other", "done already")

    waits = drain_waits(monkeypatch, resumed_by_someone_else)
    code, out, err = run(capsys, "stream", "stop", "orders", "--drain", "600")
    assert code == 7 and len(waits) == 1
    assert "superseded" in err and "READY" in err and "writers may run" in err
    assert streams.read_stream(shard.consensus, "orders").status.value == "READY"


def test_a_batch_left_by_a_killed_writer_does_not_make_the_stop_wait(store_shard, capsys, monkeypatch):
    import sqlalchemy as sa

    from airflow_upsert_provider.engine.store.tables import bindings_table

    shard = store_shard
    shard.mint_binding(0, minted_by="killed-writer")
    # The writer died an hour ago, before writing any staging file.
    with shard.consensus.engine.begin() as conn:
        conn.execute(sa.update(bindings_table).values(minted_at=time.time() - 3600))

    def no_writer_will_come(seconds: float) -> None:
        assert len(waits) < 3, "the stop waited on a batch no writer holds"

    waits = drain_waits(monkeypatch, no_writer_will_come)
    code, text, _ = run(capsys, "stream", "stop", "orders", "--drain", "600")
    assert code == 0 and waits == [] and text.startswith("shard orders: STOPPED (epoch 0)")
    assert "a batch was still in hand when the drain ended" in text
