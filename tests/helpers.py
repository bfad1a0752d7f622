"""Small builders shared by the engine tests."""

from __future__ import annotations

import glob
import json
import os
import subprocess

import pytest

from airflow_upsert_provider.engine.config import ShardConfig
from airflow_upsert_provider.engine.store.records import BatchRecord
from airflow_upsert_provider.engine.table.arrow_reader import read_table
from airflow_upsert_provider.engine.table.shard import Shard
from airflow_upsert_provider.sample_data import SampleSpec, generate, sample_schema_json
from tests.oracle import table_from_rows


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


def landing_env(tmp_path, monkeypatch, spec: SampleSpec) -> str:
    """Point `upsertctl` (run in-process through ``cli.main``) at a fresh consensus and blob
    under ``tmp_path``, and generate ``spec`` as its landing directory."""
    monkeypatch.setenv("UPSERT_CONSENSUS_URL", f"sqlite:///{tmp_path / 'c.db'}")
    monkeypatch.setenv("UPSERT_BLOB_ROOT", str(tmp_path / "blob"))
    landing = tmp_path / "landing"
    generate(str(landing), spec)
    return landing


def run_cli(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    """``upsertctl ARGV`` in this process: (exit code, stdout, stderr)."""
    from airflow_upsert_provider import cli

    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_cli_json(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, dict | None, str]:
    """``upsertctl ARGV --json`` in this process: (exit code, the JSON object on stdout, stderr)."""
    code, out, err = run_cli(capsys, *argv, "--json")
    return code, (json.loads(out) if out.strip() else None), err


class Upsertctl:
    """``upsertctl`` in this process against one consensus store and blob root, given as
    ``--consensus`` and ``--blob-root`` (what a subprocess got through ``cli_env``): calling
    it gives (exit code, stdout, stderr), :meth:`ok` the stdout of a command that must
    succeed."""

    def __init__(self, capsys: pytest.CaptureFixture, consensus_url: str, blob_root: str, *options: str) -> None:
        self.capsys = capsys
        self.options = ("--consensus", consensus_url, "--blob-root", blob_root, *options)

    def __call__(self, *argv: str) -> tuple[int, str, str]:
        return run_cli(self.capsys, *self.options, *argv)

    def ok(self, *argv: str) -> str:
        code, out, err = self(*argv)
        assert code == 0, err[-3000:]
        return out


def cli_store(tmp_path, monkeypatch, consensus_url: str):
    """A consensus store and blob root under ``tmp_path`` that `upsertctl` in this process
    also uses (through its environment): (consensus, blob)."""
    from airflow_upsert_provider.engine.blob.files import open_blob
    from airflow_upsert_provider.engine.store.registry import open_consensus

    monkeypatch.setenv("UPSERT_CONSENSUS_URL", consensus_url)
    monkeypatch.setenv("UPSERT_BLOB_ROOT", str(tmp_path / "blob"))
    blob = open_blob(str(tmp_path / "blob"))
    blob.ensure_root()
    return open_consensus(consensus_url), blob


def recover(shard: Shard, actor: str = "test"):
    """Finish the recovery a restore (or ``recover begin``) opened, in the only order the
    engine accepts: seek, then resume. Returns the resume's TransitionResult."""
    from airflow_upsert_provider.engine.lifecycle import recovery
    from airflow_upsert_provider.engine.store import streams

    sought = recovery.seek(shard, actor=actor)
    return streams.resume_after_recovery(shard.consensus, shard.shard_id, sought.epoch, actor)


def quarantined_records(shard: Shard) -> list[dict]:
    """The records quarantined beside the shard's first committed run (its rejects files)."""
    committed = shard.batches()
    rejects = committed[0].stats.get("rejects") if committed else None
    if not rejects:
        return []
    written = []
    for path in glob.glob(os.path.join(shard.blob.path(rejects["path"]), "*.json")):
        with open(path) as handle:
            written += [json.loads(line) for line in handle]
    return written


def table(shard: Shard, as_of: int | None = None) -> dict:
    """The shard's table as of ``as_of`` (default: its upper), keyed, read by the Arrow reader:
    no Spark job per check. Spark's read is held to the same rows over random histories with
    compactions (tests/test_arrow_reader_spark.py); :func:`spark_table` where Spark's own read
    is what a test is about."""
    return table_from_rows(read_table(shard, as_of).read_all().to_pylist())


def spark_table(shard: Shard, spark, as_of: int | None = None) -> dict:
    """The shard's table as of ``as_of``, read by ``Shard.read`` on ``spark``."""
    return table_from_rows(shard.read(spark, as_of=as_of).collect())


def remount(path, options: str) -> None:
    """Remounts a mount of the ``tmpfs`` fixture with ``options`` (``ro``, ``size=64m``)."""
    subprocess.run(["mount", "-o", f"remount,{options}", str(path)], check=True)
