"""Racing writer processes that all run Spark through one Spark Connect server: each is a
fresh `upsertctl --remote` process (tests/racing_writer.py, random delays around staging and
the compare-and-set); the shard ends valid and equal to its oracle."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from airflow_upsert_provider.engine.blob.files import open_blob
from airflow_upsert_provider.engine.store.registry import open_consensus
from airflow_upsert_provider.sample_data import SampleSpec
from tests.conftest import cli_env
from tests.helpers import make_shard
from tests.test_multiprocess import RUNNER, assert_valid_and_equal_to_oracle, committed_dirs, staged_dirs

pytestmark = pytest.mark.slow


def test_three_racing_writer_processes_through_connect_converge(spark, connect_server, tmp_path):
    url = f"sqlite:///{tmp_path / 'consensus.db'}"
    consensus, blob = open_consensus(url), open_blob(str(tmp_path / "blob"))
    spec = SampleSpec(records=3200, keys=800, partitions=2, segments_per_partition=8, seed=17)
    shard = make_shard(consensus, blob, tmp_path, spec=spec, max_files_per_batch=1)
    env = {**cli_env(url, blob.root), "UPSERT_SPARK_REMOTE": ""}
    procs = [
        subprocess.Popen(
            [sys.executable, RUNNER, "--remote", connect_server["address"], "run-batch", shard.shard_id,
             "--until-caught-up", "--json", "--writer-id", f"racer-{n}"],
            env={**env, "RACE_SEED": str(n), "RACE_MAX_DELAY": "0.3"},
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for n in range(3)
    ]
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-3000:]
        reports.append(json.loads(out))

    assert_valid_and_equal_to_oracle(shard, spark, 16)
    assert [r["upper"] for r in reports] == [16] * 3
    committed = [(b["ts"], r["writer_id"]) for r in reports for b in r["batches"] if b["outcome"] == "committed"]
    assert sorted(committed) == sorted((b.ts, b.writer_id) for b in shard.batches())
    assert staged_dirs(shard) == committed_dirs(shard)
