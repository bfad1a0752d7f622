"""The shard: a keyed table plus its frontier.

State lives in consensus (upper, since, seqno, bindings, one batch row per ts); data files in
blob. This module holds the rules that every writer shares: how binding(ts) is planned and
minted, the three-way classification of a batch against the upper, and the paths of runs.
"""

from __future__ import annotations

import enum
import functools
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

from airflow_upsert_provider.engine.blob.interface import Blob
from airflow_upsert_provider.engine.config import ShardConfig, validate_shard_id
from airflow_upsert_provider.engine.store.consensus import Consensus
from airflow_upsert_provider.engine.store.records import AppendResult, BatchRecord, Binding, ShardRecord
from airflow_upsert_provider.engine.errors import (
    ConfigurationError,
    IntegrityError,
    KafkaSliceUnavailable,
    PlanningOutdated,
    ReadOutdated,
    UpsertError,
)
from airflow_upsert_provider.engine.store.schema_policies import stored_schema_policy
from airflow_upsert_provider.engine.table.schema_evolution import effective_policy
from airflow_upsert_provider.engine.table.runs import current_buckets, file_problem, read_runs
from airflow_upsert_provider.engine.table.binding_planner import (
    anchor_source_index,
    plan_binding,
    remember_settled,
    survey_source,
)
from airflow_upsert_provider.engine.store.source_index import SourceIndex
from airflow_upsert_provider.engine.store.table_schemas import (
    config_at,
    current_schema,
    newest_run_version,
    schema_version_of,
)
from airflow_upsert_provider.engine.sources import DirectorySource, Segment, open_source
from airflow_upsert_provider.engine.sources.kafka import KafkaSource
from airflow_upsert_provider.engine.sources.kafka_options import KafkaShardOptions
from airflow_upsert_provider.engine.sources.kafka_planning import lost_offsets, plan_ranges, start_offsets
from airflow_upsert_provider.engine.sources.planning import range_files
from airflow_upsert_provider.engine.sources.lag import SEGMENTS

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from airflow_upsert_provider.engine.sources.kafka import KafkaConfig

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


def missing_binding_error(shard_id: str, ts: int, missing: int, upper: int) -> UpsertError:
    """Pure: the error for binding ``missing`` (ts or ts - 1) found absent while batch ``ts``
    was planned or staged, given the shard's upper read after that. Past the upper, a peer
    persisted ts and GC truncated its history while this writer paused: retryable
    :class:`PlanningOutdated` (a writer reports the batch as already persisted). Otherwise the
    binding never existed: a configuration error (only ts == upper is ever bound)."""
    if classify(ts, upper) is Disposition.DROP:
        return PlanningOutdated(
            f"batch {ts} of shard {shard_id!r} was persisted by a peer meanwhile (upper {upper}) and its "
            f"binding {missing} truncated by GC; nothing to do for it: run again",
            shard=shard_id, ts=ts, upper=upper,
        )
    if missing == ts:
        return ConfigurationError(f"batch {ts} of shard {shard_id!r} is not bound yet", shard=shard_id, ts=ts)
    return ConfigurationError(f"cannot bind ts {ts}: binding {missing} is missing", shard=shard_id, ts=ts)


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
    # The stream's lifecycle state (engine/store/streams.py): status, epoch, who set it, when, why.
    stream: dict[str, Any] | None = None
    # Landing time (mtime) of the oldest first-unbound segment over the partitions: the age of
    # the oldest record not yet committed (None: nothing pending).
    oldest_pending_at: float | None = None
    # What ``lag`` counts (engine/sources/lag.py): the source's unit.
    lag_unit: str = SEGMENTS
    # ``lag`` per partition, in lag_unit (partitions with nothing pending: 0).
    pending_by_partition: dict[str, int] = field(default_factory=dict)
    # The version of the table's schema now (docs/schema.md; 1: the schema of ``init``).
    schema_version: int = 1

    @property
    def lag(self) -> int:
        """What is pending, in ``lag_unit``: the segment files not bound yet (directory), the
        records after the offsets bound at the upper (Kafka). Not ``lag_offsets``' sum: a
        directory's file numbers may leave gaps, and a Kafka partition never bound counts
        from its low watermark."""
        return self.pending_segments

    def lag_seconds_at(self, at: float) -> float | None:
        """Age at ``at`` (unix seconds) of the oldest record not committed; None when nothing
        is pending or its landing time is not known (a Kafka source)."""
        if self.lag > 0 and self.oldest_pending_at is not None:
            return max(0.0, at - self.oldest_pending_at)
        return None

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
            "schema_version": self.schema_version,
            "rows": self.rows,
            "stream": self.stream,
            "source": {
                "high_watermark": dict(sorted(self.high_watermark.items())),
                "bound": dict(sorted(self.bound.items())),
                "lag_offsets": self.lag_offsets,
                "pending_segments": self.pending_segments,
                "lag": self.lag,
                "lag_unit": self.lag_unit,
                "oldest_pending_at": self.oldest_pending_at,
            },
        }


class Shard:
    """Handle on one shard. Cheap to build; holds no cached state (every decision reads the
    authoritative store).

    ``kafka_config`` is the client config of a Kafka shard's topic, given at run time (never
    stored with the shard); without it, what needs only consensus still works."""

    def __init__(
        self, consensus: Consensus, blob: Blob, shard_id: str, config: ShardConfig,
        *, kafka_config: "KafkaConfig | None" = None,
    ) -> None:
        self.consensus = consensus
        self.blob = blob
        self.shard_id = shard_id
        self.config = config
        self.source: DirectorySource | KafkaSource = open_source(
            config.source, config.source_format, kafka_config=kafka_config
        )

    @property
    def is_kafka(self) -> bool:
        return isinstance(self.source, KafkaSource)

    @property
    def kafka_options(self) -> KafkaShardOptions:
        return KafkaShardOptions.from_extra(self.config.extra)

    @property
    def group_id(self) -> str:
        """The consumer group whose committed offsets follow this shard's frontier."""
        assert isinstance(self.source, KafkaSource)
        return self.kafka_options.group_id or self.source.config.group_id or f"upsert-{self.shard_id}"

    # -- lifecycle --------------------------------------------------------------------------

    @classmethod
    def create(
        cls, consensus: Consensus, blob: Blob, shard_id: str, config: ShardConfig,
        *, kafka_config: "KafkaConfig | None" = None,
    ) -> "Shard":
        validate_shard_id(shard_id)
        open_source(config.source, config.source_format, kafka_config=kafka_config).check()
        blob.ensure_root()
        consensus.create_shard(shard_id, config.to_json())
        return cls(consensus, blob, shard_id, config, kafka_config=kafka_config)

    @classmethod
    def open(
        cls, consensus: Consensus, blob: Blob, shard_id: str, *, kafka_config: "KafkaConfig | None" = None
    ) -> "Shard":
        record = consensus.get_shard(shard_id)
        # The table's columns are those of the schema's newest version (version 1: the config's).
        config = ShardConfig.from_json(record.config)
        config = config_at(config, current_schema(consensus, shard_id, config.schema))
        return cls(consensus, blob, shard_id, config, kafka_config=kafka_config)

    def refresh_schema(self) -> ShardConfig:
        """Take the schema's newest version into this handle's config (one read), so that a
        long-lived handle (a continuous writer) validates its next batch against a column
        added since it was opened; the config now."""
        self.config = config_at(self.config, current_schema(self.consensus, self.shard_id, self.config.schema))
        return self.config

    def config_for_runs(self, runs: list[dict[str, Any]]) -> ShardConfig:
        """The config to read or merge ``runs`` with: this handle's, or that of the newest
        schema version one of them was written with, when a peer changed the schema after this
        handle was opened. Never an older one: a read with fewer columns than a run holds
        would drop them (and a compaction would lose them for good). A column missing from an
        older run reads as null."""
        newest = newest_run_version(runs)
        if newest <= self.config.schema_version:
            return self.config
        return config_at(self.config, schema_version_of(self.consensus, self.shard_id, newest, self.config.schema))

    def state(self) -> ShardRecord:
        return self.consensus.get_shard(self.shard_id)

    def bucket_count(self) -> int:
        """The bucket count a run written now uses: the one the compacted run records (a
        compaction may have grown it), else the count of ``init``. A run written with a count
        a compaction has grown since stays readable (``runs.read_group_count``)."""
        record = self.consensus.get_compaction(self.shard_id)
        return current_buckets(self.config, record.run if record else None)

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
            # Only ts == upper is ever minted, and binding(upper-1) exists for upper > 0 (GC
            # keeps it): gone only if the upper moved on while this writer paused.
            raise missing_binding_error(self.shard_id, ts, ts - 1, self.state().upper)
        mode = check_bad_record_mode(on_bad_record)
        if isinstance(self.source, KafkaSource):
            planned = self._plan_kafka_binding(ts, previous)
            return None if planned is None else self.consensus.mint_binding(self.shard_id, planned, minted_by)
        index = self.source_index()
        try:
            survey = survey_source(self.source, index, previous)
        except PlanningOutdated:
            # A peer bound ts and GC truncated what this planner caught up from: the peer's
            # binding is the one that counts.
            existing = self.binding(ts)
            if existing is None:
                raise
            return existing
        # The policy is read only for a file that needs a widening, once per binding.
        policy = functools.cache(lambda: effective_policy(stored_schema_policy(self.consensus, self.shard_id)))
        planned = plan_binding(ts, survey, self.source, self.config, mode, max_files, MAX_REPORTED, policy)
        minted = None if planned is None else self.consensus.mint_binding(self.shard_id, planned, minted_by)
        remember_settled(index, survey, minted)
        return minted

    def _kafka_marks(self) -> dict[str, tuple[int, int]]:
        assert isinstance(self.source, KafkaSource)
        return {str(p): marks for p, marks in self.source.watermarks().items()}

    def _plan_kafka_binding(self, ts: int, previous: Binding | None) -> Binding | None:
        """binding(ts) of a Kafka shard from the topic's watermarks; refused, binding nothing,
        when retention deleted offsets the shard has not read yet."""
        marks = self._kafka_marks()
        prev_ranges = previous.ranges if previous else {}
        lost = lost_offsets(start_offsets(prev_ranges, marks), marks)
        if lost:
            first = lost[0]
            raise KafkaSliceUnavailable(
                f"kafka topic {self.source.topic!r} partition {first.partition}: shard {self.shard_id!r} reads "
                f"on from offset {first.start}, below the low watermark {first.low_watermark}: retention "
                f"deleted offsets {first.start}..{first.low_watermark - 1} before they were processed. Nothing "
                "was bound; see docs/kafka.md, 'Retention ran ahead of the shard'",
                shard=self.shard_id, topic=self.source.topic, partition=first.partition,
                offset=first.start, low_watermark=first.low_watermark,
            )
        ranges = plan_ranges(prev_ranges, marks, self.kafka_options.max_records_per_batch)
        return None if ranges is None else Binding(ts=ts, ranges=ranges)

    def anchor_source_index(self) -> list[str] | None:
        """Anchor a directory source's index rows at binding(upper - 1) (what truncating the
        batch history needs, store/history.py); the partitions anchored, None for Kafka."""
        if self.is_kafka:
            return None
        upper = self.state().upper
        return anchor_source_index(self.source, self.source_index(), self.binding(upper - 1) if upper > 0 else None)

    def source_index(self) -> SourceIndex:
        return SourceIndex(self.consensus, self.shard_id, self.source.root, self.source.extension)

    def segment_paths(self, binding: Binding) -> list[Segment]:
        """The segment files batch ``binding.ts`` reads, in (partition, offset) order, by
        the names the binding recorded."""
        segments = []
        for partition, rng in sorted(binding.ranges.items()):
            for seq, name in range_files(rng, self.source.extension):
                segments.append(Segment(seq, partition, os.path.join(self.source.root, partition, name)))
        return segments

    # -- appends ----------------------------------------------------------------------------

    def compare_and_append(
        self, expected_upper: int, new_upper: int, batch: BatchRecord, *, epoch: int | None = None
    ) -> AppendResult:
        return self.consensus.compare_and_append(self.shard_id, expected_upper, new_upper, batch, epoch=epoch)

    def batches(self, *, below: int | None = None) -> list[BatchRecord]:
        return self.consensus.batches(self.shard_id, below=below)

    # -- reads ------------------------------------------------------------------------------

    def read(self, spark: "SparkSession", as_of: int | None = None) -> "DataFrame":
        """The table as of ``as_of`` (default: the upper): latest record per key, tombstones
        removed, user columns only. A listed file that is missing or not of its recorded size
        is an :class:`IntegrityError` naming it now (:meth:`check_run_files_listed`: one
        listing, no request per file): the frame is read by whoever collects it, where no
        :meth:`reading` explains a failure. The engine's own reads (:meth:`count_rows`,
        ``upsertctl read``) run inside :meth:`reading` instead and check nothing first."""
        runs = self.live_runs(as_of)
        self.check_run_files_listed(runs)
        return read_runs(spark, self.config_for_runs(runs), self.blob, runs)

    def count_rows(self, spark: "SparkSession") -> int:
        """Rows of the table at the upper (a damaged run file: IntegrityError naming it)."""
        runs = self.live_runs()
        with self.reading(runs):
            return read_runs(spark, self.config_for_runs(runs), self.blob, runs).count()

    @contextmanager
    def reading(self, runs: list[dict[str, Any]]) -> Iterator[None]:
        """Around the Spark action of a read of ``runs``: a failure of Spark's (a run file
        damaged in place reaches the driver as a plain Py4J or Spark Connect error) is
        explained by checking every listed file (present, recorded size and SHA-256, a
        readable Parquet footer); a damaged one is an :class:`IntegrityError` naming it, as a
        missing one is. Checked only after a failure: a read costs no extra pass. Files that
        are no longer in the shard's state (compaction replaced their runs and GC deleted them
        while the read ran) are the retryable :class:`ReadOutdated` instead."""
        try:
            yield
        except IntegrityError as exc:  # a listed file missing or damaged (the Arrow reader's check)
            named = [r["file"] for r in exc.details.get("records") or [] if "file" in r]
            outdated = self.outdated_read(named or [exc.details.get("file")])
            if outdated is not None:
                raise outdated from exc
            raise
        except (UpsertError, OSError):  # ours already, or the output's (a closed pipe, a full disk)
            raise
        except Exception as exc:
            try:
                self.check_run_files(runs)
            except (IntegrityError, ReadOutdated) as found:
                raise found from exc
            raise

    def check_run_files(self, runs: list[dict[str, Any]]) -> None:
        """Raise an :class:`IntegrityError` naming the first file of ``runs`` that is missing
        or not what was recorded when it was written (size, SHA-256, Parquet footer), or
        :class:`ReadOutdated` when every such file has left the shard's state meanwhile."""
        self.refuse_damaged(damaged_run_files(self.blob, runs))

    def check_run_files_listed(self, runs: list[dict[str, Any]]) -> None:
        """What a read can check before it starts without a request per file: each file of
        ``runs`` is in one flat listing of its run prefix (:func:`run_listing_prefixes`,
        one request per page of keys on object storage) with its recorded size. Raises as
        :meth:`check_run_files` does, naming the first file missing or of another size; a
        file damaged in place at its size is found by the read's own failure."""
        listed: dict[str, int] = {}
        for prefix in run_listing_prefixes(runs):
            listed.update((self.blob.relative(f.path), f.size) for f in self.blob.list_files(self.blob.path(prefix)))
        self.refuse_damaged([{"file": self.blob.path(d["path"]), "reason": d["reason"]}
                             for d in unlisted_run_files(runs, listed)])

    def refuse_damaged(self, damaged: list[dict[str, str]]) -> None:
        """Raise for ``damaged`` (``{file, reason}`` of files of the shard's runs, in order):
        :class:`ReadOutdated` when every one has left the shard's state meanwhile, else an
        :class:`IntegrityError` naming the first; nothing when it is empty."""
        if not damaged:
            return
        outdated = self.outdated_read([d["file"] for d in damaged])
        if outdated is not None:
            raise outdated
        first = damaged[0]
        raise IntegrityError(
            f"{len(damaged)} file(s) of the committed runs of shard {self.shard_id!r} are damaged; first: "
            f"{first['file']}: {first['reason']} (restore the shard from a checkpoint: "
            "`upsertctl checkpoint restore`)",
            shard=self.shard_id,
            file=first["file"],
            records=damaged[:MAX_REPORTED],
            count=len(damaged),
        )

    def outdated_read(self, files: list[str | None]) -> ReadOutdated | None:
        """A read that failed on ``files`` (absolute paths) checked against what is live now:
        :class:`ReadOutdated` when none of them is referenced by the shard's state any more
        (compaction replaced their runs and GC deleted them while the read ran), else None
        (a live file is missing or damaged: the integrity error stands)."""
        live = {self.blob.path(f["path"]) for run in self.live_runs() for f in run["files"]}
        replaced = files_replaced(files, live)
        if not replaced:
            return None
        return ReadOutdated(
            f"a read of shard {self.shard_id!r} lost {len(replaced)} file(s) it had planned to read: compaction "
            f"replaced their runs and GC deleted them meanwhile (first: {replaced[0]}); nothing is wrong with the "
            "shard: read again",
            shard=self.shard_id, file=replaced[0], count=len(replaced),
        )

    def live_runs(self, as_of: int | None = None) -> list[dict[str, Any]]:
        """The runs a read as of ``as_of`` (default: the upper) merges, decided on one
        snapshot of consensus; refused outside since <= as_of <= upper."""
        view = self.consensus.live_view(self.shard_id, as_of)
        if view.as_of > view.record.upper:
            raise ConfigurationError(
                f"cannot read shard {self.shard_id!r} as of {view.as_of}: its upper is {view.record.upper}",
                shard=self.shard_id,
            )
        if view.as_of < view.record.since:
            raise ConfigurationError(
                f"cannot read shard {self.shard_id!r} as of {view.as_of}: compacted below since "
                f"{view.record.since}",
                shard=self.shard_id,
            )
        return view.runs

    def status(self, spark: "SparkSession | None" = None) -> ShardStatus:
        """Frontier and source lag; ``rows`` only when a Spark session is given."""
        state = self.state()
        bound = self.bound_offsets(state.upper)
        if isinstance(self.source, KafkaSource):
            return self._kafka_status(state, bound, spark)
        # The same survey a batch plans from, read-only: new names only are parsed. The high
        # watermark is one past the highest offset bound or waiting to be bound.
        previous = self.binding(state.upper - 1) if state.upper > 0 else None
        survey = survey_source(self.source, self.source_index(), previous)
        marks: dict[str, int] = {}
        pending: dict[str, int] = {}
        oldest: float | None = None
        for part in survey.partitions:
            marks[part.partition] = max([part.frontier] + [c.seq + 1 for c in part.candidates])
            pending[part.partition] = len(part.candidates)
            if part.candidates:
                # One stat per partition: the first unbound segment is the next one read.
                landed = _landed_at(min(part.candidates, key=lambda c: c.seq).path)
                if landed is not None:
                    oldest = landed if oldest is None else min(oldest, landed)
        rows = self.count_rows(spark) if spark is not None else None
        return ShardStatus(
            shard=self.shard_id,
            upper=state.upper,
            since=state.since,
            seqno=state.seqno,
            high_watermark=marks,
            bound=bound,
            rows=rows,
            pending_segments=sum(pending.values()),
            stream=_stream_summary(self.consensus, self.shard_id),
            oldest_pending_at=oldest,
            lag_unit=self.source.lag_unit,
            pending_by_partition=pending,
            schema_version=self.refresh_schema().schema_version,
        )


    def _kafka_status(self, state: ShardRecord, bound: dict[str, int], spark: "SparkSession | None") -> ShardStatus:
        """A Kafka shard's lag: the topic's high watermarks against the offsets bound at the
        upper; the pending age is the timestamp of the first message not yet committed."""
        assert isinstance(self.source, KafkaSource)
        marks = self._kafka_marks()
        starts = start_offsets(self.binding(state.upper - 1).ranges if state.upper > 0 else {}, marks)
        high = {p: max(marks[p][1], starts[p]) if p in marks else starts[p] for p in starts}
        behind = {p: off for p, off in starts.items() if high[p] > off}
        times = self.source.first_message_times({int(p): off for p, off in behind.items()}) if behind else {}
        landed = [t for t in times.values() if t is not None]
        pending = {p: max(0, high[p] - off) for p, off in starts.items()}
        return ShardStatus(
            shard=self.shard_id,
            upper=state.upper,
            since=state.since,
            seqno=state.seqno,
            high_watermark=high,
            bound=bound,
            rows=self.count_rows(spark) if spark is not None else None,
            pending_segments=sum(pending.values()),
            stream=_stream_summary(self.consensus, self.shard_id),
            oldest_pending_at=min(landed) if landed else None,
            lag_unit=self.source.lag_unit,
            pending_by_partition=pending,
            schema_version=self.refresh_schema().schema_version,
        )


def files_replaced(files: list[str | None], live: set[str]) -> list[str]:
    """Pure: ``files`` when every one of them is a path outside ``live`` (the files the
    shard's state references now), else [] (one of them is live, or none is named)."""
    if not files or any(f is None or f in live for f in files):
        return []
    return [f for f in files if f is not None]


def run_listing_prefixes(runs: list[dict[str, Any]]) -> list[str]:
    """Pure: the prefixes (relative to the blob root) whose flat listings hold every file of
    ``runs``: the first two levels of each file's path (``<shard>/runs``, where a shard's
    batches and compactions write), or its directory when it is shallower. One prefix for a
    shard's own runs, whatever their number."""
    prefixes = set()
    for run in runs:
        for f in run["files"]:
            parts = f["path"].split("/")
            prefixes.add("/".join(parts[:2] if len(parts) > 2 else parts[:-1]))
    return sorted(prefixes)


def unlisted_run_files(runs: list[dict[str, Any]], listed: dict[str, int]) -> list[dict[str, str]]:
    """Pure: ``{path, reason}`` of every file of ``runs`` that ``listed`` (relative path →
    size, a listing of :func:`run_listing_prefixes`) does not hold (``missing``) or holds at
    another size than the state records, in the order of ``runs``."""
    found = []
    for run in runs:
        for f in run["files"]:
            size = listed.get(f["path"])
            if size is None:
                found.append({"path": f["path"], "reason": "missing"})
            elif size != f["bytes"]:
                found.append({"path": f["path"], "reason": f"size {size} bytes, the shard's state says {f['bytes']}"})
    return found


def damaged_run_files(blob: Blob, runs: list[dict[str, Any]]) -> list[dict[str, str]]:
    """``{file, reason}`` of every file of ``runs`` that is missing or not what was recorded
    when it was written (the checks of ``checkpoint verify``)."""
    damaged = []
    for run in runs:
        for f in run["files"]:
            listed = {"path": f["path"], "bytes": f["bytes"], "sha256": f.get("sha256")}
            reason = file_problem(blob, listed, "the shard's state")[1]
            if reason is not None:
                damaged.append({"file": blob.path(f["path"]), "reason": reason})
    return damaged


def _landed_at(path: str) -> float | None:
    """A segment's landing time; None if it vanished since it was listed (a prune)."""
    try:
        return os.stat(path).st_mtime
    except FileNotFoundError:
        return None


def _stream_summary(consensus: Consensus, shard_id: str) -> dict[str, Any]:
    from airflow_upsert_provider.engine.store.streams import read_stream

    state = read_stream(consensus, shard_id)
    return {k: v for k, v in state.to_dict().items() if k not in ("shard", "seek_position")}
