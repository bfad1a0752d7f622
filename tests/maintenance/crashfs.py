"""A blob that records every write, rename, mkdir, unlink and fsync, and can "crash": drop
whatever was not made durable, the way a power loss does on a POSIX filesystem.

The model: every file and directory is a node. A file's content survives a crash only if it
was fsynced; a name (directory entry) survives only if its directory was fsynced after the
entry changed. Files that existed when the double was created count as durable. A crash
rebuilds the real tree below the blob root from the durable view, so that recovery code runs
on real files with a plain ``LocalBlob``.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field

from airflow_upsert_provider.engine.blob.files import LocalBlob


class Crash(Exception):
    """The simulated power loss."""


@dataclass(eq=False)
class Node:
    is_dir: bool
    # Files: content now and content that survives a crash (None: lost, empty after crash).
    data: bytes | None = None
    durable_data: bytes | None = None
    # A file that existed at the start: its content lives in the stash (hard link).
    stash: str | None = None
    entries: dict[str, "Node"] = field(default_factory=dict)
    durable_entries: dict[str, "Node"] = field(default_factory=dict)


class CrashingBlob(LocalBlob):
    """``LocalBlob`` whose primitive operations are recorded; operation number ``crash_at``
    (0-based, counting every write, fsync, rename, mkdir, unlink and rmdir) crashes."""

    def __init__(self, root: str, stash_dir: str, crash_at: int | None = None) -> None:
        super().__init__(root)
        self.crash_at = crash_at
        self.ops: list[tuple[str, str]] = []
        self.crashed = False
        self._stash_dir = stash_dir
        self._stash_count = 0
        os.makedirs(stash_dir, exist_ok=True)
        self._root_node = self._scan(self.root)

    # -- the model ------------------------------------------------------------------------

    def _scan(self, path: str) -> Node:
        if os.path.isdir(path):
            node = Node(is_dir=True)
            for name in os.listdir(path):
                node.entries[name] = self._scan(os.path.join(path, name))
            node.durable_entries = dict(node.entries)
            return node
        self._stash_count += 1
        stash = os.path.join(self._stash_dir, str(self._stash_count))
        os.link(path, stash)
        return Node(is_dir=False, stash=stash)

    def _lookup(self, path: str) -> Node:
        node = self._root_node
        rel = os.path.relpath(path, self.root)
        if rel != ".":
            for part in rel.split(os.sep):
                node = node.entries[part]
        return node

    def _parent(self, path: str) -> tuple[Node, str]:
        return self._lookup(os.path.dirname(path)), os.path.basename(path)

    def _known(self, path: str) -> Node | None:
        """The node of ``path``, None for what another writer (Spark) created outside the
        model: its operations are recorded, not modelled."""
        try:
            return self._lookup(path)
        except KeyError:
            return None

    def _op(self, kind: str, path: str) -> None:
        if self.crashed:
            raise Crash("already crashed")
        if self.crash_at is not None and len(self.ops) == self.crash_at:
            self.crashed = True
            self._materialize()
            raise Crash(f"crash before op {len(self.ops)}: {kind} {path}")
        self.ops.append((kind, path))

    def crash_now(self) -> None:
        """Crash after the last operation (a power loss right after a call returned)."""
        self.crashed = True
        self._materialize()

    def _materialize(self) -> None:
        """Make the real tree equal the durable view."""
        for name in os.listdir(self.root):
            full = os.path.join(self.root, name)
            shutil.rmtree(full) if os.path.isdir(full) and not os.path.islink(full) else os.unlink(full)
        self._build(self._root_node, self.root)

    def _build(self, node: Node, path: str) -> None:
        for name, child in node.durable_entries.items():
            target = os.path.join(path, name)
            if child.is_dir:
                os.mkdir(target)
                self._build(child, target)
            elif child.stash is not None:
                os.link(child.stash, target)
            else:
                with open(target, "wb") as handle:
                    handle.write(child.durable_data or b"")

    # -- the primitives ---------------------------------------------------------------------

    def write_file(self, path: str, data: bytes, *, sync: bool) -> None:
        self._op("write", path)
        parent, name = self._parent(path)
        super().write_file(path, data, sync=False)
        node = Node(is_dir=False, data=data)
        parent.entries[name] = node
        if sync:
            self._op("fsync", path)
            node.durable_data = data

    def rename(self, src: str, dst: str) -> None:
        self._op("rename", f"{src} -> {dst}")
        super().rename(src, dst)
        sparent, sname = self._parent(src)
        dparent, dname = self._parent(dst)
        dparent.entries[dname] = sparent.entries.pop(sname)

    def fsync_dir(self, directory: str) -> None:
        self._op("fsync_dir", directory)
        super().fsync_dir(directory)
        node = self._known(directory)
        if node is not None:
            node.durable_entries = dict(node.entries)

    def sync_file(self, path: str) -> None:
        self._op("fsync", path)
        super().sync_file(path)
        node = self._known(path)
        if node is not None and node.stash is None:
            node.durable_data = node.data

    def mkdir(self, path: str) -> None:
        self._op("mkdir", path)
        super().mkdir(path)
        parent, name = self._parent(path)
        parent.entries[name] = Node(is_dir=True)

    def unlink(self, path: str) -> None:
        self._op("unlink", path)
        super().unlink(path)
        parent = self._known(os.path.dirname(path))
        if parent is not None:
            parent.entries.pop(os.path.basename(path), None)

    def rmdir(self, path: str) -> None:
        self._op("rmdir", path)
        super().rmdir(path)
        parent = self._known(os.path.dirname(path))
        if parent is not None:
            parent.entries.pop(os.path.basename(path), None)
