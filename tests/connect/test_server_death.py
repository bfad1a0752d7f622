"""A Spark Connect server that dies in the middle of a batch: the batch fails with the
retryable SparkUnavailable naming the server, within the bounded client retries (not the
client's ten minutes), nothing is committed, and a retry on a live server converges on the
oracle. The server is SIGKILLed from inside the batch's staging step (a hook, not a sleep)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from airflow_upsert_provider.engine.spark import server as spark_server
from airflow_upsert_provider.engine.write import upsert as upsert_module
from airflow_upsert_provider.engine.errors import SparkUnavailable
from airflow_upsert_provider.engine.spark.server import SparkServer, bound_client_retries
from airflow_upsert_provider.engine.write.writer import Writer
from airflow_upsert_provider.sample_data import SampleSpec
from tests.connect.conftest import free_port
from tests.helpers import make_shard
from tests.oracle import oracle_table, table_from_rows

pytestmark = pytest.mark.slow

SPEC = SampleSpec(records=1200, keys=300, partitions=2, segments_per_partition=2, seed=17)


@pytest.fixture
def doomed_server(tmp_path):
    """A second server of its own, that the test kills; stopped (its record cleared) after."""
    server = SparkServer(str(tmp_path / "doomed-state"))
    state = server.start(port=free_port(), master="local[1]", memory="1g",
                         conf={"spark.sql.shuffle.partitions": "2"})
    yield server, state
    server.stop(timeout=5)


def test_a_server_killed_mid_batch_fails_it_retryably_and_a_retry_converges(
        spark, doomed_server, consensus, blob, tmp_path, monkeypatch):
    from pyspark.sql import SparkSession

    server, state = doomed_server
    address = f"sc://127.0.0.1:{state['port']}"
    shard = make_shard(consensus, blob, tmp_path, spec=SPEC, max_files_per_batch=2)

    # Two retries of 50 and 200 ms: the bound itself is what is tested, at a test's scale.
    monkeypatch.setattr(spark_server, "CLIENT_RETRIES", 2)
    session = SparkSession.builder.remote(address).create()
    bound_client_retries(session)
    assert session.range(3).count() == 3

    real_stage = upsert_module.stage_batch

    def kill_then_stage(*args, **kwargs):
        os.kill(state["pid"], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while spark_server.port_answers("127.0.0.1", state["port"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        return real_stage(*args, **kwargs)

    monkeypatch.setattr(upsert_module, "stage_batch", kill_then_stage)
    doomed = Writer(shard, "doomed", spark_factory=lambda: session)
    started = time.monotonic()
    with pytest.raises(SparkUnavailable) as raised:
        doomed.step()
    assert time.monotonic() - started < 60
    assert raised.value.retryable and raised.value.exit_code == 2
    assert raised.value.details["address"] == address
    assert f"the Spark Connect server at {address} stopped answering while batch 0" in raised.value.message
    assert shard.state().upper == 0 and shard.consensus.get_batch(shard.shard_id, 0) is None

    # The retry: a new writer on a live server commits every batch once; the table is the oracle's.
    monkeypatch.setattr(upsert_module, "stage_batch", real_stage)
    retry = Writer(shard, "retry", spark_factory=lambda: spark)
    retry.run(until_caught_up=True)
    assert shard.state().upper > 0
    assert table_from_rows(shard.read(spark).collect()) == oracle_table(shard.source.root)
