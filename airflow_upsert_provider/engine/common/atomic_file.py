"""Atomic file writes, in one place: a reader sees a file's old content or all of its new
content, never part of it (a temp file beside it, renamed over it)."""

from __future__ import annotations

import os


def fsync_dir(directory: str) -> None:
    """Make the names in ``directory`` (a rename, a new file) durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: str, data: str | bytes, *, durable: bool = True, mode: int = 0o666) -> None:
    """Replace ``path`` by ``data`` in one step. ``durable``: the content and the new name are
    fsynced before this returns (a file other processes trust after a crash); without it the
    write is only atomic (a result a parent reads at once). ``mode``: the permissions of a new
    file, before the umask (0o600 for a file only its owner may read)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(raw)
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
        fsync_dir(os.path.dirname(os.path.abspath(path)))
