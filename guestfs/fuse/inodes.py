"""Node ids for paths: the table of what the kernel has looked up and not yet forgotten.

A LOOKUP answered with a node id adds one to that id's lookup count; FORGET and
BATCH_FORGET take the kernel's count back, and an id whose count reaches zero is dropped.
Failed lookups never enter the table, and the table never holds more than ``limit`` ids:
past it the least recently looked-up id is dropped (a request that names it later is
answered ESTALE, which makes the kernel look the name up again). So a tenant that stats
millions of names, or walks every file, grows it to ``limit`` entries at most.

A path's node id is a hash of the path, not a counter: the same path gets the same id in
any process, so a successor that takes over the connection (whose kernel keeps the ids
it was given) can name the paths behind them without the table, and an id forgotten and
looked up again is the same inode. Two paths whose hashes collide take the next free id.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from guestfs.fuse import abi

DEFAULT_LIMIT = 16384
ADOPTED = 1 << 62    # the count of an adopted id: a FORGET never reaches zero
_MASK = (1 << 63) - 1   # below FUSE_UNIQUE_RESEND's bit, never 0 or the root's 1


try:
    # The C module itself: hashlib would also load OpenSSL's libcrypto (3.8 MiB of the
    # daemon's RSS here) for a hash it does not need.
    from _blake2 import blake2b
except ImportError:     # an interpreter built without it
    from hashlib import blake2b


def path_id(path: str) -> int:
    digest = blake2b(path.encode("utf-8", "surrogateescape"), digest_size=8).digest()
    nodeid = int.from_bytes(digest, "little") & _MASK
    return nodeid if nodeid > abi.ROOT_ID else nodeid + 2


def child(parent: str, name: str) -> str:
    return f"/{name}" if parent == "/" else f"{parent}/{name}"


class _Node:
    __slots__ = ("path", "count")

    def __init__(self, path: str) -> None:
        self.path = path
        self.count = 0


class InodeTable:
    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self.limit = max(1, limit)
        self._lock = threading.Lock()
        self._ids: dict[str, int] = {}             # path -> nodeid, least recent first
        self._nodes: dict[int, _Node] = {}   # nodeid -> its path and lookup count
        self.evicted = 0

    def __len__(self) -> int:
        return len(self._nodes)

    def path(self, nodeid: int) -> str | None:
        if nodeid == abi.ROOT_ID:
            return "/"
        node = self._nodes.get(nodeid)
        return None if node is None else node.path

    def nodeid(self, path: str) -> int | None:
        """The node id the kernel holds for ``path``, if it holds one (a notification's
        target)."""
        return abi.ROOT_ID if path == "/" else self._ids.get(path)

    def adopted(self) -> list[int]:
        """The ids named from a predecessor's paths (adopt) and not evicted since."""
        with self._lock:
            return [i for i, n in self._nodes.items() if n.count >= ADOPTED // 2]

    def remember(self, path: str) -> int:
        """The node id of ``path`` for a LOOKUP reply about to be sent: its count +1."""
        if path == "/":
            return abi.ROOT_ID
        with self._lock:
            nodeid = self._ids.pop(path, None)
            if nodeid is None:
                nodeid = path_id(path)
                while nodeid in self._nodes or nodeid <= abi.ROOT_ID:
                    nodeid = (nodeid + 1) & _MASK
                self._nodes[nodeid] = _Node(path)
                while len(self._nodes) > self.limit:
                    self._evict_oldest()
            self._ids[path] = nodeid       # most recent last
            self._nodes[nodeid].count += 1
            return nodeid

    def _evict_oldest(self) -> None:
        old_path = next(iter(self._ids))
        del self._nodes[self._ids.pop(old_path)]
        self.evicted += 1

    def adopt(self, paths: Iterable[str]) -> int:
        """Name the node ids a predecessor gave out for ``paths`` (a successor on an
        initialised connection: the kernel still holds them, with counts we cannot know).
        Each is kept with a count no FORGET takes to zero, until the table's limit evicts
        it. Returns how many were added."""
        added = 0
        for path in paths:
            if path == "/" or path in self._ids:
                continue
            nodeid = self.remember(path)
            if nodeid == path_id(path):    # a collision's probe need not match theirs
                self._nodes[nodeid].count = ADOPTED
                added += 1
            else:
                self.forget(nodeid, 1)
        return added

    def forget(self, nodeid: int, nlookup: int) -> None:
        if nodeid == abi.ROOT_ID:
            return
        with self._lock:
            node = self._nodes.get(nodeid)
            if node is None:       # evicted, or forgotten by a predecessor's table
                return
            node.count -= nlookup
            if node.count <= 0:
                del self._nodes[nodeid]
                self._ids.pop(node.path, None)

    def counts(self) -> dict[str, int]:
        """path -> lookup count (tests, and a successor's handover)."""
        with self._lock:
            return {n.path: n.count for n in self._nodes.values()}
