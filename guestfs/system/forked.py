"""The child of a fork that goes on running guestfs code in its parent's interpreter
(`guestfs run`'s first daemon and its seccomp guard): a process of its own with nothing
of the parent's but what it is given, and a name that says what it is.

Forked, not executed, to spare the app's start-up a new interpreter and imports the
parent has done already; only from a single-threaded parent (a child of a threaded one
may inherit a lock another thread held), which callers check with single_threaded().
"""

from __future__ import annotations

import gc
import os

from guestfs.system import libc

_PR_SET_NAME = 15


def single_threaded() -> bool:
    """One thread in this process, libfuse's and ctypes' included (the kernel's count,
    not Python's): a fork then runs Python safely (no lock held by a thread the child
    would not have)."""
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


def fork() -> int:
    """os.fork() after gc.freeze(): what both processes have from before the fork is never
    visited by either's collector again, so neither copies the pages it sits on (a
    collection writes to every object it visits; those copies cost each fork of `guestfs
    run` and its daemon milliseconds of CPU at the app's start)."""
    gc.freeze()
    return os.fork()


def cut_off(keep: tuple[int, ...], devnull_stdio: bool) -> None:
    """In the child: a new session (the terminal's signals and a kill of the parent's
    process group are not for it), every descriptor closed but stdio and ``keep`` (a lock
    the parent holds, its users lock above all, must not outlive it here), stdio on
    /dev/null with ``devnull_stdio``."""
    os.setsid()
    if devnull_stdio:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))


def name_process(name: bytes) -> None:
    """/proc/PID/comm (`ps -o comm`, `pgrep -x`): a forked child's command line stays its
    parent's, which only CAP_SYS_RESOURCE could change."""
    libc.prctl_name(_PR_SET_NAME, name[:15], 0, 0, 0)
