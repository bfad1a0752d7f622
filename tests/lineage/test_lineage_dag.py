"""The OpenLineage provider's real listener reports every operator of one `airflow dags test`
run (upsert, compact, checkpoint, publish, restore, seek in sequence, on the embedded store)
through a `file` transport: the test reads the events as they were sent and holds their
datasets, facets and statistics to the shard's XCom results and its files on disk.

One DAG run for all the operators, to keep the suite's time down. Its events are also the
example in docs/lineage.md (``test_the_docs_example_is_an_event_as_sent``)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys

import pytest

from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.sample_data import SampleSpec, generate
from tests.airflow.conftest import AirflowHome, failure_text, init_shard
from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.slow

DAG_ID = "lineage_probe"
TASKS = ("upsert", "compact", "checkpoint", "publish", "restore", "seek")
PRODUCER = "https://pypi.org/project/airflow-upsert-provider/0.1.0/"
SCHEMA = [("id", "long"), ("name", "string"), ("amount", "double"), ("updated_at", "long"), ("deleted", "boolean")]

DAG = '''
import pendulum
from airflow.sdk import dag

from airflow_upsert_provider.operators.lifecycle import SeekSourceOperator
from airflow_upsert_provider.operators.maintenance import (
    CheckpointCommitOperator, CompactShardOperator, PublishIcebergOperator, RestoreCheckpointOperator,
)
from airflow_upsert_provider.operators.upsert import MicroBatchUpsertOperator


@dag(dag_id="lineage_probe", schedule=None, start_date=pendulum.datetime(2024, 1, 1), catchup=False)
def probe():
    (
        MicroBatchUpsertOperator(task_id="upsert", shard="orders", until_caught_up=True, retries=0)
        >> CompactShardOperator(task_id="compact", shard="orders", retries=0)
        >> CheckpointCommitOperator(task_id="checkpoint", shard="orders", retries=0)
        >> PublishIcebergOperator(task_id="publish", shard="orders", table="lake.orders", retries=0)
        >> RestoreCheckpointOperator(task_id="restore", shard="orders", target_shard="orders_restored", retries=0)
        >> SeekSourceOperator(task_id="seek", shard="orders_restored", retries=0,
                              epoch="{{ ti.xcom_pull(task_ids='restore')['stream']['epoch'] }}")
    )


probe()
'''


@pytest.fixture(scope="module")
def lineage_run(airflow_home: AirflowHome, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("lineage")
    dags = root / "dags"
    dags.mkdir()
    (dags / "lineage_probe.py").write_text(DAG)
    landing = str(root / "landing")
    generate(landing, SampleSpec(records=600, keys=150, partitions=2, segments_per_partition=2, seed=7))
    consensus_url = f"sqlite:///{root / 'consensus.db'}"
    blob_root = str(root / "blob")
    init_shard(consensus_url, blob_root, landing, max_files_per_batch=2)
    events_file = root / "events.jsonl"
    env = airflow_home.env(
        consensus_url, blob_root, AIRFLOW__CORE__DAGS_FOLDER=str(dags),
        AIRFLOW__OPENLINEAGE__TRANSPORT=json.dumps({"type": "file", "log_file_path": str(events_file),
                                                    "append": True}),
        AIRFLOW__OPENLINEAGE__NAMESPACE="lineage-test",
    )
    proc = airflow_home.dags_test(DAG_ID, env)
    run_id = airflow_home.latest_run(DAG_ID)
    for task in TASKS:
        assert airflow_home.task_instance(DAG_ID, run_id, task)[0] == "success", f"{task}\n{failure_text(proc)}"
    events = [json.loads(line) for line in events_file.read_text().splitlines() if line.strip()]
    return {"events": events, "xcom": {t: airflow_home.xcom(DAG_ID, run_id, t) for t in TASKS},
            "landing": landing, "blob": blob_root, "consensus_url": consensus_url, "text": events_file.read_text()}


def task_event(run: dict, task: str, event_type: str = "COMPLETE") -> dict:
    found = [e for e in run["events"] if e["job"]["name"] == f"{DAG_ID}.{task}" and e["eventType"] == event_type]
    assert len(found) == 1, f"{len(found)} {event_type} events of {task}"
    return found[0]


def names(datasets: list[dict]) -> list[tuple[str, str]]:
    return [(d["namespace"], d["name"]) for d in datasets]


def fields(dataset: dict) -> list[tuple[str, str]]:
    return [(f["name"], f["type"]) for f in dataset["facets"]["schema"]["fields"]]


def frontier(event: dict) -> dict:
    facet = event["job"]["facets"]["upsert_frontier"]
    assert facet["_producer"] == PRODUCER
    assert facet["_schemaURL"] == f"{PRODUCER}lineage-facets.json#/$defs/UpsertFrontierJobFacet"
    return {k: facet[k] for k in ("shard", "upper", "since", "status")}


def test_the_upsert_reports_the_directory_it_read_and_the_shard_it_wrote_with_its_batches(lineage_run):
    files = f"file://{socket.getfqdn()}"
    event = task_event(lineage_run, "upsert")
    report = lineage_run["xcom"]["upsert"]
    assert names(event["inputs"]) == [(files, lineage_run["landing"])]
    assert names(event["outputs"]) == [(files, f"{lineage_run['blob']}/orders")]
    assert fields(event["inputs"][0]) == fields(event["outputs"][0]) == SCHEMA
    committed = [b for b in report["batches"] if b["outcome"] == "committed"]
    assert len(committed) == report["upper"] >= 2
    # The bytes are the committed runs' files, as the store records them and as they are on disk.
    consensus = open_consensus(lineage_run["consensus_url"])
    try:
        run_files = [f for b in committed for f in consensus.get_batch("orders", b["ts"]).run["files"]]
    finally:
        consensus.dispose()
    on_disk = sum(os.path.getsize(os.path.join(lineage_run["blob"], f["path"])) for f in run_files)
    assert on_disk == sum(f["bytes"] for f in run_files) > 0
    statistics = event["outputs"][0]["outputFacets"]["outputStatistics"]
    assert (statistics["rowCount"], statistics["size"]) == (sum(b["rows_out"] for b in committed),
                                                            sum(f["bytes"] for f in run_files))
    batches = event["outputs"][0]["outputFacets"]["upsert_batches"]
    assert batches["_producer"] == PRODUCER
    assert {k: batches[k] for k in ("from_ts", "to_ts", "rows_out")} == {
        "from_ts": 0, "to_ts": report["upper"], "rows_out": statistics["rowCount"]}
    assert frontier(event) == {"shard": "orders", "upper": report["upper"], "since": 0, "status": "READY"}


def test_compaction_checkpoint_and_publish_report_what_they_read_and_wrote(lineage_run):
    files = f"file://{socket.getfqdn()}"
    shard = (files, f"{lineage_run['blob']}/orders")
    compact, compacted = task_event(lineage_run, "compact"), lineage_run["xcom"]["compact"]
    assert names(compact["inputs"]) == names(compact["outputs"]) == [shard]
    assert compact["outputs"][0]["outputFacets"]["outputStatistics"] == {
        **compact["outputs"][0]["outputFacets"]["outputStatistics"],
        "rowCount": compacted["rows"], "size": compacted["bytes"], "fileCount": compacted["files"]}
    assert compacted["rows"] > 0 and compacted["since"] == lineage_run["xcom"]["upsert"]["upper"]
    assert frontier(compact)["since"] == compacted["since"]

    checkpoint, entry = task_event(lineage_run, "checkpoint"), lineage_run["xcom"]["checkpoint"]
    directory = f"{lineage_run['blob']}/orders/checkpoints/{entry['id']}"
    assert os.path.isfile(os.path.join(directory, "MANIFEST.json"))
    assert names(checkpoint["inputs"]) == [shard] and names(checkpoint["outputs"]) == [(files, directory)]
    statistics = checkpoint["outputs"][0]["outputFacets"]["outputStatistics"]
    assert (statistics["size"], statistics["fileCount"]) == (entry["bytes"], entry["files"])

    publish, published = task_event(lineage_run, "publish"), lineage_run["xcom"]["publish"]
    assert published["outcome"] == "published"
    # The default catalog: the SQL catalog in the consensus store, named by its database.
    catalog = lineage_run["consensus_url"].replace("sqlite:///", "sqlite:////", 1) \
        if not lineage_run["consensus_url"].startswith("sqlite:////") else lineage_run["consensus_url"]
    assert names(publish["inputs"]) == [shard] and names(publish["outputs"]) == [(catalog, "lake.orders")]
    assert fields(publish["outputs"][0]) == SCHEMA
    statistics = publish["outputs"][0]["outputFacets"]["outputStatistics"]
    assert (statistics["rowCount"], statistics["size"], statistics["fileCount"]) == (
        published["rows"], published["bytes"], published["files"])


def test_restore_and_seek_report_the_checkpoint_the_source_and_the_restored_shard(lineage_run):
    files = f"file://{socket.getfqdn()}"
    entry = lineage_run["xcom"]["checkpoint"]
    restored = (files, f"{lineage_run['blob']}/orders_restored")
    restore = task_event(lineage_run, "restore")
    assert names(restore["inputs"]) == [(files, f"{lineage_run['blob']}/orders/checkpoints/{entry['id']}")]
    assert names(restore["outputs"]) == [restored]
    assert frontier(restore) == {"shard": "orders_restored", "upper": entry["upper"], "since": entry["since"],
                                 "status": "RECOVERING"}
    seek = task_event(lineage_run, "seek")
    assert names(seek["inputs"]) == [(files, lineage_run["landing"])] and names(seek["outputs"]) == [restored]
    assert frontier(seek)["upper"] == lineage_run["xcom"]["seek"]["upper"] == entry["upper"]


def test_start_events_name_no_dataset_and_every_task_ran_one_start_and_one_complete(lineage_run):
    for task in TASKS:
        start = task_event(lineage_run, task, "START")
        assert start["inputs"] == [] and start["outputs"] == []
        assert task_event(lineage_run, task)["run"]["runId"] == start["run"]["runId"]


def test_the_docs_example_is_an_event_as_sent(lineage_run):
    """docs/lineage.md shows the upsert's COMPLETE event as this run sent it, its run-specific
    values (times, ids, paths, host, versions) replaced by placeholders."""
    with open(os.path.join(REPO_ROOT, "docs", "lineage.md"), encoding="utf-8") as handle:
        docs = handle.read()
    shown = json.loads(re.search(r"<!-- event -->\n```json\n(.*?)\n```", docs, re.S).group(1))
    sent = task_event(lineage_run, "upsert")
    assert shape(shown) == shape(sent)
    assert shown["inputs"][0]["facets"]["schema"]["fields"] == sent["inputs"][0]["facets"]["schema"]["fields"]
    assert shown["job"]["facets"]["upsert_frontier"].keys() == sent["job"]["facets"]["upsert_frontier"].keys()


def shape(value):
    """The keys of every object, and the lengths of lists, of an event."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shape(v) for v in value]
    return type(value).__name__ if not isinstance(value, (int, float)) or isinstance(value, bool) else "number"


def test_without_a_transport_the_listener_is_not_registered(airflow_home, lineage_run):
    """What the other Airflow tests run with: the provider installed, no transport: its plugin
    loads but registers no listener (no fork, no extraction per task). With a transport (the
    DAG run above) it is, and sent events."""
    assert lineage_run["events"]
    probe = ("from airflow.listeners.listener import get_listener_manager; "
             "print(sorted(type(p).__name__ for p in get_listener_manager().pm.get_plugins()))")
    proc = subprocess.run([sys.executable, "-c", probe], env=airflow_home.base_env, text=True, capture_output=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "OpenLineageListener" not in proc.stdout.splitlines()[-1]
