"""Benchmark of incremental checkpoints against full ones (issue 35 item 2).

A shard of M rows (one run of 8 bucket files, checkpointed once), then N small batches of
B rows each; then a checkpoint, incremental (reads only the N new files, checks the others'
sizes) and full (``--full``: reads every file), on local disk and on the loopback S3 server
(moto, tests/s3server.py), each measured twice over:
  warm     ``create_checkpoint`` in this process;
  process  one fresh ``upsertctl checkpoint create`` process: what an Airflow task sees.
Reported: seconds, bytes read whole (hashed), and on S3 the requests the server answered, by
kind. The run files are real Parquet files written with pyarrow (no Spark needed): a
checkpoint reads their footers as it does a Spark-written run's.

    .venv/bin/python bench/bench_checkpoint.py              # M = 2,000,000 rows, N = 20 batches of 1,000
    .venv/bin/python bench/bench_checkpoint.py --quick      # M = 200,000 rows, N = 5
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

import pyarrow as pa
import pyarrow.parquet as pq

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from airflow_upsert_provider.engine.blob.files import open_blob  # noqa: E402
from airflow_upsert_provider.engine.config import ShardConfig  # noqa: E402
from airflow_upsert_provider.engine.maintenance.checkpoint import create_checkpoint  # noqa: E402
from airflow_upsert_provider.engine.maintenance.checkpoint_catalog import Catalog, checkpoint_path  # noqa: E402
from airflow_upsert_provider.engine.maintenance.checkpoint_manifest import read_manifest  # noqa: E402
from airflow_upsert_provider.engine.store.records import BatchRecord  # noqa: E402
from airflow_upsert_provider.engine.store.registry import open_consensus  # noqa: E402
from airflow_upsert_provider.engine.table.shard import Shard  # noqa: E402
from airflow_upsert_provider.sample_data import sample_schema_json  # noqa: E402
from tests.s3server import REQUEST_KINDS, S3Server, request_kind  # noqa: E402

BUCKETS = 8
SHARD = "bench"


def parquet_bytes(first: int, rows: int) -> bytes:
    ids = pa.array(range(first, first + rows), pa.int64())
    values = pa.array([f"value-{i:012d}" for i in range(first, first + rows)])
    sink = io.BytesIO()
    pq.write_table(pa.table({"id": ids, "value": values}), sink, write_page_checksum=True)
    return sink.getvalue()


def commit_run(shard: Shard, ts: int, parts: list[bytes]) -> None:
    """Write ``parts`` as the run of batch ``ts`` and commit it, checksums recorded as a
    written run's are."""
    blob = shard.blob
    run_dir = shard.run_dir(ts, "bench", uuid.uuid4().hex[:12])
    files = []
    for index, data in enumerate(parts):
        path = blob.join(run_dir, f"_bucket={index}", "part-00000.parquet")
        blob.make_dirs(blob.parent(path))
        blob.write_file(path, data, sync=True)
        files.append({"path": blob.relative(path), "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    run = {"path": blob.relative(run_dir), "files": files, "rows": 0}
    shard.compare_and_append(ts, ts + 1, BatchRecord(ts, "bench", uuid.uuid4().hex, run, {}))


def build(work: str, root: str, rows: int, batches: int, batch_rows: int) -> tuple[str, Shard]:
    url = f"sqlite:///{work}/consensus-{uuid.uuid4().hex[:6]}.db"
    consensus = open_consensus(url)
    blob = open_blob(root)
    blob.ensure_root()
    landing = os.path.join(work, "landing")
    os.makedirs(landing, exist_ok=True)
    shard = Shard.create(consensus, blob, SHARD, ShardConfig(source=f"dir:{landing}", keys=("id",),
                                                              schema=sample_schema_json()))
    per_bucket = rows // BUCKETS
    commit_run(shard, 0, [parquet_bytes(b * per_bucket, per_bucket) for b in range(BUCKETS)])
    create_checkpoint(shard, full=True)
    for ts in range(1, batches + 1):
        commit_run(shard, ts, [parquet_bytes(rows + ts * batch_rows, batch_rows)])
    return url, shard


def requests_since(server: S3Server | None, since: int) -> dict[str, int]:
    if server is None:
        return {}
    counts = collections.Counter(request_kind(m, t) for m, t in server.requests()[since:])
    return {kind: counts[kind] for kind in REQUEST_KINDS if counts[kind]}


def hashed_bytes(shard: Shard, checkpoint_id: str) -> tuple[int, int, int]:
    """(files read whole, their bytes, files size-checked) of a checkpoint, from its manifest."""
    manifest = read_manifest(shard.blob, SHARD, checkpoint_id)
    verification = manifest["verification"]
    trusted = set()
    if verification["trusted_from"]:
        trusted = {f["path"] for f in read_manifest(shard.blob, SHARD, verification["trusted_from"])["files"]}
    read = [f for f in manifest["files"] if verification["full"] or f["path"] not in trusted]
    assert len(read) == verification["hashed"], (len(read), verification)
    return len(read), sum(f["bytes"] for f in read), verification["size_checked"]


def one_store(work: str, root: str, server: S3Server | None, args: argparse.Namespace) -> list[dict]:
    url, shard = build(work, root, args.rows, args.batches, args.batch_rows)
    env = {**os.environ, "PYTHONPATH": REPO}
    results = []
    for mode in ("incremental", "full"):
        full = mode == "full"
        # Warm: in this process. Each measured checkpoint starts from the same catalog: the
        # newest checkpoint is the one made before the N batches.
        before = len(server.requests()) if server else 0
        started = time.perf_counter()
        entry = create_checkpoint(shard, full=full)
        warm = time.perf_counter() - started
        warm_requests = requests_since(server, before)
        files, read_bytes, size_checked = hashed_bytes(shard, entry.id)
        drop(shard, entry.id)  # the process run starts from the same catalog
        before = len(server.requests()) if server else 0
        command = [sys.executable, "-m", "airflow_upsert_provider.cli", "--consensus", url, "--blob-root", root,
                   "checkpoint", "create", SHARD, "--json"] + (["--full"] if full else [])
        started = time.perf_counter()
        proc = subprocess.run(command, env=env, capture_output=True, text=True)
        process = time.perf_counter() - started
        if proc.returncode != 0:
            raise SystemExit(f"upsertctl checkpoint create failed: {proc.stderr[-2000:]}")
        created = json.loads(proc.stdout)["checkpoint"]
        process_requests = requests_since(server, before)
        drop(shard, created["id"])
        results.append({"mode": mode, "warm": warm, "process": process, "files_read": files, "bytes_read": read_bytes,
                        "size_checked": size_checked, "files": entry.files, "bytes": entry.bytes,
                        "warm_requests": warm_requests, "process_requests": process_requests})
    shard.consensus.dispose()
    return results


def drop(shard: Shard, checkpoint_id: str) -> None:
    Catalog.load(shard.blob, SHARD, shard.consensus).remove({checkpoint_id})
    shard.blob.delete_tree(checkpoint_path(shard.blob, SHARD, checkpoint_id))


def requests_text(counts: dict[str, int]) -> str:
    return ", ".join(f"{kind} {n}" for kind, n in counts.items()) or "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--batches", type=int, default=None)
    parser.add_argument("--batch-rows", type=int, default=1000)
    args = parser.parse_args()
    args.rows = args.rows or (200_000 if args.quick else 2_000_000)
    args.batches = args.batches or (5 if args.quick else 20)
    work = tempfile.mkdtemp(prefix="bench-checkpoint-")
    server = S3Server().start()
    os.environ.update(server.environment())  # this process's S3 blob, and the upsertctl processes'
    for store in ("local", "s3"):
        os.makedirs(os.path.join(work, store))
    try:
        table = {
            "local": one_store(os.path.join(work, "local"), os.path.join(work, "local", "blob"), None, args),
            "s3": one_store(os.path.join(work, "s3"), f"s3://{server.create_bucket()}/upsert", server, args),
        }
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"\ncheckpoint after {args.batches} batches of {args.batch_rows:,} rows on a table of {args.rows:,} rows "
          f"({BUCKETS} bucket files)\n")
    print("| store | checkpoint | files (read whole / size only) | MB read | warm (s) | upsertctl process (s) | "
          "requests, warm | requests, process |")
    print("|---|---|---|---|---|---|---|---|")
    for store, rows in table.items():
        for r in rows:
            print(f"| {store} | {r['mode']} | {r['files']} ({r['files_read']} / {r['size_checked']}) | "
                  f"{r['bytes_read'] / 1e6:.2f} of {r['bytes'] / 1e6:.2f} | {r['warm']:.3f} | {r['process']:.2f} | "
                  f"{requests_text(r['warm_requests'])} | {requests_text(r['process_requests'])} |")


if __name__ == "__main__":
    main()
