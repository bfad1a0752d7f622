"""Atomic file writes, in one place: a reader sees a file's old content or all of its new
content, never part of it (a temp file beside it, renamed over it)."""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import BinaryIO, Iterator


def fsync_dir(directory: str) -> None:
    """Make the names in ``directory`` (a rename, a new file) durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def replacing(path: str, *, durable: bool = True, mode: int = 0o666, hidden: bool = False) -> Iterator[BinaryIO]:
    """A binary handle on a temporary file beside ``path``, renamed over ``path`` when the body
    ends, removed if it raises: ``path`` holds its old content or all of the new. ``durable``:
    content and name fsynced; ``mode``: a new file's permissions before the umask; ``hidden``:
    the temporary name starts with a dot (a directory other programs scan ignores it)."""
    directory, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(directory, f"{'.' if hidden else ''}{name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            if durable:
                os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    if durable:
        fsync_dir(directory)


def write_atomically(path: str, data: str | bytes, *, durable: bool = True, mode: int = 0o666) -> None:
    """Replace ``path`` by ``data`` in one step (:func:`replacing`). ``durable``: the content
    and the new name are fsynced before this returns (a file other processes trust after a
    crash); without it the write is only atomic (a result a parent reads at once). ``mode``: the
    permissions of a new file, before the umask (0o600 for a file only its owner may read)."""
    with replacing(path, durable=durable, mode=mode) as handle:
        handle.write(data.encode("utf-8") if isinstance(data, str) else data)
