"""The lineage rules without Airflow running: dataset names and namespaces over grids of
locations, the description of each kind of task, the custom facets against their schema, the
parent-job properties of a submitted job, and the package with the provider absent."""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest

from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.lineage import operator_lineage
from airflow_upsert_provider.lineage.rules import (
    CHECKPOINT, COMPACT, KINDS_BY_OPERATOR, PUBLISH, RESTORE, SEEK, UPSERT, Captured, ShardFacts, catalog_namespace,
    committed_range, describe, kafka_namespace, location_dataset, schema_fields, shard_dataset, source_dataset,
)
from tests.conftest import REPO_ROOT

HOSTS = ("worker-1.example.com", "localhost", "10.0.0.7")


def test_a_location_is_named_by_its_filesystem_and_path_over_a_grid():
    paths = ("/data/landing", "/data/landing/", "/a/b/c", "/")
    for host, path in itertools.product(HOSTS, paths):
        assert location_dataset(path, host) == (f"file://{host}", os.path.abspath(path))
        assert location_dataset(f"file://{path}", host) == (f"file://{host}", os.path.abspath(path))
    for scheme, bucket, key in itertools.product(("s3", "gs", "abfs", "hdfs"), ("lake", "b-1"),
                                                 ("", "shards", "a/b/c", "a/b/")):
        uri = f"{scheme}://{bucket}/{key}"
        assert location_dataset(uri, "ignored") == (f"{scheme}://{bucket}", key.strip("/") or "/")
    # A URI with credentials is refused, naming it without them.
    for uri in ("s3://AKIA:secret@lake/shards", "s3://lake/shards?secret_key=abc"):
        with pytest.raises(ConfigurationError) as refused:
            location_dataset(uri, "h")
        assert "secret" not in refused.value.message and "abc" not in refused.value.message


def test_the_shard_and_its_checkpoints_are_directories_under_the_blob_root():
    assert shard_dataset("/srv/blob", "orders", "h") == ("file://h", "/srv/blob/orders")
    assert shard_dataset("/srv/blob/", "orders", "h") == ("file://h", "/srv/blob/orders")
    assert shard_dataset("s3://lake/shards", "orders", "h") == ("s3://lake", "shards/orders")
    assert shard_dataset("s3://lake", "orders", "h") == ("s3://lake", "orders")


def test_a_kafka_topic_is_named_by_its_first_bootstrap_server_and_an_unknown_one_is_left_out():
    cases = {
        "broker:9092": "kafka://broker:9092",
        "b1:9092,b2:9092": "kafka://b1:9092",
        " SASL_SSL://b1.example.com:9093 , b2:9093": "kafka://b1.example.com:9093",
        "127.0.0.1:39001": "kafka://127.0.0.1:39001",
    }
    for servers, namespace in cases.items():
        assert kafka_namespace(servers) == namespace
        assert source_dataset("kafka:events", "h", servers) == (namespace, "events")
    assert source_dataset("kafka:events", "h", None) is None
    assert source_dataset("dir:/data/landing", "h", None) == ("file://h", "/data/landing")
    with pytest.raises(ValueError, match="unknown source"):
        source_dataset("ftp:/x", "h", None)


def test_a_catalog_namespace_never_carries_credentials_over_a_seeded_sweep():
    rng = random.Random(37)
    for _ in range(500):
        scheme = rng.choice(["https", "http", "postgresql", "postgresql+psycopg", "sqlite"])
        user = rng.choice(["", "upsert", "svc.user"])
        secret = f"S3cr3t{rng.randrange(10**6)}"
        host = rng.choice(["catalog.example.com", "db", "10.1.2.3"])
        port = rng.choice(["", ":5432", ":8181"])
        path = rng.choice(["", "/", "/api/catalog", "/upsert"])
        query = rng.choice(["", f"?token={secret}", "?sslmode=require"])
        auth = f"{user}:{secret}@" if user else ""
        namespace = catalog_namespace(f"{scheme}://{auth}{host}{port}{path}{query}")
        assert secret not in namespace and "@" not in namespace and "?" not in namespace
        assert namespace == f"{scheme.split('+')[0]}://{host}{port}{path}"
    assert catalog_namespace("sqlite:////var/lib/upsert/consensus.db") == "sqlite:////var/lib/upsert/consensus.db"


def test_schema_fields_name_simple_types_and_the_kind_of_nested_ones():
    schema = {"type": "struct", "fields": [
        {"name": "id", "type": "long", "nullable": False, "metadata": {}},
        {"name": "tags", "type": {"type": "array", "elementType": "string", "containsNull": True},
         "nullable": True, "metadata": {}},
        {"name": "address", "type": {"type": "struct", "fields": []}, "nullable": True, "metadata": {}},
    ]}
    assert schema_fields(json.dumps(schema)) == [("id", "long"), ("tags", "array"), ("address", "struct")]


def batch(ts: int, outcome: str, rows_out: int) -> dict:
    return {"ts": ts, "outcome": outcome, "rows_out": rows_out}


def test_the_committed_range_counts_only_the_tasks_own_commits_over_seeded_runs():
    rng = random.Random(11)
    outcomes = ("committed", "already_committed", "already_persisted", "nothing_to_do")
    for _ in range(400):
        start = rng.randrange(0, 50)
        steps = [batch(start + i, rng.choice(outcomes), rng.randrange(0, 100)) for i in range(rng.randrange(0, 6))]
        own = [b for b in steps if b["outcome"] in ("committed", "already_committed")]
        found = committed_range({"batches": steps})
        if not own:
            assert found is None
            continue
        assert found == {"from_ts": own[0]["ts"], "to_ts": own[-1]["ts"] + 1,
                         "rows_out": sum(b["rows_out"] for b in own), "schema_version": None}


FACTS = ShardFacts(shard="orders", blob_root="/srv/blob", host="h", source="dir:/data/landing", kafka_bootstrap=None,
                   fields=(("id", "long"), ("name", "string")), upper=5, since=3, status="READY")


def names(specs) -> list[tuple[str, str]]:
    return [(s.namespace, s.name) for s in specs]


def test_each_kind_of_task_reads_and_writes_its_datasets():
    shard, source = ("file://h", "/srv/blob/orders"), ("file://h", "/data/landing")
    # Bytes as the writer recorded them per batch; a batch a peer persisted is not this task's.
    upsert = describe(Captured(UPSERT, FACTS, {"batches": [{**batch(3, "committed", 7), "bytes_written": 700},
                                                           {**batch(4, "already_committed", 2), "bytes_written": 200},
                                                           {**batch(5, "already_persisted", 0), "bytes_written": 0}]}))
    assert (names(upsert.inputs), names(upsert.outputs)) == ([source], [shard])
    assert (upsert.outputs[0].rows, upsert.outputs[0].bytes) == (9, 900)
    assert upsert.outputs[0].batches == {"from_ts": 3, "to_ts": 5, "rows_out": 9, "schema_version": None}
    assert upsert.frontier == {"shard": "orders", "upper": 5, "since": 3, "status": "READY"}
    caught_up = describe(Captured(UPSERT, FACTS, {"batches": [batch(5, "nothing_to_do", 0)]}))
    assert caught_up.outputs[0].batches is None and caught_up.outputs[0].rows == 0

    compact = describe(Captured(COMPACT, FACTS, {"rows": 10, "bytes": 500, "files": 4}))
    assert names(compact.inputs) == names(compact.outputs) == [shard]
    assert (compact.outputs[0].rows, compact.outputs[0].bytes, compact.outputs[0].files) == (10, 500, 4)

    checkpoint = describe(Captured(CHECKPOINT, FACTS, {"id": "cp-1", "files": 6, "bytes": 800}))
    assert names(checkpoint.outputs) == [("file://h", "/srv/blob/orders/checkpoints/cp-1")]
    restored = ShardFacts(**{**FACTS.__dict__, "shard": "orders_2", "status": "RECOVERING"})
    restore = describe(Captured(RESTORE, restored, {"checkpoint": "cp-1"}, {"from_shard": "orders"}))
    assert names(restore.inputs) == [("file://h", "/srv/blob/orders/checkpoints/cp-1")]
    assert names(restore.outputs) == [("file://h", "/srv/blob/orders_2")] and restore.frontier["status"] == "RECOVERING"

    seek = describe(Captured(SEEK, FACTS, {}))
    assert (names(seek.inputs), names(seek.outputs)) == ([source], [shard])
    kafka = ShardFacts(**{**FACTS.__dict__, "source": "kafka:events", "kafka_bootstrap": "b:9092"})
    assert names(describe(Captured(SEEK, kafka, {})).inputs) == [("kafka://b:9092", "events")]
    unknown = ShardFacts(**{**FACTS.__dict__, "source": "kafka:events"})
    assert describe(Captured(SEEK, unknown, {})).inputs == ()

    publish = describe(Captured(PUBLISH, FACTS, {"table": "lake.orders", "rows": 3, "bytes": 40, "files": 1},
                                {"table_namespace": "https://catalog.example.com/api"}))
    assert names(publish.outputs) == [("https://catalog.example.com/api", "lake.orders")]
    assert publish.outputs[0].fields == FACTS.fields
    assert set(KINDS_BY_OPERATOR.values()) == {UPSERT, COMPACT, CHECKPOINT, RESTORE, SEEK, PUBLISH}


def test_the_custom_facets_follow_the_spec_rules_and_validate_against_their_schema():
    jsonschema = pytest.importorskip("jsonschema")
    from openlineage.client.serde import Serde

    from airflow_upsert_provider.lineage.facets import FACET_SCHEMA, PRODUCER

    lineage = operator_lineage(Captured(UPSERT, FACTS, {"batches": [{**batch(3, "committed", 7), "bytes_written": 1}]}))
    sent = {
        "UpsertFrontierJobFacet": json.loads(Serde.to_json(lineage.job_facets["upsert_frontier"])),
        "UpsertBatchesOutputDatasetFacet": json.loads(Serde.to_json(lineage.outputs[0].outputFacets["upsert_batches"])),
    }
    for name, facet in sent.items():
        assert facet["_producer"] == PRODUCER == "https://pypi.org/project/airflow-upsert-provider/0.1.0/"
        assert facet["_schemaURL"] == f"{PRODUCER}lineage-facets.json#/$defs/{name}"
        # Each definition, its reference to the spec's base facet left out (not fetched here).
        definition = FACET_SCHEMA["$defs"][name]["allOf"][1]
        jsonschema.validate(facet, definition)
        assert set(definition["properties"]) <= set(facet) | {"schema_version"}
    assert sent["UpsertFrontierJobFacet"] == {**sent["UpsertFrontierJobFacet"], "shard": "orders", "upper": 5,
                                              "since": 3, "status": "READY"}
    assert lineage.outputs[0].outputFacets["outputStatistics"].rowCount == 7
    assert [f.name for f in lineage.inputs[0].facets["schema"].fields] == ["id", "name"]
    assert operator_lineage(None) is None
    # docs/lineage.md shows the schema as the package holds it.
    with open(os.path.join(REPO_ROOT, "docs", "lineage.md"), encoding="utf-8") as handle:
        shown = re.search(r"<!-- facet-schema -->\n```json\n(.*?)\n```", handle.read(), re.S).group(1)
    assert json.loads(shown) == FACET_SCHEMA


def test_capture_reads_nothing_when_openlineage_is_not_configured(monkeypatch):
    from airflow_upsert_provider.lineage import capture

    for name in [n for n in os.environ if n.startswith(("AIRFLOW__OPENLINEAGE__", "OPENLINEAGE"))]:
        monkeypatch.delenv(name)

    class NoHook:  # any use fails the test
        def __getattr__(self, name):
            raise AssertionError(f"the hook was used: {name}")

    operator = type("CompactShardOperator", (), {"shard": "orders"})()
    assert capture(operator, NoHook(), {"rows": 1}) is None


def test_a_broken_lineage_setting_or_read_never_fails_the_task(monkeypatch, caplog):
    """A transport setting the provider cannot parse, a store that cannot be read: the task's
    work is done, its lineage is left out with a warning."""
    from airflow_upsert_provider.lineage import capture, parent_job_spark_conf

    class MyCompaction(type("CompactShardOperator", (), {})):  # a DAG's subclass reports as its base
        shard = "orders"

    class BrokenHook:
        def open_shard(self, shard_id):
            raise RuntimeError(f"store unreachable for {shard_id}")

    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__TRANSPORT", '{"type": "console"}')
    assert capture(MyCompaction(), BrokenHook(), {"rows": 1}) is None
    assert "the lineage of shard orders was not read: RuntimeError: store unreachable for orders" in caplog.text
    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__TRANSPORT", "{not json")
    assert capture(MyCompaction(), BrokenHook(), {"rows": 1}) is None
    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__TRANSPORT", '{"type": "console"}')
    monkeypatch.setenv("AIRFLOW__OPENLINEAGE__SPARK_INJECT_PARENT_JOB_INFO", "true")
    # A context without a task instance: the provider's helper fails; the job runs without a parent.
    assert parent_job_spark_conf({"spark.ui.enabled": "false"}, {}) == {"spark.ui.enabled": "false"}
    assert "OpenLineage: no parent job information for the Spark job: KeyError" in caplog.text


def ti(dag_id: str = "orders_dag", task_id: str = "upsert") -> SimpleNamespace:
    import pendulum

    run = SimpleNamespace(logical_date=pendulum.datetime(2026, 11, 28, tz="UTC"), run_after=None, clear_number=0,
                          conf={})
    return SimpleNamespace(dag_id=dag_id, task_id=task_id, try_number=1, map_index=-1, dag_run=run,
                           get_template_context=lambda: {"dag_run": run})


def submit_command(monkeypatch, tmp_path, **env: str) -> list[str]:
    from airflow_upsert_provider.hooks.upsert import UpsertShardHook
    from airflow_upsert_provider.operators.upsert import MicroBatchUpsertOperator, _RunPlan

    monkeypatch.setenv("AIRFLOW_CONN_UPSERT_DEFAULT", json.dumps({"conn_type": "upsert", "extra": {
        "consensus_url": f"sqlite:///{tmp_path / 'c.db'}", "blob_root": str(tmp_path)}}))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[1]"}))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    operator = MicroBatchUpsertOperator(task_id="upsert", shard="orders", spark_mode="submit",
                                        spark_conf={"spark.ui.enabled": "false"})
    workdir = tmp_path / f"work{len(list(tmp_path.iterdir()))}"
    workdir.mkdir(mode=0o700)
    hook = UpsertShardHook()
    submit = operator._build_submit_hook(hook, _RunPlan("w", 1, False, None, "fail"), str(tmp_path), str(workdir),
                                         str(workdir / "r.json"), None, {"ti": ti(), "dag_run": ti().dag_run})
    return submit._build_spark_submit_command(os.path.abspath("spark_job.py"))


def confs(command: list[str]) -> dict[str, str]:
    pairs = [command[i + 1].split("=", 1) for i, arg in enumerate(command) if arg == "--conf"]
    return {key: value for key, value in pairs}


def test_a_submitted_job_gets_the_parent_job_properties_when_the_option_is_on(monkeypatch, tmp_path):
    from airflow.providers.openlineage.plugins.macros import lineage_run_id

    transport = json.dumps({"type": "console"})
    on = confs(submit_command(monkeypatch, tmp_path, AIRFLOW__OPENLINEAGE__TRANSPORT=transport,
                              AIRFLOW__OPENLINEAGE__NAMESPACE="prod",
                              AIRFLOW__OPENLINEAGE__SPARK_INJECT_PARENT_JOB_INFO="true"))
    assert on["spark.openlineage.parentJobNamespace"] == on["spark.openlineage.rootParentJobNamespace"] == "prod"
    assert on["spark.openlineage.parentJobName"] == "orders_dag.upsert"
    assert on["spark.openlineage.parentRunId"] == lineage_run_id(ti())
    assert on["spark.openlineage.rootParentJobName"] == "orders_dag"
    assert on["spark.ui.enabled"] == "false"  # the operator's own settings stay
    assert not any(key.startswith("spark.openlineage.transport") for key in on)
    off = confs(submit_command(monkeypatch, tmp_path, AIRFLOW__OPENLINEAGE__SPARK_INJECT_PARENT_JOB_INFO="false"))
    assert not any(key.startswith("spark.openlineage") for key in off)


BLOCKED = r"""
import importlib.abc, sys

# Airflow's own start reads every installed provider's metadata (the provider is installed
# here); then every module of it is forgotten and any import of it fails, as where it is absent.
from airflow.configuration import conf
from airflow.providers_manager import ProvidersManager
conf.get("core", "dags_folder")
ProvidersManager().initialize_providers_configuration()
for name in [m for m in sys.modules if m == "openlineage" or m.startswith(("openlineage.", "airflow.providers.openlineage"))]:
    del sys.modules[name]

class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "openlineage" or name.startswith(("openlineage.", "airflow.providers.openlineage")):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, Absent())
from types import SimpleNamespace
import airflow_upsert_provider.lineage as lineage
from airflow_upsert_provider.operators.upsert import MicroBatchUpsertOperator
from airflow_upsert_provider.operators.maintenance import CompactShardOperator
from airflow_upsert_provider.operators.lifecycle import SeekSourceOperator

assert lineage.lineage_enabled() is False
operator = CompactShardOperator(task_id="compact", shard="orders")
assert lineage.capture(operator, None, {"rows": 1}) is None
assert operator.get_openlineage_facets_on_complete(None) is None
assert lineage.parent_job_spark_conf({"a": "b"}, {}) == {"a": "b"}
loaded = sorted(m for m in sys.modules if m == "openlineage" or m.startswith(("openlineage.", "airflow.providers.openlineage")))
print("loaded:", loaded)
"""


def test_without_the_provider_the_operators_import_and_nothing_of_it_is_imported():
    env = dict(os.environ, PYTHONPATH=REPO_ROOT, AIRFLOW__OPENLINEAGE__TRANSPORT='{"type": "console"}',
               AIRFLOW__OPENLINEAGE__SPARK_INJECT_PARENT_JOB_INFO="true")
    proc = subprocess.run([sys.executable, "-c", BLOCKED], env=env, text=True, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip().splitlines()[-1] == "loaded: []"
