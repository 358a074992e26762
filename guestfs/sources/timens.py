"""The container's own boot clock: a time namespace whose CLOCK_BOOTTIME starts when the
container did, for the app `guestfs run` starts.

Why: /proc/uptime served as the container's age while /proc/<pid>/stat start times stay
counted from the host's boot makes `ps -o etime` (uptime − start) negative and print
garbage such as `441077233-19:06:40`; `pgrep --older` and `killall -o` go wrong the same
way. In a time namespace the kernel shifts both the start times and its own /proc/uptime
and /proc/stat btime by the offset, so everything agrees. A reader in such a namespace
must get the same shifted btime from our /proc/stat: ``read_boottime_offset``.
"""

from __future__ import annotations

import ctypes
import os

from guestfs.sources.host_root import HostRoot
from guestfs.system import libc

CLONE_NEWTIME = 0x80


def parse_boottime_offset(text: str) -> float:
    """Seconds of the ``boottime`` line of /proc/<pid>/timens_offsets (0 when absent)."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] in ("boottime", "7"):   # 7: CLOCK_BOOTTIME
            return int(parts[1]) + int(parts[2]) / 1e9
    return 0.0


def read_boottime_offset(host: HostRoot, pid: int) -> float:
    """The boottime offset of ``pid``'s time namespace; 0 for the host's, for a kernel
    without time namespaces, or a pid we cannot see."""
    if pid <= 0:
        return 0.0
    text = host.try_read_text(f"/proc/{pid}/timens_offsets")
    if not text:
        return 0.0
    try:
        return parse_boottime_offset(text)
    except ValueError:
        return 0.0


def _setns_time(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, CLONE_NEWTIME) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


def _offsets(offset: float) -> str:
    sec = int(offset // 1)
    nsec = int(round((offset - sec) * 1e9))
    if nsec >= 1_000_000_000:
        sec, nsec = sec + 1, 0
    return f"boottime {sec} {nsec}\n"


def enter_container_boottime(age: float, boottime_now: float) -> None:
    """Put this (single-threaded) process in a new time namespace whose CLOCK_BOOTTIME is
    ``age`` now (``boottime_now``: the current namespace's CLOCK_BOOTTIME, read at the same
    moment); what it execs and forks stays there. Raises OSError where time namespaces are
    missing or refused (kernel < 5.6, no CAP_SYS_ADMIN, a seccomp filter), leaving the
    process as it was."""
    offset = min(0.0, age - boottime_now)   # negative: the container booted after the host
    original = os.open("/proc/self/ns/time", os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.unshare(CLONE_NEWTIME) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"unshare(CLONE_NEWTIME): {os.strerror(err)}")
        try:
            # Written before any process enters the namespace, as the kernel requires.
            fd = os.open("/proc/self/timens_offsets",
                         os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.write(fd, _offsets(offset).encode())
            finally:
                os.close(fd)
            # Entered now, not at exec: kernels before 6.x do not switch at exec, and a
            # process whose own time namespace is not the one its children get cannot
            # vfork (EINVAL; dash then says "Cannot fork" for every command).
            _setns_time("/proc/self/ns/time_for_children")
        except OSError:
            # Back to the old namespace for ourselves and our children alike.
            if libc.setns(original, CLONE_NEWTIME) != 0:
                raise OSError(ctypes.get_errno(), "cannot return to the host's time "
                                                  "namespace after a failed switch") from None
            raise
    finally:
        os.close(original)
