"""Snapshot expiry reads only what it needs and keeps a metadata file per kept snapshot: on the
loopback S3 server (through the proxy that records every request and its answer) an expiry
sends no request for a file an earlier expiry deleted and its requests do not grow with the
table's history; every kept snapshot's metadata file registers the table with that snapshot
current; and the rule choosing those files, over seeded histories."""

from __future__ import annotations

import json
import random
from collections import Counter

from airflow_upsert_provider.engine.blob.files import open_blob
from airflow_upsert_provider.engine.maintenance import iceberg_catalog
from airflow_upsert_provider.engine.maintenance.iceberg import PUBLISHED, publish_iceberg
from airflow_upsert_provider.engine.maintenance.iceberg_catalog import catalog_properties
from airflow_upsert_provider.engine.maintenance.iceberg_expiry import (
    Retention,
    expire_snapshots,
    metadata_files_to_keep,
)
from airflow_upsert_provider.engine.store.registry import open_consensus
from tests.arrow_runs import compact_batches, expected_table
from tests.helpers import make_shard
from tests.maintenance.test_iceberg import TABLE, by_key, commit_batches

METADATA_PREFIX = "shards/_iceberg/analytics/orders/metadata/"


def test_each_kept_snapshot_keeps_the_newest_metadata_file_written_while_it_was_current():
    cases = 0
    for seed in range(400):
        rng = random.Random(seed)
        # A history: each publish commits a snapshot (a metadata file), then an expiry may
        # commit one more metadata file with the same snapshot current.
        log: list[tuple[str, int]] = []
        became: dict[int, int] = {}
        commits: list[int] = []
        current_of: dict[str, int] = {}
        now = 1000
        for snapshot_id in range(rng.randrange(1, 12)):
            now += rng.randrange(1, 50)
            became[snapshot_id] = now
            commits.append(now)
            for n in range(rng.randrange(1, 4)):
                path = f"m{len(log)}.json"
                log.append((path, now))
                current_of[path] = snapshot_id
                now += rng.randrange(0, 20) if n == 0 else rng.randrange(1, 20)
        kept = {i for i in became if rng.random() < 0.6}
        chosen = metadata_files_to_keep(log, became, kept, commits)
        # One file per kept snapshot, the newest with it current; none of another snapshot.
        assert sorted(current_of[p] for p in chosen) == sorted(kept)
        for path in chosen:
            newest = [p for p, _ts in log if current_of[p] == current_of[path]][-1]
            assert path == newest
        # A log pruned of a snapshot's files keeps none for it, and nothing of another.
        pruned = [(p, ts) for p, ts in log if current_of[p] not in kept or rng.random() < 0.5]
        assert {current_of[p] for p in metadata_files_to_keep(pruned, became, kept, commits)} <= kept
        cases += 1
    assert cases == 400


def test_on_s3_an_expiry_asks_for_no_deleted_file_and_its_requests_stay_flat(s3_faults, tmp_path):
    url = f"sqlite:///{tmp_path / 'c.db'}"
    consensus = open_consensus(url)
    catalog = iceberg_catalog.open_catalog(catalog_properties(url, s3_faults.root))
    try:
        shard = make_shard(consensus, open_blob(s3_faults.root), tmp_path, buckets=2)
        rng = random.Random(36)
        history: list[dict] = []
        since_of: dict[int, int] = {}
        per_publish: list[Counter] = []
        gone: list[list[str]] = []
        for _ in range(12):
            commit_batches(shard, rng, history, 1)
            compact_batches(shard, history, shard.state().upper)
            result = publish_iceberg(shard, catalog, TABLE, retention=None)
            assert result.outcome == PUBLISHED
            since_of[result.snapshot_id] = shard.state().since
            table = catalog.load_table(TABLE)
            seen = len(s3_faults.proxy.requests())
            expire_snapshots(table, Retention(keep_last=3), now_ms=0)
            requests = [r for r in s3_faults.proxy.requests()[seen:]
                        if r.key.startswith(METADATA_PREFIX) or "list-type" in r.query]
            # Requests for metadata files (the manifests a kept snapshot lists are read too: how
            # many there are is PyIceberg's layout of the table, not the history's length).
            per_publish.append(Counter((r.method, r.status) for r in requests
                                       if r.key.endswith(".metadata.json") or "list-type" in r.query))
            # No request for a file that is gone (an earlier expiry deleted it); a 404 is only
            # PyIceberg's check that a file it then writes does not exist yet.
            written = {r.key for r in requests if r.method == "PUT"}
            gone.append(sorted(r.key for r in requests if r.status == 404 and r.key not in written))
        assert gone == [[]] * 12, gone
        # One listing, and as many metadata files read after 12 publishes as after 4.
        assert len({tuple(sorted(c.items())) for c in per_publish[3:]}) == 1, per_publish
        # (a previous metadata file still present, and the table's new one after its commit)
        assert max(c["GET", 200] for c in per_publish[3:]) <= 2, per_publish

        table = catalog.load_table(TABLE)
        assert len(table.snapshots()) == 3
        # Each older kept snapshot's metadata file registers the table with it current.
        current = table.current_snapshot().snapshot_id
        for n, snapshot in enumerate(s for s in table.snapshots() if s.snapshot_id != current):
            candidates = [e.metadata_file for e in table.metadata.metadata_log]
            registered = None
            for path in reversed(candidates):
                try:
                    with table.io.new_input(path).open() as stream:
                        current_of = json.loads(stream.read())["current-snapshot-id"]
                except FileNotFoundError:
                    continue  # deleted: of no kept snapshot
                if current_of == snapshot.snapshot_id:
                    registered = catalog.register_table(("analytics", f"restored{n}"), path)
                    break
            assert registered is not None, f"no metadata file of kept snapshot {snapshot.snapshot_id}"
            assert registered.current_snapshot().snapshot_id == snapshot.snapshot_id
            assert by_key(registered.scan().to_arrow()) == expected_table(
                shard.config, history, since_of[snapshot.snapshot_id])
    finally:
        iceberg_catalog.close_catalog(catalog)
        consensus.dispose()
