"""Faults around the daemon's privilege split: what readers see when the serving process
is interrupted or killed, and that its unmount watcher never outlives it."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys

import pytest

from guestfs.daemon.mountpoint import is_guestfs_mount
from tests.support.fusemount import force_unmount, mounted, require_fuse, wait_for

pytestmark = pytest.mark.real


def start_daemon(mp: str, log: str) -> subprocess.Popen[bytes]:
    """`guestfs mount` as the leader of its own process group (as from a terminal)."""
    require_fuse()
    os.makedirs(mp, exist_ok=True)
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "guestfs", "mount", mp], stderr=err,
                                start_new_session=True)
    if not wait_for(lambda: is_guestfs_mount(mp) or proc.poll() is not None):
        proc.kill()
        raise AssertionError("guestfs mount did not come up")
    return proc


def watcher_of(pid: int) -> int:
    """The daemon's unmount watcher: its one child running ``_boot.py --unmount-watcher``
    (the size probe's short-lived reader runs another command line)."""
    def cmdline(p: int | str) -> list[bytes]:
        try:
            with open(f"/proc/{p}/cmdline", "rb") as f:
                return f.read().split(b"\0")
        except FileNotFoundError:
            return []

    with open(f"/proc/{pid}/task/{pid}/children") as f:
        (child,) = (int(p) for p in f.read().split() if b"--unmount-watcher" in cmdline(p))
    return child


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_ctrl_c_to_the_process_group_still_unmounts(tmp_path):
    """SIGINT reaches the server and its watcher at once: the watcher ignores it and
    detaches the mount after the server's clean stop, then exits."""
    mp, log = str(tmp_path / "mnt"), str(tmp_path / "log")
    proc = start_daemon(mp, log)
    try:
        watcher = watcher_of(proc.pid)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        assert wait_for(lambda: gone(watcher), 10)
        with open("/proc/self/mountinfo") as f:
            assert mp not in f.read()
        assert os.listdir(mp) == []  # the plain directory again, no stale mount
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        force_unmount(mp)


def test_server_killed_readers_see_enotconn_watcher_exits_next_start_serves(tmp_path):
    """SIGKILL of the server: readers get ENOTCONN (the kernel's answer for a dead FUSE
    daemon), the watcher exits rather than linger, and the next mount on the same mount
    point detaches the stale one and serves again."""
    mp, log = str(tmp_path / "mnt"), str(tmp_path / "log")
    proc = start_daemon(mp, log)
    try:
        watcher = watcher_of(proc.pid)
        proc.kill()
        proc.wait()
        with pytest.raises(OSError) as e, open(f"{mp}/proc/meminfo") as f:
            f.read()
        assert e.value.errno == errno.ENOTCONN
        assert wait_for(lambda: gone(watcher), 10)
        with mounted(mp, log=str(tmp_path / "log2")), open(f"{mp}/proc/meminfo") as f:
            assert f.readline().startswith("MemTotal:")
    finally:
        force_unmount(mp)


def test_boot_and_selfexec_name_the_unmount_watcher_alike():
    """_boot.py spells the watcher's argument itself (it imports nothing of the package
    before it must); the daemon starts it with selfexec's."""
    from guestfs import _boot
    from guestfs.system import selfexec

    assert _boot.UNMOUNT_WATCHER == selfexec.UNMOUNT_WATCHER
