"""Blob on object storage (``s3://``, and ``gs://``, ``abfs[s]://``, ``hdfs://`` through the
same layer), over ``pyarrow.fs`` (:func:`~.filesystems.filesystem_for`).

Paths are full URIs (``s3://bucket/prefix/a/b``): :meth:`ObjectBlob.path` makes them and every
method takes them, so a path means the same thing on the driver and on every executor.

What the operations mean here, where a POSIX filesystem and an object store differ:

- **Writes.** A completed PUT is durable and atomic: readers see the old object or the whole
  new one, never part of it. ``write_atomic`` and ``write_file`` are one PUT each (small
  objects in one request; pyarrow switches to a multipart upload, published atomically by its
  completion, above its part size). ``sync_written``, ``sync_file``, ``fsync_dir``,
  ``make_dirs``, ``mkdir`` and ``rmdir`` have nothing to do and do nothing.
- **No rename.** Object stores cannot rename; :meth:`ObjectBlob.rename` is refused. Writers
  write every object under its final, unique name, and the consensus commit is the only
  publication.
- **Directories are prefixes.** A prefix exists while some key lies below it (``exists``,
  ``is_dir``, ``listdir`` say what pyarrow lists). PyArrow's deletions leave a zero-byte
  directory marker (``parent/``) behind them (apache/arrow#36275): a prefix may therefore be
  listed although it holds no object. Markers are never yielded as files, and ``delete_tree``
  of an enclosing prefix removes them.
- **Ages.** An object's mtime is its last-modified time. A prefix has none of its own: its
  age (``mtime``, ``walk_dirs``) is that of the newest object below it, and a prefix with no
  object below (markers only) has no age and is not yielded by ``walk_dirs``. GC's grace rule
  stays sound: a prefix a writer is writing into holds the writer's newest object, which is
  young; a writer that has not completed its first PUT has nothing GC can list, so nothing GC
  could delete. An object uploaded in parts is dated from the start of its upload and appears
  only when the upload completes (an upload slower than the grace period can thus appear
  already old: GC's claim in consensus, checked by every commit, keeps a commit from naming it
  once GC decided to delete it).
- **Listings** go one prefix level at a time (delimiter listings, paged by the store at 1,000
  keys and followed by pyarrow), recursing in name order: the memory a walk holds is the
  listing of one level per depth, never the whole tree.
- **Deletions.** ``delete_tree(p)`` deletes every key below ``p/`` (a sibling ``p0/`` is not
  below it) in batched requests; a key written under ``p`` after pyarrow listed it survives,
  as a file created in a directory being removed does on a POSIX filesystem. A missing object
  or prefix is no error.
- **The root.** ``ensure_root`` and ``check_root`` never create a bucket: a missing bucket,
  denied access or an endpoint where nothing answers is a :class:`ConfigurationError`
  (``field: blob_root``) naming the bucket, the prefix and the endpoint, never a credential.
- **Failures.** The filesystem layer retries a failed request itself, within its bound
  (:mod:`.filesystems`). What still fails comes out of every method that sends requests in
  its class (:func:`_store_requests`): a transient failure (a 5xx answer, throttling, a
  connection cut or timed out) is :class:`BlobUnavailable` (retryable), denied access or a
  missing bucket the :class:`ConfigurationError` of the root; each names the operation, the
  URI, bucket, prefix and endpoint, never a credential. A missing object stays a
  ``FileNotFoundError``; a failure of no known kind leaves pyarrow's ``OSError`` as it is.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import inspect
import os
import re
import uuid
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, TypeVar

from airflow_upsert_provider.engine.blob.filesystems import (
    S3Credentials,
    display_uri,
    filesystem_for,
    s3_endpoint,
    s3_max_attempts,
    s3_region,
    split_uri,
)
from airflow_upsert_provider.engine.blob.interface import BlobFile, BlobTree, prefixes_of
from airflow_upsert_provider.engine.errors import BlobUnavailable, ConfigurationError, UpsertError, first_line

if TYPE_CHECKING:
    import pyarrow.fs
    import pyarrow.parquet

# Bytes read at a time when an object is hashed: memory stays bounded whatever its size.
CHECKSUM_CHUNK = 1 << 20

# PyArrow's S3 errors read "... AWS Error <CODE> [(HTTP status <N>)] during <Operation>
# operation: <detail>" (the status where the SDK knows no name for the error).
_AWS_ERROR = re.compile(r"AWS Error ([A-Z_]+)(?: \(HTTP status (\d+)\))? during (\w+) operation")
_DENIED = {"ACCESS_DENIED", "INVALID_ACCESS_KEY_ID", "SIGNATURE_DOES_NOT_MATCH", "UNRECOGNIZED_CLIENT",
           "INVALID_CLIENT_TOKEN_ID", "EXPIRED_TOKEN", "MISSING_AUTHENTICATION_TOKEN", "INVALID_SIGNATURE",
           "FORBIDDEN", "UNAUTHORIZED"}
# Errors that may pass: the store is overloaded, restarting or throttling, or a connection was
# cut or timed out (NETWORK_CONNECTION: curl's error); an error the SDK has no name for is
# transient by its HTTP status (5xx, 429).
_TRANSIENT = {"SERVICE_UNAVAILABLE", "SLOW_DOWN", "THROTTLING", "INTERNAL_FAILURE", "REQUEST_TIMEOUT",
              "NETWORK_CONNECTION"}
# curl's codes for "nothing could be reached": the host is not known, nothing listens. At the
# root check that is a wrong endpoint; once the root answered, the store went away for now.
_CURL_CODE = re.compile(r"curlCode: (\d+)")
_UNREACHABLE_CURL_CODES = {"6", "7"}
# A missing object or a path of the wrong kind means what it says to the caller.
_MEANINGFUL_ERRORS = (FileNotFoundError, NotADirectoryError, IsADirectoryError, FileExistsError)
# Environment variables whose values are secrets: never repeated, whatever a store's error says.
SECRET_VARIABLES = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AZURE_STORAGE_ACCOUNT_KEY",
                    "AZURE_STORAGE_SAS_TOKEN", "AZURE_CLIENT_SECRET")


_Method = TypeVar("_Method", bound=Callable)


def _store_requests(operation: str) -> Callable[[_Method], _Method]:
    """Decorate a method of :class:`ObjectBlob` that sends requests about the path it takes
    first: pyarrow's ``OSError`` of a failed request comes out in its class
    (:meth:`ObjectBlob._store_error`), also from a walk while it is iterated. The one place
    where the blob's failures are translated."""

    def decorate(method: _Method) -> _Method:
        if inspect.isgeneratorfunction(method):

            @functools.wraps(method)
            def walking(self: "ObjectBlob", path: str, *args, **kwargs):
                try:
                    yield from method(self, path, *args, **kwargs)
                except OSError as exc:
                    error = self._store_error(exc, operation, path)
                    if error is None:
                        raise
                    raise error from None

            return walking  # type: ignore[return-value]

        @functools.wraps(method)
        def calling(self: "ObjectBlob", path: str, *args, **kwargs):
            try:
                return method(self, path, *args, **kwargs)
            except OSError as exc:
                error = self._store_error(exc, operation, path)
                if error is None:
                    raise
                raise error from None

        return calling  # type: ignore[return-value]

    return decorate


class ObjectBlob:
    """Blob store on object storage, rooted at a bucket (container, namenode) and prefix."""

    def __init__(self, root: str, *, credentials: S3Credentials | None = None) -> None:
        """``credentials``: what every request to an S3 root is signed with (an Airflow ``aws``
        connection's), instead of this process's credential chain."""
        scheme, authority, prefix = split_uri(root)
        if not scheme:
            raise ConfigurationError(f"blob root {root!r} is a local path: use LocalBlob", field="blob_root")
        self.scheme, self.authority, self.prefix = scheme, authority, prefix
        self.credentials = credentials if scheme == "s3" else None
        self.root = f"{scheme}://{authority}/{prefix}" if prefix else f"{scheme}://{authority}"

    def __repr__(self) -> str:
        return f"ObjectBlob({self.root!r})"

    def path(self, *parts: str) -> str:
        """The URI of ``parts`` below the root."""
        return self.join(self.root, *parts)

    # -- path arithmetic: keys are '/'-separated whatever the machine's os.sep -----------------

    def join(self, path: str, *parts: str) -> str:
        """The URI of ``parts`` below ``path``."""
        tail = "/".join(part.strip("/") for part in parts if part.strip("/"))
        base = path.rstrip("/")
        return f"{base}/{tail}" if tail else base

    def parent(self, path: str) -> str:
        """The prefix ``path`` lies in; a bucket's URI is its own parent (as ``/`` is)."""
        if not split_uri(path)[2]:
            return path.rstrip("/")
        return path.rstrip("/").rpartition("/")[0]

    def name(self, path: str) -> str:
        """The last component of ``path``."""
        return path.rstrip("/").rpartition("/")[2]

    def relative(self, path: str) -> str:
        """``path`` relative to the root, '/'-separated, as consensus records it (``""`` for
        the root itself). A path outside the root is a ValueError: nothing the engine
        records may point outside its blob root."""
        path = path.rstrip("/")
        if path == self.root:
            return ""
        if not path.startswith(self.root + "/"):
            raise ValueError(f"{path} is not below the blob root {self.root}")
        return path[len(self.root) + 1 :]

    # -- the root ------------------------------------------------------------------------------

    def ensure_root(self) -> None:
        """Nothing to create (a prefix exists once an object lies below it; buckets are never
        created here): check that the bucket is there and reachable."""
        if self.scheme == "hdfs":
            filesystem, inner = filesystem_for(self.root, self.credentials)
            try:
                filesystem.create_dir(inner, recursive=True)
            except OSError as exc:
                raise self._root_error(exc) from None
            return
        self.check_root(writable=False)

    def check_root(self, *, writable: bool = True) -> None:
        """Raise a clear :class:`ConfigurationError` unless the bucket exists and answers,
        the root is not an object, and, with ``writable``, an object can be written below it
        (probed with a real PUT and DELETE: permissions are the store's to say)."""
        import pyarrow as pa
        import pyarrow.fs as pafs

        filesystem, inner = filesystem_for(self.root, self.credentials)
        bucket = inner.split("/", 1)[0] if self.scheme != "hdfs" else inner
        try:
            if filesystem.get_file_info(bucket).type == pafs.FileType.NotFound:
                raise ConfigurationError(
                    f"blob root {self.root}: {self._container_word()} {self._bucket()!r} does not exist "
                    f"({self._where()}); create it, or fix --blob-root / UPSERT_BLOB_ROOT or the endpoint",
                    field="blob_root",
                )
            if self.prefix and filesystem.get_file_info(inner).type == pafs.FileType.File:
                raise ConfigurationError(f"blob root {self.root} is an object, not a prefix ({self._where()})",
                                         field="blob_root")
            if writable:
                probe = f"{inner}/.probe-{uuid.uuid4().hex}"
                written = f"upsert blob root probe {probe}\n".encode()
                with filesystem.open_output_stream(probe) as out:
                    out.write(written)
                try:
                    with filesystem.open_input_stream(probe) as stream:
                        read = stream.read()
                finally:
                    filesystem.delete_file(probe)
                if read != written:
                    raise self._altered_error(written, read)
        # GCS's client raises ArrowException (not OSError) for credentials it cannot use.
        except (OSError, pa.ArrowException) as exc:
            raise self._root_error(exc, writing=writable) from None

    def _altered_error(self, written: bytes, read: bytes) -> ConfigurationError:
        """The root's error for a store that gave back other bytes than a probe object held:
        every run file written there would be damaged."""
        framed = b"x-amz-checksum-" in read or read.startswith(f"{len(written):x}\r\n".encode())
        how = ("it kept the upload's aws-chunked framing and trailing checksum in the object" if framed
               else f"wrote {len(written)} bytes, read back {len(read)} other bytes")
        return ConfigurationError(
            f"blob root {self.root} cannot be used: the store changed an object written to it ({how}; "
            f"{self._where()}), so every file written there would be damaged; the likely cause is a store "
            "that does not decode the AWS SDK's checksummed uploads: set AWS_REQUEST_CHECKSUM_CALCULATION="
            "when_required for this process and every Spark executor (docs/storage.md, \"Stores that "
            "change uploads\")",
            field="blob_root",
        )

    def _secrets(self) -> tuple[str, ...]:
        """The secrets this blob signs with, which no message may repeat."""
        if self.credentials is None:
            return ()
        return tuple(v for v in (self.credentials.secret_access_key, self.credentials.session_token) if v)

    def _bucket(self) -> str:
        return self.authority.split("@", 1)[0] if self.scheme in ("abfs", "abfss") else self.authority

    def _container_word(self) -> str:
        return {"abfs": "container", "abfss": "container", "hdfs": "namenode"}.get(self.scheme, "bucket")

    def _endpoint(self) -> str:
        if self.scheme == "s3":
            endpoint = s3_endpoint(self.credentials)
            if endpoint:
                return display_uri(endpoint)
            region = s3_region(self.credentials)
            return f"AWS S3{' in ' + region if region else ''}"
        if self.scheme in ("abfs", "abfss"):
            return self.authority.split("@", 1)[-1]
        if self.scheme == "hdfs":
            return self.authority
        return "Google Cloud Storage"

    def _where(self) -> str:
        return f"{self._container_word()} {self._bucket()!r}, prefix {self.prefix!r}, endpoint {self._endpoint()}"

    def _root_error(self, exc: OSError, *, writing: bool = False) -> UpsertError:
        code, reason = store_failure(exc, self._secrets())
        if failure_kind(exc) == "transient":
            # The endpoint answered (or the connection broke midway): the store may answer next time.
            return self._unavailable(exc, "check", self.root)
        if code in _DENIED:
            what = f"access denied ({code})"
            hint = "check the credentials of this process (docs/storage.md) and the bucket's policy"
        elif code == "NETWORK_CONNECTION":
            what = "nothing answered at the endpoint"
            hint = "check AWS_ENDPOINT_URL and that the store is up"
        elif code == "NO_SUCH_BUCKET":
            what = f"the {self._container_word()} does not exist"
            hint = "create it, or fix --blob-root / UPSERT_BLOB_ROOT or the endpoint"
        else:
            what = f"{'writing a probe object' if writing else 'reading'} failed: {reason}"
            hint = "fix --blob-root / UPSERT_BLOB_ROOT, the credentials or the endpoint"
        return ConfigurationError(f"blob root {self.root} cannot be used: {what} ({self._where()}); {hint}",
                                  field="blob_root")

    def _store_error(self, exc: OSError, operation: str, path: str) -> UpsertError | None:
        """The error a failed request of ``operation`` on ``path`` raises, once the filesystem
        layer gave up retrying it; None: ``exc`` means what it says (a missing object) or is of
        no known kind, and goes up as it is."""
        if isinstance(exc, _MEANINGFUL_ERRORS):
            return None
        kind = failure_kind(exc)
        if kind in ("transient", "unreachable"):
            # The root answered when the command started: the store went away for now.
            return self._unavailable(exc, operation, path)
        if kind in ("denied", "no_bucket"):
            return self._root_error(exc)
        return None

    def _unavailable(self, exc: OSError, operation: str, path: str) -> BlobUnavailable:
        code, reason = store_failure(exc, self._secrets())
        attempts = f", retried up to {s3_max_attempts()} attempts (AWS_MAX_ATTEMPTS)" if self.scheme == "s3" else ""
        return BlobUnavailable(
            f"{_VERBS[operation]} {display_uri(path)} failed{attempts}: {reason} ({self._where()}); "
            f"{unavailable_advice(code, reason, operation)}",
            operation=operation,
            bucket=self._bucket(),
            key=split_uri(path)[2],
            endpoint=self._endpoint(),
            reason=code or reason,
        )

    # -- primitive operations ------------------------------------------------------------------

    @_store_requests("write")
    def write_file(self, path: str, data: bytes, *, sync: bool) -> None:
        """One PUT: the object is durable once it returns, ``sync`` or not."""
        filesystem, inner = filesystem_for(path, self.credentials)
        with filesystem.open_output_stream(inner) as out:
            out.write(data)

    def rename(self, src: str, dst: str) -> None:
        raise NotImplementedError(
            f"object storage has no rename ({src} -> {dst}): write the object under its final name"
        )

    def fsync_dir(self, directory: str) -> None:
        """Nothing to sync: a completed PUT is durable."""

    def sync_file(self, path: str) -> None:
        """Nothing to sync: a completed PUT is durable."""

    def mkdir(self, path: str) -> None:
        """Nothing to create: a prefix exists once an object lies below it."""

    def rmdir(self, path: str) -> None:
        """Nothing to remove: an empty prefix does not exist. (Deleting a directory marker
        would take pyarrow's ``delete_dir``, which deletes whatever a writer put below the
        prefix meanwhile.)"""

    @_store_requests("delete")
    def unlink(self, path: str) -> None:
        filesystem, inner = filesystem_for(path, self.credentials)
        filesystem.delete_file(inner)

    # -- metadata objects ----------------------------------------------------------------------

    def make_dirs(self, path: str) -> None:
        """Nothing to create: a prefix exists once an object lies below it."""

    def write_atomic(self, path: str, data: bytes) -> None:
        """Write ``data`` so that ``path`` holds either its old content or all of ``data``,
        durably: one PUT (atomic and durable on the store, no temporary object, no rename)."""
        self.write_file(path, data, sync=True)

    def sync_written(self, paths: Iterable[str]) -> None:
        """Nothing to sync: every object another writer completed is durable."""

    @_store_requests("read")
    def read_bytes(self, path: str) -> bytes:
        filesystem, inner = filesystem_for(path, self.credentials)
        with filesystem.open_input_stream(inner) as stream:
            return stream.read()

    @_store_requests("read")
    def checksum(self, path: str) -> str:
        """SHA-256 of the object at ``path``, hex, read in chunks."""
        filesystem, inner = filesystem_for(path, self.credentials)
        digest = hashlib.sha256()
        with filesystem.open_input_stream(inner) as stream:
            while chunk := stream.read(CHECKSUM_CHUNK):
                digest.update(chunk)
        return digest.hexdigest()

    @_store_requests("read")
    def parquet_metadata(self, path: str) -> "pyarrow.parquet.FileMetaData":
        """The Parquet footer of the object at ``path`` (ranged GETs), read through this
        blob's filesystem: its endpoint, retries and error mapping (a store that keeps failing
        is :class:`BlobUnavailable`); an object that is no Parquet raises pyarrow's
        ``ArrowInvalid``."""
        import pyarrow.parquet as pq

        filesystem, inner = filesystem_for(path, self.credentials)
        with filesystem.open_input_file(inner) as handle:
            return pq.read_metadata(handle)

    @_store_requests("stat")
    def exists(self, path: str) -> bool:
        import pyarrow.fs as pafs

        filesystem, inner = filesystem_for(path, self.credentials)
        return filesystem.get_file_info(inner).type != pafs.FileType.NotFound

    @_store_requests("stat")
    def is_dir(self, path: str) -> bool:
        import pyarrow.fs as pafs

        filesystem, inner = filesystem_for(path, self.credentials)
        return filesystem.get_file_info(inner).type == pafs.FileType.Directory

    @_store_requests("list")
    def listdir(self, path: str) -> list[str]:
        filesystem, inner = filesystem_for(path, self.credentials)
        return [info.base_name for info in _children(filesystem, inner)]

    @_store_requests("list")
    def walk_files(self, path: str) -> Iterator[BlobFile]:
        """Every object below ``path`` (recursively), with its size and last-modified time,
        in name order at every level (the order :class:`~.files.LocalBlob` yields). One
        delimiter listing per prefix; no request per object."""
        filesystem, inner = filesystem_for(path, self.credentials)
        for entry, _ in _walk(filesystem, path.rstrip("/"), inner):
            if entry is not None:
                yield entry

    def list_files(self, path: str) -> Iterator[BlobFile]:
        """Every object below ``path`` with its size and last-modified time, in key order,
        from one flat listing: one request per page of keys (1,000 on S3), however many
        prefixes they are under (:meth:`walk_files` sends one per prefix)."""
        yield from self._flat_listing(path)[0]

    @_store_requests("list")
    def _flat_listing(self, path: str) -> tuple[list[BlobFile], list[str]]:
        """The objects below ``path`` and the URIs of every prefix the same listing shows
        (directory markers included), from one flat listing."""
        import pyarrow.fs as pafs

        filesystem, inner = filesystem_for(path, self.credentials)
        uri, inner = path.rstrip("/"), inner.rstrip("/")
        try:
            # pyarrow lists a recursive selector without a delimiter (ListObjectsV2, every page).
            infos = filesystem.get_file_info(pafs.FileSelector(inner, recursive=True, allow_not_found=True))
        except (FileNotFoundError, NotADirectoryError):
            return [], []
        files = [BlobFile(uri + info.path[len(inner):], info.size, _seconds(info))
                 for info in infos if info.type == pafs.FileType.File]
        prefixes = [uri + info.path[len(inner):] for info in infos if info.type == pafs.FileType.Directory]
        return files, prefixes

    def list_tree(self, path: str) -> BlobTree:
        """Every object below ``path`` (one flat listing, a request per page of keys) and
        every prefix holding one, dated by its newest object (as :meth:`walk_dirs` dates them,
        without a request per prefix); and, from the same listing, the prefixes that hold no
        object, only directory markers (:attr:`BlobTree.markers`)."""
        files, prefixes = self._flat_listing(path)
        holding = prefixes_of(files, path)
        held = {p.path for p in holding}
        return BlobTree(files, holding, markers=sorted(p for p in prefixes if p not in held))

    @_store_requests("list")
    def walk_dirs(self, path: str) -> Iterator[BlobFile]:
        """Every prefix below ``path`` (``path`` itself excluded) that holds an object, with
        the last-modified time of the newest object below it as its mtime: a prefix's own
        age does not exist on an object store. Deepest first within each prefix (a prefix
        comes after everything below it, whose ages make its own)."""
        filesystem, inner = filesystem_for(path, self.credentials)
        for _, directory in _walk(filesystem, path.rstrip("/"), inner):
            if directory is not None:
                yield directory

    @_store_requests("stat")
    def mtime(self, path: str) -> float | None:
        """Last modification of the object at ``path``; of a prefix, that of the newest
        object below it; None if there is neither (any more)."""
        import pyarrow.fs as pafs

        filesystem, inner = filesystem_for(path, self.credentials)
        info = filesystem.get_file_info(inner)
        if info.type == pafs.FileType.File:
            return _seconds(info)
        if info.type == pafs.FileType.NotFound:
            return None
        newest = None
        for entry, _ in _walk(filesystem, path.rstrip("/"), inner):
            if entry is not None and (newest is None or entry.mtime > newest):
                newest = entry.mtime
        return newest

    @_store_requests("stat")
    def size(self, path: str) -> int:
        import pyarrow.fs as pafs

        filesystem, inner = filesystem_for(path, self.credentials)
        info = filesystem.get_file_info(inner)
        if info.type != pafs.FileType.File:
            raise FileNotFoundError(errno.ENOENT, "no such object", path)
        return info.size

    @_store_requests("delete")
    def delete_tree(self, path: str) -> None:
        """Delete every object below ``path`` (and the object ``path`` itself, if any): a
        sibling sharing its first characters (``runs/10`` beside ``runs/1``) is not below it."""
        filesystem, inner = filesystem_for(path, self.credentials)
        try:
            filesystem.delete_dir(inner)
        except FileNotFoundError:
            pass

    def delete_file(self, path: str) -> None:
        try:
            self.unlink(path)
        except FileNotFoundError:
            pass


def request_error(root: str, exc: OSError, operation: str, uri: str) -> UpsertError | None:
    """The engine error a request of ``operation`` on ``uri`` (below the object-storage
    ``root``) that failed with ``exc`` stands for, as :class:`ObjectBlob`'s own requests raise
    it; None when ``exc`` is of no kind the store explains. For code that reaches the store
    through ``pyarrow.fs`` directly (the executors writing and reading runs)."""
    return ObjectBlob(root)._store_error(exc, operation, uri)


def _children(filesystem: "pyarrow.fs.FileSystem", inner: str) -> list["pyarrow.fs.FileInfo"]:
    """The entries one level below ``inner`` (one delimiter listing, every page), by name."""
    import pyarrow.fs as pafs

    try:
        infos = filesystem.get_file_info(pafs.FileSelector(inner, recursive=False, allow_not_found=True))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted(infos, key=lambda info: info.base_name)


def _walk(
    filesystem: "pyarrow.fs.FileSystem", uri: str, inner: str
) -> Iterator[tuple[BlobFile | None, BlobFile | None]]:
    """(file, None) for every object below ``uri`` in name order, and (None, prefix) for every
    prefix below it holding an object, after its contents, dated by its newest object."""
    yield from _walk_level(filesystem, uri, inner, [])


def _walk_level(
    filesystem: "pyarrow.fs.FileSystem", uri: str, inner: str, newest: list[float]
) -> Iterator[tuple[BlobFile | None, BlobFile | None]]:
    import pyarrow.fs as pafs

    for info in _children(filesystem, inner):
        child = f"{uri}/{info.base_name}"
        if info.type == pafs.FileType.Directory:
            below: list[float] = []
            yield from _walk_level(filesystem, child, info.path, below)
            if below:
                yield None, BlobFile(child, 0, below[0])
                _note(newest, below[0])
        elif info.type == pafs.FileType.File:
            mtime = _seconds(info)
            _note(newest, mtime)
            yield BlobFile(child, info.size, mtime), None


def _note(newest: list[float], mtime: float) -> None:
    if not newest:
        newest.append(mtime)
    elif mtime > newest[0]:
        newest[0] = mtime


def _seconds(info: "pyarrow.fs.FileInfo") -> float:
    return info.mtime_ns / 1e9 if info.mtime_ns is not None else 0.0


# How a message names each operation.
_VERBS = {"write": "writing", "read": "reading", "stat": "looking up", "list": "listing", "delete": "deleting",
          "check": "checking the blob root at"}


# An internal error of the store (HTTP 500, 501...): unlike 503 or throttling, it may be the
# store's own bug with one kind of request, answered the same way every time.
_INTERNAL_ERROR = re.compile(r"^INTERNAL_FAILURE\b|\(HTTP 5(?!03)\d\d\)")


def unavailable_advice(code: str, reason: str, operation: str) -> str:
    """What a :class:`BlobUnavailable` advises, from the store's last answer (``code`` and
    ``reason`` of :func:`store_failure`) to ``operation``: run the step again; after an
    internal error on every attempt, also that a store failing the same way each time may have
    a bug with this request (s3rver answers every truncated listing with 500)."""
    advice = "a transient failure of the store: run the step again when it answers"
    if not _INTERNAL_ERROR.search(reason):
        return f"{advice} (docs/storage.md)"
    example = " (a listing that fails only when it is truncated, past 1,000 keys, is one)" if operation == "list" else ""
    return (f"{advice}; the store answered every attempt with an internal error: if the step fails the same "
            f"way each time, it may be the store's bug with this request{example}, not a passing failure: "
            "report it to the store's maintainers (docs/storage.md, \"Failures\")")


def failure_kind(exc: BaseException) -> str:
    """What a failed request says about the store, from pyarrow's message: ``"denied"``,
    ``"no_bucket"``, ``"unreachable"`` (no such host, nothing listens), ``"transient"`` (a
    5xx answer, throttling, a connection cut or timed out), or ``""`` (none of these)."""
    text = str(exc)
    match = _AWS_ERROR.search(text)
    if not match:
        return ""
    code, status, _operation = match.groups()
    if code in _DENIED or (code == "UNKNOWN" and status in ("401", "403")):
        return "denied"
    if code == "NO_SUCH_BUCKET":
        return "no_bucket"
    if code == "NETWORK_CONNECTION":
        curl = _CURL_CODE.search(text)
        return "unreachable" if curl is not None and curl.group(1) in _UNREACHABLE_CURL_CODES else "transient"
    if code in _TRANSIENT or (status is not None and (status.startswith("5") or status == "429")):
        return "transient"
    return ""


def store_failure(exc: BaseException, secrets: Iterable[str] = ()) -> tuple[str, str]:
    """(error code, one-line reason) of a failed store request, with every secret the
    environment holds and ``secrets`` cut out: PyArrow's S3 errors carry the code of the AWS error; a store's
    own message may quote a signed request."""
    text = first_line(exc) or type(exc).__name__
    match = _AWS_ERROR.search(text)
    code = ""
    if match:
        code, status, operation = match.groups()
        if code == "UNKNOWN" and status == "403":
            code = "ACCESS_DENIED"  # a HEAD request's 403 has no body to name the error
        text = f"{code}{f' (HTTP {status})' if status else ''} during {operation}"
    for value in (*(os.environ.get(name) for name in SECRET_VARIABLES), *secrets):
        if value:
            text = text.replace(value, "***")
    return code, text[:300]
