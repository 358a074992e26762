"""supervise.rebind_in against real mount namespaces: binds locked into a user namespace
are covered, and a target the app replaced by a symlink (to a FIFO) is neither followed
nor waited on."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from guestfs.daemon.mountpoint import is_guestfs_mount
from guestfs.wrap import supervise
from guestfs.wrap.run import stop_process
from tests.support.fusemount import force_unmount, mounted, require_fuse, wait_for

pytestmark = pytest.mark.real


def head_in(pid: int, path: str = "/proc/meminfo") -> str:
    out = subprocess.run(["nsenter", "-t", str(pid), "-m", "head", "-c", "40", path],
                         capture_output=True, text=True, timeout=30)
    return out.stdout if out.returncode == 0 else f"error: {out.stderr.strip()}"


def own_ns(pid: int) -> bool:
    return os.readlink(f"/proc/{pid}/ns/mnt") != os.readlink("/proc/self/ns/mnt")


def test_binds_locked_in_a_user_namespace_are_covered(tmp_path):
    """An app whose binds were inherited by a user-namespaced mount namespace cannot have
    them unmounted (the kernel locks them); the new mount goes on top instead."""
    require_fuse()
    mp = str(tmp_path / "mnt")
    inner = (f"mount --bind {mp}/proc/meminfo /proc/meminfo && "
             "exec unshare --user --map-root-user --mount sleep 300")
    app = None
    try:
        with mounted(mp, "--memory-limit", "512Mi") as daemon:
            app = subprocess.Popen(["unshare", "--mount", "--propagation", "private",
                                    "sh", "-c", inner])
            assert wait_for(lambda: "sleep" in Path(f"/proc/{app.pid}/comm").read_text(), 10)
            assert wait_for(lambda: "524288" in head_in(app.pid), 10)
            daemon.kill()
            daemon.wait()
            assert "not connected" in head_in(app.pid)
        with mounted(mp, "--memory-limit", "256Mi"):
            supervise.rebind_in(app.pid, [(mp + "/proc/meminfo", "/proc/meminfo")])
            assert "262144" in head_in(app.pid)
    finally:
        if app is not None:
            app.kill()
            app.wait()
        force_unmount(mp)


def test_a_target_replaced_by_a_symlink_to_a_fifo_is_not_followed(tmp_path):
    require_fuse()
    mp = str(tmp_path / "mnt")
    fifo, target = tmp_path / "fifo", tmp_path / "target"
    os.mkfifo(fifo)
    target.symlink_to(fifo)
    app = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sleep", "300"])
    try:
        assert wait_for(lambda: own_ns(app.pid), 10)
        with mounted(mp, "--memory-limit", "512Mi"):
            errors: list[BaseException] = []

            def rebind() -> None:
                try:
                    supervise.rebind_in(app.pid, [(mp + "/proc/meminfo", str(target))])
                except BaseException as e:  # noqa: BLE001 - reported below
                    errors.append(e)

            worker = threading.Thread(target=rebind, daemon=True)
            worker.start()
            worker.join(30)
            assert not worker.is_alive(), "rebind blocked on the FIFO"
            assert errors == []
            # In the app's namespace the path itself now serves our file; the FIFO and
            # our own namespace are untouched.
            assert head_in(app.pid, str(target)).startswith("MemTotal:         524288 kB")
            assert target.is_symlink() and os.readlink(target) == str(fifo)
    finally:
        with contextlib.suppress(OSError):  # releases a rebind child blocked on the FIFO
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        app.kill()
        app.wait()
        force_unmount(mp)


def idle(pid: int) -> bool:
    """Every thread of ``pid`` is asleep, and its self-probe child is gone (its unmount
    watcher, ``_boot.py --unmount-watcher``, stays for life)."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
        states = [(t / "stat").read_text().rsplit(")", 1)[1].split()[0] for t in tasks]
        children = [c for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
                    if b"--unmount-watcher" not in
                    Path(f"/proc/{c}/cmdline").read_bytes().split(b"\0")]
    except OSError:
        return False
    return len(tasks) > 1 and set(states) == {"S"} and not children


@pytest.mark.parametrize("how", ["stop_daemon", "kill -TERM, then -CONT"])
def test_a_stopped_daemon_still_unmounts_when_stopped(tmp_path, how):
    """A daemon stopped with SIGSTOP still unmounts when it is ended, leaving no stale
    mount: stop_daemon sends its SIGTERM to the main thread, the one whose signal ends
    libfuse's loop; and the daemon blocks the stop signals in every other thread it
    starts, so a SIGTERM sent to the process (an operator's kill) cannot be taken by one
    of those once the daemon continues (each failed about 2 times in 3 before)."""
    require_fuse()
    mp = str(tmp_path / "mnt")
    os.makedirs(mp)
    proc = subprocess.Popen([sys.executable, "-m", "guestfs", "mount", mp],
                            stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: is_guestfs_mount(mp), 30)
        # An idle daemon (every thread asleep: its startup probe done) is where a SIGTERM
        # sent to the process was taken by a worker thread once it continued.
        assert wait_for(lambda: idle(proc.pid), 30)
        os.kill(proc.pid, signal.SIGSTOP)
        if how == "stop_daemon":
            supervise.stop_daemon(proc, timeout=20)
        else:
            os.kill(proc.pid, signal.SIGTERM)
            os.kill(proc.pid, signal.SIGCONT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(20)
        assert proc.returncode == 0  # a clean exit, not the SIGKILL after the timeout
        with open("/proc/self/mountinfo") as f:
            assert not any(line.split()[4] == mp for line in f)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)
        stop_process(proc)
        force_unmount(mp)
