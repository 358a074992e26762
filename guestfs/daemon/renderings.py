"""What the FUSE layer keeps of its renderings, so no reader sees a file torn between two:
the bytes each open file handle was given (per-caller serving) and the current generation
of each page-cached file (page-cache serving). Both bounded in entries and bytes; their
place among the daemon's caches is in docs/mount.md, "Map of the caches"."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass


class OpenRenderings:
    """The rendering each open file handle was given, kept without a RELEASE callback.

    mfusepy leaves callbacks we do not define to libfuse's C defaults, and a Python
    release() costs every open/read/close about 100 us here (it runs while the reader's
    next open waits for the GIL). So nothing tells us when a handle closes: renderings are
    dropped oldest first once there are more than ``max_entries`` of them or they pass
    ``max_bytes`` (each counted with its dict and object overhead, so a million opens of a
    4-byte file are bounded too). A handle held open past that many newer renderings gets a
    fresh rendering at its next read.

    A rendering put with ``unread=True`` (the one a GETATTR sized the file by, handed to
    the open that followed) is what the handle's first read serves, whatever its offset:
    ``take_unread`` returns it once.
    """

    ENTRY_OVERHEAD = 200  # bytes per entry beside the data: dict slot, int, bytes header

    def __init__(self, max_entries: int = 2048, max_bytes: int = 32 << 20) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._data: dict[int, bytes] = {}
        self._unread: set[int] = set()
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._data)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def get(self, fh: int) -> bytes | None:
        return self._data.get(fh)

    def take_unread(self, fh: int) -> bytes | None:
        """The handle's rendering if no read has been served from it yet, else None; either
        way it counts as read from now on."""
        with self._lock:
            if fh not in self._unread:
                return None
            self._unread.discard(fh)
            return self._data.get(fh)

    def peek_unread(self, fh: int) -> bytes | None:
        """The handle's rendering if no read has been served from it yet (not consumed)."""
        with self._lock:
            return self._data.get(fh) if fh in self._unread else None

    def put(self, fh: int, data: bytes, unread: bool = False) -> None:
        with self._lock:
            if unread:
                self._unread.add(fh)
            else:
                self._unread.discard(fh)
            old = self._data.pop(fh, None)
            if old is not None:
                self._bytes -= len(old) + self.ENTRY_OVERHEAD
            self._data[fh] = data
            self._bytes += len(data) + self.ENTRY_OVERHEAD
            while len(self._data) > 1 and (len(self._data) > self.max_entries
                                           or self._bytes > self.max_bytes):
                oldest = next(iter(self._data))
                self._unread.discard(oldest)
                self._bytes -= len(self._data.pop(oldest)) + self.ENTRY_OVERHEAD


@dataclass
class Generation:
    """One rendering of a page-cached file, as the kernel knows it: its size and mtime
    are what GETATTR reported, and a changed mtime is what makes the kernel drop the
    pages it cached of the one before (auto_inval_data)."""

    data: bytes
    mtime_ns: int
    deadline: float      # monotonic: fresh until then
    last_read: float = 0.0


class Generations:
    """The current rendering of each page-cached file, and when one may replace another.

    The kernel fills a file's pages with READs at several offsets (a 1 MiB cpuinfo is
    several requests within one read() call), and a reader copies pages out after
    they are filled. A new rendering published between two of those steps would hand
    the reader a file torn between two renderings, or one cut at the other's size. So
    a generation read within ``hold`` seconds is not replaced: the GETATTR that asks is
    answered with the current one, and a later one publishes. Never for more than
    ``max_hold`` past its deadline, so a file read without pause still changes
    (docs/mount.md says what a reader may see across read() calls)."""

    def __init__(self, hold: float = 0.005, max_hold: float = 0.05,
                 max_entries: int = 16384, max_bytes: int = 64 << 20) -> None:
        # Generous: a generation dropped while the kernel still holds its attributes
        # would have its next page refill served from a newer rendering. 16384 files is
        # about 1,200 containers of a --per-container mount.
        self.hold = hold
        self.max_hold = max_hold
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.published = 0      # renderings that replaced another (or came first)
        self.held = 0           # replacements put off because a fill may be running
        self._gens: OrderedDict[str, Generation] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._gens)

    def get(self, name: str) -> Generation | None:
        with self._lock:
            return self._gens.get(name)

    def offer(self, name: str, deadline: float, data: bytes,
              now: float) -> tuple[Generation, bool]:
        """Make ``data`` current for ``name`` unless a fill of the current one may be
        running: (the current generation, whether it was held back)."""
        with self._lock:
            old = self._gens.get(name)
            if old is not None:
                self._gens.move_to_end(name)
                if old.data == data:
                    old.deadline = deadline   # unchanged: the cached pages stay good
                    return old, False
                if now - old.last_read < self.hold and now < old.deadline + self.max_hold:
                    self.held += 1
                    return old, True
                self._bytes -= len(old.data)
            # A new mtime for every new rendering, strictly increasing (the kernel
            # compares mtimes for equality; the clock may stand still or step back).
            mtime = max(time.time_ns(), old.mtime_ns + 1) if old is not None \
                else time.time_ns()
            new = self._gens[name] = Generation(data, mtime, deadline)
            self._bytes += len(data)
            self.published += 1
            while len(self._gens) > 1 and (len(self._gens) > self.max_entries
                                           or self._bytes > self.max_bytes):
                self._bytes -= len(self._gens.popitem(last=False)[1].data)
            return new, False

    def forget(self, names: Iterable[str]) -> None:
        """Drop the generations of ``names`` (the files of a container that is gone)."""
        with self._lock:
            for name in names:
                gen = self._gens.pop(name, None)
                if gen is not None:
                    self._bytes -= len(gen.data)

    def read(self, name: str, now: float) -> Generation | None:
        with self._lock:
            gen = self._gens.get(name)
            if gen is not None:
                gen.last_read = now
            return gen


class SizedRenderings:
    """The renderings a direct_io file's size was reported from, by (reader, path), for
    the open that follows; and each reader's last open given one, while that handle is
    unread (``opened``). Both bounded: a stat() never followed by an open, an open never
    read, are dropped oldest first past ``max_entries``."""

    def __init__(self, max_entries: int = 4096) -> None:
        self.max_entries = max_entries
        # (reader, path) -> (rendering, its view key): an open takes it only while the
        # reader's view is still that one (runc's init sizes the files it binds while
        # still in runc's cgroup, then moves and execs the app under the same pid).
        self._sized: dict[tuple[object, str], tuple[bytes, str | None]] = {}
        # (reader, path) -> (handle, view key) of its last open given a sized rendering.
        self._opened: dict[tuple[object, str], tuple[int, str | None]] = {}
        self._lock = threading.Lock()

    def remember(self, who: object, path: str, data: bytes, key: str | None) -> None:
        with self._lock:
            _bounded_put(self._sized, (who, path), (data, key), self.max_entries)

    def take(self, who: object, path: str) -> tuple[bytes, str | None] | None:
        with self._lock:
            return self._sized.pop((who, path), None)

    def opened(self, who: object, path: str, fh: int, key: str | None) -> None:
        with self._lock:
            _bounded_put(self._opened, (who, path), (fh, key), self.max_entries)

    def last_opened(self, who: object, path: str) -> tuple[int, str | None] | None:
        with self._lock:
            return self._opened.get((who, path))


def _bounded_put(d: dict, key: object, value: object, limit: int) -> None:  # type: ignore[type-arg]
    d.pop(key, None)
    if len(d) >= limit:
        d.pop(next(iter(d)))
    d[key] = value
