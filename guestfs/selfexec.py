"""Starting guestfs's own code in a new process, the way the installed command runs: our
interpreter by absolute path, isolated (-I), on the package's own files by absolute path.
Never ``python -m guestfs``, which imports whatever ``guestfs`` the working directory holds."""

from __future__ import annotations

import os
import sys

BOOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_boot.py")
_lifeline: tuple[int, int] | None = None


class SelfExecError(RuntimeError):
    pass


def interpreter() -> str:
    exe = sys.executable
    if not exe or not os.path.isabs(exe):
        raise SelfExecError(f"cannot tell which Python runs guestfs (sys.executable={exe!r})")
    return exe


def guestfs_argv(args: list[str], exit_with_fd: int | None = None) -> list[str]:
    """The command line that runs ``guestfs ARGS`` with this very package."""
    watch = ["--exit-with-fd", str(exit_with_fd)] if exit_with_fd is not None else []
    return [interpreter(), "-I", BOOT, *watch, *args]


def lifeline_fd() -> int:
    """The read end of a pipe whose write end only this process holds (both ends are
    close-on-exec, so the commands we exec do not keep it): a child given this fd sees end
    of file when we are gone, however we died. One pipe serves every child."""
    global _lifeline
    if _lifeline is None:
        _lifeline = os.pipe()
    return _lifeline[0]
