"""Which runs of a shard a compaction merges: the tiered policy, a pure function of state.

Below since the shard keeps a short list of compacted runs ("tiers"), oldest first, each
holding the latest row of every key over a contiguous range of ts ``[from_ts, to_ts)``; the
ranges follow each other and the newest ends at since. A compaction to a new since merges the
batches between the old and the new since with the newest tiers of similar size: walking from
the newest tier back, a tier joins the merge while it holds at most ``SIZE_RATIO`` times the rows
the merge holds already (persist's spine merges batches of similar size; Paimon's universal
compaction compares a run with the sum of the newer ones). So every tier holds more than
``SIZE_RATIO`` times the rows of the next newer one: there are at most about
log2(table / change) + 1 tiers. A row is merged again only into an output at least 1.5 times
the size of the tier it was in, so it is rewritten O(log(table / change)) times: a cycle's work
follows what changed, amortized, never the table. ``max_runs`` bounds the tiers a read merges:
when there would be more (a table beyond about 2^max_runs times a cycle's change), the newest
merge until there are ``max_runs``.

A full compaction merges every tier and batch into one run: the compaction before tiers.

A compaction may also grow the shard's bucket count (:func:`next_bucket_count`): by a whole
factor, so that each old bucket splits into known new ones (a key of bucket b among N is in
bucket b mod M among every divisor M of N). It then merges fully, so every compacted run has the
new count; batches written with the old count stay readable (``runs.read_group_count``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from airflow_upsert_provider.engine.config import MAX_BUCKETS
from airflow_upsert_provider.engine.errors import ConfigurationError, IntegrityError

# A read merges at most this many compacted runs (plus the batches from since on): 10 tiers
# hold a table about 2^10 times one cycle's change before the bound forces larger merges, and
# they hold at most about twice the table's rows (each tier more than twice the next).
DEFAULT_MAX_RUNS = 10
# A tier joins a merge while it holds at most this many times the merge's rows so far.
SIZE_RATIO = 2


@dataclass(frozen=True)
class Tier:
    """A compacted run's place in the policy: its ts range ``[from_ts, to_ts)`` and its rows."""

    from_ts: int
    to_ts: int
    rows: int


@dataclass(frozen=True)
class TierRun:
    """A compacted run as the store records it: its tier, directory and files."""

    tier: Tier
    path: str
    files: tuple[dict[str, Any], ...]

    def run(self) -> dict[str, Any]:
        """The run description merges and checks take (``{"path", "files", "rows"}``)."""
        return {"path": self.path, "files": list(self.files), "rows": self.tier.rows}


def check_max_runs(value: Any, name: str = "max_runs") -> int:
    """``value`` if it is an integer >= 1, else a :class:`ConfigurationError` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"{name} must be an integer >= 1 (the compacted runs a read merges), got {value!r}",
                                 field=name)
    return value


def check_bucket_count(value: Any, current: int, name: str = "buckets") -> int:
    """``value`` if the bucket count may become it: an integer that is a whole multiple of the
    ``current`` count (each old bucket splits into known new ones), at most ``MAX_BUCKETS``;
    else a :class:`ConfigurationError` naming ``name``, the value and what is allowed."""
    if (isinstance(value, bool) or not isinstance(value, int) or value < current or value % current
            or value > MAX_BUCKETS):
        largest = MAX_BUCKETS // current * current
        allowed = (f"a multiple of the current count {current} up to {MAX_BUCKETS} ({current}, {2 * current}, ..., "
                   f"{largest})" if 2 * current <= MAX_BUCKETS else f"only the current count {current}")
        raise ConfigurationError(f"{name} {value!r} is not allowed: the bucket count can only grow, to {allowed}",
                                 field=name)
    return value


def next_bucket_count(
    current: int, *, requested: int | None = None, target_bucket_bytes: int | None = None, run_bytes: int = 0
) -> int:
    """The bucket count a compaction writes: ``requested`` if given (checked by
    :func:`check_bucket_count`); else double the ``current`` one when the ``run_bytes`` of the runs
    it compacts (every run below its since) exceed ``target_bucket_bytes`` per bucket on average
    and doubling stays within ``MAX_BUCKETS``; else the current one. Pure."""
    if requested is not None:
        return check_bucket_count(requested, current)
    if target_bucket_bytes is not None and run_bytes > target_bucket_bytes * current and 2 * current <= MAX_BUCKETS:
        return 2 * current
    return current


def merge_count(tiers: Sequence[Tier], new_rows: int, *, max_runs: int, full: bool = False) -> int:
    """How many of the newest ``tiers`` (oldest first) merge with the new batches' ``new_rows``
    rows: every one for a full compaction; else the newest while each holds no more rows than
    ``SIZE_RATIO`` times the merge so far, and more if the tiers left plus the output would exceed ``max_runs``."""
    check_max_runs(max_runs)
    if full:
        return len(tiers)
    merged_rows, count = new_rows, 0
    while count < len(tiers) and tiers[-1 - count].rows <= SIZE_RATIO * merged_rows:
        merged_rows += tiers[-1 - count].rows
        count += 1
    return max(count, len(tiers) + 1 - max_runs)


def merged_tier(tiers: Sequence[Tier], count: int, since: int, target: int, rows: int) -> Tier:
    """The tier a merge of the newest ``count`` tiers and the batches from ``since`` to
    ``target`` writes: it starts where the oldest merged tier started, or at ``since``."""
    return Tier(tiers[-count].from_ts if count else since, target, rows)


def drops_tombstones(count: int, tiers: Sequence[Tier], has_order_column: bool) -> bool:
    """Whether the merge may drop tombstones: only when it includes the oldest tier (nothing
    older is left for a tombstone to hide) and no order column can let an older-ts row win."""
    return count == len(tiers) and not has_order_column


def tier_runs(run: dict[str, Any] | None, since: int) -> list[TierRun]:
    """The compacted runs a shard's compaction record holds, oldest first. A record written
    before tiers (no ``tiers`` field) is one tier over every ts below since. Each file belongs
    to the tier whose directory holds it; a file no tier holds is an :class:`IntegrityError`."""
    if run is None:
        return []
    if "tiers" not in run:
        return [TierRun(Tier(0, since, run.get("rows", 0)), run["path"], tuple(run["files"]))]
    by_dir: dict[str, list[dict[str, Any]]] = {t["path"]: [] for t in run["tiers"]}
    for listed in run["files"]:
        directory = next((d for d in by_dir if listed["path"].startswith(d + "/")), None)
        if directory is None:
            raise IntegrityError(f"compacted file {listed['path']} is in none of the compaction's tiers "
                                 f"({sorted(by_dir)})", file=listed["path"])
        by_dir[directory].append(listed)
    return [
        TierRun(Tier(t["from_ts"], t["to_ts"], t["rows"]), t["path"], tuple(by_dir[t["path"]]))
        for t in run["tiers"]
    ]


def compaction_run(
    tiers: Sequence[TierRun], replaces: Sequence[str], buckets: int | None = None
) -> dict[str, Any]:
    """The compaction record's run for ``tiers`` (oldest first, every one written with
    ``buckets`` buckets): a run like any other to a read (``path``: the newest tier's directory,
    ``files``: every tier's, ``buckets``: the shard's count from this swap on; without it, the
    count of ``init``), with the ``tiers`` and what the swap ``replaces`` (the merged runs'
    directories, for GC)."""
    return {
        **({} if buckets is None else {"buckets": buckets}),
        "path": tiers[-1].path,
        "files": [f for t in tiers for f in t.files],
        "rows": sum(t.tier.rows for t in tiers),
        "tiers": [{"path": t.path, "from_ts": t.tier.from_ts, "to_ts": t.tier.to_ts, "rows": t.tier.rows}
                  for t in tiers],
        "replaces": list(replaces),
    }
