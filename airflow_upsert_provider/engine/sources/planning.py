"""Planning a binding from a directory listing: pure decisions, no filesystem or store.

A batch lists each partition once (unavoidable). Names whose verdict is already settled (a
segment some binding bound, a file set aside in quarantine, an ignored name) are removed from
the listing by one set difference; only the rest, the new names, are parsed. A new name
with an offset below the partition's frontier is either a bound segment put back or a late
arrival; which one is decided against the set of bound offsets (the binding whose range
covers the offset), never by counting files, since retention deletes bound files. Below the
truncation horizon (the bindings GC truncated) the answer is "truncated", never "unbound":
such a file is settled, never a late arrival (:func:`put_back_reason`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from airflow_upsert_provider.engine.sources.directory import (
    BadFile,
    Segment,
    is_ignored,
    segment_offset,
    split_duplicate_offsets,
)


@dataclass
class NewNames:
    """What the unsettled names of one partition's listing are."""

    # Well-formed, offset at or above the frontier, no other file with that offset.
    candidates: list[Segment] = field(default_factory=list)
    # Well-formed, offset below the frontier: a bound segment put back, or a late arrival.
    below: list[Segment] = field(default_factory=list)
    bad: list[BadFile] = field(default_factory=list)
    # Hidden and temporary files: settled by their name alone.
    ignored: list[str] = field(default_factory=list)


def sort_out_new_names(
    partition: str,
    directory: str,
    listing: Iterable[str],
    settled: set[str] | frozenset[str],
    frontier: int,
    source_format: str,
) -> NewNames:
    """Classify the names of ``listing`` that are not in ``settled``. Cost: one set
    difference over the listing, then work per new name only."""
    result = NewNames()
    well_formed: list[Segment] = []
    present = listing if isinstance(listing, (set, frozenset)) else set(listing)
    for name in present - settled:
        if is_ignored(name):
            result.ignored.append(name)
            continue
        path = os.path.join(directory, name)
        offset, reason = segment_offset(name, source_format)
        if offset is None:
            result.bad.append(BadFile(path, reason or ""))
        else:
            well_formed.append(Segment(offset, partition, path))
    unique, clashes = split_duplicate_offsets(well_formed)
    result.bad += clashes
    result.bad.sort(key=lambda b: b.path)
    for segment in unique:
        (result.candidates if segment.seq >= frontier else result.below).append(segment)
    return result


def range_files(rng: dict[str, Any], extension: str) -> list[tuple[int, str]]:
    """(offset, file name) of every segment a binding range bound. Bindings minted before
    names were recorded list bare offsets, whose name was ``<offset><extension>``."""
    files = []
    for entry in rng.get("files", []):
        if isinstance(entry, int):
            files.append((entry, f"{entry}{extension}"))
        else:
            files.append((int(entry[0]), str(entry[1])))
    return files


def late_arrival_reason(segment: Segment, frontier: int, covering: dict[str, Any] | None, extension: str) -> str | None:
    """None if ``segment`` (offset below ``frontier``) is a segment that the binding range
    ``covering`` its offset bound, under this very name; else why it is a late arrival."""
    reason = (
        f"late arrival: offset {segment.seq} is below the bound offset {frontier} "
        f"of partition {segment.partition!r}"
    )
    bound_names = [name for offset, name in range_files(covering or {}, extension) if offset == segment.seq]
    if segment.name in bound_names:
        return None
    if bound_names:
        return f"{reason}; that offset is bound to {bound_names[0]!r}"
    return reason


def put_back_reason(
    segment: Segment,
    frontier: int,
    horizon: int,
    oldest_ts: int,
    last_ts: int,
    range_at: Callable[[int], dict[str, Any] | None],
    extension: str,
) -> str | None:
    """None if ``segment`` (offset below ``frontier``, the ``to`` of binding ``last_ts``) is a
    segment some binding bound under this very name, put back, or lies below the partition's
    truncation ``horizon``; else why it is a late arrival.

    The bindings below ``oldest_ts`` are truncated (store/history.py); ``horizon`` is the
    ``from`` of binding ``oldest_ts`` for this partition, so every offset below it was covered
    by a truncated binding: whether under this name is no longer known, and such a file is
    never called late (it is most likely a bound segment put back; a file that was never
    bound cannot be told from one any more). Above the horizon, the binding covering the
    offset is found by a binary search over [oldest_ts, last_ts] (each partition's ``to``
    never decreases from one binding to the next); ``range_at(ts)`` is the partition's range
    in binding ts (None: the binding does not name the partition), asked only inside it."""
    if segment.seq < horizon:
        return None
    low, high = oldest_ts, last_ts
    while low < high:
        middle = (low + high) // 2
        if range_to(range_at(middle)) > segment.seq:
            high = middle
        else:
            low = middle + 1
    return late_arrival_reason(segment, frontier, range_at(low), extension)


def bound_names(rng: dict[str, Any], extension: str) -> set[str]:
    return {name for _, name in range_files(rng, extension)}


def range_to(rng: dict[str, Any] | None) -> int:
    return int(rng["to"]) if rng else 0
