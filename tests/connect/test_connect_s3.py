"""A shard whose blob root is on the loopback S3 server, written and read through the Spark
Connect server (conftest.py): this process (the client) reaches the bucket for the shard's
metadata, and the server's executors write and read the runs there with the credential chain
of the server process. Spark's own Parquet and JSON writers cannot reach the bucket on a
stock PySpark: the runs and the quarantined records go through the executors' pyarrow path."""

from __future__ import annotations

import json

from airflow_upsert_provider.engine.blob.files import open_blob
from tests.oracle import oracle_table
from tests.test_run_io_s3 import check_run_is_what_is_stored, stored_objects
from tests.test_runs import new_shard, run_all, table, write_segment


def test_a_shard_on_s3_written_and_read_through_connect_equals_the_oracle(spark, consensus, s3_server, s3_root,
                                                                          tmp_path):
    landing = str(tmp_path / "landing")
    write_segment(landing, "p0", 0, [{"id": i, "v": "a", "ts": 1} for i in range(60)])
    write_segment(landing, "p0", 1, [{"id": i, "v": "b", "ts": 2, "deleted": i % 5 == 0} for i in range(30, 90)])
    write_segment(landing, "p1", 0, [{"id": i, "v": "c", "ts": 3} for i in range(80, 100)])
    expected = oracle_table(landing, order_by="ts", delete_marker="deleted")
    with open(f"{landing}/p1/1.jsonl", "w") as handle:
        handle.write('{"id": "not a number", "v": "x", "ts": 4}\n')
    blob = open_blob(s3_root)
    shard = new_shard(consensus, blob, landing, "s", max_files_per_batch=2)
    run_all(spark, shard, on_bad_record="quarantine")

    assert table(spark, shard) == expected
    bucket, prefix = s3_root[len("s3://"):].split("/", 1)
    batches = shard.batches()
    assert len(batches) == 2 and all(b.run["rows"] > 0 for b in batches)
    for batch in batches:
        check_run_is_what_is_stored(s3_server, bucket, prefix, batch.run)
    [rejects] = [b.stats["rejects"] for b in batches if b.stats.get("rejects")]
    check_run_is_what_is_stored(s3_server, bucket, prefix, rejects)
    [quarantined] = [json.loads(line) for data in stored_objects(s3_server, bucket, f"{prefix}/{rejects['path']}/").values()
                     for line in data.decode().splitlines()]
    assert (quarantined["file"], quarantined["line"]) == (f"{landing}/p1/1.jsonl", 1)
