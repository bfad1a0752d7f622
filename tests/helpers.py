"""Small builders shared by the engine tests."""

from __future__ import annotations

import os

from airflow_upsert_provider.engine.config import ShardConfig
from airflow_upsert_provider.engine.consensus import BatchRecord
from airflow_upsert_provider.engine.shard import Shard
from airflow_upsert_provider.sample_data import SampleSpec, generate, sample_schema_json


def sample_config(landing: str, **overrides) -> ShardConfig:
    values = dict(
        source=f"dir:{landing}",
        keys=("id",),
        schema=sample_schema_json(),
        order_by="updated_at",
        delete_marker="deleted",
        buckets=4,
        max_files_per_batch=4,
    )
    values.update(overrides)
    return ShardConfig(**values)


def make_shard(consensus, blob, tmp_path, *, spec: SampleSpec | None = None, shard_id: str = "orders", **overrides) -> Shard:
    landing = str(tmp_path / "landing")
    os.makedirs(landing, exist_ok=True)
    if spec is not None:
        generate(landing, spec)
    return Shard.create(consensus, blob, shard_id, sample_config(landing, **overrides))


def batch(ts: int, token: str = "t", writer_id: str = "w") -> BatchRecord:
    return BatchRecord(ts=ts, writer_id=writer_id, token=token, run={"path": f"x/{ts}", "files": [], "rows": 0}, stats={})
