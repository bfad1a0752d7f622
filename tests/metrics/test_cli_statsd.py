"""``upsertctl --statsd``: a real run (init, batches, compaction, checkpoint, GC, the frontier
status) sends its metrics to a StatsD listener on loopback, with their values and tags; nothing
is sent without the option; a bad address is refused."""

from __future__ import annotations

import json

import pytest

from airflow_upsert_provider.sample_data import SAMPLE_SCHEMA_DDL, SampleSpec
from tests.helpers import landing_env
from tests.helpers import run_cli as run
from tests.metrics.statsd_listener import parse_line

SPEC = SampleSpec(records=600, keys=150, partitions=2, segments_per_partition=2, seed=37)


@pytest.fixture
def landing(tmp_path, monkeypatch):
    monkeypatch.delenv("UPSERT_STATSD", raising=False)
    return landing_env(tmp_path, monkeypatch, SPEC)


def ok(capsys, *argv):
    code, out, err = run(capsys, *argv)
    assert code == 0, err[-3000:]
    return out


def test_a_cli_run_sends_batch_maintenance_and_frontier_metrics(spark, landing, capsys, listener):
    ok(capsys, "init", "orders", "--source", f"dir:{landing}", "--key", "id", "--order-by", "updated_at",
       "--delete-marker", "deleted", "--max-files-per-batch", "2", "--schema", SAMPLE_SCHEMA_DDL,
       "--statsd", listener.address)
    assert listener.drain("after-init") == []  # init is no batch and no maintenance step
    report = json.loads(ok(capsys, "run-batch", "orders", "--until-caught-up", "--json", "--statsd",
                           listener.address))
    lines = [parse_line(line) for line in listener.drain("after-batches")]
    committed = [b for b in report["batches"] if b["outcome"] == "committed"]
    assert len(committed) == 2 and report["batches"][-1]["outcome"] == "nothing_to_do"

    def values(name, **tags):
        return [value for n, t, value, _ in lines if n == name and t == {"shard": "orders", **tags}]

    assert values("upsert.batch.outcome", outcome="committed") == [1.0, 1.0]
    assert values("upsert.batch.outcome", outcome="nothing_to_do") == [1.0]
    assert values("upsert.batch.rows_in") == [float(b["rows_in"]) for b in committed]
    assert values("upsert.batch.rows_out") == [float(b["rows_out"]) for b in committed]
    assert values("upsert.batch.rejects") == [0.0, 0.0]
    written = values("upsert.batch.bytes_written")
    assert written == [float(b["bytes_written"]) for b in committed] and all(w > 0 for w in written)
    assert values("upsert.upper") == [1.0, 2.0, 2.0]
    # The first batch left the second's files pending: lag in segments, and their age.
    assert values("upsert.lag", unit="segments") == [2.0, 0.0, 0.0]
    ages = values("upsert.lag_seconds")
    assert len(ages) == 3 and ages[0] > 0 and ages[1:] == [0.0, 0.0]
    durations = [(t["outcome"], v, kind) for n, t, v, kind in lines if n == "upsert.batch.duration"]
    assert [(o, kind) for o, _, kind in durations] == [("committed", "ms"), ("committed", "ms"),
                                                        ("nothing_to_do", "ms")]
    assert all(v > 0 for _, v, _ in durations)
    assert values("upsert.live_runs") == [2.0]
    kinds = {n: kind for n, _, _, kind in lines}
    assert kinds["upsert.batch.rows_in"] == "c" and kinds["upsert.lag"] == "g"

    ok(capsys, "compact", "orders", "--statsd", listener.address)
    ok(capsys, "checkpoint", "create", "orders", "--statsd", listener.address)
    ok(capsys, "gc", "orders", "--grace", "0", "--statsd", listener.address)
    lines = [parse_line(line) for line in listener.drain("after-maintenance")]
    assert [(n, t, kind) for n, t, _, kind in lines] == [
        ("upsert.compact.duration", {"shard": "orders"}, "ms"),
        ("upsert.live_runs", {"shard": "orders"}, "g"),
        ("upsert.checkpoint.duration", {"shard": "orders"}, "ms"),
        ("upsert.gc.duration", {"shard": "orders"}, "ms"),
    ]
    assert lines[1][2] == 1.0  # one compacted run is all a read merges now
    assert all(v > 0 for n, _, v, _ in lines if n.endswith(".duration"))

    ok(capsys, "frontier", "status", "orders", "--statsd", listener.address)
    lines = {n: (t, v) for n, t, v, _ in map(parse_line, listener.drain("after-status"))}
    assert lines["upsert.frontier.status"] in (({"shard": "orders", "status": "OK"}, 0.0),
                                               ({"shard": "orders", "status": "IDLE"}, 1.0))
    assert lines["upsert.frontier.breach"] == ({"shard": "orders"}, 0.0)
    assert lines["upsert.lag"] == ({"shard": "orders", "unit": "segments"}, 0.0)


def test_the_environment_variable_turns_metrics_on_and_nothing_is_sent_without_it(spark, landing, capsys, listener,
                                                                                   monkeypatch):
    ok(capsys, "init", "orders", "--source", f"dir:{landing}", "--key", "id", "--schema", SAMPLE_SCHEMA_DDL,
       "--max-files-per-batch", "2")
    ok(capsys, "run-batch", "orders")
    ok(capsys, "gc", "orders")
    ok(capsys, "frontier", "status", "orders")
    assert listener.drain("metrics-off") == []
    monkeypatch.setenv("UPSERT_STATSD", listener.address)
    ok(capsys, "run-batch", "orders")
    names = [parse_line(line)[0] for line in listener.drain("metrics-on")]
    assert names.count("upsert.batch.outcome") == 1 and "upsert.live_runs" in names


@pytest.mark.parametrize("value", ["localhost", "127.0.0.1:0", "127.0.0.1:70000", ":8125", "host:port"])
def test_a_bad_statsd_address_is_refused_before_anything_runs(tmp_path, capsys, monkeypatch, value):
    monkeypatch.setenv("UPSERT_CONSENSUS_URL", f"sqlite:///{tmp_path / 'c.db'}")
    code, out, _ = run(capsys, "status", "orders", "--statsd", value, "--json")
    assert code == 2
    assert json.loads(out)["field"] == "statsd" and repr(value) in json.loads(out)["message"]
    monkeypatch.setenv("UPSERT_STATSD", value)
    code, _, err = run(capsys, "status", "orders")
    assert code == 2 and f"UPSERT_STATSD takes HOST:PORT (a UDP port 1-65535), not {value!r}" in err
    assert not (tmp_path / "c.db").exists()  # refused before the store was opened
