"""Starting guestfs's own code in a new process, the way the installed command runs: our
interpreter by absolute path, isolated (-I), on the package's own files by absolute path.
Never ``python -m guestfs``, which imports whatever ``guestfs`` the working directory holds."""

from __future__ import annotations

import os
import sys

BOOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_boot.py")


# _boot.py's first argument for the daemon's unmount watcher (spelled out there too:
# _boot.py imports nothing of the package before it has to).
UNMOUNT_WATCHER = "--unmount-watcher"
SECCOMP_GUARD = "--seccomp-guard"
SECCOMP_KEEPER = "--seccomp-keeper"
SECCOMP_SUCCESSOR = "--seccomp-successor"
THEN_ANSWER = "--then-answer"   # SECCOMP_GUARD FD --then-answer MOUNTPOINT CALLS
FUSE_HOLDER = "--fuse-holder"   # CTL FUSE LOCK MOUNTPOINT SOCKET -- ARGV (fuse/holder.py)
FUSE_HOLDER_STANDALONE = "--fuse-holder-standalone"   # LOCK_DIR [SECONDS]


class SelfExecError(RuntimeError):
    pass


def interpreter() -> str:
    exe = sys.executable
    if not exe or not os.path.isabs(exe):
        raise SelfExecError(f"cannot tell which Python runs guestfs (sys.executable={exe!r})")
    return exe


def guestfs_argv(args: list[str]) -> list[str]:
    """The command line that runs ``guestfs ARGS`` with this very package."""
    return [interpreter(), "-I", BOOT, *args]


def helper_argv(mode: str, *args: str) -> list[str]:
    """A small helper of _boot.py's (UNMOUNT_WATCHER, SECCOMP_GUARD, SECCOMP_KEEPER,
    SECCOMP_SUCCESSOR): without site (-S), so it waits with little more than the
    interpreter in memory."""
    return [interpreter(), "-I", "-S", BOOT, mode, *args]

