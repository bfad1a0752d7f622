"""The provider as Airflow sees it: discovery, the connection form, the example DAGs' parse."""

from __future__ import annotations

import json
import os
import sys

import pytest

from tests.airflow.conftest import failure_text
from tests.conftest import REPO_ROOT

# One Python process for what Airflow discovers and parses: the provider, the example DAGs'
# parse, their params' schemas; each test reads its part.
PROBE = r"""
import copy, json, sys
from airflow.dag_processing.dagbag import DagBag
from airflow.providers_manager import ProvidersManager
from airflow.sdk.exceptions import ParamValidationError

pm = ProvidersManager()
info = pm.providers["airflow-upsert-provider"]
hook = pm.hooks["upsert"]
widgets = {
    name: {"field": w.field_name, "schema": w.field["schema"], "sensitive": w.is_sensitive,
           "package": w.package_name}
    for name, w in pm.connection_form_widgets.items() if name.startswith("extra__upsert__")
}
provider = {
    "version": info.version,
    "package": info.data["package-name"],
    "hook_class": hook.hook_class_name,
    "hook_name": hook.hook_name,
    "connection_id_attr": hook.connection_id_attribute_name,
    "widgets": widgets,
    "behaviour": pm.field_behaviours.get("upsert"),
}

bag = DagBag(dag_folder=sys.argv[1])
parse = {
    "dags": sorted(bag.dag_ids),
    "errors": {k: str(v) for k, v in bag.import_errors.items()},
    "warnings": {k: [str(w) for w in v] for k, v in bag.captured_warnings.items()},
}

bad = json.loads(sys.argv[2])
params_of = {}
for dag_id, dag in bag.dags.items():
    params = {}
    for name in dag.params:
        param = dag.params.get_param(name)
        refused = []
        for value in bad.get(name, []):
            try:
                copy.deepcopy(param).resolve(value=value)
            except ParamValidationError:
                refused.append(value)
        params[name] = {"schema": param.schema, "description": param.description, "refused": refused,
                        "default": param.value, "default_valid": param.resolve(suppress_exception=True) == param.value,
                        "null_valid": copy.deepcopy(param).resolve(value=None, suppress_exception=True) is None
                        and "null" in param.schema.get("type", [])}
    params_of[dag_id] = params
print(json.dumps({"provider": provider, "parse": parse, "params": params_of}))
"""


@pytest.fixture(scope="module")
def airflow_view(airflow_home) -> dict:
    proc = airflow_home.run([sys.executable, "-c", PROBE, os.path.join(REPO_ROOT, "dags"), json.dumps(BAD_VALUES)],
                            airflow_home.base_env)
    assert proc.returncode == 0, failure_text(proc)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_providers_manager_discovers_the_provider_and_its_connection_form(airflow_view):
    found = airflow_view["provider"]
    assert found["package"] == "airflow-upsert-provider"
    assert found["version"] == "0.1.0"
    assert found["hook_class"] == "airflow_upsert_provider.hooks.upsert.UpsertShardHook"
    assert found["connection_id_attr"] == "upsert_conn_id"
    fields = {w["field"]: w for w in found["widgets"].values()}
    assert set(fields) == {
        "consensus_url", "blob_root", "spark_conn_id", "default_buckets", "default_max_files_per_batch",
        "kafka_conn_id", "aws_conn_id",
    }
    assert fields["spark_conn_id"]["schema"]["default"] == "spark_default"
    assert fields["default_buckets"]["schema"]["type"] == ["integer", "null"]
    # Airflow 3.3 shows an extra field's schema examples, not ui-field-behaviour placeholders.
    assert fields["consensus_url"]["schema"]["examples"] == [
        "sqlite:////var/lib/upsert/consensus.db", "postgresql://upsert@db.example.com:5432/upsert",
    ]
    assert fields["blob_root"]["schema"]["examples"] == ["/shared/upsert/blob"]
    assert all(w["schema"].get("examples") for w in fields.values() if "string" in w["schema"]["type"])
    assert {w["package"] for w in fields.values()} == {"airflow-upsert-provider"}
    behaviour = found["behaviour"]
    assert {"host", "port", "login", "schema"} <= set(behaviour["hidden_fields"])
    # The PostgreSQL password lives in the masked password field, relabelled.
    assert "password" not in behaviour["hidden_fields"]
    assert behaviour["relabeling"]["password"].startswith("Consensus password")
    assert not any(name.startswith("extra__") for name in behaviour["placeholders"])


def test_airflow_providers_list_shows_it(airflow_home):
    proc = airflow_home.run([os.path.join(os.path.dirname(sys.executable), "airflow"), "providers", "list",
                             "-o", "json"], airflow_home.base_env)
    assert proc.returncode == 0, failure_text(proc)
    listed = json.loads(proc.stdout[proc.stdout.index("["):])
    mine = [p for p in listed if p["package_name"] == "airflow-upsert-provider"]
    assert mine and mine[0]["version"] == "0.1.0"


def test_example_dags_parse_without_errors_or_warnings(airflow_view):
    parsed = airflow_view["parse"]
    assert parsed["errors"] == {}
    assert parsed["warnings"] == {}
    assert {"upsert_microbatch", "upsert_backfill"} <= set(parsed["dags"])


# Values a user may type in the trigger form that must be refused there, not in the task.
BAD_VALUES = {
    "shard": ["", "a b", "../orders", "x" * 129],
    "spark_mode": ["sumbit", "In_process", ""],
    "batch_size": [0, -1, 100_001, "8"],
    "max_batches": [0, 1_000_001, 2.5],
    "keep_last": [0, -3, "7"],
    "grace_seconds": [-1, "6h"],
    "dry_run": ["treu", "false", 0, None],
    "checkpoint": ["", "Latest", "42", "../x"],
    "restore_target": ["a b", "../orders", "x" * 129],
    "shards": ["orders", [""], ["a b"], ["../orders"], [1]],
    "cadence_seconds": [0, -1, "60"],
    "stall_multiplier": [0, 0.5, "3"],
    "min_stall_seconds": [-1, "900"],
    "window_seconds": [0, 59, "3600"],
    "consecutive_breaches": [0, 101, 1.5, "2"],
    "watch_seconds": [-1, 86401, 2.5, "840"],
    "namespace": ["prod eu", "a/b", "x" * 65],
    "pagerduty_conn_id": ["a b", "pd/x"],
    "slack_conn_id": ["a b", "sl/x"],
    "kafka_conn_id": ["", "a b", "k/x"],
    # The monitor's is optional: blank means the upsert connection's own kafka_conn_id.
    "upsert_frontier_monitor.kafka_conn_id": ["a b", "k/x"],
    "window": ["", "10x", "1h 30", 90],
}


def test_every_dag_param_has_a_title_a_full_description_and_a_schema_that_refuses_bad_input(airflow_view):
    found = airflow_view["params"]
    assert {"upsert_microbatch", "upsert_backfill", "upsert_maintenance", "upsert_recovery", "upsert_frontier_monitor", "upsert_kafka"} <= set(found)
    seen = set()
    for dag_id, params in found.items():
        for name, param in params.items():
            schema = param["schema"]
            where = f"{dag_id}.{name}"
            assert schema.get("title") and schema["title"] != name, where
            # A full sentence, not a two-word label.
            assert len(param["description"] or "") >= 60 and param["description"].endswith("."), where
            assert schema.get("type"), where
            # Bounds live in allOf: the trigger form clamps to a top-level minimum/maximum.
            assert "minimum" not in schema and "maximum" not in schema, where
            assert schema["type"] != "integer" or "minimum" in schema.get("allOf", [{}])[0], where
            # The trigger form submits with the defaults: a blank that means "none" is a null
            # default of a nullable param (the form renders it optional), never a required "".
            assert param["default"] != "" and param["default_valid"], where
            assert param["default"] is not None or param["null_valid"], where
            expected = BAD_VALUES.get(where, BAD_VALUES.get(name, []))
            assert sorted(map(repr, param["refused"])) == sorted(map(repr, expected)), where
            seen.add(where if where in BAD_VALUES else name)
    assert seen == set(BAD_VALUES)


def test_a_param_whose_empty_value_means_every_shard_is_not_marked_required(airflow_view):
    """The trigger form marks a param required unless its type admits null: the monitor's
    shards (empty: every shard) must not read as required."""
    shards = airflow_view["params"]["upsert_frontier_monitor"]["shards"]
    assert "null" in shards["schema"]["type"] and shards["null_valid"], shards
    assert shards["default"] == [] and shards["default_valid"], shards
