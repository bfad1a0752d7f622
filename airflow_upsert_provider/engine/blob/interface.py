"""What every blob store offers the engine: the ``Blob`` protocol and the ``BlobFile`` a
listing yields. :class:`~.files.LocalBlob` (local or POSIX-mounted disk) and
:class:`~.objects.ObjectBlob` (object storage) both satisfy it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Iterator, Protocol

if TYPE_CHECKING:
    import pyarrow.parquet


@dataclass(frozen=True)
class BlobFile:
    path: str
    size: int
    # Last modification (seconds since the epoch): GC's grace period is measured from it.
    mtime: float = 0.0


@dataclass(frozen=True)
class BlobTree:
    """Everything below a path from one listing (:meth:`Blob.list_tree`): its files, and its
    directories with their ages (on object storage a prefix's age is its newest object's)."""

    files: list[BlobFile]
    dirs: list[BlobFile]
    # Object storage: prefixes the listing shows that hold no object, only pyarrow's zero-byte
    # directory markers (apache/arrow#36275); they have no age. Local disk: none (an empty
    # directory is in ``dirs``, with its mtime).
    markers: list[str] = field(default_factory=list)


def prefixes_of(files: Iterable[BlobFile], path: str) -> list[BlobFile]:
    """Every prefix strictly below ``path`` that holds one of ``files`` (whose paths start with
    ``path/``), dated by its newest file: what a walk of the prefixes would yield, derived
    from a flat listing without a request per prefix. Deepest first, then by name."""
    base = path.rstrip("/")
    newest: dict[str, float] = {}
    for f in files:
        parts = f.path[len(base) + 1:].split("/")[:-1]
        for depth in range(1, len(parts) + 1):
            prefix = f"{base}/{'/'.join(parts[:depth])}"
            if prefix not in newest or f.mtime > newest[prefix]:
                newest[prefix] = f.mtime
    return [BlobFile(p, 0, m) for p, m in sorted(newest.items(), key=lambda item: (-item[0].count("/"), item[0]))]


class Blob(Protocol):
    """Where runs, rejects, manifests and checkpoints live. Every path is a string
    :meth:`path` made (an absolute path, or a full URI on object storage). Arithmetic on such
    paths goes through :meth:`join`, :meth:`parent`, :meth:`name` and :meth:`relative`, never
    ``os.path``: a URI is no local path. Paths recorded in consensus, manifests and GC claims
    are relative to the root and '/'-separated on every store (:meth:`relative`)."""

    root: str

    def ensure_root(self) -> None: ...

    def check_root(self, *, writable: bool = True) -> None: ...

    def path(self, *parts: str) -> str: ...

    def join(self, path: str, *parts: str) -> str: ...

    def parent(self, path: str) -> str: ...

    def name(self, path: str) -> str: ...

    def relative(self, path: str) -> str: ...

    def write_file(self, path: str, data: bytes, *, sync: bool) -> None: ...

    def rename(self, src: str, dst: str) -> None: ...

    def fsync_dir(self, directory: str) -> None: ...

    def sync_file(self, path: str) -> None: ...

    def mkdir(self, path: str) -> None: ...

    def unlink(self, path: str) -> None: ...

    def rmdir(self, path: str) -> None: ...

    def make_dirs(self, path: str) -> None: ...

    def write_atomic(self, path: str, data: bytes) -> None: ...

    def sync_written(self, paths: Iterable[str]) -> None: ...

    def read_bytes(self, path: str) -> bytes: ...

    def checksum(self, path: str) -> str: ...

    def parquet_metadata(self, path: str) -> "pyarrow.parquet.FileMetaData": ...

    def exists(self, path: str) -> bool: ...

    def is_dir(self, path: str) -> bool: ...

    def listdir(self, path: str) -> list[str]: ...

    def walk_files(self, path: str) -> Iterator[BlobFile]: ...

    def list_files(self, path: str) -> Iterator[BlobFile]: ...

    def list_tree(self, path: str) -> BlobTree: ...

    def walk_dirs(self, path: str) -> Iterator[BlobFile]: ...

    def mtime(self, path: str) -> float | None: ...

    def size(self, path: str) -> int: ...

    def delete_tree(self, path: str) -> None: ...

    def delete_file(self, path: str) -> None: ...
