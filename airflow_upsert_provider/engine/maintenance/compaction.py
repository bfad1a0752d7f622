"""Compaction: merge a shard's batches below a chosen since into its compacted runs.

Below since the shard keeps a few compacted runs ("tiers", see ``compaction_policy``), each a
run like any other (key, value columns, ``_deleted``, ``_ts``; one sorted Parquet file per
bucket) holding the latest row of every key over a contiguous ts range, with its own ``_ts``
kept, so that a read as of any ts >= since merges them with the later batches and gets exactly
what it got before. A compaction merges the batches from the old to the new since with the
newest tiers of similar size (the policy chooses them) into one new tier; a full compaction
merges everything into one. Without an order column tombstones are dropped when the merge
includes the oldest tier: nothing older remains for a tombstone to hide. Otherwise they are
kept: an older tier still holds the key, or a later batch may bring it with a lower order
value, which the tombstone must still beat (see ``runs.merge_runs``).

It is swapped in by compare-and-set on ``since`` (one transaction that also replaces the
compaction record, whose tiers are the kept ones plus the new one: exactly the merged runs are
replaced). Writers only move ``upper`` and compaction only reads batches below the new since,
which are immutable, so a writer never makes a compaction lose and a compaction never touches
a batch at ts >= since. Two compactions race on since: the loser deletes its own output
(nobody can reference it) and retries against the new state, choosing its merge again.

A compaction can grow the bucket count (``buckets``, or the shard's ``target_bucket_bytes``):
it then merges fully and writes with the new count, and the swap records the count in the
compaction record with the new run, so the count changes exactly when the runs do. A writer
that read the old count and commits after the swap is not refused: its run records the count
it was written with, and reads merge runs of both counts by the old count's buckets
(``runs.read_group_count``); the next compaction rewrites it with the new count.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Callable

from airflow_upsert_provider.engine.common.retry import CAS_CONTENTION
from airflow_upsert_provider.engine.errors import (
    CommitOutcomeUnknown,
    CommitRefused,
    ConfigurationError,
    ConsensusUnavailable,
    UpsertError,
)
from airflow_upsert_provider.engine.maintenance.change_retention import held_since
from airflow_upsert_provider.engine.maintenance.compaction_policy import (
    DEFAULT_MAX_RUNS,
    TierRun,
    check_bucket_count,
    check_max_runs,
    compaction_run,
    drops_tombstones,
    merge_count,
    merged_tier,
    next_bucket_count,
    tier_runs,
)
from airflow_upsert_provider.engine.table.runs import (
    bucket_column,
    current_buckets,
    merge_runs,
    order_column,
    write_bucketed,
)
from airflow_upsert_provider.engine.table.shard import Shard

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

COMPACTED = "compacted"
NOTHING_TO_DO = "nothing_to_do"
# A lost race means another compaction advanced since; a few rounds settle any real contention.
MAX_ATTEMPTS = CAS_CONTENTION.max_attempts


@dataclass
class CompactionResult:
    shard: str
    outcome: str
    since_before: int
    since: int
    upper: int
    runs_merged: int = 0
    # Compacted runs a read merges after this compaction (the tiers below since).
    runs_below_since: int = 0
    full: bool = False
    rows: int = 0
    files: int = 0
    bytes: int = 0
    attempts: int = 0
    seconds: float = 0.0
    run_path: str | None = None
    # The bucket count before and after (they differ when this compaction grew it).
    buckets_before: int | None = None
    buckets: int | None = None

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["seconds"] = round(self.seconds, 3)
        return data


def compaction_dir(shard: Shard, since: int, nonce: str) -> str:
    """Where the output of one compaction attempt goes: unique per attempt, and at the same
    depth as a batch's run (``<shard>/runs/<group>/<name>``) so GC treats both alike."""
    return shard.blob.path(shard.shard_id, "runs", f"since={since:012d}", f"compaction-{nonce}")


def check_target(shard_id: str, target: int, upper: int) -> None:
    """Refuse a new since beyond the shard's upper (a caller may check it before Spark starts)."""
    if target > upper:
        raise ConfigurationError(f"cannot compact shard {shard_id!r} to since {target}: its upper is {upper}",
                                 shard=shard_id)


def check_before_spark(shard: Shard, *, since: int | None = None, buckets: int | None = None,
                       buckets_name: str = "buckets") -> None:
    """Refuse what can be refused without Spark, before a caller starts it (seconds, and no
    JVM for a bad argument): a since beyond the upper, a bucket count that is not a whole
    multiple of the current one, a live run file missing from one listing. :func:`compact`
    checks again on its own snapshot.

    :param buckets_name: the argument's name in the caller's terms (``--buckets`` for the CLI).
    """
    view = shard.consensus.live_view(shard.shard_id, since)
    check_target(shard.shard_id, view.as_of, view.record.upper)
    if buckets is not None:
        check_bucket_count(buckets, current_buckets(shard.config, view.compaction.run if view.compaction else None),
                           buckets_name)
    if view.as_of > view.record.since:
        shard.check_run_files_listed(view.runs)


def compact(
    spark: "SparkSession",
    shard: Shard,
    *,
    since: int | None = None,
    full: bool = False,
    max_runs: int = DEFAULT_MAX_RUNS,
    buckets: int | None = None,
    on_step: Callable[[str], None] | None = None,
    max_attempts: int = MAX_ATTEMPTS,
) -> CompactionResult:
    """Compact the batches of ``shard`` below ``since`` (default: its upper) into its
    compacted runs and advance since.

    :param since: the new since; reads as of a ts below it fail afterwards. Must be <= upper.
    :param full: merge every compacted run and batch below since into one run (a rewrite of
        the table) instead of the newest runs of similar size.
    :param max_runs: at most this many compacted runs stay below since (>= 1).
    :param buckets: the bucket count to write, a whole multiple of the current one (a full
        merge when it grows); default: the current one, doubled when the runs below since
        exceed the shard's ``target_bucket_bytes`` per bucket.
    :param on_step: called with ``"written"`` after the output is written and before the
        swap (tests force races there).
    :param max_attempts: how many lost races to retry before giving up.
    """
    from pyspark.sql import functions as F

    check_max_runs(max_runs)
    started = time.monotonic()
    consensus, blob = shard.consensus, shard.blob
    for attempt in range(1, max_attempts + 1):
        # State, compacted run and batches from one snapshot: they agree with each other.
        view = consensus.live_view(shard.shard_id, since)
        state, target = view.record, view.as_of
        check_target(shard.shard_id, target, state.upper)
        # A change retention keeps the batches of its period above since (change_retention.py).
        target = held_since(consensus, shard.shard_id, view.batches, target)
        if target <= state.since:
            current = current_buckets(shard.config, view.compaction.run if view.compaction else None)
            if buckets is not None:
                check_bucket_count(buckets, current)
            return CompactionResult(
                shard.shard_id, NOTHING_TO_DO, state.since, state.since, state.upper,
                attempts=attempt, seconds=time.monotonic() - started, buckets_before=current, buckets=current,
            )
        compacted = view.compaction.run if view.compaction else None
        tiers = tier_runs(compacted, state.since)
        batch_runs = [b.run for b in view.batches if state.since <= b.ts < target]
        buckets_before = current_buckets(shard.config, compacted)
        run_bytes = sum(f["bytes"] for t in tiers for f in t.files) + sum(
            f["bytes"] for r in batch_runs for f in r["files"])
        bucket_count = next_bucket_count(buckets_before, requested=buckets,
                                         target_bucket_bytes=shard.config.target_bucket_bytes, run_bytes=run_bytes)
        # Every compacted run keeps one bucket count: a count that grows rewrites them all.
        rebucket = bucket_count != buckets_before
        count = merge_count([t.tier for t in tiers], sum(r.get("rows", 0) for r in batch_runs),
                            max_runs=max_runs, full=full or rebucket)
        kept, merging = tiers[: len(tiers) - count], tiers[len(tiers) - count :]
        runs = [t.run() for t in merging] + batch_runs
        # Every input is checked against its recorded size and SHA-256 first: a bit flipped in
        # a page that still decodes would otherwise be merged into an output with fresh,
        # matching checksums, and the damage would become permanent. It costs one more read of
        # the inputs, which the merge reads whole anyway.
        shard.check_run_files(runs)
        # Merged and written with the newest schema any input holds (never fewer columns
        # than a run has); a column an older run lacks becomes null.
        config = shard.config_for_runs([*([compacted] if compacted else []), *batch_runs])
        merged = merge_runs(spark, config, blob, runs)
        survivors = merged.where(F.col("_ts") < target)
        if drops_tombstones(count, tiers, order_column(shard.config) is not None):
            # Every later batch outranks a compacted row and no older one is left: a tombstone
            # has nothing left to hide.
            survivors = survivors.where(~F.col("_deleted"))
        run_dir = compaction_dir(shard, target, uuid.uuid4().hex[:12])
        with shard.reading(runs):  # a run file damaged in place: exit 4 naming it
            written = write_bucketed(survivors.withColumn("_bucket", bucket_column(config, bucket_count)),
                                     config, blob, run_dir, buckets=bucket_count)
        # GC keeps the replaced runs for its grace period after the swap: reads planned before it.
        tier = merged_tier([t.tier for t in tiers], count, state.since, target, written["rows"])
        run = compaction_run([*kept, TierRun(tier, written["path"], tuple(written["files"]))],
                             [r["path"] for r in runs], bucket_count)
        run["schema_version"] = config.schema_version
        if on_step is not None:
            on_step("written")
        try:
            swapped = consensus.compare_and_set_since(shard.shard_id, state.since, target, run)
        except CommitRefused:
            # GC claimed this output (the swap came later than its grace period): it is GC's
            # to delete now; write a new one.
            continue
        except ConsensusUnavailable:
            try:
                current = consensus.get_compaction(shard.shard_id)
            except ConsensusUnavailable:
                # Still down: the swap may have landed, so this is not "nothing changed".
                current = None
            if current is None or current.run["path"] != run["path"]:
                # Whether it landed is unknown: the output stays for GC to judge (grace period).
                raise CommitOutcomeUnknown(
                    f"compaction of shard {shard.shard_id!r} to since {target} has an unknown outcome; "
                    f"its output {run['path']} is kept and a retry is safe",
                    shard=shard.shard_id,
                ) from None
            swapped = True
        if swapped:
            return CompactionResult(
                shard=shard.shard_id,
                outcome=COMPACTED,
                since_before=state.since,
                since=target,
                upper=state.upper,
                runs_merged=len(runs),
                runs_below_since=len(kept) + 1,
                full=full or rebucket,
                rows=written["rows"],
                files=len(written["files"]),
                bytes=sum(f["bytes"] for f in written["files"]),
                attempts=attempt,
                seconds=time.monotonic() - started,
                run_path=run["path"],
                buckets_before=buckets_before,
                buckets=bucket_count,
            )
        # Another compaction advanced since first: this output provably lost.
        blob.delete_tree(run_dir)
    raise UpsertError(
        f"compaction of shard {shard.shard_id!r} lost the race for since {max_attempts} times; "
        "another compaction keeps advancing it",
        shard=shard.shard_id,
    )
