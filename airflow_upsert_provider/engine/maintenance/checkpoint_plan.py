"""What a checkpoint reads (pure): every file it lists is either hashed (read whole: SHA-256
and Parquet footer) or, when an earlier verified checkpoint already hashed that very file,
only checked for presence and size.

A checkpoint is committed only after every file its manifest lists was checked, so the newest
committed checkpoint's manifest says which files were hashed, with which size and SHA-256.
Run files are immutable and their paths never reused: a live file with the same path, size
and recorded SHA-256 as a listed one is that file, and hashing it again finds nothing new
unless it was damaged since. Such damage is what ``full`` (a full verify, a restore) catches;
an incremental check catches a file gone or of another size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

# Read the whole file: size, SHA-256 against the recorded one, Parquet footer.
HASH = "hash"
# Presence and size only: an earlier verified checkpoint hashed this file.
SIZE = "size"


@dataclass(frozen=True)
class FileCheck:
    """How one listed file is checked. ``sha256`` is the value the manifest will record: the
    one recorded when the run was written, else the one the trusted checkpoint hashed (None:
    none known, the hash taken now is recorded)."""

    path: str
    bytes: int
    sha256: str | None
    how: str


def hashed_files(manifest_files: Iterable[Mapping[str, Any]]) -> dict[str, tuple[int, str]]:
    """Pure: path -> (bytes, sha256) of the files a committed checkpoint's manifest lists."""
    return {str(f["path"]): (int(f["bytes"]), str(f["sha256"])) for f in manifest_files}


def plan_file_checks(
    files: Iterable[Mapping[str, Any]], trusted: Mapping[str, tuple[int, str]], *, full: bool
) -> list[FileCheck]:
    """Pure: how to check each of ``files`` (dicts with path, bytes and a recorded sha256 or
    None). A file is only size-checked when not ``full`` and ``trusted`` (what an earlier
    verified checkpoint hashed) holds its path with the same size and, when the run recorded
    one, the same SHA-256; every other file is hashed."""
    checks = []
    for f in files:
        path, size, recorded = str(f["path"]), int(f["bytes"]), f.get("sha256")
        seen = trusted.get(path)
        if not full and seen is not None and seen[0] == size and (recorded is None or recorded == seen[1]):
            checks.append(FileCheck(path, size, seen[1], SIZE))
        else:
            checks.append(FileCheck(path, size, recorded, HASH))
    return checks


def count_checks(checks: Iterable[FileCheck]) -> dict[str, int]:
    """Pure: how many files were hashed and how many only size-checked."""
    counts = {"hashed": 0, "size_checked": 0}
    for check in checks:
        counts["hashed" if check.how == HASH else "size_checked"] += 1
    return counts
