"""Blob on the local (or a shared, POSIX-mounted) filesystem, and :func:`open_blob`, which
picks the store a root names (object storage: :mod:`.objects`).

Paths are absolute paths, strings Spark understands, so that every executor reads and writes
the same place. :class:`~.interface.Blob` is the interface both stores satisfy.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import uuid
from typing import TYPE_CHECKING, Iterable, Iterator

from airflow_upsert_provider.engine.blob.interface import Blob, BlobFile, BlobTree
from airflow_upsert_provider.engine.common.atomic_file import fsync_dir
from airflow_upsert_provider.engine.errors import ConfigurationError

if TYPE_CHECKING:
    import pyarrow.parquet

    from airflow_upsert_provider.engine.blob.filesystems import S3Credentials


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
        """Create the root if it is missing; a clear error if it cannot be a directory."""
        if os.path.exists(self.root) and not os.path.isdir(self.root):
            raise ConfigurationError(f"blob root {self.root} is not a directory", field="blob_root")
        try:
            os.makedirs(self.root, exist_ok=True)
        except OSError as exc:
            raise ConfigurationError(
                f"cannot create blob root {self.root}: {exc.strerror}", field="blob_root"
            ) from None

    def check_root(self, *, writable: bool = True) -> None:
        """Raise a clear error unless the root is an existing directory and, with
        ``writable``, one this process can create files in. Writability is probed with a
        real file: permission bits say nothing of a read-only mount, nor of root."""
        if not os.path.exists(self.root):
            raise ConfigurationError(
                f"blob root {self.root} does not exist (check --blob-root / UPSERT_BLOB_ROOT)",
                field="blob_root",
            )
        if not os.path.isdir(self.root):
            raise ConfigurationError(f"blob root {self.root} is not a directory", field="blob_root")
        if not writable:
            return
        try:
            fd, probe = tempfile.mkstemp(dir=self.root, prefix=".probe-")
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise ConfigurationError(
                f"blob root {self.root} is not writable: {exc.strerror}", field="blob_root"
            ) from None

    def path(self, *parts: str) -> str:
        """The absolute path (a string Spark accepts) of ``parts`` below the root."""
        return os.path.join(self.root, *parts)

    # -- path arithmetic (the engine never applies os.path to a blob path itself) -------------

    def join(self, path: str, *parts: str) -> str:
        """The path of ``parts`` below ``path``."""
        return os.path.join(path, *parts)

    def parent(self, path: str) -> str:
        return os.path.dirname(path)

    def name(self, path: str) -> str:
        """The last component of ``path``."""
        return os.path.basename(path)

    def relative(self, path: str) -> str:
        """``path`` relative to the root, '/'-separated, as consensus records it (``""`` for
        the root itself). A path outside the root is a ValueError: nothing the engine
        records may point outside its blob root."""
        relative = os.path.relpath(path, self.root)
        if os.path.isabs(relative) or relative == os.pardir or relative.startswith(os.pardir + os.sep):
            raise ValueError(f"{path} is not below the blob root {self.root}")
        return "" if relative == os.curdir else relative.replace(os.sep, "/")

    # -- primitive operations ----------------------------------------------------------------
    # Every metadata write and every deletion goes through these few methods, so that a test
    # double can record them and simulate a crash that drops what was not made durable.

    def write_file(self, path: str, data: bytes, *, sync: bool) -> None:
        with open(path, "wb") as handle:
            handle.write(data)
            handle.flush()
            if sync:
                os.fsync(handle.fileno())

    def rename(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def fsync_dir(self, directory: str) -> None:
        fsync_dir(directory)

    def sync_file(self, path: str) -> None:
        """Flush the content of a file another writer left unsynced (Spark writes through
        Hadoop's local filesystem, which never fsyncs) to stable storage."""
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def mkdir(self, path: str) -> None:
        os.mkdir(path)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def rmdir(self, path: str) -> None:
        os.rmdir(path)

    # -- metadata files ---------------------------------------------------------------------

    def make_dirs(self, path: str) -> None:
        """Create ``path`` and its missing parents, each entry made durable in its parent
        (a rename into a directory whose own entry is lost by a crash is lost with it)."""
        if os.path.isdir(path):
            return
        parent = os.path.dirname(path)
        if parent != path:
            self.make_dirs(parent)
        try:
            self.mkdir(path)
        except FileExistsError:
            return
        self.fsync_dir(parent)

    def write_atomic(self, path: str, data: bytes) -> None:
        """Write ``data`` so that ``path`` holds either its old content or all of ``data``,
        durably: temp file in the same directory, fsync, rename, fsync the directory."""
        directory = os.path.dirname(path)
        self.make_dirs(directory)
        tmp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}")
        try:
            self.write_file(tmp, data, sync=True)
            self.rename(tmp, path)
        except BaseException:
            try:
                self.unlink(tmp)
            except FileNotFoundError:
                pass
            raise
        self.fsync_dir(directory)

    def sync_written(self, paths: Iterable[str]) -> None:
        """Make files that another writer created below the root durable, names included:
        fsync each file, then every directory from the files' up to the root (a new name
        survives a crash only once its directory is synced, and so on up the new
        directories). Data files must be durable before the commit that names them."""
        directories: set[str] = set()
        for path in paths:
            self.sync_file(path)
            directory = os.path.dirname(path)
            while directory not in directories and (directory + os.sep).startswith(self.root + os.sep):
                directories.add(directory)
                directory = os.path.dirname(directory)
        # Deepest first: each directory is synced after the entries below it were.
        for directory in sorted(directories, key=lambda d: (-d.count(os.sep), d)):
            self.fsync_dir(directory)

    def read_bytes(self, path: str) -> bytes:
        with open(path, "rb") as handle:
            return handle.read()

    def checksum(self, path: str) -> str:
        """SHA-256 of the file at ``path``, hex."""
        with open(path, "rb") as handle:
            return hashlib.file_digest(handle, "sha256").hexdigest()

    def parquet_metadata(self, path: str) -> "pyarrow.parquet.FileMetaData":
        """The Parquet footer of the file at ``path``, read from an open file (a path given
        to pyarrow as a string would be parsed as a URI). A file that is no Parquet raises
        pyarrow's ``ArrowInvalid``."""
        import pyarrow.parquet as pq

        with open(path, "rb") as handle:
            return pq.read_metadata(handle)

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
        """Every file below ``path`` (recursively), with its size and mtime, in a stable
        order. One ``stat`` per file (GC plans over hundreds of thousands)."""
        try:
            entries = sorted(os.scandir(path), key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            return
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                yield from self.walk_files(entry.path)
            else:
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:  # deleted meanwhile (a writer dropping a lost batch)
                    continue
                yield BlobFile(entry.path, st.st_size, st.st_mtime)

    def list_files(self, path: str) -> Iterator[BlobFile]:
        """Every file below ``path``, in no particular order: :meth:`walk_files` (a local
        directory tree has no flat listing to gain from)."""
        return self.walk_files(path)

    def list_tree(self, path: str) -> BlobTree:
        """Every file and every directory below ``path`` (:meth:`walk_files`,
        :meth:`walk_dirs`): a directory's own mtime counts here, an empty one is listed."""
        return BlobTree(list(self.walk_files(path)), list(self.walk_dirs(path)))

    def walk_dirs(self, path: str) -> Iterator[BlobFile]:
        """Every directory below ``path`` (recursively, ``path`` itself excluded), with its
        mtime: a directory's age says when an entry was last added to or removed from it
        (a writer staging into it), even while it holds no file."""
        try:
            entries = sorted(os.scandir(path), key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            return
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False):
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            yield BlobFile(entry.path, 0, st.st_mtime)
            yield from self.walk_dirs(entry.path)

    def mtime(self, path: str) -> float | None:
        """Last modification of ``path``; None if it does not exist (any more)."""
        try:
            return os.stat(path).st_mtime
        except FileNotFoundError:
            return None

    def size(self, path: str) -> int:
        return os.path.getsize(path)

    def delete_tree(self, path: str) -> None:
        """Delete ``path`` and everything below it, then make the removal durable."""
        if not os.path.isdir(path):
            return
        for dirpath, dirnames, filenames in os.walk(path, topdown=False):
            for name in filenames:
                self.delete_file(os.path.join(dirpath, name))
            for name in dirnames:
                self.rmdir(os.path.join(dirpath, name))
        self.rmdir(path)
        self.fsync_dir(os.path.dirname(path))

    def delete_file(self, path: str) -> None:
        try:
            self.unlink(path)
        except FileNotFoundError:
            pass


def open_blob(root: str, *, s3_credentials: S3Credentials | None = None) -> Blob:
    """The blob store at ``root``: a local path (or ``file://``) is a :class:`LocalBlob`, a
    URI of an object store an :class:`~.objects.ObjectBlob` (on S3 signed with
    ``s3_credentials`` when given, else with this process's chain); an unknown scheme is
    refused naming the value."""
    from airflow_upsert_provider.engine.blob.filesystems import split_uri

    scheme, _, local_path = split_uri(root)
    if not scheme:
        return LocalBlob(local_path)
    from airflow_upsert_provider.engine.blob.objects import ObjectBlob

    return ObjectBlob(root, credentials=s3_credentials)
