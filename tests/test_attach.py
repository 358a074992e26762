"""`guestfs attach`: binds inside an app's own mount namespace, healed after the daemon
is killed and restarted, without restarting the app (the sidecar pattern)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import pytest

from guestfs import sysmount
from tests.fusemount import force_unmount, mounted, require_fuse, wait_for

pytestmark = pytest.mark.real


def free_total(app: int) -> str:
    out = subprocess.run(["nsenter", "-t", str(app), "-m", "free", "-m"], capture_output=True,
                         text=True, timeout=30)
    rows = [ln.split() for ln in out.stdout.splitlines() if ln.startswith("Mem:")]
    return rows[0][1] if rows else f"error: {out.stderr.strip()}"


def attach(app: int, mp: str) -> str:
    out = subprocess.run([sys.executable, "-m", "guestfs", "attach", "--pid", str(app),
                          "--source", mp], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_attach_and_heal_after_a_daemon_restart(tmp_path):
    require_fuse()
    mp = str(tmp_path / "shared")
    os.makedirs(mp)
    # The pod's shared emptyDir: a shared mount point that app namespaces receive as slaves.
    sysmount.bind(mp, mp)
    subprocess.run(["mount", "--make-shared", mp], check=True)
    app = subprocess.Popen(["unshare", "--mount", "--propagation", "slave", "sleep", "600"])
    try:
        assert wait_for(lambda: os.readlink(f"/proc/{app.pid}/ns/mnt")
                        != os.readlink("/proc/self/ns/mnt"), 5)
        with mounted(mp, "--memory-limit", "512Mi") as daemon:
            host_total = free_total(app.pid)
            assert host_total != "512"
            assert "bound" in attach(app.pid, mp)
            assert free_total(app.pid) == "512"
            assert "bound 0," in attach(app.pid, mp)   # live binds are left alone
            daemon.kill()
            daemon.wait()
            assert wait_for(lambda: free_total(app.pid) != "512", 5)  # stale: ENOTCONN
            with mounted(mp, "--memory-limit", "256Mi"):
                healed = attach(app.pid, mp)
                assert wait_for(lambda: free_total(app.pid) == "256", 5), \
                    (healed, free_total(app.pid))
    finally:
        app.kill()
        app.wait()
        force_unmount(mp)
        with contextlib.suppress(OSError):  # the shared self-bind (ismount cannot see it)
            sysmount.umount(mp, detach=True)
