"""A `guestfs mount --hold` started (and restarted) by a test, whichever daemon serves it
found by its pid file (a successor writes it too), and every daemon, holder and mount of it
gone at cleanup."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from guestfs.fuse.holder import NAME as HOLDER_NAME
from tests.support.mounts import force_unmount, wait_for
from tests.support.procs import alive


def holders_of(mp: str) -> list[int]:
    """The holders of ``mp``'s connection: by their command line, or, in the first
    HOLDER_DELAY after the mount, by the name of the child that will become one (its
    command line is still its daemon's)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            named = Path(f"/proc/{pid}/comm").read_bytes().strip() == HOLDER_NAME
            if (b"--fuse-holder" in argv or named) and os.fsencode(mp) in argv:
                out.append(int(pid))
    return out


class HeldMount:
    def __init__(self, root: Path) -> None:
        self.args: list[str] = []       # the layout's options, for every start
        self.mp = str(root / "mnt")
        self.pid_file = str(root / "daemon.pid")
        self.lock_dir = str(root / "locks")
        self.log = str(root / "daemon.log")
        self.started: list[subprocess.Popen[bytes]] = []
        os.makedirs(self.mp)

    def start(self) -> subprocess.Popen[bytes]:
        with open(self.log, "ab") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "guestfs", "mount", self.mp, "--hold",
                 "--pid-file", self.pid_file, "--lock-dir", self.lock_dir, *self.args],
                stderr=err, start_new_session=True)
        self.started.append(proc)
        return proc

    def serving_pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError):
            pid = int(Path(self.pid_file).read_text())
            return pid if alive(pid) else None
        return None

    def cleanup(self) -> None:
        pid = self.serving_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            wait_for(lambda: not alive(pid), 10)
        for proc in self.started:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait()
        for pid in holders_of(self.mp):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        force_unmount(self.mp)


def kill_in_turn(m: HeldMount, kills: int) -> None:
    """``kills`` kill -9s of whichever daemon serves, every other one followed at once by
    a new `guestfs mount --hold` (what a restarted DaemonSet container runs)."""
    for i in range(kills):
        victim = m.serving_pid()
        assert victim is not None, Path(m.log).read_text()[-3000:]
        os.kill(victim, signal.SIGKILL)
        if i % 2 == 0:
            m.start()
        assert wait_for(lambda v=victim: m.serving_pid() not in (None, v), 15), \
            f"kill {i}: no successor\n" + Path(m.log).read_text()[-3000:]
        time.sleep(0.4)         # reads through the successor before the next kill
