"""PSI triggers on the served pressure files: the kernel's API (Documentation/accounting/
psi.rst) and LXCFS 7.0's, through guestfs's FUSE engine.

A reader opens MP/proc/pressure/<resource> for writing, writes a trigger ("some 150000
1000000") and polls for POLLPRI. The daemon opens the file that reader's rendering comes
from (its cgroup's <resource>.pressure, or the host's /proc/pressure/<resource> where
the view serves that: sources.usage.pressure_level), writes the trigger there and
watches that descriptor with one epoll. When it fires, the open file is marked and the
kernel's FUSE client woken (FUSE_NOTIFY_POLL); its next POLL is answered POLLPRI once, as
the kernel answers, since psi_trigger_poll consumes the event it reports. The trigger
lives as long as the reader's open file: its RELEASE closes the daemon's descriptor, which
destroys it in the kernel.

What the kernel refuses is the reader's answer: EINVAL for a malformed trigger or, for a
daemon without CAP_SYS_RESOURCE (it drops it), a window that is not a multiple of 2 s
(Linux >= 6.5); EBUSY for a second trigger on one open file. At most ``limit`` trigger
files are open at once, and ``per_view`` for the readers of one view, whatever readers
ask (EMFILE past either): each pins kernel memory, and one container must not take them
all.

A held mount's triggers outlive the daemon (docs/mount.md, "Takeover"): the holder is
given each trigger file's descriptor (which keeps the kernel's trigger) and its state at
every change (``keeper``), and a successor adopts them before it serves, so a reader
polling through a daemon's death sees its events and never a POLLERR. An event that
fires in the instant of the death may be reported twice, or lost if the dead daemon had
taken it from the kernel and not yet told the reader's poll.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import select
import stat
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from guestfs.fuse.abi import DEFAULT_POLLMASK, POLLERR, POLLPRI
from guestfs.sources.host_root import HostRoot
from guestfs.sources.reader_root import open_dir
from guestfs.sources.snapshot import Level
from guestfs.system import sysmount

log = logging.getLogger("guestfs.psi")

LIMIT = 256
PER_VIEW = 32
# What poll reports for a pressure file without a trigger (psi_trigger_poll's answer).
NO_TRIGGER = DEFAULT_POLLMASK | POLLERR | POLLPRI
_OPEN_FLAGS = os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass
class _Trigger:
    fd: int
    owner: str              # the view whose reader opened it (its per_view share)
    armed: bool = False     # a trigger was written: watched
    fired: bool = False     # fired since the last POLL that was told so
    gone: bool = False      # the source reports POLLERR (its cgroup was removed)
    kh: int | None = None   # the kernel's handle of the open file, once it polls


class Keeper(Protocol):
    """Where a held mount's trigger states go (held.Lease): never blocks."""

    def keep(self, fh: int, record: bytes, fd: int | None = None) -> bool: ...

    def drop(self, fh: int) -> bool: ...


def _record(t: _Trigger) -> bytes:
    return json.dumps({"owner": t.owner, "armed": t.armed, "fired": t.fired,
                       "gone": t.gone, "kh": t.kh}, separators=(",", ":")).encode()


def _from_record(fd: int, record: bytes) -> _Trigger:
    """A kept trigger's state; ValueError for a record that is not one."""
    try:
        r = json.loads(record)
        kh = r["kh"]
        t = _Trigger(fd, str(r["owner"]), r["armed"] is True, r["fired"] is True,
                     r["gone"] is True, kh if isinstance(kh, int) else None)
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"not a kept trigger: {e}") from None
    return t


class Triggers:
    """The triggered open files by FUSE handle. ``wake(kh)`` sends FUSE_NOTIFY_POLL;
    ``keeper`` (a held mount's) is told every trigger's state as it changes."""

    def __init__(self, wake: Callable[[int], int], limit: int = LIMIT,
                 per_view: int = PER_VIEW, keeper: Keeper | None = None) -> None:
        self._wake, self.limit, self.per_view = wake, limit, per_view
        self._keeper = keeper
        self._by_fh: dict[int, _Trigger] = {}
        self._owned: Counter[str] = Counter()
        self._fds: dict[int, int] = {}        # source fd -> handle, while armed
        self._lock = threading.Lock()
        self._epoll: select.epoll | None = None
        self._stop_r, self._stop_w = -1, -1
        self._thread: threading.Thread | None = None
        # Shown in the status file.
        self.counts: Counter[str] = Counter(opened=0, released=0, armed=0, fired=0,
                                            refused=0, gone=0, adopted=0, untold=0)

    def __len__(self) -> int:
        return len(self._by_fh)

    def __contains__(self, fh: int) -> bool:
        return fh in self._by_fh

    def add(self, fh: int, fd: int, owner: str) -> None:
        """Keep ``fd`` (the source, opened for writing) for handle ``fh``, opened by a
        reader of view ``owner``; closed and EMFILE past a limit."""
        with self._lock:
            full = len(self._by_fh) >= self.limit or self._owned[owner] >= self.per_view
            if full:
                os.close(fd)
                self.counts["refused"] += 1
                raise OSError(errno.EMFILE, "too many PSI trigger files open")
            self._by_fh[fh] = t = _Trigger(fd, owner)
            self._owned[owner] += 1
            self.counts["opened"] += 1
            # Before the OPEN is answered: a death after it leaves the holder a trigger
            # the kernel may never release (bounded by per_view), never a reader's
            # trigger that no successor knows.
            self._tell(fh, t, fd)

    def _tell(self, fh: int, t: _Trigger, fd: int | None = None) -> None:
        """The keeper told ``t``'s state (called holding _lock: in the order it changed)."""
        if self._keeper is not None and not self._keeper.keep(fh, _record(t), fd):
            self.counts["untold"] += 1

    def adopt(self, kept: list[tuple[int, bytes, int]]) -> None:
        """A successor's start: the triggers its predecessor left with the holder
        (handle, record, descriptor), each as it was, watched again if armed, and every
        poller they had woken once, to ask again what its file reports (an event fired
        meanwhile, or while the predecessor died, is there)."""
        wake = []
        with self._lock:
            for fh, record, fd in kept:
                try:
                    t = _from_record(fd, record)
                except ValueError as e:
                    log.warning("a kept PSI trigger dropped: %s", e)
                    os.close(fd)
                    continue
                if fh in self._by_fh or len(self._by_fh) >= self.limit:
                    os.close(fd)
                    continue
                self._by_fh[fh] = t
                self._owned[t.owner] += 1
                self.counts["adopted"] += 1
                if t.armed and not t.gone:
                    self._ensure_thread().register(fd, select.EPOLLPRI | select.EPOLLET)
                    self._fds[fd] = fh
                if t.kh is not None:
                    wake.append(t.kh)
        for kh in wake:
            self._wake(kh)

    def write(self, fh: int, data: bytes) -> int:
        """The trigger written to the source; watched from then on."""
        t = self._by_fh.get(fh)
        if t is None:
            raise OSError(errno.EBADF, "not a trigger file")
        n = os.write(t.fd, data)
        with self._lock:
            if not t.armed and self._by_fh.get(fh) is t:
                # Only once armed (before its trigger a PSI file polls POLLERR), and
                # edge-triggered: each firing wakes the file's queue once, and a state
                # that stays (the POLLERR of a removed cgroup's file) is not reported
                # at every wait.
                self._ensure_thread().register(t.fd, select.EPOLLPRI | select.EPOLLET)
                self._fds[t.fd] = fh
                t.armed = True
                self.counts["armed"] += 1
                self._tell(fh, t)
        return n

    def poll(self, fh: int, kh: int | None) -> int:
        """What a POLL of handle ``fh`` is answered; ``kh`` is woken when that changes."""
        with self._lock:
            t = self._by_fh.get(fh)
            if t is None:
                return NO_TRIGGER
            told = kh is not None and kh != t.kh
            if told:
                t.kh = kh
            if not t.armed or t.gone:
                answer = NO_TRIGGER
            elif t.fired:
                t.fired, told = False, True
                answer = DEFAULT_POLLMASK | POLLPRI
            else:
                answer = DEFAULT_POLLMASK
            if told:
                self._tell(fh, t)
            return answer

    def release(self, fh: int) -> None:
        with self._lock:
            t = self._by_fh.pop(fh, None)
            if t is None:
                return
            # Before the RELEASE is answered (add says why).
            if self._keeper is not None and not self._keeper.drop(fh):
                self.counts["untold"] += 1
            self._fds.pop(t.fd, None)
            self.counts["released"] += 1
            self._owned[t.owner] -= 1
            if self._owned[t.owner] <= 0:
                del self._owned[t.owner]
        os.close(t.fd)   # drops the epoll registration and destroys the kernel's trigger

    def stop(self) -> None:
        with self._lock:
            triggers, self._by_fh = list(self._by_fh.values()), {}
            self._fds.clear()
            self._owned.clear()
        for t in triggers:
            with contextlib.suppress(OSError):
                os.close(t.fd)
        w, self._stop_w = self._stop_w, -1    # once: the thread closes it
        if w >= 0:
            os.write(w, b"x")
        if self._thread is not None:
            self._thread.join(1.0)

    # ------------------------------------------------------------ the watcher

    def _ensure_thread(self) -> select.epoll:
        """The epoll and its thread, made at the first trigger (called holding _lock)."""
        if self._epoll is None:
            self._epoll = select.epoll()
            self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC)
            self._epoll.register(self._stop_r, select.EPOLLIN)
            self._thread = threading.Thread(target=self._loop, name="guestfs-psi",
                                            daemon=True)
            self._thread.start()
        return self._epoll

    def _loop(self) -> None:
        assert self._epoll is not None
        stop_r, stop_w = self._stop_r, self._stop_w
        while True:
            try:
                events = self._epoll.poll()
            except InterruptedError:
                continue
            wake: list[int] = []
            with self._lock:
                for fd, ev in events:
                    if fd == stop_r:
                        self._epoll.close()
                        os.close(stop_r)
                        os.close(stop_w)
                        return
                    t = self._by_fh.get(self._fds.get(fd, -1))
                    if t is None or t.fd != fd:
                        continue
                    if ev & select.EPOLLERR:
                        # The source is gone (or PSI was turned off): it would be
                        # reported again at every wait.
                        with contextlib.suppress(OSError):
                            self._epoll.unregister(fd)
                        t.gone = True
                        self.counts["gone"] += 1
                    elif ev & select.EPOLLPRI:
                        t.fired = True
                        self.counts["fired"] += 1
                    self._tell(self._fds[fd], t)
                    if t.kh is not None:
                        wake.append(t.kh)
            for kh in wake:
                self._wake(kh)


def open_source(host: HostRoot, pins: Mapping[str, int], level: Level | None,
                resource: str) -> int:
    """The file a trigger for ``resource`` is written to, opened for writing without
    following a symlink: ``level``'s <resource>.pressure, or (None) the host's
    /proc/pressure/<resource>, reopened from the daemon's pinned descriptor (never
    through its own mount). Raises OSError."""
    if level is None:
        pin = pins.get(f"/proc/pressure/{resource}")
        if pin is None:
            raise OSError(errno.ENOENT, f"no /proc/pressure/{resource} on this host")
        return os.open(f"/proc/self/fd/{pin}", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    name = f"{resource}.pressure"
    dfd = open_dir(host, level.anchor, level.directory) if level.anchor is not None \
        else sysmount.open_nofollow(host.path(level.directory))
    try:
        fd = os.open(name, _OPEN_FLAGS, dir_fd=dfd)
        st, dst = os.fstat(fd), os.fstat(dfd)
        if not stat.S_ISREG(st.st_mode) or st.st_dev != dst.st_dev:
            os.close(fd)
            raise OSError(errno.EINVAL, f"{level.file_path(name)}: not a cgroup file")
        return fd
    finally:
        os.close(dfd)
