"""DirectorySource: ``<root>/<partition>/<seq>.<jsonl|parquet>``.

A segment's offset is its integer ``seq``; offsets strictly increase within a partition.
Files appear atomically (renamed into place); hidden and temporary files (``.x``, ``_x``,
``*.tmp``, ``*.inprogress``) are ignored. Everything else that is not a well-formed segment is
reported, never skipped silently.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from airflow_upsert_provider.engine.errors import ConfigurationError

PARTITION_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.=-]*$")
SEGMENT_PATTERN = re.compile(r"^(0|[1-9][0-9]*)\.(jsonl|parquet)$")
EXTENSIONS = {"jsonl": ".jsonl", "parquet": ".parquet"}


@dataclass(frozen=True, order=True)
class Segment:
    seq: int
    partition: str
    path: str


@dataclass(frozen=True)
class BadFile:
    path: str
    reason: str


def is_ignored(name: str) -> bool:
    return name.startswith((".", "_")) or name.endswith((".tmp", ".inprogress", ".crc"))


class DirectorySource:
    """A landing directory of change files, one subdirectory per partition."""

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
            if not PARTITION_PATTERN.match(name):
                raise ConfigurationError(
                    f"source partition directory {os.path.join(self.root, name)!r} has an "
                    "unusable name: use letters, digits, '_', '.', '=', '-'",
                    field="source",
                )
            names.append(name)
        return names

    def scan(self, partition: str) -> tuple[list[Segment], list[BadFile]]:
        """The partition's segments in offset order, and the files that are not segments."""
        directory = os.path.join(self.root, partition)
        segments: list[Segment] = []
        bad: list[BadFile] = []
        for name in os.listdir(directory):
            if is_ignored(name):
                continue
            path = os.path.join(directory, name)
            match = SEGMENT_PATTERN.match(name)
            if match is None:
                stem = name.rsplit(".", 1)[0]
                reason = (
                    f"segment name {name!r} is not a non-negative integer offset"
                    if not stem.isdigit() or name == stem
                    else f"segment name {name!r} is not <offset>{self.extension}"
                )
                bad.append(BadFile(path, reason))
            elif "." + match.group(2) != self.extension:
                bad.append(BadFile(path, f"segment {name!r} is not {self.source_format} (expected *{self.extension})"))
            else:
                segments.append(Segment(int(match.group(1)), partition, path))
        segments.sort()
        return segments, bad

    def unreadable_reason(self, segment: Segment, schema_fields: list[dict[str, Any]], keys: tuple[str, ...]) -> str | None:
        """Why a segment cannot be read against the shard schema, or None. Checked when a
        batch is bound, so that every writer agrees on which files the batch reads."""
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
            return parquet_schema_problem(segment.path, schema_fields, keys)
        return None

    def describe(self) -> dict[str, Any]:
        return {"type": "directory", "root": self.root, "format": self.source_format}


# Spark type name (as in the schema JSON) -> Arrow type names a Parquet segment may carry.
_ARROW_COMPATIBLE = {
    "long": ("int",), "integer": ("int",), "short": ("int",), "byte": ("int",),
    "double": ("double", "float", "halffloat"), "float": ("float", "halffloat"),
    "string": ("string", "large_string"), "boolean": ("bool",),
    "date": ("date",), "timestamp": ("timestamp",), "binary": ("binary", "large_binary"),
}


def parquet_schema_problem(path: str, schema_fields: list[dict[str, Any]], keys: tuple[str, ...]) -> str | None:
    """A whole-file mismatch between a Parquet segment and the shard schema, or None.
    A file's schema is immutable, so every writer reaches the same verdict."""
    import pyarrow.parquet as pq

    try:
        arrow_schema = pq.read_schema(path)
    except Exception as exc:  # pyarrow raises several types for a corrupt footer
        return f"unreadable Parquet footer: {exc}"
    fields = {f.name: f for f in arrow_schema}
    for spec in schema_fields:
        name, spark_type = spec["name"], spec["type"]
        if name not in fields:
            if name in keys:
                return f"missing key column '{name}'"
            continue
        arrow_type = str(fields[name].type)
        compatible = _ARROW_COMPATIBLE.get(spark_type) if isinstance(spark_type, str) else None
        if compatible and not arrow_type.startswith(compatible):
            return f"field '{name}': expected {spark_type}, got {arrow_type}"
    return None
