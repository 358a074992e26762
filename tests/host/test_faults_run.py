"""Faults around `guestfs run`: what its app's readers see when the terminal sends Ctrl-C,
when run itself is killed -9, and when its small cgroup runs out of memory."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from guestfs.daemon.mountpoint import is_guestfs_mount
from guestfs.syscalls.guard import GUARD_NAME
from tests.support.fusemount import (
    force_unmount,
    is_guestfs_daemon,
    private_mountpoint,
    require_fuse,
    wait_for,
)
from tests.support.realcg import in_cgroup, v1_cgroup

pytestmark = pytest.mark.real
GUESTFS = str(Path(sys.executable).parent / "guestfs")


@pytest.fixture
def mp() -> Iterator[Path]:
    with private_mountpoint() as path:
        yield path
MiB = 1 << 20


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
        # Up once the daemon serves and the app is started (run's second child).
        assert wait_for(lambda: proc.poll() is not None or (
            is_guestfs_mount(str(mp)) and len(psutil.Process(proc.pid).children()) >= 2), 30)
        seen = psutil.Process(proc.pid).children(recursive=True)
        yield proc
    finally:
        with contextlib.suppress(psutil.Error):
            seen += psutil.Process(proc.pid).children(recursive=True)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        kill_tree(seen)  # first: a leftover daemon holds run's output pipes open
        # Processes started after the snapshot (found by their mountpoint) go too.
        kill_tree([p for p in psutil.process_iter(["cmdline"])
                   if str(mp) in " ".join(p.info["cmdline"] or [])])
        proc.wait(timeout=30)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()   # not read to EOF: a straggler may still hold its end
        force_unmount(str(mp))


def daemon_of(run_pid: int) -> psutil.Process:
    kids = psutil.Process(run_pid).children()
    return next(p for p in kids if is_guestfs_daemon(p.cmdline(), p.name()))


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


READS_FOREVER = "while :; do head -1 /proc/meminfo; sleep 0.1; done"


def test_kill_9_of_run_leaves_the_app_served_until_its_last_process_exits(mp):
    """run killed with -9 (or OOM-killed): the app lives on, and so do its files, for as
    long as any of its processes does (they hold the mount's users lock); then the daemon
    unmounts and exits on its own, leaving nothing behind. Before, the daemon went with
    run and the app read "Transport endpoint is not connected"."""
    with started_run(mp, "sh", "-c", READS_FOREVER, opts=("--memory-limit", "256Mi")) as run:
        assert run.stdout is not None
        assert run.stdout.readline() == "MemTotal:         262144 kB\n"
        daemon = daemon_of(run.pid)
        app = next(p for p in psutil.Process(run.pid).children() if p.name() == "sh")
        os.kill(run.pid, signal.SIGKILL)
        run.wait(10)
        time.sleep(2)                       # the daemon's users check runs every 0.25 s
        seen = [run.stdout.readline() for _ in range(10)]
        assert seen == ["MemTotal:         262144 kB\n"] * 10, seen
        assert daemon.is_running() and is_guestfs_mount(str(mp))
        app.kill()
        assert wait_for(lambda: gone(daemon), 20), daemon.cmdline()
        assert wait_for(lambda: not os.path.ismount(mp), 10)
        assert not is_guestfs_mount(str(mp))


SYSINFO_FOREVER = "while :; do getconf _PHYS_PAGES; sleep 0.1; done"


def test_kill_9_of_run_leaves_sysinfo_answered_from_the_apps_files(mp):
    """run killed with -9: its guard starts a successor that answers sysinfo(2) from the
    app's files, which still serve (glibc's _PHYS_PAGES is sysinfo's totalram). Calls made
    while it starts wait for it. Before, the guard passed every call to the kernel and
    the app saw the node's pages while its /proc/meminfo said 256 MiB. Once the app is
    gone, so are the successor and the guard."""
    pages = str(256 * MiB // os.sysconf("SC_PAGE_SIZE")) + "\n"
    with started_run(mp, "sh", "-c", SYSINFO_FOREVER, opts=("--memory-limit", "256Mi")) as run:
        assert run.stdout is not None
        assert run.stdout.readline() == pages
        app = next(p for p in psutil.Process(run.pid).children() if p.name() == "sh")
        os.kill(run.pid, signal.SIGKILL)
        run.wait(10)
        seen = [run.stdout.readline() for _ in range(30)]
        assert seen == [pages] * 30, seen

        def keepers() -> list[psutil.Process]:
            """run's guard (forked from run: named, with run's command line) and the
            successor it started."""
            return [p for p in psutil.process_iter(["cmdline", "name"])
                    if str(mp) in (c := " ".join(p.info["cmdline"] or []))
                    and ("--seccomp-successor" in c
                         or p.info["name"] == GUARD_NAME.decode())]

        assert len(keepers()) == 2     # the guard and its successor
        app.kill()
        assert wait_for(lambda: not keepers(), 20), keepers()


# Four app processes, each smaller than the daemon or run, together past 64 MiB: the kernel
# used to pick the daemon (the largest), then run, before any of them.
MANY_SMALL = ("for i in 1 2 3 4; do python3 -c 'import time; a = b\"x\" * (6 << 20); "
              "time.sleep(120)' & done; "
              "wait -n; echo first=$?; kill $(jobs -p); wait; head -1 /proc/meminfo")


def test_oom_in_a_64mib_cgroup_kills_the_app_not_the_daemon_or_run(mp):
    require_fuse()
    with v1_cgroup(64 * MiB, 100000, 100000) as cg:
        try:
            out = in_cgroup(cg, [GUESTFS, "run", "--mountpoint", str(mp), "--",
                                 "bash", "-c", MANY_SMALL])
        finally:
            force_unmount(str(mp))
        with open(os.path.join(cg.dirs["memory"], "memory.oom_control")) as f:
            oom_kills = int(f.read().split("oom_kill ")[1].split()[0])
    assert oom_kills >= 1  # a real OOM happened
    assert out.returncode == 0, out.stderr  # run lived to pass on the app's status
    lines = out.stdout.splitlines()
    assert lines[0] == "first=137", out.stdout  # an app process was the first one killed
    assert lines[-1] == "MemTotal:          65536 kB", out.stderr  # the daemon still serves


def test_run_on_a_per_container_mount_refuses_at_once_in_one_line():
    """A per-container mount has no MP/proc: run waited 30 s for one, then blamed an
    empty file."""
    from tests.support.fusemount import mounted

    with private_mountpoint() as mp, mounted(str(mp), "--per-container"):
        out = subprocess.run([GUESTFS, "run", "--mountpoint", str(mp), "--", "true"],
                             capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "is a per-container mount" in lines[0], out.stderr
