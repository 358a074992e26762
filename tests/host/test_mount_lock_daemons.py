"""Real `guestfs mount --daemon` processes racing for one mountpoint, killed or stopped
while holding the mount lock (the lock itself: tests/unit/test_mount_lock.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

import pytest

from guestfs.daemon import mountlock
from tests.support.fusemount import force_unmount, require_fuse, wait_for


def _mount_entries(mp: str) -> int:
    with open("/proc/self/mountinfo") as f:
        return sum(1 for line in f if line.split()[4] == mp)


@pytest.mark.real
def test_two_concurrent_daemons_on_one_mountpoint_only_one_mounts(tmp_path):
    require_fuse()
    mp = str(tmp_path / "mnt")
    os.makedirs(mp)
    pidfiles = [tmp_path / f"pid{i}" for i in range(2)]
    procs = [subprocess.Popen([sys.executable, "-m", "guestfs", "mount", mp, "--daemon",
                               "--pid-file", str(pf)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for pf in pidfiles]
    try:
        outs = [p.communicate(timeout=60) for p in procs]
        codes = sorted(p.returncode for p in procs)
        assert codes == [0, 1], outs
        loser_err = next(err for p, (_, err) in zip(procs, outs, strict=True)
                         if p.returncode == 1)
        assert loser_err.count("\n") == 1 and "Traceback" not in loser_err, loser_err
        assert f"{mp} is already served by another guestfs mount" in loser_err
        assert _mount_entries(mp) == 1  # not stacked
        (served,) = [int(pf.read_text()) for pf in pidfiles if pf.exists()]
        os.kill(served, signal.SIGTERM)
        assert wait_for(lambda: _mount_entries(mp) == 0, 30)  # stopping it leaves nothing
    finally:
        for pf in pidfiles:
            with contextlib.suppress(OSError, ValueError):
                os.kill(int(pf.read_text()), signal.SIGKILL)
        force_unmount(mp)


@pytest.mark.real
def test_a_mount_after_a_killed_daemon_takes_over(tmp_path):
    """The lock dies with its holder: kill -9 leaves no lock behind, and the next mount
    replaces the stale mount."""
    require_fuse()
    mp = str(tmp_path / "mnt")
    os.makedirs(mp)
    pf = tmp_path / "pid"
    try:
        for _ in range(2):
            subprocess.run([sys.executable, "-m", "guestfs", "mount", mp, "--daemon",
                            "--pid-file", str(pf)], check=True, timeout=60)
            assert wait_for(pf.exists, 10)
            os.kill(int(pf.read_text()), signal.SIGKILL)
            assert wait_for(lambda: not mountlock.served_by_other(mp), 10)
        assert _mount_entries(mp) == 1  # the stale one replaced, not stacked
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pf.read_text()), signal.SIGKILL)
        force_unmount(mp)


@pytest.mark.real
def test_a_second_mount_over_a_stopped_daemon_fails_instead_of_hanging(tmp_path):
    """The lock is looked at before the mountpoint: probing a mount whose daemon is stopped
    (listdir, stat) would block forever."""
    require_fuse()
    mp = str(tmp_path / "mnt")
    os.makedirs(mp)
    pf = tmp_path / "pid"
    subprocess.run([sys.executable, "-m", "guestfs", "mount", mp, "--daemon",
                    "--pid-file", str(pf)], check=True, timeout=60)
    daemon = int(pf.read_text())
    os.kill(daemon, signal.SIGSTOP)
    try:
        out = subprocess.run([sys.executable, "-m", "guestfs", "mount", mp, "--daemon"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 1
        assert out.stderr == (f"guestfs: {mp} is already served by another guestfs mount "
                              f"(pid {daemon}); one mount per mountpoint\n")
    finally:
        os.kill(daemon, signal.SIGCONT)
        os.kill(daemon, signal.SIGTERM)
        assert wait_for(lambda: _mount_entries(mp) == 0, 30)
        force_unmount(mp)
