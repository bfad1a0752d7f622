"""The retention log of a directory source: which segments were deleted, kept by the source.

A seek after a restore has to know whether segments it needs were deleted meanwhile (a
consensus store lost with it the bindings that named them). The source keeps that knowledge
itself, as a Kafka broker keeps a log start offset: every deletion that goes through
``prune`` is first appended to ``<partition>/.retention.jsonl`` (one JSON object a line:
offset, name, deleted_at) and synced, then the segment is unlinked. The log is a hidden file,
which the source ignores as data. A deletion the log does not record (``rm`` by hand) can be
seen by a seek only if a binding still names the segment.

``prune`` decides what to delete with ``plan_prune`` (pure: listings, bound offsets and bound
names in, deletions out) and then logs and unlinks (docs/recovery.md, docs/source.md).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

from airflow_upsert_provider.engine.errors import BadInputError
from airflow_upsert_provider.engine.sources.planning import range_files

if TYPE_CHECKING:
    from airflow_upsert_provider.engine.table.shard import Shard

LOG_NAME = ".retention.jsonl"


@dataclass(frozen=True)
class DeletedSegment:
    partition: str
    offset: int
    name: str
    deleted_at: float


def log_path(partition_dir: str) -> str:
    return os.path.join(partition_dir, LOG_NAME)


def read_log(partition: str, partition_dir: str) -> list[DeletedSegment]:
    """Every deletion the partition's retention log records; a line that does not parse is
    an error naming the file and line (a damaged log must not hide a deletion)."""
    path = log_path(partition_dir)
    try:
        handle = open(path, encoding="utf-8")
    except FileNotFoundError:
        return []
    deleted = []
    with handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                deleted.append(DeletedSegment(partition, int(entry["offset"]), str(entry["name"]),
                                              float(entry["deleted_at"])))
            except (ValueError, KeyError, TypeError) as exc:
                if not line.endswith("\n"):
                    # A crash in the middle of appending the last line: that deletion never
                    # happened (the line is written and synced before the unlink).
                    continue
                raise BadInputError(
                    f"retention log {path} line {number} does not parse ({exc!r}): fix or remove "
                    "the line; it must say which segment was deleted",
                    file=path,
                    line=number,
                ) from None
    return deleted


def record_deletions(partition_dir: str, entries: Iterable[tuple[int, str]], now: float | None = None) -> None:
    """Append (offset, name) deletions to the partition's log and sync it, before deleting."""
    stamp = time.time() if now is None else now
    text = "".join(json.dumps({"offset": o, "name": n, "deleted_at": stamp}) + "\n" for o, n in entries)
    if not text:
        return
    with open(log_path(partition_dir), "a", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


# -- pruning: deleting the segments the shard no longer needs ----------------------------------

PRUNE_BELOW = ("checkpoint", "committed")


@dataclass(frozen=True)
class PartitionPrune:
    """What pruning does in one partition: the segments below ``bound`` that a binding
    bound (``delete``), and how many segment files below it no binding bound (kept: a late
    arrival or a file set aside is for a human to look at, not for retention to hide)."""

    partition: str
    bound: int
    delete: tuple[tuple[int, str, int], ...]  # (offset, name, bytes)
    kept_unbound: int

    @property
    def bytes(self) -> int:
        return sum(size for _, _, size in self.delete)

    def to_dict(self) -> dict[str, Any]:
        return {"bound": self.bound, "files": len(self.delete), "bytes": self.bytes,
                "kept_unbound": self.kept_unbound, "deleted": [name for _, name, _ in self.delete]}


def lowest_bounds(bounds: Iterable[dict[str, int]]) -> dict[str, int]:
    """Per partition, the lowest of several bound offsets; a partition one of them does not
    name is bound at 0 there (that shard or checkpoint still needs all of it)."""
    bounds = list(bounds)
    partitions = set().union(*bounds) if bounds else set()
    return {p: min(b.get(p, 0) for b in bounds) for p in sorted(partitions)}


def plan_prune(
    bound: dict[str, int],
    segments: dict[str, list[tuple[int, str, int]]],
    bound_names: dict[str, set[str]],
) -> list[PartitionPrune]:
    """Pure: per partition, the segments (offset, name, bytes) strictly below its bound
    offset that a binding bound under that very name. A partition the bound does not name
    keeps everything."""
    plans = []
    for partition in sorted(segments):
        limit = bound.get(partition, 0)
        below = [s for s in sorted(segments[partition]) if s[0] < limit]
        names = bound_names.get(partition, set())
        delete = tuple(s for s in below if s[1] in names)
        plans.append(PartitionPrune(partition, limit, delete, len(below) - len(delete)))
    return plans


@dataclass
class PruneReport:
    shard: str
    below: str
    dry_run: bool
    bound: dict[str, int]
    partitions: list[PartitionPrune] = field(default_factory=list)
    # The checkpoint whose bound offsets held pruning back (--below checkpoint).
    checkpoint: str | None = None
    # Other shards of the consensus reading the same landing directory (they hold it back too).
    shared_with: list[str] = field(default_factory=list)

    @property
    def files(self) -> int:
        return sum(len(p.delete) for p in self.partitions)

    @property
    def bytes(self) -> int:
        return sum(p.bytes for p in self.partitions)

    def to_dict(self) -> dict[str, Any]:
        return {
            "shard": self.shard,
            "below": self.below,
            "dry_run": self.dry_run,
            "checkpoint": self.checkpoint,
            "shared_with": self.shared_with,
            "bound": self.bound,
            "partitions": {p.partition: p.to_dict() for p in self.partitions},
            "files": self.files,
            "bytes": self.bytes,
        }


def _checkpoint_bound(shard: "Shard") -> tuple[str, dict[str, int]] | None:
    """The oldest retained checkpoint of ``shard`` and the bound offsets at its upper, as a
    restore of it would seek them (its manifest's last binding), held back further by this
    consensus's own binding at that ts if it differs. None without a checkpoint."""
    from airflow_upsert_provider.engine.maintenance.checkpoint_catalog import Catalog
    from airflow_upsert_provider.engine.maintenance.checkpoint_manifest import read_manifest

    catalog = Catalog.load(shard.blob, shard.shard_id, shard.consensus)
    if not catalog.entries:
        return None
    oldest = min(catalog.entries, key=lambda e: (e.upper, e.created_at))
    if oldest.upper == 0:
        return oldest.id, {}
    manifest = read_manifest(shard.blob, shard.shard_id, oldest.id, oldest.manifest_sha256)
    last = [b for b in manifest["bindings"] if int(b["ts"]) == oldest.upper - 1]
    bounds = [{p: int(r["to"]) for p, r in last[0]["ranges"].items()}] if last else [{}]
    here = shard.binding(oldest.upper - 1)
    if here is not None:
        bounds.append(here.to_offsets())
    return oldest.id, lowest_bounds(bounds)


def _committed_bound(shard: "Shard") -> dict[str, int]:
    return shard.bound_offsets(shard.state().upper)


def _shards_sharing_source(shard: "Shard") -> list["Shard"]:
    from airflow_upsert_provider.engine.table.shard import Shard

    others = []
    for record in shard.consensus.list_shards():
        if record.shard_id == shard.shard_id:
            continue
        other = Shard.open(shard.consensus, shard.blob, record.shard_id)
        if other.source.root == shard.source.root:
            others.append(other)
    return others


def prune(shard: "Shard", *, below: str = "checkpoint", dry_run: bool = False) -> PruneReport:
    """Delete the source segments ``shard`` no longer needs, each recorded in its partition's
    retention log (synced) before it is unlinked, so that a later seek knows it is gone.

    ``below="checkpoint"``: only segments below the bound offsets at the upper of the oldest
    retained checkpoint (and below the shard's own bound), so every retained checkpoint stays
    restorable and its recovery's seek finds what it needs. ``below="committed"``: below the
    shard's bound offsets, for a shard that will never be restored. Only segments a binding
    bound are deleted. Other shards of the consensus reading the same landing directory hold
    the bound back by the same rule (their committed bound if they have no checkpoint)."""
    from airflow_upsert_provider.engine.errors import ConfigurationError

    if shard.is_kafka:
        raise ConfigurationError(
            f"shard {shard.shard_id!r} reads {shard.source.uri}: the broker's retention (retention.ms, "
            "retention.bytes) deletes Kafka records, not upsertctl; `source prune` is for landing directories",
            field="source",
        )
    if below not in PRUNE_BELOW:
        raise ConfigurationError(f"unknown prune bound {below!r}; expected one of {PRUNE_BELOW}", field="below")
    bounds = [_committed_bound(shard)]
    checkpoint_id = None
    if below == "checkpoint":
        found = _checkpoint_bound(shard)
        if found is None:
            raise ConfigurationError(
                f"shard {shard.shard_id!r} has no checkpoint: --below checkpoint keeps what the oldest "
                "checkpoint needs, and there is none. Create one (upsertctl checkpoint create), or use "
                "--below committed if the shard will never be restored; nothing was deleted",
                shard=shard.shard_id,
                field="below",
            )
        checkpoint_id, at_checkpoint = found
        bounds.append(at_checkpoint)
    sharing = _shards_sharing_source(shard)
    for other in sharing:
        bounds.append(_committed_bound(other))
        if below == "checkpoint":
            other_found = _checkpoint_bound(other)
            if other_found is not None:
                bounds.append(other_found[1])
    bound = lowest_bounds(bounds)

    names: dict[str, set[str]] = {}
    upper = shard.state().upper
    for binding in shard.consensus.bindings(shard.shard_id):
        if binding.ts >= upper:
            break
        for partition, rng in binding.ranges.items():
            names.setdefault(partition, set()).update(n for _, n in range_files(rng, shard.source.extension))
    # Bindings below since - 1 may have been truncated (store/history.py): the names they
    # bound that are still present are in the source index, with those set aside in quarantine
    # (which stay: they are for a human).
    index = shard.source_index()
    last = shard.binding(upper - 1) if upper > 0 else None
    for partition in shard.source.partitions():
        settled, _lag = index.settled(partition, last)
        directory = shard.source.partition_dir(partition)
        set_aside = index.quarantined_among(sorted(os.path.join(directory, n) for n in settled))
        names.setdefault(partition, set()).update(n for n in settled if os.path.join(directory, n) not in set_aside)
    segments: dict[str, list[tuple[int, str, int]]] = {}
    for partition in shard.source.partitions():
        found_segments, _bad = shard.source.scan(partition)
        segments[partition] = [(s.seq, s.name, _size(s.path)) for s in found_segments if s.seq < bound.get(partition, 0)]
    plans = plan_prune(bound, segments, names)
    report = PruneReport(shard.shard_id, below, dry_run, bound, plans, checkpoint_id,
                         [o.shard_id for o in sharing])
    if not dry_run:
        for plan in plans:
            _delete_logged(shard.source.partition_dir(plan.partition), plan)
    return report


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def _delete_logged(directory: str, plan: PartitionPrune) -> None:
    """The log first, synced, then the unlinks: a crash in between leaves files the log calls
    deleted (a seek finds them present, harmless), never a deletion the log does not know."""
    if not plan.delete:
        return
    record_deletions(directory, [(offset, name) for offset, name, _ in plan.delete])
    for _, name, _ in plan.delete:
        try:
            os.unlink(os.path.join(directory, name))
        except FileNotFoundError:
            pass
