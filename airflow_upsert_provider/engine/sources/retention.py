"""The retention log of a directory source: which segments were deleted, kept by the source.

A seek after a restore has to know whether segments it needs were deleted meanwhile (a
consensus store lost with it the bindings that named them). The source keeps that knowledge
itself, as a Kafka broker keeps a log start offset: every deletion that goes through
``prune`` is first appended to ``<partition>/.retention.jsonl`` (one JSON object a line:
offset, name, deleted_at) and synced, then the segment is unlinked. The log is a hidden file,
which the source ignores as data. A deletion the log does not record (``rm`` by hand) can be
seen by a seek only if a binding still names the segment.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import Iterable

from airflow_upsert_provider.engine.errors import BadInputError

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
