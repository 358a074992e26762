"""`guestfs run` forks its first daemon and its seccomp guard rather than start new
interpreters (docs/run.md, "How `run` starts its daemon"): each is a process of its
own, named for ps, holding nothing of run's (its users lock above all, which would keep
the daemon from ever finding itself unused), and gone with the app. A process with
threads never forks them: it executes them as before."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from guestfs.daemon.daemon_status import read_status
from guestfs.syscalls.guard import GUARD_NAME, ListenerGuard
from guestfs.wrap.daemon_process import DAEMON_NAME, ForkedDaemon, RunError, fork_daemon
from tests.support.fusemount import private_mountpoint, require_fuse
from tests.support.mounts import force_unmount, wait_for
from tests.support.procs import alive

pytestmark = pytest.mark.real


@pytest.fixture
def mp() -> Iterator[Path]:
    with private_mountpoint() as path:
        yield path


@contextlib.contextmanager
def running(mp: Path) -> Iterator[psutil.Process]:
    """`guestfs run` with an app that waits for a file; everything killed at the end."""
    require_fuse()
    stop = mp.parent / "stop"
    proc = subprocess.Popen([sys.executable, "-m", "guestfs", "run", "--mountpoint", str(mp),
                             "--memory-limit", "256Mi", "--", "sh", "-c",
                             f"while [ ! -e {stop} ]; do sleep 0.05; done"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run = psutil.Process(proc.pid)
    try:
        yield run
    finally:
        stop.touch()
        try:
            proc.wait(30)
        finally:
            with contextlib.suppress(psutil.Error):
                for p in run.children(recursive=True):
                    p.kill()
            proc.kill()
            proc.wait()
            force_unmount(str(mp))


def named(run: psutil.Process, name: bytes) -> list[psutil.Process]:
    out = []
    for c in run.children():
        with contextlib.suppress(psutil.Error):
            if c.name() == name.decode() and c.status() != psutil.STATUS_ZOMBIE:
                out.append(c)
    return out


def fd_targets(pid: int) -> list[str]:
    out = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            out.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return out


def test_run_forks_its_daemon_and_guard_holding_nothing_of_runs(mp):
    with running(mp) as run:
        assert wait_for(lambda: len(named(run, DAEMON_NAME)) == 1
                        and len(named(run, GUARD_NAME)) == 1, 30)
        (daemon,), (guard,) = named(run, DAEMON_NAME), named(run, GUARD_NAME)
        # The mount's own record names the forked daemon as the one serving.
        assert read_status(str(mp))["pid"] == daemon.pid
        for p in (daemon, guard):
            assert os.getsid(p.pid) == p.pid                # a session of its own
            assert not [t for t in fd_targets(p.pid) if t.endswith(".users")], \
                fd_targets(p.pid)
        # The guard: /dev/null stdio, its socket, the app's listener once the app's child
        # has handed it over, nothing else.
        def guard_fds() -> list[str]:
            return sorted(t.split(":")[0] for t in fd_targets(guard.pid))

        wanted = sorted(["/dev/null"] * 3 + ["socket", "anon_inode"])
        assert wait_for(lambda: guard_fds() == wanted, 10), guard_fds()
        assert "seccomp" in " ".join(fd_targets(guard.pid))
    assert wait_for(lambda: not alive(daemon.pid) and not alive(guard.pid), 20)


def test_a_threaded_process_executes_the_guard_and_refuses_to_fork_a_daemon():
    stop = threading.Event()
    t = threading.Thread(target=stop.wait)
    t.start()
    try:
        guard = ListenerGuard.forked()
        try:
            cmdline = psutil.Process(guard.pid).cmdline()
            assert "--seccomp-guard" in cmdline, cmdline
        finally:
            guard.close()
        assert wait_for(lambda: not alive(guard.pid), 10)
        with pytest.raises(RunError):
            fork_daemon("/nonexistent", [], lambda argv: 0)
    finally:
        stop.set()
        t.join()


def test_forked_daemon_as_popen():
    """What run's supervisor asks of a daemon, for the forked one."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover
        os.execvp("sleep", ["sleep", "30"])
    d = ForkedDaemon(pid)
    try:
        assert d.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            d.wait(0.05)
        d.terminate()
        assert d.wait(10) == -15 and d.poll() == -15
        d.kill()                     # reaped: no signal goes to a pid reused meanwhile
    finally:
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.kill(pid, 9)
            os.waitpid(pid, 0)
