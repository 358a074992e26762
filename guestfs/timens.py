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

from guestfs.hostroot import HostRoot

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


def enter_container_boottime(age: float, boottime_now: float) -> None:
    """Make the children and the next exec of this process see CLOCK_BOOTTIME = ``age``
    now (``boottime_now``: this namespace's CLOCK_BOOTTIME, read at the same moment).
    Raises OSError where time namespaces are missing or refused (kernel < 5.6, no
    CAP_SYS_ADMIN, a seccomp filter)."""
    offset = age - boottime_now          # negative: the container booted after the host
    if offset > 0:
        offset = 0.0                     # an age past the host's uptime is no age
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWTIME) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare(CLONE_NEWTIME): {os.strerror(err)}")
    sec = int(offset // 1)
    nsec = int(round((offset - sec) * 1e9))
    if nsec >= 1_000_000_000:
        sec, nsec = sec + 1, 0
    # Written before any process enters the namespace, as the kernel requires.
    fd = os.open("/proc/self/timens_offsets", os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.write(fd, f"boottime {sec} {nsec}\n".encode())
    finally:
        os.close(fd)
