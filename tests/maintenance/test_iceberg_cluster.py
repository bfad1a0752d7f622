"""A publish whose data files the executors of a Spark standalone cluster write (one master,
one worker, on loopback), driven by `upsertctl publish --spark --master spark://...`: the
table is on the loopback S3 server, which the worker's executors reach with the credentials of
their own environment (nothing is sent from the driver). The snapshot equals the shard's table
at its since, the executor ran the write tasks, and no log of the cluster or of the driver
holds the secret."""

from __future__ import annotations

import glob
import json
import os
import random

import pytest

from airflow_upsert_provider.engine.blob.files import open_blob
from airflow_upsert_provider.engine.maintenance import iceberg_catalog
from airflow_upsert_provider.engine.maintenance.compaction import compact
from airflow_upsert_provider.engine.maintenance.iceberg import current_data_files
from airflow_upsert_provider.engine.maintenance.iceberg_buckets import bucket_of_data_file
from airflow_upsert_provider.engine.maintenance.iceberg_catalog import catalog_properties
from airflow_upsert_provider.engine.store.registry import open_consensus
from tests.airflow.test_scale_out import StandaloneCluster, app_id, tasks_run_by
from tests.arrow_runs import expected_table
from tests.conftest import REPO_ROOT, TEST_JVM_OPTIONS, cli_env
from tests.helpers import make_shard
from tests.maintenance.test_iceberg import TABLE, by_key
from tests.maintenance.test_iceberg_spark import spark_batch, updates
from tests.s3server import SECRET_ACCESS_KEY
from tests.test_run_io_s3 import upsertctl

pytestmark = pytest.mark.slow

BUCKETS = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, s3_server):
    """One master and one worker whose own environment reaches the S3 server and imports this
    checkout."""
    running = StandaloneCluster(str(tmp_path_factory.mktemp("spark-cluster")), workers=1, env=dict(
        s3_server.environment(), PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))).start()
    yield running
    running.stop()


def test_a_clusters_executors_write_the_data_files_of_a_publish_to_s3(cluster, spark, s3_executors, tmp_path):
    root = s3_executors
    url = f"sqlite:///{tmp_path / 'c.db'}"
    consensus = open_consensus(url)
    try:
        # The shard's runs, written and compacted by this process's local session.
        shard = make_shard(consensus, open_blob(root), tmp_path, buckets=BUCKETS)
        history: list[dict] = []
        rng = random.Random(52)
        for _ in range(2):
            spark_batch(spark, shard, history, updates(rng, rng.sample(range(100), 60)))
        compact(spark, shard)
        since = shard.state().since

        done = upsertctl(
            "publish", "orders", "--iceberg", TABLE, "--spark", "--json",
            "--master", f"spark://127.0.0.1:{cluster.port}",
            "--conf", "spark.executor.memory=512m", "--conf", f"spark.executor.extraJavaOptions={TEST_JVM_OPTIONS}",
            "--conf", "spark.sql.shuffle.partitions=4",
            env=cli_env(url, root))
        assert done.returncode == 0, done.stderr[-3000:]
        report = json.loads(done.stdout)
        assert (report["outcome"], report["since"], report["buckets_rewritten"]) == ("published", since, BUCKETS)

        catalog = iceberg_catalog.open_catalog(catalog_properties(url, root))
        try:
            table = catalog.load_table(TABLE)
            assert by_key(table.scan().to_arrow()) == expected_table(shard.config, history, since)
            files = list(current_data_files(table))
            assert len(files) == report["files"]
            assert all(f.file_path.startswith(f"{root}/_iceberg/analytics/orders/data/") for f in files)
            assert {bucket_of_data_file(f.file_path) for f in files} == {str(b) for b in range(BUCKETS)}
        finally:
            iceberg_catalog.close_catalog(catalog)
    finally:
        consensus.dispose()
    # The cluster's executor ran the job's tasks (its worker's log of the application).
    [ran] = tasks_run_by(cluster, app_id(cluster, "airflow-upsert-provider"))
    assert ran
    # The secret is in the worker's environment only: no log of the cluster or of the driver shows it.
    logs = glob.glob(os.path.join(cluster.dir, "**", "*"), recursive=True)
    for path in [p for p in logs if os.path.isfile(p)]:
        with open(path, encoding="utf-8", errors="replace") as handle:
            assert SECRET_ACCESS_KEY not in handle.read(), path
    assert SECRET_ACCESS_KEY not in done.stdout + done.stderr
