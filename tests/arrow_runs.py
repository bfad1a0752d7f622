"""Runs written straight with pyarrow, in the layout the engine's writers give them, and the
engine's merge rule in plain Python: for tests of the Arrow reader that need no Spark."""

from __future__ import annotations

import io
import uuid
from typing import Any

from airflow_upsert_provider.engine.store.records import BatchRecord
from airflow_upsert_provider.engine.table.runs import order_column, run_schema, table_columns
from airflow_upsert_provider.engine.table.shard import Shard


def arrow_run_schema(config):
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(run_schema(config), timezone="UTC")


def write_run(shard: Shard, group: str, rows: list[dict[str, Any]], buckets: int | None = None) -> dict[str, Any]:
    """Write ``rows`` (run columns; ``id`` is the key) as a run under ``<shard>/runs/<group>/``:
    one Parquet file per bucket (``id % buckets``, standing in for the key hash; default the
    count of ``init``, else recorded in the run as a rebucketed one is), sorted by key, as
    consensus records a run."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    blob, config = shard.blob, shard.config
    schema = arrow_run_schema(config)
    run_dir = blob.path(shard.shard_id, "runs", group, f"w-{uuid.uuid4().hex[:8]}")
    files = []
    by_bucket: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        by_bucket.setdefault(row["id"] % (buckets or config.buckets), []).append(row)
    for bucket, members in sorted(by_bucket.items()):
        members.sort(key=lambda r: r["id"])
        table = pa.Table.from_pylist(members, schema=schema)
        sink = io.BytesIO()
        pq.write_table(table, sink)
        path = blob.join(run_dir, f"_bucket={bucket}", "part-00000.parquet")
        blob.make_dirs(blob.parent(path))
        blob.write_file(path, sink.getvalue(), sync=False)
        files.append({"path": blob.relative(path), "bytes": len(sink.getvalue()), "sha256": blob.checksum(path)})
    run = {"path": blob.relative(run_dir), "files": files, "rows": len(rows)}
    return run if buckets is None else {**run, "buckets": buckets}


def commit_batch(shard: Shard, rows: list[dict[str, Any]], buckets: int | None = None) -> int:
    """Commit ``rows`` (table columns and ``_deleted``) as the batch at the shard's upper,
    written with ``buckets`` (:func:`write_run`); its ts."""
    ts = shard.state().upper
    stamped = [{**row, "_ts": ts} for row in rows]
    run = write_run(shard, f"ts={ts:012d}", stamped, buckets)
    result = shard.compare_and_append(ts, ts + 1, BatchRecord(ts=ts, writer_id="w", token=f"t{ts}", run=run, stats={}))
    assert result.upper == ts + 1, result
    return ts


def compact_batches(shard: Shard, history: list[dict[str, Any]], since: int, buckets: int | None = None) -> None:
    """Compact as the engine does, from the rows ``history`` holds (every committed row, with
    ``_ts``): per key the winner below ``since``, tombstones kept with an order column;
    ``buckets`` rebuckets, as ``compact(buckets=...)`` does."""
    state = shard.state()
    view = shard.consensus.live_view(shard.shard_id, since)
    survivors = merged(shard.config, [r for r in history if r["_ts"] < since], keep_tombstones=True)
    if order_column(shard.config) is None:
        survivors = [r for r in survivors if not r["_deleted"]]
    run = write_run(shard, f"since={since:012d}", survivors, buckets)
    assert shard.consensus.compare_and_set_since(
        shard.shard_id, state.since, since, {**run, "replaces": [r["path"] for r in view.runs]}
    )


def rank(config, row: dict[str, Any]) -> tuple:
    """The engine's rank of a run row: order value (null lowest), then ``_ts``."""
    order = order_column(config)
    if order is None:
        return (row["_ts"],)
    value = row[order]
    return ((0, 0) if value is None else (1, value), row["_ts"])


def merged(config, rows: list[dict[str, Any]], *, keep_tombstones: bool = False) -> list[dict[str, Any]]:
    """Per key the row of highest rank; tombstones removed unless ``keep_tombstones``."""
    best: dict[Any, dict[str, Any]] = {}
    for row in rows:
        key = tuple(row[k] for k in config.keys)
        if key not in best or rank(config, row) > rank(config, best[key]):
            best[key] = row
    return [r for _, r in sorted(best.items()) if keep_tombstones or not r["_deleted"]]


def expected_table(config, history: list[dict[str, Any]], as_of: int) -> dict[tuple, dict[str, Any]]:
    """The table as of ``as_of``: user columns of the winners below it, by key."""
    columns = table_columns(config)
    return {
        tuple(r[k] for k in config.keys): {c: r[c] for c in columns}
        for r in merged(config, [r for r in history if r["_ts"] < as_of])
    }


def arrow_table(reader, keys=("id",)) -> dict[tuple, dict[str, Any]]:
    rows = reader.read_all().to_pylist()
    table = {tuple(r[k] for k in keys): r for r in rows}
    assert len(table) == len(rows), "a key came out twice"
    return table
