"""UpsertShardHook reads the connection the way the docs say (run in a subprocess so that the
Airflow configuration of the test home applies)."""

from __future__ import annotations

import json
import sys

import pytest

from airflow_upsert_provider.sample_data import SampleSpec, generate
from tests.airflow.conftest import failure_text


def _json_lines(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]

PROBE = r"""
import json, os, sys
from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.hooks.upsert import UpsertShardHook
from airflow_upsert_provider.sample_data import SAMPLE_SCHEMA_DDL

landing = sys.argv[1]
hook = UpsertShardHook()
shard = hook.create_shard("created", source=f"dir:{landing}", keys=["id"], schema_ddl=SAMPLE_SCHEMA_DDL,
                          order_by="updated_at", delete_marker="deleted", target_bucket_bytes=64 << 20)
try:
    UpsertShardHook("no_such_connection").settings
    undefined = None
except ConfigurationError as exc:
    undefined = exc.message
from airflow_upsert_provider.engine.table.schema_apply import schema_policy
widening = hook.create_shard("widening", source=f"dir:{landing}", keys=["id"], schema_ddl=SAMPLE_SCHEMA_DDL,
                             schema_evolution="add_and_widen")
try:
    hook.create_shard("bogus", source=f"dir:{landing}", keys=["id"], schema_ddl=SAMPLE_SCHEMA_DDL,
                      schema_evolution="sometimes")
    bad_policy = None
except ConfigurationError as exc:
    bad_policy = exc.message
print(json.dumps({"policies": [schema_policy(shard), schema_policy(widening)], "bad_policy": bad_policy,
                  "bogus_created": any(r.shard_id == "bogus" for r in hook.get_consensus().list_shards())}))
print(json.dumps({
    "buckets": shard.config.buckets,
    "max_files": shard.config.max_files_per_batch,
    "target_bucket_bytes": hook.open_shard("created").config.target_bucket_bytes,
    "upper": hook.open_shard("created").state().upper,
    "master": hook.spark_master(),
    "redacted": hook.settings.redacted_consensus_url,
    "has_password": ":s3cret-pw@" in hook.settings.consensus_url,
    "undefined": undefined,
}))

# Then, in the same process, no upsert connection (the embedded defaults) and the Spark
# connection given as the second argument.
os.environ.pop("AIRFLOW_CONN_UPSERT_DEFAULT")
os.environ["AIRFLOW_CONN_SPARK_DEFAULT"] = sys.argv[2]
hook = UpsertShardHook()
print(json.dumps({"embedded": {"consensus": hook.settings.consensus_url, "blob": hook.settings.blob_root,
                               "master": hook.spark_master()}}))
"""


def test_hook_builds_engine_objects_from_the_connection(airflow_home, tmp_path, pg_url):
    landing = str(tmp_path / "landing")
    generate(landing, SampleSpec(records=50, keys=10, partitions=1, segments_per_partition=1))
    # The password travels in the connection's password field, not in the URL.
    user_url = pg_url.replace(":s3cret-pw@", "@")
    env = airflow_home.env(user_url, str(tmp_path / "blob"), password="s3cret-pw",
                           spark_master="local[1]")
    upsert = json.loads(env["AIRFLOW_CONN_UPSERT_DEFAULT"])
    upsert["extra"].update(default_buckets=3, default_max_files_per_batch=5)
    env["AIRFLOW_CONN_UPSERT_DEFAULT"] = json.dumps(upsert)
    # The same process then drops the upsert connection (the embedded defaults) and reads a
    # standalone master given as host and port, the way the Spark provider reads it.
    standalone = json.dumps({"conn_type": "spark", "host": "spark://10.0.0.5", "port": 7077})
    proc = airflow_home.run([sys.executable, "-c", PROBE, landing, standalone], env)
    assert proc.returncode == 0, failure_text(proc)
    policies = next(line for line in _json_lines(proc.stdout) if "policies" in line)
    assert policies == {"policies": ["add_columns", "add_and_widen"], "bogus_created": False, "bad_policy":
                        "unknown schema evolution policy 'sometimes'; expected one of none, add_columns, add_and_widen"}
    found = next(line for line in _json_lines(proc.stdout) if "buckets" in line)
    assert (found["buckets"], found["max_files"], found["upper"]) == (3, 5, 0)
    assert found["target_bucket_bytes"] == 64 << 20, "the size target did not reach the stored config"
    assert found["master"] == "local[1]"
    assert found["has_password"] and "s3cret-pw" not in found["redacted"] and "***" in found["redacted"]
    assert "s3cret-pw" not in proc.stdout + proc.stderr
    assert found["undefined"].startswith("Airflow connection 'no_such_connection' is not defined")

    embedded = next(line for line in _json_lines(proc.stdout) if "embedded" in line)["embedded"]
    assert embedded == {
        "consensus": f"sqlite:///{airflow_home.path}/upsert/consensus.db",
        "blob": f"{airflow_home.path}/upsert/blob",
        "master": "spark://10.0.0.5:7077",
    }


def test_the_blob_root_field_takes_an_s3_uri_and_refuses_an_unknown_scheme(s3_root, monkeypatch):
    # In process: the connection comes from the environment, no metadata database is read.
    from airflow_upsert_provider.engine.blob.objects import ObjectBlob
    from airflow_upsert_provider.engine.errors import ConfigurationError
    from airflow_upsert_provider.hooks.upsert import UpsertShardHook

    def connection(blob_root: str) -> None:
        monkeypatch.setenv("AIRFLOW_CONN_UPSERT_DEFAULT", json.dumps(
            {"conn_type": "upsert", "extra": {"consensus_url": "sqlite:////nonexistent/c.db", "blob_root": blob_root}}))

    connection(s3_root)
    blob = UpsertShardHook().get_blob()
    assert isinstance(blob, ObjectBlob) and blob.root == s3_root

    connection("ftp://files.example/blob")
    with pytest.raises(ConfigurationError) as caught:
        UpsertShardHook().settings
    refused = caught.value
    assert refused.details["field"] == "blob_root"
    assert "'ftp://files.example/blob'" in refused.message and "unsupported scheme 'ftp'" in refused.message
