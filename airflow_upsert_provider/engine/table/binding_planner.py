"""Planning binding(ts) of a directory source: which segments batch ts reads, which files
are bad input. The shell around the pure decisions of ``sources.planning``: it lists each
partition once, reads what consensus knows (``source_index``), and looks up only new names.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable

from airflow_upsert_provider.engine.config import ShardConfig
from airflow_upsert_provider.engine.store.records import Binding
from airflow_upsert_provider.engine.errors import BadInputError
from airflow_upsert_provider.engine.store.source_index import SourceIndex
from airflow_upsert_provider.engine.sources import DirectorySource, Segment
from airflow_upsert_provider.engine.sources.planning import range_to, sort_out_new_names
from airflow_upsert_provider.engine.table.schema_evolution import locked_columns, widening_refusal


@dataclass
class PartitionSurvey:
    partition: str
    frontier: int
    present: set[str]
    # Names settled through the previous binding, and how many bindings the stored row
    # lagged behind it.
    settled: set[str]
    lag: int = 0
    # New names this survey settled: ignored, already quarantined, bound segments put back.
    newly_settled: set[str] = field(default_factory=set)
    candidates: list[Segment] = field(default_factory=list)
    problems: list[dict[str, str]] = field(default_factory=list)


@dataclass
class SourceSurvey:
    previous: Binding | None
    partitions: list[PartitionSurvey]
    # Partitions of the previous binding whose directory is gone keep their frontier.
    vanished: dict[str, int]

    @property
    def problems(self) -> list[dict[str, str]]:
        return [p for s in self.partitions for p in s.problems]

    @property
    def candidates(self) -> list[Segment]:
        return sorted((c for s in self.partitions for c in s.candidates), key=lambda s: (s.seq, s.partition))


def survey_source(source: DirectorySource, index: SourceIndex, previous: Binding | None) -> SourceSurvey:
    """Every partition's new segments and bad files, beyond binding ``previous``."""
    prev_ranges = previous.ranges if previous else {}
    surveys: list[PartitionSurvey] = []
    for partition in source.partitions():
        directory = source.partition_dir(partition)
        present = set(source.list_names(partition))
        settled, lag = index.settled(partition, previous)
        frontier = range_to(prev_ranges.get(partition))
        survey = PartitionSurvey(partition, frontier, present, settled, lag)
        new = sort_out_new_names(partition, directory, present, settled, frontier, source.source_format)
        survey.newly_settled.update(new.ignored)
        survey.candidates = new.candidates
        quarantined = index.quarantined_among([b.path for b in new.bad] + [s.path for s in new.below])
        for bad in new.bad:
            if bad.path in quarantined:
                survey.newly_settled.add(os.path.basename(bad.path))
            else:
                survey.problems.append({"file": bad.path, "reason": bad.reason})
        for segment in sorted(new.below):
            if segment.path in quarantined:
                survey.newly_settled.add(segment.name)
                continue
            assert previous is not None  # a frontier above 0 comes from a binding
            reason = index.late_arrival_reason(segment, frontier, previous)
            if reason is None:
                survey.newly_settled.add(segment.name)  # a bound segment put back
            else:
                survey.problems.append({"file": segment.path, "reason": reason})
        surveys.append(survey)
    listed = {s.partition for s in surveys}
    vanished = {p: range_to(r) for p, r in prev_ranges.items() if p not in listed}
    return SourceSurvey(previous, surveys, vanished)


def plan_binding(
    ts: int,
    survey: SourceSurvey,
    source: DirectorySource,
    config: ShardConfig,
    on_bad_record: str,
    max_files: int | None,
    max_reported: int,
    schema_policy: Callable[[], str],
) -> Binding | None:
    """binding(ts) from a survey: the lowest offsets first, at most ``max_files`` segments;
    unreadable ones among them and every bad file are problems (raised in fail mode, set
    aside in quarantine mode). None when there is nothing to bind. A Parquet file holding a
    column in a wider type is readable when the shard's schema evolution policy (read from
    ``schema_policy`` only for such a file) widens the column: the batch then widens it."""
    problems = survey.problems
    taken = survey.candidates[: max_files or config.max_files_per_batch]
    readable: list[Segment] = []
    schema_fields = config.schema_fields()
    locked = locked_columns(config.keys, config.order_by)

    def refuse_widening(column: str, old_type: Any, wider: str) -> str | None:
        return widening_refusal(column, wider, schema_policy(), locked=locked)

    for segment in taken:
        reason = source.unreadable_reason(segment, schema_fields, config.keys, refuse_widening)
        if reason is None:
            readable.append(segment)
        else:
            problems.append({"file": segment.path, "reason": reason})
    if problems and on_bad_record == "fail":
        raise BadInputError(
            f"{len(problems)} bad source file(s) in {source.root}; first: "
            f"{problems[0]['file']}: {problems[0]['reason']} "
            "(fix or remove them, or run with --on-bad-record quarantine)",
            records=problems[:max_reported],
            count=len(problems),
        )
    if not taken and not problems:
        return None
    starts = {s.partition: s.frontier for s in survey.partitions} | survey.vanished
    ranges: dict[str, dict[str, Any]] = {}
    for partition, start in sorted(starts.items()):
        mine = [s for s in taken if s.partition == partition]
        ranges[partition] = {
            "from": start,
            # Unreadable segments set aside are covered too: the frontier moves past them.
            "to": mine[-1].seq + 1 if mine else start,
            # Names are recorded: a padded name is not rebuilt from its offset.
            "files": [[s.seq, s.name] for s in readable if s.partition == partition],
        }
    return Binding(ts=ts, ranges=ranges, quarantined=problems)


# The stored row is rewritten (O(files present)) when it lags this many bindings behind;
# in between, planning catches up from the bindings minted since (O(new files)).
SAVE_EVERY_BINDINGS = 32


def remember_settled(index: SourceIndex, survey: SourceSurvey, minted: Binding | None) -> None:
    """Save a partition's settled names still present, through ``minted`` (or the previous
    binding when nothing was minted), when the survey settled names no binding records
    (ignored files, quarantined or bound files found by look-up), when the row lags
    ``SAVE_EVERY_BINDINGS`` behind, or when it holds more names of deleted files than of
    present ones. Otherwise the row stays: names it lacks are caught up from bindings."""
    through = minted or survey.previous
    for partition in survey.partitions:
        lag = partition.lag + (minted is not None)
        if not partition.newly_settled and lag < SAVE_EVERY_BINDINGS and len(partition.settled) <= 2 * len(partition.present):
            continue
        names = (partition.settled & partition.present) | partition.newly_settled
        if minted is not None:
            names |= index.settled_by(partition.partition, minted) & partition.present
        index.save(partition.partition, through, names)


def anchor_source_index(source: DirectorySource, index: SourceIndex, last: Binding | None) -> list[str]:
    """Save every indexed partition's settled names through ``last`` (binding(upper - 1)),
    as planning would, so that no row is anchored below it; the partitions saved. Truncation
    of the batch history (store/history.py) keeps the bindings from the lowest anchor on: a
    row is checked against its anchor and catches up from the bindings after it.

    Indexed: every present partition, and every partition ``last`` names whose directory is
    absent now (moved away during a GC, back later): its row keeps the names its bindings
    settled, caught up while those bindings still exist, so that when it is back its files
    are settled by name, not looked up below a truncated history."""
    survey = survey_source(source, index, last)
    for partition in survey.partitions:
        index.save(partition.partition, last, (partition.settled & partition.present) | partition.newly_settled)
    for partition in survey.vanished:
        index.save(partition, last, index.settled(partition, last)[0])
    return [p.partition for p in survey.partitions] + sorted(survey.vanished)
