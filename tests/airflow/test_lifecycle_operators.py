"""The stream lifecycle operators in process, against a real store through the `upsert`
connection: what each transition records (the task try as the actor), how a stopped,
stopping or recovering stream refuses or ends a `MicroBatchUpsertOperator` run, and the
recovery order begin -> seek -> resume enforced by the engine, refusals failing without retry
with the engine's message. The example DAG `upsert_recovery` runs end to end in
test_example_dags.py."""

from __future__ import annotations

import copy
import datetime
import json
import os
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_upsert_provider.engine.store import streams
from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.engine.sources.planning import range_files
from airflow_upsert_provider.engine.write.writer import Writer
from airflow_upsert_provider.operators.lifecycle import (
    BeginRecoveryOperator,
    ResumeAfterRecoveryOperator,
    ResumeStreamOperator,
    SeekSourceOperator,
    StopStreamOperator,
)
from airflow_upsert_provider.operators.upsert import MicroBatchUpsertOperator
from tests.helpers import make_shard, table
from tests.maintenance.support import SPEC, oracle, written_shard

RUN_ID = "manual__2026-11-23T10:00:00+00:00"


def context(task_id: str, try_number: int = 1) -> dict:
    """What an operator reads of its task instance: the identity it records."""
    ti = SimpleNamespace(dag_id="lifecycle", run_id=RUN_ID, task_id=task_id, map_index=-1, try_number=try_number)
    return {"ti": ti}


def actor(task_id: str, try_number: int = 1) -> str:
    return f"airflow:lifecycle:{RUN_ID}:{task_id}:try{try_number}"


def when(stream: dict) -> str:
    return datetime.datetime.fromtimestamp(stream["changed_at"], datetime.timezone.utc).isoformat(timespec="seconds")


def use_store(monkeypatch, consensus_url: str, blob_root: str) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_UPSERT_DEFAULT",
        json.dumps({"conn_type": "upsert", "extra": {"consensus_url": consensus_url, "blob_root": blob_root}}),
    )


def history(consensus) -> list[tuple[str, str, str]]:
    return [(h["action"], h["to"], h["actor"]) for h in streams.stream_history(consensus, "orders")]


def test_a_stop_refuses_runs_ends_a_run_early_and_fences_until_resumed(spark, sqlite_url, blob, tmp_path, monkeypatch):
    consensus = open_consensus(sqlite_url)
    shard = written_shard(spark, consensus, blob, tmp_path, batches=1)
    use_store(monkeypatch, sqlite_url, blob.root)

    stopped = StopStreamOperator(task_id="stop", shard="orders", reason="source migration",
                                 drain_seconds="0").execute(context("stop"))
    assert (stopped["from"], stopped["status"], stopped["changed"]) == ("READY", "STOPPED", True)
    assert (stopped["stream"]["changed_by"], stopped["stream"]["reason"]) == (actor("stop"), "source migration")

    # A stopped stream: the run fails before it binds anything, naming who stopped it, when and why.
    with pytest.raises(AirflowFailException) as refused:
        MicroBatchUpsertOperator(task_id="upsert", shard="orders", until_caught_up=True).execute(context("upsert"))
    assert str(refused.value) == (
        f"stream refused: shard 'orders' is not READY: the stream is STOPPED (epoch 0), set by "
        f"{actor('stop')} at {when(stopped['stream'])}: source migration; a run starts no batch until "
        "it is READY (docs/recovery.md)"
    )
    assert shard.state().upper == 1 and consensus.get_binding("orders", 1) is None

    resumed = ResumeStreamOperator(task_id="resume", shard="orders", reason="migration done").execute(context("resume"))
    assert (resumed["from"], resumed["status"]) == ("STOPPED", "READY")

    # A stop during a run: the batch in hand commits, no other starts, and XCom says why.
    run = MicroBatchUpsertOperator(task_id="upsert", shard="orders", until_caught_up=True)
    log_batch = run._log_batch

    def stop_after_the_first_batch(batch: dict) -> None:
        log_batch(batch)
        StopStreamOperator(task_id="stop", shard="orders", reason="disk check", drain_seconds=0).execute(
            context("stop", 2))

    run._log_batch = stop_after_the_first_batch
    report = run.execute(context("upsert", 2))
    assert [(b["ts"], b["outcome"]) for b in report["batches"]] == [(1, "committed")]
    assert report["upper"] == 2 == shard.state().upper
    stream = streams.read_stream(consensus, "orders")
    assert report["stopped_because"] == (
        f"the stream is STOPPED (epoch 0), set by {actor('stop', 2)} at {when(stream.to_dict())}: disk check"
    )
    ResumeStreamOperator(task_id="resume", shard="orders").execute(context("resume", 2))

    # A recovery begun while a batch is staged: its commit is fenced, nothing of it is kept.
    real_append = Writer.append
    begun: list[dict] = []

    def begin_recovery_then_append(writer, staged):
        begun.append(BeginRecoveryOperator(task_id="begin", shard="orders", reason="suspect store").execute(
            context("begin")))
        return real_append(writer, staged)

    monkeypatch.setattr(Writer, "append", begin_recovery_then_append)
    with pytest.raises(AirflowFailException) as fenced:
        MicroBatchUpsertOperator(task_id="upsert", shard="orders").execute(context("upsert", 3))
    monkeypatch.setattr(Writer, "append", real_append)
    epoch = begun[0]["epoch"]
    assert epoch > 0 and begun[0]["status"] == "RECOVERING"
    assert str(fenced.value) == (
        f"stream fenced by a recovery (epoch {epoch}): commit of batch 2 of shard 'orders' by writer "
        f"'{actor('upsert', 3)}' fenced: the stream is RECOVERING (epoch {epoch}), set by {actor('begin')} at "
        f"{when(begun[0]['stream'])}: suspect store; nothing was committed"
    )
    assert shard.state().upper == 2 and consensus.batches("orders")[-1].ts == 1
    # Only the fenced writer staged batch 2: its staged files are gone.
    staged_dir = os.path.join(blob.root, "orders", "runs", "ts=000000000002")
    assert not os.path.exists(staged_dir) or os.listdir(staged_dir) == []

    sought = SeekSourceOperator(task_id="seek", shard="orders", epoch=str(epoch)).execute(context("seek"))
    assert (sought["epoch"], sought["upper"], sought["stream"]["seeked_epoch"]) == (epoch, 2, epoch)
    back = ResumeAfterRecoveryOperator(task_id="recover_resume", shard="orders", epoch=epoch).execute(
        context("recover_resume"))
    assert (back["from"], back["status"], back["epoch"]) == ("RECOVERING", "READY", epoch)

    caught_up = MicroBatchUpsertOperator(task_id="upsert", shard="orders", until_caught_up=True).execute(
        context("upsert", 4))
    assert caught_up["stopped_because"] is None
    assert caught_up["upper"] == 6 == shard.state().upper
    assert table(shard) == oracle(shard)
    assert history(consensus) == [
        ("stop", "STOPPING", actor("stop")), ("finalize", "STOPPED", actor("stop")),
        ("resume", "READY", actor("resume")),
        ("stop", "STOPPING", actor("stop", 2)), ("finalize", "STOPPED", actor("stop", 2)),
        ("resume", "READY", actor("resume", 2)),
        ("recover begin", "RECOVERING", actor("begin")), ("recover seek", "RECOVERING", actor("seek")),
        ("recover resume", "READY", actor("recover_resume")),
    ]
    consensus.dispose()


def test_recovery_operators_run_in_order_and_refusals_fail_without_retry(consensus, consensus_url, blob, tmp_path,
                                                                         monkeypatch):
    shard = make_shard(consensus, blob, tmp_path, spec=SPEC, max_files_per_batch=2)
    use_store(monkeypatch, consensus_url, blob.root)

    begun = BeginRecoveryOperator(task_id="begin", shard="orders", reason="store replaced").execute(context("begin"))
    epoch = begun["epoch"]
    assert (begun["from"], begun["status"], begun["stream"]["changed_by"]) == ("READY", "RECOVERING", actor("begin"))
    described = f"the stream is RECOVERING (epoch {epoch}), set by {actor('begin')} at {when(begun['stream'])}: store replaced"

    # Out of order: resume before the seek; and the other ways out of a recovery.
    with pytest.raises(AirflowFailException) as refused:
        ResumeAfterRecoveryOperator(task_id="recover_resume", shard="orders", epoch=str(epoch)).execute(
            context("recover_resume"))
    assert str(refused.value) == (
        f"stream refused: recover resume of shard 'orders' refused: recovery epoch {epoch} has no seek: "
        f"run recover seek first; {described}"
    )
    with pytest.raises(AirflowFailException, match=r"^stream refused: resume of shard 'orders' refused: a recovery "
                                                   r"is open: use recover resume after recover seek; the stream is RECOVERING"):
        ResumeStreamOperator(task_id="resume", shard="orders").execute(context("resume"))
    with pytest.raises(AirflowFailException, match=r"^stream refused: stop of shard 'orders' refused: a recovery is open"):
        StopStreamOperator(task_id="stop", shard="orders", drain_seconds=0).execute(context("stop"))
    with pytest.raises(AirflowFailException) as other_epoch:
        SeekSourceOperator(task_id="seek", shard="orders", epoch=epoch - 1).execute(context("seek"))
    assert str(other_epoch.value) == (
        f"stream refused: recover seek of shard 'orders' refused: it was asked for epoch {epoch - 1}, but the "
        f"open recovery is epoch {epoch}; {described}"
    )
    # A micro-batch task fails before it submits anything: the job would only be refused too.
    def no_submit(*args, **kwargs):
        raise AssertionError("a Spark job was submitted for a stream that is not READY")

    monkeypatch.setattr(MicroBatchUpsertOperator, "_run_submit", no_submit)
    with pytest.raises(AirflowFailException) as not_ready:
        MicroBatchUpsertOperator(task_id="upsert", shard="orders", spark_mode="submit").execute(context("upsert"))
    assert str(not_ready.value) == (
        f"stream refused: shard 'orders' is not READY: {described}; a run starts no batch until it is READY "
        "(docs/recovery.md)"
    )
    with pytest.raises(AirflowFailException, match=r"^epoch must be an integer, got 'latest'$"):
        SeekSourceOperator(task_id="seek", shard="orders", epoch="latest").execute(context("seek"))
    with pytest.raises(AirflowFailException, match=r"^drain_seconds must be a number of seconds, got '1m'$"):
        StopStreamOperator(task_id="stop", shard="orders", drain_seconds="1m").execute(context("stop"))

    # A segment the next batch needs is gone: the seek fails naming it, and changes nothing.
    binding = shard.mint_binding(0, minted_by="lost-writer")
    partition, rng = sorted(binding.ranges.items())[0]
    offset, name = range_files(rng, shard.source.extension)[0]
    gone = os.path.join(shard.source.partition_dir(partition), name)
    kept = gone + ".kept"
    os.rename(gone, kept)
    with pytest.raises(AirflowFailException) as missing:
        SeekSourceOperator(task_id="seek", shard="orders", epoch=epoch).execute(context("seek"))
    assert str(missing.value).startswith(
        f"source segments missing: seek of shard 'orders' (epoch {epoch}) failed: segment {gone} (offset "
        f"{offset} of partition {partition!r}, at or after the seek point 0) is missing, binding of batch 0"
    )
    assert streams.read_stream(consensus, "orders").seeked_epoch is None
    os.rename(kept, gone)

    # In order, with the epoch as a template renders it (a string) and as native XCom (an int).
    sought = SeekSourceOperator(task_id="seek", shard="orders", epoch=str(epoch)).execute(context("seek", 2))
    assert (sought["epoch"], sought["upper"], sought["position"]) == (epoch, 0, {})
    assert sought["segments_ahead"] == 12 and sought["stream"]["seeked_epoch"] == epoch
    resumed = ResumeAfterRecoveryOperator(task_id="recover_resume", shard="orders", epoch=epoch).execute(
        context("recover_resume", 2))
    assert (resumed["from"], resumed["status"], resumed["epoch"], resumed["changed"]) == (
        "RECOVERING", "READY", epoch, True)
    assert history(consensus) == [
        ("recover begin", "RECOVERING", actor("begin")),
        ("recover seek", "RECOVERING", actor("seek", 2)),
        ("recover resume", "READY", actor("recover_resume", 2)),
    ]
    # Resuming again is refused (no recovery is open), not silently accepted.
    with pytest.raises(AirflowFailException, match=r"^stream refused: recover resume of shard 'orders' refused: "
                                                   r"no recovery is open; the stream is READY"):
        ResumeAfterRecoveryOperator(task_id="recover_resume", shard="orders").execute(context("recover_resume", 3))


def test_a_killed_stop_ends_its_drain_and_finalizes(consensus, consensus_url, blob, tmp_path, monkeypatch):
    shard = make_shard(consensus, blob, tmp_path, spec=SPEC, max_files_per_batch=2)
    use_store(monkeypatch, consensus_url, blob.root)
    # A writer holds batch 0: the stop waits for its commit, up to the drain.
    shard.mint_binding(0, minted_by="slow-writer")
    stop = StopStreamOperator(task_id="stop", shard="orders", reason="maintenance", drain_seconds=600)
    copy.deepcopy(stop)  # Airflow copies operators: the kill flag must copy too
    naps: list[float] = []

    def killed_while_waiting(seconds: float) -> None:
        # Airflow's SIGTERM handler runs on_kill between two polls of the drain.
        assert not naps, "the drain went on polling after on_kill"
        naps.append(seconds)
        stop.on_kill()

    stop._drain_sleep = killed_while_waiting
    report = stop.execute(context("stop"))
    assert naps == [1.0]
    assert (report["from"], report["status"]) == ("READY", "STOPPED")
    assert history(consensus) == [("stop", "STOPPING", actor("stop")), ("finalize", "STOPPED", actor("stop"))]
    assert shard.state().upper == 0 and consensus.get_binding("orders", 0) is not None


def test_a_failed_task_keeps_the_engine_error_as_its_cause(sqlite_url, blob, monkeypatch):
    from airflow_upsert_provider.engine.errors import ShardNotFound

    use_store(monkeypatch, sqlite_url, blob.root)
    with pytest.raises(AirflowFailException) as resumed:
        ResumeStreamOperator(task_id="resume", shard="nosuch").execute(context("resume"))
    with pytest.raises(AirflowFailException) as upserted:
        MicroBatchUpsertOperator(task_id="upsert", shard="nosuch").execute(context("upsert"))
    # The traceback of the engine's error stays attached for the task log.
    assert isinstance(resumed.value.__cause__, ShardNotFound)
    assert isinstance(upserted.value.__cause__, ShardNotFound)


def test_a_stop_superseded_by_a_resume_fails_the_task(sqlite_url, blob, tmp_path, monkeypatch):
    consensus = open_consensus(sqlite_url)
    make_shard(consensus, blob, tmp_path, spec=SPEC, max_files_per_batch=2).mint_binding(0, minted_by="w")
    use_store(monkeypatch, sqlite_url, blob.root)
    stop = StopStreamOperator(task_id="stop", shard="orders", reason="maintenance", drain_seconds=600)
    naps: list[float] = []

    def resumed_meanwhile(seconds: float) -> None:
        assert not naps, "the drain went on waiting after the stream was resumed"
        naps.append(seconds)
        streams.finalize_stop(consensus, streams.read_stream(consensus, "orders"), "other")
        streams.resume(consensus, "orders", "other", "done already")

    stop._drain_sleep = resumed_meanwhile
    # A DAG gating maintenance on this task must not go on: the stream is READY, writers may run.
    with pytest.raises(AirflowFailException, match="superseded.*READY"):
        stop.execute(context("stop"))
    assert naps == [1.0] and streams.read_stream(consensus, "orders").status.value == "READY"
    consensus.dispose()
