"""Which buckets a publish rewrites: those whose live run files changed since the last publish.

A shard's rows are hashed into buckets and every run file lies in one (``_bucket=<n>``), so a
bucket's part of the table is a function of its live run files alone. A publish records in
its snapshot summary (``upsert.buckets``) a digest of each bucket's live files (their paths
and sizes: run files are immutable and their paths never reused); the next publish rewrites
the buckets whose digest differs, deletes the data files of buckets that are gone, and keeps
the data files of the others in the new snapshot. A data file's bucket is in its name (the
task id it was written under, :func:`task_id`). Whenever this cannot be told for sure (a
snapshot without digests, a data file of no known bucket), every bucket is rewritten.

Clustered keys (a batch touches few buckets) save the rewrite of every untouched bucket;
random keys touch every bucket in every batch, so every publish rewrites everything, as a
whole rewrite does. All pure.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_upsert_provider.engine.table.arrow_reader import bucket_groups

SUMMARY_BUCKETS = "upsert.buckets"
# The key of the one group of a shard whose files are not all in bucket directories.
WHOLE = "*"
# Task ids of one bucket's data files: (bucket + 1) * TASKS_PER_BUCKET + n; the whole group's
# are below TASKS_PER_BUCKET.
TASKS_PER_BUCKET = 1_000_000
# PyIceberg names a data file "00000-<task id>-<write uuid>.parquet" (an object-store
# location provider puts a hash and "-" before it).
_DATA_FILE_NAME = re.compile(r"(?:^|-)\d{5}-(\d+)-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\.parquet$")


def bucket_files(files: Sequence[dict[str, Any]], group_count: int) -> dict[str, list[dict[str, Any]]]:
    """The live run files by bucket key (``str(n)``, or :data:`WHOLE`): their bucket modulo
    ``group_count`` (``runs.read_group_count`` of the runs they come from), so that a key's
    rows are in one group whichever bucket count each run was written with."""
    return {WHOLE if bucket is None else str(bucket): listed
            for bucket, listed in bucket_groups(list(files), group_count)}


def bucket_digests(by_bucket: Mapping[str, Sequence[dict[str, Any]]], group_count: int) -> dict[str, str]:
    """Per bucket key, a digest of its live run files (paths and sizes, in any order) and of
    the ``group_count`` they were grouped by: a group of another count holds other keys, so
    its data files are never kept for it."""
    digests = {}
    for key, listed in by_bucket.items():
        text = "\n".join([f"groups\t{group_count}", *sorted(f"{f['path']}\t{f['bytes']}" for f in listed)])
        digests[key] = hashlib.sha256(text.encode()).hexdigest()[:32]
    return digests


def task_id(bucket: str, n: int) -> int:
    """The task id of the ``n``-th data file written for ``bucket``."""
    if n >= TASKS_PER_BUCKET:
        raise ValueError(f"bucket {bucket}: more than {TASKS_PER_BUCKET} data files")
    return n if bucket == WHOLE else (int(bucket) + 1) * TASKS_PER_BUCKET + n


def bucket_of_data_file(path: str) -> str | None:
    """The bucket key a data file was written for, from its name; None for a name of no
    known form."""
    match = _DATA_FILE_NAME.search(path.rsplit("/", 1)[-1])
    if match is None:
        return None
    group = int(match.group(1)) // TASKS_PER_BUCKET
    return WHOLE if group == 0 else str(group - 1)


def published_digests(summary: Mapping[str, str] | None) -> dict[str, str] | None:
    """The digests a snapshot summary records; None when it records none (or not readably)."""
    text = (summary or {}).get(SUMMARY_BUCKETS)
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        return None
    return value


def summary_digests(digests: Mapping[str, str]) -> str:
    return json.dumps(dict(sorted(digests.items())), separators=(",", ":"))


@dataclass(frozen=True)
class BucketPlan:
    """What a publish does per bucket: ``rewrite`` (bucket keys to write again), ``keep``
    and ``delete`` (the current snapshot's data files it keeps or removes)."""

    rewrite: tuple[str, ...]
    keep: tuple[str, ...]
    delete: tuple[str, ...]


def plan_buckets(
    live: Mapping[str, str], published: Mapping[str, str] | None, current_files: Sequence[str]
) -> BucketPlan:
    """The :class:`BucketPlan` of a publish whose live buckets have digests ``live``, over a
    snapshot that recorded ``published`` (None: nothing recorded) and holds ``current_files``.
    A bucket is kept iff its digest is the one recorded and every current file's bucket is
    known; else everything is rewritten. Pure."""
    owners = {path: bucket_of_data_file(path) for path in current_files}
    if published is None or any(owner is None for owner in owners.values()):
        unchanged: set[str] = set()
    else:
        unchanged = {key for key, digest in live.items() if published.get(key) == digest}
    return BucketPlan(
        rewrite=tuple(sorted(key for key in live if key not in unchanged)),
        keep=tuple(sorted(path for path, owner in owners.items() if owner in unchanged)),
        delete=tuple(sorted(path for path, owner in owners.items() if owner not in unchanged)),
    )
