"""DirectorySource: ``<root>/<partition>/<offset>.<jsonl|parquet>``.

A segment's offset is the integer its name spells, in ASCII digits, zero padding allowed
(``00000000000000000042.jsonl`` is offset 42), within 0..2**63-1; offsets strictly increase
within a partition and two files with one offset are bad input. Files appear atomically
(renamed into place); hidden and temporary files (``.x``, ``_x``, ``*.tmp``, ``*.inprogress``,
``*.crc``) are ignored. Everything else that is not a well-formed segment is reported, never
skipped silently. docs/source.md describes the layout, retention and late arrivals.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable

from airflow_upsert_provider.engine.errors import ConfigurationError
from airflow_upsert_provider.engine.sources.lag import SEGMENTS

if TYPE_CHECKING:
    from airflow_upsert_provider.engine.sources.parquet_types import WideningRefusal

# fullmatch everywhere: ``$`` in re.match also matches before a final newline.
PARTITION_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.=-]*")
SEGMENT_PATTERN = re.compile(r"([0-9]+)\.(jsonl|parquet)")
EXTENSIONS = {"jsonl": ".jsonl", "parquet": ".parquet"}
# Offsets are stored and read as signed 64-bit integers (Spark BIGINT).
MAX_OFFSET = 2**63 - 1


@dataclass(frozen=True, order=True)
class Segment:
    seq: int
    partition: str
    path: str

    @property
    def name(self) -> str:
        return os.path.basename(self.path)


@dataclass(frozen=True)
class BadFile:
    path: str
    reason: str


def is_ignored(name: str) -> bool:
    return name.startswith((".", "_")) or name.endswith((".tmp", ".inprogress", ".crc"))


def segment_offset(name: str, source_format: str) -> tuple[int | None, str | None]:
    """(offset, None) for a well-formed segment name, else (None, why it is not one)."""
    extension = EXTENSIONS[source_format]
    match = SEGMENT_PATTERN.fullmatch(name)
    if match is None:
        stem, dot, _ = name.rpartition(".")
        if dot and stem.isascii() and stem.isdigit():
            return None, f"segment name {name!r} is not <offset>{extension}"
        return None, f"segment name {name!r} is not a non-negative integer offset"
    if "." + match.group(2) != extension:
        return None, f"segment {name!r} is not {source_format} (expected *{extension})"
    offset = int(match.group(1))
    if offset > MAX_OFFSET:
        return None, f"segment name {name!r}: offset beyond the largest offset {MAX_OFFSET} (2**63-1)"
    return offset, None


def split_duplicate_offsets(segments: Iterable[Segment]) -> tuple[list[Segment], list[BadFile]]:
    """Segments whose offset no other segment of their partition shares, and a bad file
    for each one that shares it: every file of a clash is set aside, since none of them is
    more the segment at that offset than the others."""
    by_offset: dict[tuple[str, int], list[Segment]] = {}
    for segment in segments:
        by_offset.setdefault((segment.partition, segment.seq), []).append(segment)
    unique: list[Segment] = []
    bad: list[BadFile] = []
    for (partition, offset), clash in by_offset.items():
        if len(clash) == 1:
            unique.append(clash[0])
            continue
        names = ", ".join(sorted(s.name for s in clash))
        bad += [
            BadFile(s.path, f"{len(clash)} segments with offset {offset} in partition {partition!r}: {names}")
            for s in sorted(clash, key=lambda s: s.name)
        ]
    unique.sort()
    return unique, bad


class DirectorySource:
    """A landing directory of change files, one subdirectory per partition."""

    # An offset is a segment file; its records are not known before it is read.
    lag_unit = SEGMENTS

    def __init__(self, root: str, source_format: str = "jsonl") -> None:
        self.root = os.path.abspath(root)
        self.source_format = source_format
        self.extension = EXTENSIONS[source_format]

    @property
    def uri(self) -> str:
        return f"dir:{self.root}"

    def check(self) -> None:
        if not os.path.isdir(self.root):
            raise ConfigurationError(f"source directory {self.root} does not exist", field="source")

    def partitions(self) -> list[str]:
        self.check()
        names = []
        for name in sorted(os.listdir(self.root)):
            if is_ignored(name) or not os.path.isdir(os.path.join(self.root, name)):
                continue
            if not PARTITION_PATTERN.fullmatch(name):
                raise ConfigurationError(
                    f"source partition directory {os.path.join(self.root, name)!r} has an "
                    "unusable name: use letters, digits, '_', '.', '=', '-'",
                    field="source",
                )
            names.append(name)
        return names

    def partition_dir(self, partition: str) -> str:
        return os.path.join(self.root, partition)

    def list_names(self, partition: str) -> list[str]:
        """Every entry of the partition's directory, unparsed (the one pass over it a batch
        needs)."""
        return os.listdir(self.partition_dir(partition))

    def scan(self, partition: str) -> tuple[list[Segment], list[BadFile]]:
        """The partition's segments in offset order, and the files that are not segments.
        Parses every name: for a look at a whole partition, not for planning a batch."""
        directory = self.partition_dir(partition)
        segments: list[Segment] = []
        bad: list[BadFile] = []
        for name in self.list_names(partition):
            if is_ignored(name):
                continue
            path = os.path.join(directory, name)
            offset, reason = segment_offset(name, self.source_format)
            if offset is None:
                bad.append(BadFile(path, reason or ""))
            else:
                segments.append(Segment(offset, partition, path))
        segments, clashes = split_duplicate_offsets(segments)
        return segments, bad + clashes

    def unreadable_reason(
        self, segment: Segment, schema_fields: list[dict[str, Any]], keys: tuple[str, ...],
        refuse_widening: "WideningRefusal | None" = None,
    ) -> str | None:
        """Why a segment cannot be read against the shard schema, or None. Checked when a
        batch is bound, so that every writer agrees on which files the batch reads. A Parquet
        column in a wider type is readable when ``refuse_widening`` lets it widen."""
        try:
            if os.path.isdir(segment.path):
                return "segment is a directory, not a file"
            with open(segment.path, "rb") as handle:
                head = handle.read(4)
        except OSError as exc:
            return f"unreadable: {exc.strerror or exc}"
        if self.source_format == "parquet":
            if head != b"PAR1":
                return "not a Parquet file (bad magic bytes)"
            from airflow_upsert_provider.engine.sources.parquet_types import parquet_schema_problem

            return parquet_schema_problem(segment.path, schema_fields, keys, refuse_widening)
        return None


