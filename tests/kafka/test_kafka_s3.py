"""A Kafka shard whose blob root is on the loopback S3 server: `upsertctl` in this process, on
the session's Spark whose executors get the server's variables (``s3_executors``), fetches the
topic's slices and writes each batch's runs to the bucket; the table is what the topic holds,
and `upsertctl frontier observe` sees the shard caught up with the topic."""

from __future__ import annotations

import json

import pytest

from airflow_upsert_provider.engine.store.registry import open_consensus
from tests.helpers import Upsertctl
from tests.kafka.conftest import MOCK_PARTITIONS, produce_changes
from tests.oracle import table_from_rows
from tests.test_run_io_s3 import check_run_is_what_is_stored

pytestmark = pytest.mark.slow


def test_a_kafka_shard_on_s3_holds_what_the_topic_holds(s3_server, s3_root, s3_executors, tmp_path, capsys,
                                                         kafka_bootstrap, kafka_topic):
    # Keys keep to one partition each (key % 4); every key is written twice, every 7th then
    # deleted by a tombstone: the table holds each key's last value unless it was deleted.
    changes = [(i % MOCK_PARTITIONS, str(i), {"id": i, "name": f"first-{i}"}) for i in range(120)]
    changes += [(i % MOCK_PARTITIONS, str(i), {"id": i, "name": f"last-{i}"}) for i in range(0, 120, 2)]
    changes += [(i % MOCK_PARTITIONS, str(i), None) for i in range(0, 120, 7)]
    produce_changes(kafka_bootstrap, kafka_topic, changes)
    topic_holds = {}
    for _, key, change in changes:
        if change is None:
            topic_holds.pop((int(key),), None)
        else:
            topic_holds[(int(key),)] = change

    config = tmp_path / "kafka.json"
    config.write_text(json.dumps({"bootstrap.servers": kafka_bootstrap}))
    url = f"sqlite:///{tmp_path / 'consensus.db'}"
    run = Upsertctl(capsys, url, s3_root, "--kafka-config", str(config)).ok
    run("init", "k", "--source", f"kafka:{kafka_topic}", "--key", "id", "--schema", "id BIGINT, name STRING",
        "--buckets", "2", "--max-records-per-batch", "120")
    batches = json.loads(run("run-batch", "k", "--until-caught-up", "--json"))["batches"]
    assert [b["outcome"] for b in batches][:2] == ["committed", "committed"]
    assert table_from_rows(json.loads(line) for line in run("read", "k").splitlines()) == topic_holds

    bucket, prefix = s3_root[len("s3://"):].split("/", 1)
    consensus = open_consensus(url)
    try:
        committed = consensus.batches("k")
        assert len(committed) == 2 and sum(b.run["rows"] for b in committed) > 0
        for batch in committed:
            check_run_is_what_is_stored(s3_server, bucket, prefix, batch.run)
    finally:
        consensus.dispose()

    # The frontier of the shard on S3, observed against the topic.
    out = json.loads(run("frontier", "observe", "k", "--json"))
    assert out["unobservable"] == {}
    [observed] = out["observations"]
    offsets = {str(p): sum(1 for q, _, _ in changes if q == p) for p in range(MOCK_PARTITIONS)}
    assert observed["shard_id"] == "k" and observed["upper"] == 2
    assert (observed["high_watermark"], observed["lag"], observed["lag_unit"]) == (offsets, 0, "records")
