"""Benchmark of GC's object requests as a shard's history grows: GC from state against the
sweep (the listing GC every GC was before), on the loopback S3 server, at 100 and at 10,000
committed batches, with the same garbage each time.

    .venv/bin/python bench/bench_gc_requests.py                  # 100 and 10,000 batches
    .venv/bin/python bench/bench_gc_requests.py --batches 100 1000 --every 50

For each history size a shard (1 bucket, one small run per batch, written with pyarrow in the
writers' layout and committed through the engine's commit API: the state a writer makes,
without Spark) gets its history: batches, a full compaction every ``--every`` batches, and the
replaced runs removed after each, as the maintenance DAG's GC does. To build 10,000 batches in
minutes, the history's run objects are put into (and its garbage removed from) the in-process
S3 server's store directly, leaving what a GC leaves on S3: each deleted run's ``ts=`` prefix
marker (pyarrow's deletions write it, apache/arrow#36275), and no replacement rows. Every
consensus commit is the engine's. Then, twice: one compaction's worth of
garbage (``--every`` new batches and a compaction that replaces them and the previous compacted
run), aged past the grace period, and one GC, counted by request kind (LIST, GET, HEAD,
DELETE, PUT, other): first GC from state, then the sweep, then (after another compaction's
garbage) a second sweep: the first removes, once, the ``ts=`` markers the history and GC from
state left (4 requests each); the second shows a sweep's own cost. Target (issue 35 item 6): GC from
state's requests at 10,000 batches within 1.2x of its requests at 100.

``gc_requests(...)`` is the measurement alone, for the maintenance-scale benchmark to import.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from airflow_upsert_provider.engine.blob.files import open_blob  # noqa: E402
from airflow_upsert_provider.engine.maintenance.gc import collect_garbage  # noqa: E402
from airflow_upsert_provider.engine.store.registry import open_consensus  # noqa: E402
from airflow_upsert_provider.engine.store.gc_claims import forget_replaced, replacements_of  # noqa: E402
from airflow_upsert_provider.engine.store.records import BatchRecord  # noqa: E402
from tests.arrow_runs import arrow_run_schema, commit_batch, compact_batches  # noqa: E402
from tests.helpers import make_shard  # noqa: E402
from tests.maintenance.support import age_compaction  # noqa: E402
from tests.s3server import REQUEST_KINDS, S3Server, request_kind  # noqa: E402

GRACE = 600
KEYS = 50


def gc_requests(server: S3Server, consensus, blob, shard_id: str, *, sweep: bool) -> tuple[dict[str, int], dict]:
    """One GC of ``shard_id`` (past-grace garbage, nothing dry): the requests the S3 server
    answered during it, by kind, and the GC report."""
    before = len(server.requests())
    report = collect_garbage(consensus, blob, shard_id, grace_seconds=GRACE, sweep=sweep)
    counts = collections.Counter(request_kind(method, target) for method, target in server.requests()[before:])
    return {kind: counts.get(kind, 0) for kind in REQUEST_KINDS}, report.to_dict()


class History:
    """A shard on its own bucket, advanced batch by batch (rows of the sample schema)."""

    def __init__(self, server: S3Server, work: str, batches: int) -> None:
        self.server = server
        self.bucket = server.create_bucket()
        self.blob = open_blob(f"s3://{self.bucket}/upsert")
        self.consensus = open_consensus(f"sqlite:///{work}/consensus-{batches}.db")
        landing = os.path.join(work, f"landing-{batches}")
        os.makedirs(landing)
        self.shard = make_shard(self.consensus, self.blob, _Path(landing), shard_id=f"h{batches}", buckets=1)
        self.rows: list[dict] = []
        self.rng = random.Random(batches)

    def commit(self, n: int, *, direct: bool = False) -> None:
        """``n`` batches of one row each; ``direct``: their objects put into the server's store
        without a request (the history), else through the blob as a writer's are."""
        for _ in range(n):
            ts = self.shard.state().upper
            row = {"id": self.rng.randrange(KEYS), "name": f"n{ts}", "amount": float(ts), "updated_at": ts,
                   "_deleted": False}
            if direct:
                self._commit_direct(ts, {**row, "_ts": ts})
            else:
                commit_batch(self.shard, [row])
            self.rows.append({**row, "_ts": ts})

    def _commit_direct(self, ts: int, row: dict) -> None:
        import hashlib
        import io

        import pyarrow as pa
        import pyarrow.parquet as pq

        sink = io.BytesIO()
        pq.write_table(pa.Table.from_pylist([row], schema=arrow_run_schema(self.shard.config)), sink)
        data = sink.getvalue()
        run_dir = f"{self.shard.shard_id}/runs/ts={ts:012d}/w-{ts}"
        path = f"{run_dir}/_bucket=0/part-00000.parquet"
        self._store().put_object(self.bucket, f"upsert/{path}", data)
        run = {"path": run_dir, "files": [{"path": path, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}],
               "rows": 1}
        result = self.shard.compare_and_append(ts, ts + 1, BatchRecord(ts=ts, writer_id="w", token=f"t{ts}", run=run,
                                                                        stats={}))
        assert result.upper == ts + 1, result

    def collect_directly(self) -> None:
        """Remove the replaced runs from the server's store as GC does (their objects, leaving
        each group's prefix marker), and their replacement rows."""
        store = self._store()
        paths = [path for path, _ in replacements_of(self.consensus, self.shard.shard_id)]
        keys = list(store.get_bucket(self.bucket).keys.keys())
        for path in paths:
            prefix = f"upsert/{path}/"
            for key in [k for k in keys if k.startswith(prefix)]:
                store.delete_object(self.bucket, key)
            store.put_object(self.bucket, f"upsert/{path.rsplit('/', 1)[0]}/", b"")
        forget_replaced(self.consensus, paths)

    @staticmethod
    def _store():
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.s3.models import s3_backends

        return s3_backends[DEFAULT_ACCOUNT_ID]["aws"]

    def compact(self) -> None:
        """A full compaction to the upper, and the garbage aged past the grace period."""
        compact_batches(self.shard, self.rows, self.shard.state().upper)
        # Only the winners matter to later compactions: keep the history held here small.
        latest = {r["id"]: r for r in sorted(self.rows, key=lambda r: (r["updated_at"], r["_ts"]))}
        self.rows = list(latest.values())
        self.server.age(self.bucket, seconds=3 * 3600)
        age_compaction(self.consensus, self.shard.shard_id)


class _Path(str):
    """``make_shard`` takes a pytest tmp_path and builds ``tmp_path / "landing"``."""

    def __truediv__(self, name: str) -> str:
        return os.path.join(self, name)


def build(server: S3Server, work: str, batches: int, every: int) -> History:
    history = History(server, work, batches)
    started = time.perf_counter()
    while history.shard.state().upper < batches:
        history.commit(min(every, batches - history.shard.state().upper), direct=True)
        history.compact()
        history.collect_directly()
        done = history.shard.state().upper
        if done % max(every, batches // 10) == 0:
            progress(f"  [{batches:>6} batches] {done} committed ({time.perf_counter() - started:.0f} s)")
    return history


def progress(message: str) -> None:
    """Progress goes to stderr; the figures alone to stdout."""
    print(message, file=sys.stderr, flush=True)


KINDS = ("LIST", "GET", "HEAD", "DELETE", "PUT", "other")


def table_header(every: int) -> str:
    return (f"GC requests by kind, one compaction's garbage ({every} batches and a compacted run):\n"
            f"| batches | GC | deleted | groups removed | {' | '.join(KINDS)} | total |\n"
            "|---:|---|---:|---:|" + "---:|" * (len(KINDS) + 1))


def table_row(batches: int, mode: str, deleted: tuple[int, int], counts: dict[str, int]) -> str:
    return (f"| {batches:,} | {mode} | {deleted[0]} | {deleted[1]} | " + " | ".join(str(counts[k]) for k in KINDS)
            + f" | {sum(counts.values())} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[100, 10_000], help="history sizes (batches)")
    parser.add_argument("--every", type=int, default=100, help="batches per compaction (the garbage of one)")
    args = parser.parse_args()
    if any(b < args.every or b % args.every for b in args.batches) or args.every < 1:
        parser.error("every history size must be a positive multiple of --every")
    work = tempfile.mkdtemp(prefix="bench-gc-")
    server = S3Server().start()
    os.environ.update(server.environment(), AWS_CONFIG_FILE=os.path.join(work, "absent"),
                      AWS_SHARED_CREDENTIALS_FILE=os.path.join(work, "absent"))
    print(table_header(args.every), flush=True)
    results: dict[tuple[int, str], dict[str, int]] = {}
    deleted: dict[tuple[int, str], tuple[int, int]] = {}
    try:
        for batches in args.batches:
            progress(f"building a history of {batches:,} batches ...")
            history = build(server, work, batches, args.every)
            # The first sweep also removes, once, the markers the history and GC from state left;
            # the second shows a sweep's own cost once none is left.
            for mode, sweep in (("state", False), ("sweep", True), ("sweep again", True)):
                history.commit(args.every)
                history.compact()
                progress(f"  [{batches:>6} batches] GC ({mode}) ...")
                counts, report = gc_requests(server, history.consensus, history.blob, history.shard.shard_id,
                                             sweep=sweep)
                results[batches, mode] = counts
                deleted[batches, mode] = (report["deleted"]["items"], report["groups_removed"])
                # Each GC's figures as soon as it finished: a long run shows what it measured so far.
                print(table_row(batches, mode, deleted[batches, mode], counts), flush=True)
            history.consensus.dispose()
    finally:
        server.stop()
    print("\n" + table_header(args.every))
    for (batches, mode), counts in results.items():
        print(table_row(batches, mode, deleted[batches, mode], counts))
    low, high = min(args.batches), max(args.batches)
    for mode in ("state", "sweep", "sweep again"):
        a, b = sum(results[low, mode].values()), sum(results[high, mode].values())
        by_kind = ", ".join(f"{k} {results[high, mode][k]}/{results[low, mode][k]}" for k in KINDS
                            if results[low, mode][k] or results[high, mode][k])
        print(f"{mode}: {high:,} / {low:,} batches = {b / a:.2f}x ({by_kind})")


if __name__ == "__main__":
    main()
