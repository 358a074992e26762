"""`guestfs attach`: binds inside an app's own mount namespace, healed after the daemon
is killed and restarted, without restarting the app (the sidecar pattern)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import pytest

from guestfs.system import sysmount
from guestfs.wrap.run import stop_process
from tests.support.fusemount import force_unmount, mounted, require_fuse, wait_for

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


@pytest.mark.parametrize("mode", ["once", "watch"])
def test_attach_and_heal_after_a_daemon_restart(tmp_path, mode):
    """once: `guestfs attach` run again after the restart (a restarted sidecar); watch:
    one `guestfs attach --watch` that notices the stale binds by itself."""
    require_fuse()
    mp = str(tmp_path / "shared")
    os.makedirs(mp)
    # The pod's shared emptyDir: a shared mount point that app namespaces receive as slaves.
    sysmount.bind(mp, mp)
    subprocess.run(["mount", "--make-shared", mp], check=True)
    app = subprocess.Popen(["unshare", "--mount", "--propagation", "slave", "sleep", "600"])
    watcher = None
    try:
        assert wait_for(lambda: os.readlink(f"/proc/{app.pid}/ns/mnt")
                        != os.readlink("/proc/self/ns/mnt"), 5)
        with mounted(mp, "--memory-limit", "512Mi") as daemon:
            assert free_total(app.pid) != "512"
            if mode == "once":
                assert "bound" in attach(app.pid, mp)
                assert "bound 0," in attach(app.pid, mp)   # live binds are left alone
            else:
                watcher = subprocess.Popen([sys.executable, "-m", "guestfs", "attach",
                                            "--watch", "--pid", str(app.pid), "--source", mp,
                                            "--interval", "0.3"])
            assert wait_for(lambda: free_total(app.pid) == "512", 10)
            daemon.kill()
            daemon.wait()
            assert wait_for(lambda: free_total(app.pid) != "512", 5)  # stale: ENOTCONN
            with mounted(mp, "--memory-limit", "256Mi"):
                healed = attach(app.pid, mp) if mode == "once" else "watching"
                assert wait_for(lambda: free_total(app.pid) == "256", 10), \
                    (healed, free_total(app.pid))
    finally:
        if watcher is not None:
            stop_process(watcher)
        app.kill()
        app.wait()
        force_unmount(mp)
        with contextlib.suppress(OSError):  # the shared self-bind (ismount cannot see it)
            sysmount.umount(mp, detach=True)
