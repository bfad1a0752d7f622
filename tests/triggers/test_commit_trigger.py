"""ShardCommitTrigger's run() against a real store (SQLite and PostgreSQL) whose commits are
made by `upsertctl run-batch`: one event per commit range with the contract's keys and the
batches' rows, a restart resumes from the upper it reported (never a ts twice), and a trigger
without a start reports only what is committed after it first looked.

The Asset state store the triggerer injects needs the triggerer's supervisor; here it is an
in-memory object with the same two calls (``aget``, ``aset``)."""

from __future__ import annotations

import asyncio
import importlib
import json

import pytest

from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.sample_data import SAMPLE_SCHEMA_DDL, SampleSpec, generate
from airflow_upsert_provider.triggers.commits import REPORTED_UPPER_KEY, ShardCommitTrigger
from tests.helpers import Upsertctl

SPEC = SampleSpec(records=800, keys=200, partitions=2, segments_per_partition=4, seed=37)


class StateStore:
    """What the trigger calls of Airflow's AssetStateStoreAccessors."""

    def __init__(self) -> None:
        self.values: dict[str, object] = {}

    async def aget(self, key: str, default: object = None) -> object:
        return self.values.get(key, default)

    async def aset(self, key: str, value: object) -> None:
        self.values[key] = json.loads(json.dumps(value))


def next_event(trigger: ShardCommitTrigger, state: StateStore) -> dict:
    """The first event of a fresh run() of ``trigger`` (the triggerer starts one per trigger)."""
    trigger.asset_state_store = state

    async def first() -> dict:
        events = trigger.run()
        try:
            return (await anext(events)).payload
        finally:
            await events.aclose()  # as the triggerer cancels it: the store is closed

    return asyncio.run(asyncio.wait_for(first(), timeout=120))


def test_commits_made_by_the_cli_fire_one_event_per_range_and_a_restart_reports_no_ts_twice(
        spark, consensus_url, tmp_path, capsys, monkeypatch):
    blob_root = str(tmp_path / "blob")
    monkeypatch.setenv("AIRFLOW_CONN_UPSERT_DEFAULT", json.dumps(
        {"conn_type": "upsert", "extra": {"consensus_url": consensus_url, "blob_root": blob_root}}))
    landing = tmp_path / "landing"
    generate(str(landing), SPEC)
    ctl = Upsertctl(capsys, consensus_url, blob_root)
    ctl.ok("init", "orders", "--source", f"dir:{landing}", "--key", "id", "--order-by", "updated_at",
           "--delete-marker", "deleted", "--schema", SAMPLE_SCHEMA_DDL, "--max-files-per-batch", "2")

    def commit(batches: int) -> list[dict]:
        out = ctl.ok("run-batch", "orders", "--max-batches", str(batches), "--json")
        # The last line: the trigger's hook, running meanwhile, logs to the same captured stdout.
        report = json.loads(out.strip().splitlines()[-1])
        return [b for b in report["batches"] if b["outcome"] == "committed"]

    trigger = ShardCommitTrigger(shard="orders", after_upper=0, poll_interval=0.01)
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_upsert_provider.triggers.commits.ShardCommitTrigger"
    assert json.loads(json.dumps(kwargs)) == kwargs
    module, name = classpath.rsplit(".", 1)
    state = StateStore()

    def rebuilt() -> ShardCommitTrigger:  # what a (re)started triggerer runs
        return getattr(importlib.import_module(module), name)(**kwargs)

    first = commit(2)
    event = next_event(rebuilt(), state)
    assert {k: event[k] for k in ("shard", "from_ts", "to_ts", "upper", "upper_before", "committed",
                                  "schema_version")} == {
        "shard": "orders", "from_ts": 0, "to_ts": 2, "upper": 2, "upper_before": 0, "committed": 2,
        "schema_version": 1}
    assert event["rows_out"] == sum(b["rows_out"] for b in first) > 0
    assert event["rows_in"] == sum(b["rows_in"] for b in first)
    assert isinstance(event["committed_at"], float)
    assert json.loads(json.dumps(event)) == event  # what the triggerer stores as the Asset event's payload
    assert state.values == {REPORTED_UPPER_KEY: 2}

    # A restarted triggerer: a new instance, the same Asset state. It resumes at 2. A column
    # added meanwhile: the event names the schema version the batch was written with.
    ctl.ok("schema", "add-column", "orders", "discount", "DOUBLE")
    second = commit(1)
    event = next_event(rebuilt(), state)
    assert (event["from_ts"], event["to_ts"], event["rows_out"]) == (2, 3, second[0]["rows_out"])
    assert event["schema_version"] == 2
    assert state.values == {REPORTED_UPPER_KEY: 3}

    # No start given: what is committed from the first look on, nothing before it.
    fresh_state = StateStore()
    watcher = ShardCommitTrigger(shard="orders", poll_interval=0.01)
    watcher.asset_state_store = fresh_state

    async def first_look_then_commit() -> dict:
        events = watcher.run()
        pending = asyncio.ensure_future(anext(events))
        while REPORTED_UPPER_KEY not in fresh_state.values:  # the first look saved the upper
            await asyncio.sleep(0.01)
        assert fresh_state.values == {REPORTED_UPPER_KEY: 3}
        await asyncio.to_thread(commit, 1)
        try:
            return (await pending).payload
        finally:
            await events.aclose()

    event = asyncio.run(asyncio.wait_for(first_look_then_commit(), timeout=120))
    assert (event["from_ts"], event["to_ts"]) == (3, 4)


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"shard": "no spaces"}, "shard"),
    ({"shard": "s", "after_upper": -1}, "after_upper"),
    ({"shard": "s", "after_upper": True}, "after_upper"),
    ({"shard": "s", "after_upper": "3"}, "after_upper"),
    ({"shard": "s", "poll_interval": 0}, "poll_interval"),
])
def test_bad_arguments_are_refused_naming_them(kwargs, field):
    with pytest.raises(ConfigurationError) as refused:
        ShardCommitTrigger(**kwargs)
    assert refused.value.details.get("field") == field
