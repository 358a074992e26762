"""Faults around `guestfs run`: what its app's readers see when the terminal sends Ctrl-C,
when run itself is killed -9, and when its small cgroup runs out of memory."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from guestfs.mountcmd import is_guestfs_mount
from tests.fusemount import force_unmount, require_fuse, wait_for

pytestmark = pytest.mark.real
GUESTFS = str(Path(sys.executable).parent / "guestfs")


@pytest.fixture
def mp() -> Iterator[Path]:
    """A mount point of our own under /tmp (mktemp): pytest's shared tmp_path may be renamed
    under us by other test sessions cleaning up, and a mount there could not be found."""
    d = Path(tempfile.mkdtemp(prefix="guestfs-run-test-"))
    try:
        yield d / "mnt"
    finally:
        force_unmount(str(d / "mnt"))
        shutil.rmtree(d, ignore_errors=True)


def kill_tree(procs: list[psutil.Process]) -> None:
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(procs, timeout=10)


@contextlib.contextmanager
def started_run(mp: Path, *cmd: str, opts: tuple[str, ...] = ()
                ) -> Iterator[subprocess.Popen[str]]:
    """`guestfs run` as the foreground job of a terminal would be: leader of its own process
    group. Everything it started is killed and its mount removed afterwards."""
    require_fuse()
    proc = subprocess.Popen([GUESTFS, "run", "--mountpoint", str(mp), *opts, "--", *cmd],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    seen: list[psutil.Process] = []
    try:
        assert wait_for(lambda: is_guestfs_mount(str(mp)) or proc.poll() is not None, 30)
        seen = psutil.Process(proc.pid).children(recursive=True)
        yield proc
    finally:
        with contextlib.suppress(psutil.Error):
            seen += psutil.Process(proc.pid).children(recursive=True)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        kill_tree(seen)  # first: a leftover daemon holds run's output pipes open
        proc.communicate(timeout=30)
        force_unmount(str(mp))


def daemon_of(run_pid: int) -> psutil.Process:
    kids = psutil.Process(run_pid).children()
    return next(p for p in kids if "mount" in p.cmdline())


def gone(p: psutil.Process) -> bool:
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# The app catches Ctrl-C and takes a while to shut down; the files must still be served then.
SLOW_SHUTDOWN = ("trap 'sleep 1; head -1 /proc/meminfo; exit 3' INT; "
                 "echo ready; while :; do sleep 0.1; done")


def test_ctrl_c_leaves_the_daemon_serving_until_the_app_has_exited(mp):
    with started_run(mp, "sh", "-c", SLOW_SHUTDOWN, opts=("--memory-limit", "256Mi")) as run:
        assert run.stdout is not None
        assert run.stdout.readline() == "ready\n"
        daemon = daemon_of(run.pid)
        os.killpg(run.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        out, err = run.communicate(timeout=60)
        assert run.returncode == 3, err
        assert "MemTotal:         262144 kB" in out, err
        assert wait_for(lambda: gone(daemon), 15)  # stopped once the app was done
        assert not is_guestfs_mount(str(mp))


def test_kill_9_of_run_takes_its_daemon_and_mount_with_it(mp):
    with started_run(mp, "sleep", "600") as run:
        assert is_guestfs_mount(str(mp))
        daemon = daemon_of(run.pid)
        os.kill(run.pid, signal.SIGKILL)
        run.wait(10)
        # Poll: the daemon notices, unmounts and exits on its own.
        assert wait_for(lambda: gone(daemon), 20), daemon.cmdline()
        assert wait_for(lambda: not os.path.ismount(mp), 10)
        assert not is_guestfs_mount(str(mp))

