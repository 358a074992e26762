"""Who is reading: a reader is (pid, start time), learnt once per process and vouched for
by a pidfd afterwards, so a reused pid never inherits another process's view."""

from __future__ import annotations

import os
import select
import threading
from collections import OrderedDict
from collections.abc import Callable

# A reader is (pid, start time): a pid alone is reused once its process exits, and a new
# process must never be served a view cached for the old one (another container's).
Reader = tuple[int, int | None]


PIDFD_THREAD = os.O_EXCL  # pidfd_open flag (Linux 6.9): a pidfd for a thread id
PIDFDS = 256              # readers remembered by pidfd; others pay a /proc read per request


class ReaderIds:
    """(pid, start time) of readers, without reading /proc/<pid>/stat on every request.

    The first request of a pid opens a pidfd for it and reads its start time once. Later
    requests only poll the pidfd: while it is not readable the process has not exited, so
    the pid cannot have been reused and the remembered start time still names it. Once it
    is readable, or where pidfds do not exist (old kernels, gVisor, a thread id before
    Linux 6.9), the start time is read again. (The read cost ~25 us per request here; the
    poll ~1 us.)"""

    def __init__(self, start_time: Callable[[int], int | None], use_pidfd: bool) -> None:
        self._start_time = start_time
        self._use_pidfd = use_pidfd and hasattr(os, "pidfd_open")
        self._known: OrderedDict[int, tuple[int, int | None]] = OrderedDict()
        # Held across the poll: an fd closed by eviction and reused for another process's
        # pidfd must never vouch for this pid.
        self._lock = threading.Lock()

    def __call__(self, pid: int) -> Reader:
        with self._lock:
            hit = self._known.get(pid)
            if hit is not None:
                if not _exited(hit[0]):
                    return (pid, hit[1])
                os.close(self._known.pop(pid)[0])
        return self._learn(pid)

    def _learn(self, pid: int) -> Reader:
        fd = self._pidfd(pid)
        start = self._start_time(pid)
        if fd is None:
            return (pid, start)
        if _exited(fd):  # exiting while we looked: nothing to remember
            os.close(fd)
            return (pid, start)
        with self._lock:
            old = self._known.pop(pid, None)
            self._known[pid] = (fd, start)
            if old is not None:
                os.close(old[0])
            while len(self._known) > PIDFDS:
                os.close(self._known.popitem(last=False)[1][0])
        return (pid, start)

    def _pidfd(self, pid: int) -> int | None:
        if not self._use_pidfd:
            return None
        for flags in (0, PIDFD_THREAD):  # a FUSE request carries the thread's id
            try:
                return os.pidfd_open(pid, flags)
            except OSError:
                continue
        return None

    def close(self) -> None:
        with self._lock:
            for fd, _ in self._known.values():
                os.close(fd)
            self._known.clear()


def _exited(pidfd: int) -> bool:
    try:
        return bool(select.select([pidfd], [], [], 0)[0])
    except (OSError, ValueError):
        return True


class CgroupFiles:
    """The /proc/<pid>/cgroup of readers seen lately, each kept open and read again with
    pread: one system call where an open, fstat, read and close were four, and a
    per-caller read checks its reader's cgroups at its GETATTR and again at its OPEN
    (server.key_for). A descriptor of a /proc/<pid> file names its process, not its
    number: once that process has exited its reads fail (ESRCH), never another's."""

    def __init__(self, path_of: Callable[[str], str], limit: int = PIDFDS) -> None:
        self._path_of, self._limit = path_of, limit
        self._fds: OrderedDict[Reader, int] = OrderedDict()
        # Held across the pread: a descriptor closed by eviction and reused for another
        # file must never be read as this reader's.
        self._lock = threading.Lock()

    def read(self, who: Reader) -> str | None:
        """The cgroup file of reader ``who`` (pid, start time), None if unreadable."""
        with self._lock:
            fd = self._fds.get(who)
            if fd is not None:
                try:
                    return os.pread(fd, 65536, 0).decode("utf-8", "replace")
                except OSError:
                    os.close(self._fds.pop(who))
                    return None
        return self._learn(who)

    def _learn(self, who: Reader) -> str | None:
        try:
            fd = os.open(self._path_of(f"/proc/{who[0]}/cgroup"),
                         os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            text = os.pread(fd, 65536, 0).decode("utf-8", "replace")
        except OSError:
            os.close(fd)
            return None
        with self._lock:
            old = self._fds.pop(who, None)
            self._fds[who] = fd
            if old is not None:
                os.close(old)
            while len(self._fds) > self._limit:
                os.close(self._fds.popitem(last=False)[1])
        return text

    def close(self) -> None:
        with self._lock:
            for fd in self._fds.values():
                os.close(fd)
            self._fds.clear()
