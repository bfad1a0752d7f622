"""Asset events: which shard's Asset a task declares, when an event is due, and the event's
numbers, in process. The real `airflow dags test` runs that emit them (a committing run's one
event with its numbers, the consumer DAG it queues, none for a caught-up run) are
tests/airflow/test_example_dags.py::test_backfill_then_schedule_catch_the_shard_up."""

from __future__ import annotations

import itertools
import json

from airflow_upsert_provider.engine.common.commit_events import CommittedBatch
from airflow_upsert_provider.engine.table.change_rules import plan_consumer_read
from airflow_upsert_provider.operators.upsert import (
    MicroBatchUpsertOperator,
    earlier_try_writer_ids,
    producer_event,
    shard_asset,
)
from airflow_upsert_provider.sample_data import SampleSpec

URI = "upsert://upsert_default/orders"


def test_the_shard_asset_is_declared_for_a_literal_shard_only():
    literal = MicroBatchUpsertOperator(task_id="a", shard="orders")
    assert [o.uri for o in literal.outlets] == [URI] == [shard_asset("upsert_default", "orders").uri]
    # A templated shard is known at run time only: its asset is added to the outlets of the try.
    assert MicroBatchUpsertOperator(task_id="b", shard="{{ params.shard }}").outlets == []


# -- when an event is due and what it announces (pure) -------------------------------------------

TRY = "airflow:upsert_microbatch:manual__1:upsert:try{}"


def test_the_earlier_tries_of_a_writer_are_the_lower_try_numbers_of_its_task_instance():
    assert earlier_try_writer_ids(TRY.format(3)) == [TRY.format(1), TRY.format(2)]
    assert earlier_try_writer_ids(TRY.format(1)) == []
    mapped = "airflow:upsert_microbatch:manual__1:upsert:4:try2"
    assert earlier_try_writer_ids(mapped) == ["airflow:upsert_microbatch:manual__1:upsert:4:try1"]
    assert earlier_try_writer_ids("upsertctl:host:42") == [] and earlier_try_writer_ids("") == []


def _histories(tries: int, most: int, peers: int):
    """Every history of one task instance's ``tries`` (each committing 0..``most`` batches; all
    but the last fail after their commits, before an event) and ``peers`` one-batch peer runs,
    in every order, and every point where the last try starts before its first commit:
    (committers in commit order, 0 for a peer; index of the commit before which the last try
    started). An earlier try may still commit after the last one started (a zombie)."""
    for counts in itertools.product(range(most + 1), repeat=tries):
        pool = [k for k, n in enumerate(counts, start=1) for _ in range(n)] + [0] * peers
        for order in sorted(set(itertools.permutations(pool))):
            own = [i for i, k in enumerate(order) if k == tries]
            for start in range(0, (own[0] if own else len(order)) + 1):
                yield order, start


def test_a_retry_announces_every_batch_its_earlier_tries_committed_whatever_peers_committed_since():
    checked = 0
    for tries in (1, 2, 3):
        for peers in range(0, 3):
            for order, start in _histories(tries, 2, peers):
                # Batch ts = its index in commit order; its rows_out, ts + 1.
                def batch(ts):
                    return CommittedBatch(ts, rows_in=2 * ts + 1, rows_out=ts + 1, committed_at=None)

                own = [batch(ts) for ts, k in enumerate(order) if k == tries]
                earlier = [batch(ts) for ts, k in enumerate(order) if 0 < k < tries]
                event = producer_event(start, own, earlier)
                mine = [b.ts for b in own + earlier]
                if not mine:
                    assert event is None, (order, start)
                    continue
                upper = len(order)
                assert event.from_ts == min([start, *mine]), (order, start)
                assert event.rows_out == sum(ts + 1 for ts in mine) and event.rows_in == sum(2 * ts + 1 for ts in mine)
                # Each peer announces its own batch; with the retry's range, every ts is announced,
                # so a consumer first run on these events starts at ts 0 and reads all of them.
                events = [{"from_ts": ts, "to_ts": ts + 1} for ts, k in enumerate(order) if k == 0]
                events.append({"from_ts": event.from_ts, "to_ts": upper})
                announced = {ts for e in events for ts in range(e["from_ts"], e["to_ts"])}
                assert announced == set(range(upper)), (order, start, events)
                first_read = plan_consumer_read(None, None, events)
                assert (first_read.from_ts, first_read.to_ts) == (0, upper)
                checked += 1
    assert checked > 1000


class OutletEvents(dict):
    """What the task runner hands an operator as ``context["outlet_events"]``."""

    def __missing__(self, asset):
        from types import SimpleNamespace

        self[asset] = SimpleNamespace(extra={})
        return self[asset]


def _run_second_try(sqlite_url, blob, monkeypatch):
    """Try 2 of the task instance ``TRY`` names, on the shard ``orders`` of that store: its task
    instance, operator, outlet events and report."""
    from types import SimpleNamespace

    monkeypatch.setenv("AIRFLOW_CONN_UPSERT_DEFAULT", json.dumps(
        {"conn_type": "upsert", "extra": {"consensus_url": sqlite_url, "blob_root": blob.root}}))
    ti = SimpleNamespace(dag_id="upsert_microbatch", run_id="manual__1", task_id="upsert", map_index=-1, try_number=2)
    events = OutletEvents()
    op = MicroBatchUpsertOperator(task_id="upsert", shard="orders")
    return ti, op, events, op.execute({"ti": ti, "outlet_events": events})


def test_a_retry_that_finds_its_batch_persisted_emits_the_event(sqlite_url, blob, tmp_path, monkeypatch):
    from airflow_upsert_provider.engine.store.registry import open_consensus
    from tests.helpers import batch, make_shard

    consensus = open_consensus(sqlite_url)
    shard = make_shard(consensus, blob, tmp_path, spec=SampleSpec(records=40, keys=10, partitions=1,
                                                                   segments_per_partition=2, seed=3))
    # Try 1 committed the only batch, then failed (its last append's outcome was unknown).
    assert shard.mint_binding(0, minted_by="try1") is not None
    shard.compare_and_append(0, 1, batch(0, token="t1", writer_id=TRY.format(1)), epoch=0)
    ti, op, events, report = _run_second_try(sqlite_url, blob, monkeypatch)
    assert report["committed"] == 0 and report["upper"] == 1  # nothing left to do: no Spark
    asset = shard_asset("upsert_default", "orders")
    assert [o.uri for o in op.outlets] == [asset.uri]
    assert events[asset].extra == {"upper": 1, "upper_before": 1, "committed": 0, "rows_in": 0, "rows_out": 0,
                                   "from_ts": 0, "to_ts": 1, "schema_version": 1}

    # The next run finds nothing new and its newest batch is no try of its own: no event.
    ti.run_id, ti.try_number = "manual__2", 1
    op = MicroBatchUpsertOperator(task_id="upsert", shard="orders")
    op.execute({"ti": ti, "outlet_events": OutletEvents()})
    assert op.outlets == []
    consensus.dispose()


def test_a_retry_announces_its_earlier_trys_batch_below_a_peers_newer_one(sqlite_url, blob, tmp_path, monkeypatch):
    from dataclasses import replace

    from airflow_upsert_provider.engine.store.registry import open_consensus
    from tests.helpers import batch, make_shard

    consensus = open_consensus(sqlite_url)
    shard = make_shard(consensus, blob, tmp_path, spec=SampleSpec(records=40, keys=10, partitions=1,
                                                                   segments_per_partition=3, seed=3))
    # Try 1 committed ts 0 and failed before its event; a peer (another run) then committed
    # ts 1, announced by its own event; another task instance's try 1 committed ts 2.
    commits = [(TRY.format(1), 9, 7), ("airflow:upsert_microbatch:scheduled__2:upsert:try1", 5, 4),
               ("airflow:upsert_microbatch:manual__1:other:try1", 3, 3)]
    for ts, (writer, rows_in, rows_out) in enumerate(commits):
        assert shard.mint_binding(ts, minted_by=writer, max_files=1) is not None
        record = replace(batch(ts, token=f"t{ts}", writer_id=writer), stats={"rows_in": rows_in, "rows_out": rows_out})
        assert shard.compare_and_append(ts, ts + 1, record, epoch=0).outcome.value == "committed"
    ti, op, events, report = _run_second_try(sqlite_url, blob, monkeypatch)
    assert report["committed"] == 0 and report["upper"] == 3  # the source is all bound and persisted
    asset = shard_asset("upsert_default", "orders")
    assert [o.uri for o in op.outlets] == [asset.uri]
    # The range runs from try 1's batch to the upper (the peers' batches in between included);
    # the rows are try 1's only.
    assert events[asset].extra == {"upper": 3, "upper_before": 3, "committed": 0, "rows_in": 9, "rows_out": 7,
                                   "from_ts": 0, "to_ts": 3, "schema_version": 1}
    consensus.dispose()
