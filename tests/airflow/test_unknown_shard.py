"""An unknown shard names the closest existing one, in the operators, the sensor's rounds and
`upsertctl` (no Spark: every one fails before a session would start)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_upsert_provider.cli import main
from airflow_upsert_provider.engine.blob.files import open_blob
from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.operators.lifecycle import StopStreamOperator
from airflow_upsert_provider.operators.maintenance import CompactShardOperator
from airflow_upsert_provider.operators.upsert import MicroBatchUpsertOperator


@pytest.fixture
def store(tmp_path, monkeypatch) -> str:
    url = f"sqlite:///{tmp_path / 'consensus.db'}"
    blob_root = str(tmp_path / "blob")
    open_blob(blob_root).ensure_root()
    consensus = open_consensus(url)
    for shard_id in ("orders", "customers"):
        consensus.create_shard(shard_id, "{}")
    consensus.dispose()
    monkeypatch.setenv("AIRFLOW_CONN_UPSERT_DEFAULT", json.dumps(
        {"conn_type": "upsert", "extra": {"consensus_url": url, "blob_root": blob_root}}))
    monkeypatch.setenv("UPSERT_CONSENSUS_URL", url)
    monkeypatch.setenv("UPSERT_BLOB_ROOT", blob_root)
    return url


def _context(task_id: str) -> dict:
    ti = SimpleNamespace(dag_id="d", run_id="r", task_id=task_id, map_index=-1, try_number=1)
    return {"ti": ti}


@pytest.mark.parametrize("operator", [
    MicroBatchUpsertOperator(task_id="upsert", shard="ordrs"),
    CompactShardOperator(task_id="compact", shard="ordrs"),
    StopStreamOperator(task_id="stop", shard="ordrs", reason="test"),
], ids=lambda o: o.task_id)
def test_operators_name_the_closest_shard(store, operator):
    with pytest.raises(AirflowFailException) as failure:
        operator.execute(_context(operator.task_id))
    assert "'ordrs'" in str(failure.value)
    assert "did you mean 'orders'?" in str(failure.value)


def test_upsertctl_names_the_closest_shard(store, capsys):
    code = main(["status", "custmers", "--no-rows", "--json"])
    out, err = capsys.readouterr()
    assert code == 2, err
    assert "did you mean 'customers'?" in err
    assert json.loads(out)["closest"] == "customers"


def test_nothing_alike_keeps_the_plain_message(store, capsys):
    assert main(["status", "zzzz", "--no-rows"]) == 2
    err = capsys.readouterr().err
    assert "unknown shard 'zzzz'" in err and "did you mean" not in err
