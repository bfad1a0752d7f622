"""The shard: a keyed table plus its frontier.

State lives in consensus (upper, since, seqno, bindings, one batch row per ts); data files in
blob. This module holds the rules that every writer shares: how binding(ts) is planned and
minted, the three-way classification of a batch against the upper, and the paths of runs.
"""

from __future__ import annotations

import enum
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_upsert_provider.engine.blob import LocalBlob
from airflow_upsert_provider.engine.config import ShardConfig, validate_shard_id
from airflow_upsert_provider.engine.consensus import (
    AppendResult,
    BatchRecord,
    Binding,
    Consensus,
    ShardRecord,
)
from airflow_upsert_provider.engine.errors import BadInputError, ConfigurationError
from airflow_upsert_provider.engine.runs import read_runs
from airflow_upsert_provider.engine.sources import DirectorySource, Segment, open_source

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

BAD_RECORD_MODES = ("fail", "quarantine")
# How many offending records or files an error message lists.
MAX_REPORTED = 20


class Disposition(str, enum.Enum):
    DROP = "drop"  # ts < upper: a peer (or an earlier attempt) persisted it
    PROCESS = "process"  # ts == upper: append it now
    HOLD = "hold"  # ts > upper: keep it until the upper gets there


def classify(ts: int, upper: int) -> Disposition:
    """Invariant 4, the one rule every batch a writer holds goes through."""
    if ts < upper:
        return Disposition.DROP
    if ts == upper:
        return Disposition.PROCESS
    return Disposition.HOLD


def path_slug(text: str) -> str:
    """A writer id made safe for one path component (ids from Airflow hold ':' and '/')."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("._")
    return (slug or "writer")[:96]


def check_bad_record_mode(mode: str) -> str:
    if mode not in BAD_RECORD_MODES:
        raise ConfigurationError(
            f"unknown bad-record mode {mode!r}; expected one of {BAD_RECORD_MODES}",
            field="on_bad_record",
        )
    return mode


@dataclass
class ShardStatus:
    shard: str
    upper: int
    since: int
    seqno: int
    high_watermark: dict[str, int]
    bound: dict[str, int]
    rows: int | None
    pending_segments: int

    @property
    def lag_offsets(self) -> dict[str, int]:
        return {
            p: max(0, hw - self.bound.get(p, 0)) for p, hw in sorted(self.high_watermark.items())
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "shard": self.shard,
            "upper": self.upper,
            "since": self.since,
            "seqno": self.seqno,
            "rows": self.rows,
            "source": {
                "high_watermark": dict(sorted(self.high_watermark.items())),
                "bound": dict(sorted(self.bound.items())),
                "lag_offsets": self.lag_offsets,
                "pending_segments": self.pending_segments,
            },
        }


class Shard:
    """Handle on one shard. Cheap to build; holds no cached state (every decision reads the
    authoritative store)."""

    def __init__(self, consensus: Consensus, blob: LocalBlob, shard_id: str, config: ShardConfig) -> None:
        self.consensus = consensus
        self.blob = blob
        self.shard_id = shard_id
        self.config = config
        self.source: DirectorySource = open_source(config.source, config.source_format)

    # -- lifecycle --------------------------------------------------------------------------

    @classmethod
    def create(cls, consensus: Consensus, blob: LocalBlob, shard_id: str, config: ShardConfig) -> "Shard":
        validate_shard_id(shard_id)
        open_source(config.source, config.source_format).check()
        blob.ensure_root()
        consensus.create_shard(shard_id, config.to_json())
        return cls(consensus, blob, shard_id, config)

    @classmethod
    def open(cls, consensus: Consensus, blob: LocalBlob, shard_id: str) -> "Shard":
        record = consensus.get_shard(shard_id)
        return cls(consensus, blob, shard_id, ShardConfig.from_json(record.config))

    def state(self) -> ShardRecord:
        return self.consensus.get_shard(self.shard_id)

    # -- paths ------------------------------------------------------------------------------

    def run_dir(self, ts: int, writer_id: str, nonce: str) -> str:
        """Staging path unique to (writer, ts, attempt): no two attempts share files."""
        return self.blob.path(self.shard_id, "runs", f"ts={ts:012d}", f"{path_slug(writer_id)}-{nonce}")

    def rejects_dir(self, ts: int, writer_id: str, nonce: str) -> str:
        return self.blob.path(self.shard_id, "rejects", f"ts={ts:012d}", f"{path_slug(writer_id)}-{nonce}")

    # -- bindings ---------------------------------------------------------------------------

    def binding(self, ts: int) -> Binding | None:
        return self.consensus.get_binding(self.shard_id, ts)

    def bound_offsets(self, upper: int) -> dict[str, int]:
        """Source offsets covered by every batch below ``upper``."""
        if upper == 0:
            return {}
        binding = self.binding(upper - 1)
        return binding.to_offsets() if binding else {}

    def mint_binding(
        self, ts: int, *, minted_by: str, on_bad_record: str = "fail", max_files: int | None = None
    ) -> Binding | None:
        """binding(ts), minting it by compare-and-set if nobody has; None when the source
        holds nothing beyond binding(ts-1) (no empty batches are minted).

        ``max_files`` overrides the shard's files per batch for a binding this call mints
        (a backfill binds larger batches); a binding that exists is returned as it is."""
        existing = self.binding(ts)
        if existing is not None:
            return existing
        previous = self.binding(ts - 1) if ts > 0 else None
        if ts > 0 and previous is None:
            # Only ts == upper is ever minted, and binding(upper-1) exists for upper > 0.
            raise ConfigurationError(f"cannot bind ts {ts}: binding {ts - 1} is missing", shard=self.shard_id)
        planned = self._plan_binding(ts, previous, check_bad_record_mode(on_bad_record), max_files)
        if planned is None:
            return None
        return self.consensus.mint_binding(self.shard_id, planned, minted_by)

    def _plan_binding(
        self, ts: int, previous: Binding | None, on_bad_record: str, max_files: int | None = None
    ) -> Binding | None:
        source = self.source
        prev_ranges = previous.ranges if previous else {}
        known_quarantined = self.consensus.quarantined_files(self.shard_id)
        problems: list[dict[str, str]] = []
        candidates: list[Segment] = []
        starts: dict[str, tuple[int, int]] = {}

        for partition in source.partitions():
            segments, bad_files = source.scan(partition)
            problems += [
                {"file": b.path, "reason": b.reason} for b in bad_files if b.path not in known_quarantined
            ]
            prev = prev_ranges.get(partition, {"to": 0, "count": 0})
            start, count = prev["to"], prev["count"]
            below = [s for s in segments if s.seq < start]
            if len(below) > count:
                # A segment appeared with an offset already bound: it would never be read.
                bound = self._bound_seqs(partition)
                for seg in below:
                    if seg.seq not in bound and seg.path not in known_quarantined:
                        problems.append(
                            {
                                "file": seg.path,
                                "reason": f"late arrival: offset {seg.seq} is below the bound offset "
                                f"{start} of partition {partition!r}",
                            }
                        )
            starts[partition] = (start, count)
            candidates += [s for s in segments if s.seq >= start]
        # Partitions that vanished keep their frontier.
        for partition, prev in prev_ranges.items():
            starts.setdefault(partition, (prev["to"], prev["count"]))

        candidates.sort(key=lambda s: (s.seq, s.partition))
        taken = candidates[: max_files or self.config.max_files_per_batch]
        readable: list[Segment] = []
        for seg in taken:
            reason = source.unreadable_reason(seg, self.config.schema_fields(), self.config.keys)
            if reason is None:
                readable.append(seg)
            else:
                problems.append({"file": seg.path, "reason": reason})

        if problems and on_bad_record == "fail":
            raise BadInputError(
                f"{len(problems)} bad source file(s) in {source.root}; first: "
                f"{problems[0]['file']}: {problems[0]['reason']} "
                "(fix or remove them, or run with --on-bad-record quarantine)",
                records=problems[:MAX_REPORTED],
                count=len(problems),
            )
        if not taken and not problems:
            return None

        ranges: dict[str, dict[str, Any]] = {}
        late_per_partition: dict[str, int] = {}
        for p in problems:
            if p["reason"].startswith("late arrival"):
                part = os.path.basename(os.path.dirname(p["file"]))
                late_per_partition[part] = late_per_partition.get(part, 0) + 1
        for partition, (start, count) in sorted(starts.items()):
            mine = [s for s in taken if s.partition == partition]
            ranges[partition] = {
                "from": start,
                "to": mine[-1].seq + 1 if mine else start,
                "files": [s.seq for s in readable if s.partition == partition],
                # Segments below "to" ever bound or set aside: detects late arrivals cheaply.
                "count": count + len(mine) + late_per_partition.get(partition, 0),
            }
        return Binding(ts=ts, ranges=ranges, quarantined=problems)

    def _bound_seqs(self, partition: str) -> set[int]:
        seqs: set[int] = set()
        for binding in self.consensus.bindings(self.shard_id):
            seqs.update(binding.ranges.get(partition, {}).get("files", []))
        quarantined = self.consensus.quarantined_files(self.shard_id)
        prefix = os.path.join(self.source.root, partition) + os.sep
        for path in quarantined:
            if path.startswith(prefix):
                stem = os.path.basename(path).split(".", 1)[0]
                if stem.isdigit():
                    seqs.add(int(stem))
        return seqs

    def segment_paths(self, binding: Binding) -> list[Segment]:
        """The segment files batch ``binding.ts`` reads, in (partition, offset) order."""
        segments = []
        for partition, rng in sorted(binding.ranges.items()):
            for seq in rng["files"]:
                path = os.path.join(self.source.root, partition, f"{seq}{self.source.extension}")
                segments.append(Segment(seq, partition, path))
        return segments

    # -- appends ----------------------------------------------------------------------------

    def compare_and_append(self, expected_upper: int, new_upper: int, batch: BatchRecord) -> AppendResult:
        return self.consensus.compare_and_append(self.shard_id, expected_upper, new_upper, batch)

    def batches(self, *, below: int | None = None) -> list[BatchRecord]:
        return self.consensus.batches(self.shard_id, below=below)

    # -- reads ------------------------------------------------------------------------------

    def read(self, spark: "SparkSession", as_of: int | None = None) -> "DataFrame":
        """The table as of ``as_of`` (default: the upper): latest record per key, tombstones
        removed, user columns only."""
        state = self.state()
        as_of = state.upper if as_of is None else as_of
        if as_of > state.upper:
            raise ConfigurationError(
                f"cannot read shard {self.shard_id!r} as of {as_of}: its upper is {state.upper}",
                shard=self.shard_id,
            )
        if as_of < state.since:
            raise ConfigurationError(
                f"cannot read shard {self.shard_id!r} as of {as_of}: compacted below since {state.since}",
                shard=self.shard_id,
            )
        return read_runs(spark, self.config, self.blob, self.runs_as_of(as_of))

    def runs_as_of(self, as_of: int) -> list[dict[str, Any]]:
        """The runs a read as of ``as_of`` merges: the compacted run (every ts below its
        since) and the batches from its since up to ``as_of``."""
        compaction = self.consensus.get_compaction(self.shard_id)
        if compaction is None:
            return [b.run for b in self.batches(below=as_of)]
        if as_of < compaction.since:
            # since advanced while this read started.
            raise ConfigurationError(
                f"cannot read shard {self.shard_id!r} as of {as_of}: compacted below since {compaction.since}",
                shard=self.shard_id,
            )
        later = self.consensus.batches(self.shard_id, from_ts=compaction.since, below=as_of)
        return [compaction.run] + [b.run for b in later]

    def status(self, spark: "SparkSession | None" = None) -> ShardStatus:
        """Frontier and source lag; ``rows`` only when a Spark session is given."""
        state = self.state()
        bound = self.bound_offsets(state.upper)
        marks: dict[str, int] = {}
        pending = 0
        for partition in self.source.partitions():
            segments, _ = self.source.scan(partition)
            marks[partition] = segments[-1].seq + 1 if segments else 0
            pending += sum(1 for s in segments if s.seq >= bound.get(partition, 0))
        rows = self.read(spark).count() if spark is not None else None
        return ShardStatus(
            shard=self.shard_id,
            upper=state.upper,
            since=state.since,
            seqno=state.seqno,
            high_watermark=marks,
            bound=bound,
            rows=rows,
            pending_segments=pending,
        )
