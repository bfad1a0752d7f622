"""Blob: where runs, rejects, manifests and checkpoints live.

Paths are strings that Spark and Hadoop understand, so that every executor reads and writes
the same place. The local filesystem is implemented here; the interface is what a Hadoop
filesystem (``hdfs://``, ``s3a://``) implementation has to provide.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Iterator

from airflow_upsert_provider.engine.errors import ConfigurationError


@dataclass(frozen=True)
class BlobFile:
    path: str
    size: int


class LocalBlob:
    """Blob store on the local (or a shared, POSIX-mounted) filesystem."""

    def __init__(self, root: str) -> None:
        if root.startswith("file://"):
            root = root[len("file://") :]
        if "://" in root:
            scheme = root.split("://", 1)[0]
            raise ConfigurationError(
                f"blob root scheme {scheme!r} is not supported yet; use a local or shared "
                "POSIX path that every Spark executor can reach",
                field="blob_root",
            )
        self.root = os.path.abspath(root)

    def __repr__(self) -> str:
        return f"LocalBlob({self.root!r})"

    def ensure_root(self) -> None:
        try:
            os.makedirs(self.root, exist_ok=True)
        except OSError as exc:
            raise ConfigurationError(
                f"cannot create blob root {self.root}: {exc.strerror}", field="blob_root"
            ) from None

    def check_root(self) -> None:
        """Raise a clear error unless the root exists and is a writable directory."""
        if not os.path.isdir(self.root):
            raise ConfigurationError(f"blob root {self.root} does not exist", field="blob_root")
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise ConfigurationError(f"blob root {self.root} is not writable", field="blob_root")

    def path(self, *parts: str) -> str:
        """The absolute path (a string Spark accepts) of ``parts`` below the root."""
        return os.path.join(self.root, *parts)

    # -- metadata files ---------------------------------------------------------------------

    def write_atomic(self, path: str, data: bytes) -> None:
        """Write ``data`` so that ``path`` holds either its old content or all of ``data``,
        durably: temp file in the same directory, fsync, rename, fsync the directory."""
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        fsync_dir(directory)

    def read_bytes(self, path: str) -> bytes:
        with open(path, "rb") as handle:
            return handle.read()

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(path)

    def listdir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except FileNotFoundError:
            return []

    def walk_files(self, path: str) -> Iterator[BlobFile]:
        """Every file below ``path`` (recursively), with its size, in a stable order."""
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames.sort()
            for name in sorted(filenames):
                full = os.path.join(dirpath, name)
                yield BlobFile(full, os.path.getsize(full))

    def size(self, path: str) -> int:
        return os.path.getsize(path)

    def delete_tree(self, path: str) -> None:
        if os.path.isdir(path):
            shutil.rmtree(path)

    def delete_file(self, path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_blob(root: str) -> LocalBlob:
    return LocalBlob(root)
