"""kill -9 of a daemon right after its mount appears: the process must die and the mount
must be replaceable. The daemon probes its own mount at start; when a thread of the daemon
itself was blocked in that FUSE request, kill -9 left an unkillable process behind."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile

import pytest

from guestfs.daemon.mountpoint import is_guestfs_mount
from tests.support.fusemount import force_unmount, require_fuse, wait_for

pytestmark = pytest.mark.real


def abort_fuse_connections_of(mp: str) -> None:
    """Last resort so a failing run does not hang: abort the mount's FUSE connection."""
    with contextlib.suppress(OSError, subprocess.SubprocessError, StopIteration):
        # From the mount table: a stat() of a wedged mount would hang too.
        with open("/proc/self/mountinfo") as f:
            minor = next(ln.split()[2].split(":")[1] for ln in f if ln.split()[4] == mp)
        ctl = tempfile.mkdtemp(prefix="guestfs-fusectl-")
        subprocess.run(["mount", "-t", "fusectl", "none", ctl], check=True, timeout=10)
        try:
            with open(f"{ctl}/{minor}/abort", "w") as f:
                f.write("1")
        finally:
            subprocess.run(["umount", ctl], check=False, timeout=10)
            os.rmdir(ctl)


@pytest.mark.parametrize("attempt", range(6))
def test_kill_9_right_after_the_mount_appears(tmp_path, attempt):
    require_fuse()
    mp = str(tmp_path / "mnt")
    os.makedirs(mp)
    proc = subprocess.Popen([sys.executable, "-m", "guestfs", "mount", mp],
                            stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: is_guestfs_mount(mp) or proc.poll() is not None, 20)
        proc.kill()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            abort_fuse_connections_of(mp)
            proc.wait(15)
            pytest.fail("the killed daemon did not exit: a thread of it was stuck in a "
                        "FUSE request to its own mount")
    finally:
        if proc.poll() is None:
            abort_fuse_connections_of(mp)
            proc.kill()
            proc.wait(15)
        force_unmount(mp)
