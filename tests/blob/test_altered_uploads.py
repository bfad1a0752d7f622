"""A store that changes what it stores (s3rver keeps the AWS SDK's aws-chunked framing and
trailing checksum inside the object) is caught by the root check, which reads its probe
object back: a configuration error naming the likely cause and the fix, in process and through
``upsertctl`` (exit 2), before anything is written. The proxy of ``s3_faults`` plays the store."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from airflow_upsert_provider.engine.blob.files import open_blob
from airflow_upsert_provider.engine.errors import ConfigurationError
from tests.conftest import REPO_ROOT, cli_env

FIX = "AWS_REQUEST_CHECKSUM_CALCULATION=when_required"


def probes(s3_faults) -> list:
    return [r for r in s3_faults.proxy.requests() if "/.probe-" in f"/{r.key}"]


def test_the_root_check_reads_its_probe_back_and_refuses_a_store_that_changed_it(s3_faults):
    s3_faults.proxy.store_aws_chunked()
    with pytest.raises(ConfigurationError) as caught:
        open_blob(s3_faults.root).check_root()
    error = caught.value
    assert error.details["field"] == "blob_root" and error.exit_code == 2
    assert error.message.startswith(f"blob root {s3_faults.root} cannot be used: the store changed an object "
                                    "written to it (it kept the upload's aws-chunked framing")
    assert FIX in error.message and "docs/storage.md" in error.message
    # The probe was written, read back and deleted: nothing is left of it.
    assert [r.method for r in probes(s3_faults)].count("PUT") == 1
    assert [r.method for r in probes(s3_faults)].count("GET") == 1
    assert s3_faults.server.keys(s3_faults.bucket) in ([], ["shards/"])


def test_the_fix_the_error_names_makes_the_same_store_usable(s3_faults, monkeypatch):
    s3_faults.proxy.store_aws_chunked()
    monkeypatch.setenv("AWS_REQUEST_CHECKSUM_CALCULATION", "when_required")
    blob = open_blob(s3_faults.root)
    blob.check_root()
    blob.write_file(blob.path("a"), b"whole bytes", sync=True)
    assert blob.read_bytes(blob.path("a")) == b"whole bytes"


def test_a_read_only_check_sends_no_probe(s3_faults):
    s3_faults.proxy.store_aws_chunked()
    open_blob(s3_faults.root).check_root(writable=False)
    assert probes(s3_faults) == []


def test_upsertctl_init_on_a_store_that_changes_uploads_exits_2_naming_the_fix(s3_faults, tmp_path):
    s3_faults.proxy.store_aws_chunked()
    env = cli_env(f"sqlite:///{tmp_path / 'consensus.db'}", s3_faults.root, AWS_REQUEST_CHECKSUM_CALCULATION="")
    land = tmp_path / "land"
    land.mkdir()
    result = subprocess.run([sys.executable, "-m", "airflow_upsert_provider.cli", "init", "s", "--source",
                             f"dir:{land}", "--key", "id", "--schema", "id BIGINT", "--json"],
                            env=env, capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert result.returncode == 2, result.stderr
    payload = json.loads(result.stdout)
    assert (payload["error"], payload["field"]) == ("ConfigurationError", "blob_root")
    assert "the store changed an object written to it" in result.stderr and FIX in result.stderr
    assert s3_faults.server.keys(s3_faults.bucket) in ([], ["shards/"])
