"""sysinfo(2) and sched_{get,set}affinity(2) answered from the served files, for the
process trees `guestfs run` starts and the containers `guestfs seccomp-agent` is handed.

The answers come from the same files the app reads (/proc/meminfo, /proc/loadavg,
/proc/uptime, /sys/devices/system/cpu/online), read through the mount, so `free`,
`uptime`, nproc and getconf can never disagree with one another.

Affinity under a CPU quota (docs/syscalls.md): sched_getaffinity(0) answers
the first N CPUs of the caller's real mask, N being the visible CPU count. What an app
then does with that mask decides the default:
- ``view`` (default): sched_setaffinity(0, <the mask it was told>) succeeds without
  changing anything. The save-and-restore pattern (OpenMP runtimes, taskset-like
  wrappers, libraries that set the mask they read) would otherwise pin every quota-limited
  container on a node to the same first CPUs, all competing for CPU 0..N-1 while the rest
  idle; the quota already bounds the CPU time. Any other mask is applied for real.
- ``pin``: setaffinity is not intercepted, so setting the told mask pins for real.
- ``host``: affinity is not intercepted: nproc counts the allowed CPUs, as without guestfs.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import math
import os
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from guestfs.render.sysinfo import (
    SysinfoView,
    ViewTextError,
    cpu_count_of,
    first_cpus,
    pack_sysinfo,
    parse_view,
    same_cpus,
)
from guestfs.sources.host_root import pread_path
from guestfs.syscalls.filter import (
    Arch,
    Interception,
    SeccompUnavailable,
    install_listener,
    this_arch,
)
from guestfs.syscalls.guard import ListenerGuard
from guestfs.syscalls.notify import (
    CONTINUE,
    EFAULT,
    Answer,
    CallerMemory,
    Handler,
    ListenerLoop,
    Notification,
    Served,
)
from guestfs.system import libc
from guestfs.system.oneline import os_error_line

log = logging.getLogger("guestfs.seccomp")

VIEW_FILES = ("/proc/meminfo", "/proc/loadavg", "/proc/uptime",
              "/sys/devices/system/cpu/online")
REFRESH_AFTER = 0.25      # seconds a read view is answered from without re-reading
REFRESH_WAIT = 0.2        # longest a call waits for a re-read (a stopped daemon hangs it)
_MAX_MASK = 8192          # bytes; the kernel copies at most cpumask_size() (<= 1 KiB)


def interception_for(sysinfo: bool, affinity: str) -> Interception:
    return Interception(sysinfo=sysinfo, getaffinity=affinity != "host",
                        setaffinity=affinity == "view")


@dataclass(frozen=True)
class _Read:
    sysinfo: SysinfoView
    cpus: int
    at: float           # time.monotonic() of the read


class ServedView:
    """The served files, re-read at most every REFRESH_AFTER seconds. A read that takes
    longer than REFRESH_WAIT (a stopped daemon) finishes in the background while calls
    are answered from the last good read; with no good read at all the kernel answers."""

    def __init__(self, read_texts: Callable[[], dict[str, str]],
                 wait: float = REFRESH_WAIT) -> None:
        self._read_texts = read_texts
        self._wait = wait       # the seccomp agent's one loop serves many: it waits less
        self._failing = ""      # the last failure logged: a missing view is logged once
        self._last: _Read | None = None
        self._lock = threading.Lock()
        self._reading: threading.Thread | None = None

    def _refresh(self) -> None:
        try:
            t = self._read_texts()
            read = _Read(parse_view(t["/proc/meminfo"], t["/proc/loadavg"],
                                    t["/proc/uptime"]),
                         cpu_count_of(t["/sys/devices/system/cpu/online"]), time.monotonic())
        except (OSError, KeyError, ViewTextError) as e:
            if str(e) != self._failing:
                log.warning("reading the served view for sysinfo: %s", e)
                self._failing = str(e)
            return
        if self._failing:
            log.info("the served view reads again")
            self._failing = ""
        self._last = read

    def current(self, wait: float | None = None) -> _Read | None:
        last = self._last
        if last is not None and time.monotonic() - last.at < REFRESH_AFTER:
            return last
        with self._lock:
            if self._reading is None or not self._reading.is_alive():
                self._reading = threading.Thread(target=self._refresh, daemon=True,
                                                 name="guestfs-sysinfo-read")
                self._reading.start()
            reading = self._reading
        reading.join(self._wait if wait is None else wait)
        return self._last


def texts_under(mp: str) -> Callable[[], dict[str, str]]:
    """The view's files as served at mountpoint ``mp`` (read with pread, which every FUSE
    client forwards)."""
    def read() -> dict[str, str]:
        return {path: pread_path(mp + path).decode("ascii", "replace") for path in VIEW_FILES}
    return read




def _real_affinity(arch: Arch, tid: int, length: int) -> bytes | None:
    """The kernel's own answer for ``tid`` with buffer ``length``: the bytes it would copy
    out, or None where it would fail (then it answers itself, with its errno)."""
    buf = ctypes.create_string_buffer(min(length, _MAX_MASK))
    n = libc.syscall(ctypes.c_long(arch.sched_getaffinity), ctypes.c_long(tid),
                      ctypes.c_long(len(buf)), buf)
    return None if n < 0 else buf.raw[:n]


def _mask_args(note: Notification) -> tuple[int, int]:
    return note.args[1] & 0xFFFFFFFF, note.args[2]     # unsigned int len, mask pointer


def make_handlers(arch: Arch, view: ServedView, what: Interception) -> dict[int, Handler]:
    packed: list = [None, -1, b""]       # the read, its uptime second, the struct

    def sysinfo(note: Notification, mem: CallerMemory) -> Answer:
        read = view.current()
        if read is None:
            return CONTINUE
        # Packed once per read and uptime second (the kernel's uptime has whole seconds).
        elapsed = time.monotonic() - read.at
        second = math.ceil(read.sysinfo.uptime + elapsed)
        if packed[0] is not read or packed[1] != second:
            packed[:] = read, second, pack_sysinfo(read.sysinfo, elapsed)
        data = packed[2]
        # Not writable at the copy: EFAULT, what the kernel's copy_to_user gives.
        return Answer(0) if mem.write(note.args[0], data) else EFAULT

    def told_mask(note: Notification, length: int) -> tuple[bytes, bytes] | None:
        read = view.current()
        real = _real_affinity(arch, note.pid, length)
        if read is None or real is None:
            return None
        return real, first_cpus(real, read.cpus)

    def getaffinity(note: Notification, mem: CallerMemory) -> Answer:
        length, addr = _mask_args(note)
        masks = told_mask(note, length)
        if masks is None or masks[0] == masks[1]:
            return CONTINUE                # an error to give, or nothing to hide
        told = masks[1]
        return Answer(len(told)) if mem.write(addr, told) else EFAULT

    def setaffinity(note: Notification, mem: CallerMemory) -> Answer:
        length, addr = _mask_args(note)
        if not 0 < length <= _MAX_MASK:
            return CONTINUE
        masks = told_mask(note, _MAX_MASK)
        if masks is None or masks[0] == masks[1]:
            return CONTINUE
        try:
            wanted = mem.read(addr, length)
        except OSError:
            return CONTINUE                # the kernel's EFAULT
        # Setting back the mask it was told keeps the real, wider one (module docstring).
        return Answer(0) if same_cpus(wanted, masks[1]) else CONTINUE

    handlers: dict[int, Handler] = {}
    if what.sysinfo:
        handlers[arch.sysinfo] = sysinfo
    if what.getaffinity:
        handlers[arch.sched_getaffinity] = getaffinity
    if what.setaffinity:
        handlers[arch.sched_setaffinity] = setaffinity
    return handlers


# --------------------------------------------------------------- handing over the listener

def hand_over_listener(sock: socket.socket, what: Interception, guard: ListenerGuard) -> None:
    """In the app's child, while it still holds CAP_SYS_ADMIN: install the filter, give the
    guard its copy, and send the listener to the supervisor (or the reason there is
    none). The guard's copy first: a supervisor killed before it has received the
    listener would otherwise leave the app's calls failing with ENOSYS."""
    try:
        fd = install_listener(what)
    except SeccompUnavailable as e:
        sock.sendall(f"no:{e.strerror}".encode())
        return
    try:
        guard.add(fd)
        socket.send_fds(sock, [b"ok"], [fd])
    finally:
        os.close(fd)
        sock.close()


def take_listener(sock: socket.socket, timeout: float = 10.0) -> int | None:
    """In the supervisor: the listener the child sent, or None (with the reason logged)."""
    try:
        if not select.select([sock], [], [], timeout)[0]:
            log.warning("the app's seccomp listener did not arrive in %gs", timeout)
            return None
        msg, fds, _flags, _addr = socket.recv_fds(sock, 256, 1)
    except OSError as e:
        log.warning("receiving the app's seccomp listener: %s", os_error_line(e))
        return None
    finally:
        sock.close()
    if not fds:
        if msg.startswith(b"no:"):
            log.warning("sysinfo and the CPU count are not answered for the app: %s",
                        msg[3:].decode(errors="replace"))
        return None
    os.set_inheritable(fds[0], False)
    return fds[0]


class SyscallSupervisor:
    """The notification loop: a thread of the `guestfs run` process, never the FUSE
    daemon. Its guard already holds the listener (hand_over_listener)."""

    def __init__(self, listener: int, handlers: dict[int, Handler],
                 guard: ListenerGuard) -> None:
        self.listener = listener
        self.guard = guard
        self.loop = ListenerLoop(until_empty=True).start()
        # The listener stays ours (stop() closes it): nothing to do when it hangs up.
        self.loop.add(Served(listener, handlers, "the app's listener",
                             on_gone=lambda _served: None))

    def stop(self) -> None:
        self.loop.stop()
        self.guard.close()          # the guard takes over any orphaned descendant
        with contextlib.suppress(OSError):
            os.close(self.listener)


def supervise_listener(listener: int, view: ServedView, what: Interception,
                       guard: ListenerGuard) -> SyscallSupervisor | None:
    arch = this_arch()
    if arch is None:
        os.close(listener)
        return None
    return SyscallSupervisor(listener, make_handlers(arch, view, what), guard)
