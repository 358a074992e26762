"""`guestfs run -- CMD`: CMD in a private mount namespace with the served files bound
over their /proc and /sys counterparts; the filesystem is mounted first, or reused."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys

from guestfs import sysmount
from guestfs.mountcmd import is_guestfs_mount, wait_mounted
from guestfs.view import SERVED_FILES

log = logging.getLogger("guestfs.run")
DEFAULT_MOUNTPOINT = "/run/guestfs"
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2, signal.SIGWINCH)


class RunError(RuntimeError):
    pass


def start_daemon(mp: str, mount_args: list[str]) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-m", "guestfs", "mount", mp, *mount_args])
    if not wait_mounted(mp, None, 20.0) or proc.poll() is not None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        proc.wait()
        raise RunError(f"guestfs mount {mp} did not come up")
    return proc


def stop_process(proc: subprocess.Popen, timeout: float = 10.0) -> None:  # type: ignore[type-arg]
    """SIGTERM (a guestfs daemon unmounts on it), then SIGKILL after ``timeout``."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def binds_for(mp: str) -> list[tuple[str, str]]:
    # A kernel without PSI has no /proc/pressure: nothing to cover there.
    return [(mp + f, f) for f in SERVED_FILES if os.path.exists(f)]


def _child(binds: list[tuple[str, str]], cmd: list[str]) -> None:
    try:
        sysmount.unshare_mount_namespace()
        for src, dst in binds:
            sysmount.bind(src, dst)
        os.execvp(cmd[0], cmd)
    except OSError as e:
        print(f"guestfs run: {cmd[0]}: {e}", file=sys.stderr)
        os._exit(127)


def run(mp: str, cmd: list[str], mount_args: list[str]) -> int:
    mp = os.path.abspath(mp)
    daemon = None
    if not is_guestfs_mount(mp):
        daemon = start_daemon(mp, mount_args)
    try:
        binds = binds_for(mp)
        pid = os.fork()
        if pid == 0:
            _child(binds, cmd)
        for sig in FORWARDED:
            signal.signal(sig, lambda s, _f: os.kill(pid, s))
        _, status = os.waitpid(pid, 0)
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)
        rc = os.waitstatus_to_exitcode(status)
        return 128 - rc if rc < 0 else rc
    finally:
        if daemon is not None:
            stop_process(daemon)
