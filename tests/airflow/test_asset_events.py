"""Asset events: which shard's Asset a task declares, when an event is due, and the event's
numbers, in process. The real `airflow dags test` runs that emit them (a committing run's one
event with its numbers, the consumer DAG it queues, none for a caught-up run) are
tests/airflow/test_example_dags.py::test_backfill_then_schedule_catch_the_shard_up."""

from __future__ import annotations

import json

import pytest

from airflow_upsert_provider.operators.upsert import MicroBatchUpsertOperator, event_from_ts, shard_asset
from airflow_upsert_provider.sample_data import SampleSpec

URI = "upsert://upsert_default/orders"


def test_the_shard_asset_is_declared_for_a_literal_shard_only():
    literal = MicroBatchUpsertOperator(task_id="a", shard="orders")
    assert [o.uri for o in literal.outlets] == [URI] == [shard_asset("upsert_default", "orders").uri]
    # A templated shard is known at run time only: its asset is added to the outlets of the try.
    assert MicroBatchUpsertOperator(task_id="b", shard="{{ params.shard }}").outlets == []


# -- when an event is due (pure), and a retry that finds its batch persisted -------------------------

TRY = "airflow:upsert_microbatch:manual__1:upsert:try{}"


def test_is_earlier_try_compares_tries_of_one_task_instance():
    from airflow_upsert_provider.operators.upsert import is_earlier_try

    assert is_earlier_try(TRY.format(1), TRY.format(2))
    assert not is_earlier_try(TRY.format(2), TRY.format(2)) and not is_earlier_try(TRY.format(3), TRY.format(2))
    assert not is_earlier_try("airflow:upsert_microbatch:manual__0:upsert:try1", TRY.format(2))  # another run
    assert not is_earlier_try("upsertctl:host:42", TRY.format(2)) and not is_earlier_try("", TRY.format(2))


@pytest.mark.parametrize(
    "outcomes, newest, due",
    [
        (["committed"], None, True),
        (["already_committed"], None, True),  # its own append, found landed after a lost connection
        (["already_persisted", "committed"], TRY.format(1), True),
        ([], None, False),  # nothing to do
        (["already_persisted"], None, False),  # a peer's batch, announced by the peer
        (["already_persisted", "already_persisted"], "upsertctl:host:42", False),
        ([], "upsertctl:host:42", False),
        ([], TRY.format(1), True),  # a retry that finds its earlier try's batch persisted
        (["already_persisted"], TRY.format(1), True),
        ([], TRY.format(2), False),  # its own try cannot have committed before it started
    ],
)
def test_an_event_is_due_when_this_run_committed_or_an_earlier_try_committed_unannounced(outcomes, newest, due):
    from airflow_upsert_provider.operators.upsert import asset_event_due

    assert asset_event_due(outcomes, newest, TRY.format(2)) is due


class OutletEvents(dict):
    """What the task runner hands an operator as ``context["outlet_events"]``."""

    def __missing__(self, asset):
        from types import SimpleNamespace

        self[asset] = SimpleNamespace(extra={})
        return self[asset]


def test_an_events_range_starts_at_the_upper_found_or_at_the_earlier_trys_batch_it_announces():
    for upper in range(0, 30):
        assert event_from_ts(upper, None) == upper
        for earlier in range(0, upper):
            # The earlier try's batch is below the upper this try found: the range covers it.
            assert event_from_ts(upper, earlier) == earlier < upper


def test_a_retry_that_finds_its_batch_persisted_emits_the_event(sqlite_url, blob, tmp_path, monkeypatch):
    from types import SimpleNamespace

    from airflow_upsert_provider.engine.store.registry import open_consensus
    from tests.helpers import batch, make_shard

    consensus = open_consensus(sqlite_url)
    shard = make_shard(consensus, blob, tmp_path, spec=SampleSpec(records=40, keys=10, partitions=1,
                                                                   segments_per_partition=2, seed=3))
    # Try 1 committed the only batch, then failed (its last append's outcome was unknown).
    assert shard.mint_binding(0, minted_by="try1") is not None
    shard.compare_and_append(0, 1, batch(0, token="t1", writer_id=TRY.format(1)), epoch=0)
    monkeypatch.setenv("AIRFLOW_CONN_UPSERT_DEFAULT", json.dumps(
        {"conn_type": "upsert", "extra": {"consensus_url": sqlite_url, "blob_root": blob.root}}))
    ti = SimpleNamespace(dag_id="upsert_microbatch", run_id="manual__1", task_id="upsert", map_index=-1, try_number=2)
    events = OutletEvents()
    op = MicroBatchUpsertOperator(task_id="upsert", shard="orders")
    report = op.execute({"ti": ti, "outlet_events": events})
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
