"""`guestfs attach` in namespaces it must not trust or must not touch: symlinks planted by
the app at the targets, its own mount namespace, a mount that did not propagate after a
daemon restart, and a mount visible only inside the target (the bind fallback). Every app
here is a real `unshare --mount` namespace with private propagation, so nothing it or a
regressed attach mounts can reach the machine's own /proc."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from guestfs.wrap.run import stop_process
from tests.host.test_attach import free_total
from tests.support.fusemount import mounted, require_fuse, wait_for

pytestmark = pytest.mark.real


def run_attach(app: int, mp: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "guestfs", "attach", "--pid", str(app),
                           "--source", mp, *extra], capture_output=True, text=True,
                          timeout=60)


def in_app(app: int, script: str) -> str:
    out = subprocess.run(["nsenter", "-t", str(app), "-m", "sh", "-c", script],
                         capture_output=True, text=True, timeout=30)
    return out.stdout.strip()


@contextlib.contextmanager
def app_namespace(setup: str = "true") -> Iterator[int]:
    """A process in its own private mount namespace that ran ``setup`` there first."""
    require_fuse()
    app = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                            f"{setup} && echo ready && exec sleep 600"],
                           stdout=subprocess.PIPE, text=True)
    try:
        assert app.stdout is not None and app.stdout.readline().strip() == "ready"
        yield app.pid
    finally:
        app.kill()
        app.wait()


# The attacker's plants, made inside the app's namespace: a tmpfs ("victim") whose
# detaching would show, and a symlink to it where attach looks for its target.
VICTIM = "mkdir -p /tmp/{v} && mount -t tmpfs victim /tmp/{v} && echo alive > /tmp/{v}/marker"
PLANTS = {
    "file": "mount -t tmpfs cpu /sys/devices/system/cpu && ln -s /tmp/{v} "
            "/sys/devices/system/cpu/online",
    "directory": "mount -t tmpfs sys /sys/devices/system && ln -s /tmp/{v} "
                 "/sys/devices/system/cpu",
}


@pytest.mark.parametrize("where", sorted(PLANTS))
def test_a_symlink_planted_at_a_target_is_refused_not_followed(tmp_path, where):
    victim = f"guestfs-victim-{os.getpid()}-{where}"
    mp = str(tmp_path / "mnt")
    setup = " && ".join([VICTIM.format(v=victim), PLANTS[where].format(v=victim)])
    with mounted(mp, "--memory-limit", "512Mi"), app_namespace(setup) as app:
        out = run_attach(app, mp)
        # The victim tmpfs is still mounted, with its file: nothing was unmounted or
        # bound through the symlink.
        assert in_app(app, f"cat /tmp/{victim}/marker") == "alive"
        assert in_app(app, f"findmnt -n -o FSTYPE /tmp/{victim}") == "tmpfs"
        assert out.returncode != 0
        err = out.stderr.strip()
        assert "\n" not in err and "symlink" in err and "/sys/devices/system/cpu" in err, err
        assert "Traceback" not in out.stderr
        # The safe targets were bound all the same.
        assert free_total(app) == "512"


def test_attach_refuses_its_own_mount_namespace(tmp_path):
    """`attach --pid` of a process in attach's own namespace (`--pid 1` on a host) would
    cover everyone's /proc there. Run inside a throwaway namespace, so a regression binds
    only there."""
    mp = str(tmp_path / "mnt")
    attach_self = f"{sys.executable} -m guestfs attach --pid $$ --source {mp}"
    with mounted(mp, "--memory-limit", "512Mi"):
        # $$ is the shell itself, in the new namespace with attach. After the refusal the
        # namespace still has the kernel's meminfo.
        script = (f"{attach_self}; echo rc=$?; {attach_self} --watch; echo rc=$?; "
                  "findmnt -n /proc/meminfo || echo kernel")
        out = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                              script],
                             capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["rc=1", "rc=1", "kernel"], out.stdout
    errs = out.stderr.strip().splitlines()
    assert len(errs) == 2 and all("own mount namespace" in e for e in errs), errs


def test_attach_after_a_restart_that_did_not_propagate_rebinds(tmp_path):
    """The app's namespace holds a private copy of the mount, which the daemon's death
    leaves stale and its restart does not replace. attach used to look for the source
    there, found none, printed "bound 0" and exited 0, leaving ENOTCONN. Now it clones
    the live mount from its own namespace and moves it in."""
    mp = str(tmp_path / "mnt")
    # The app's namespace is created while the mount is live: it holds a private copy.
    with mounted(mp, "--memory-limit", "512Mi") as daemon, app_namespace() as app:
        first = run_attach(app, mp)
        assert first.returncode == 0, first.stderr
        assert "(move_mount)" in first.stdout
        assert free_total(app) == "512"
        daemon.kill()
        daemon.wait()
        assert wait_for(lambda: free_total(app) != "512", 5)
        with mounted(mp, "--memory-limit", "256Mi"):
            assert in_app(app, f"cat {mp}/proc/meminfo >/dev/null 2>&1 || echo stale") \
                == "stale"   # the app's own copy of the mount stays dead
            healed = run_attach(app, mp)
            assert healed.returncode == 0, healed.stderr
            assert "bound 0," not in healed.stdout, healed.stdout
            assert free_total(app) == "256"
            # the dead daemon's bind was detached, not covered
            assert in_app(app, "findmnt -n -o TARGET /proc/meminfo") == "/proc/meminfo"
            again = run_attach(app, mp)
            assert "bound 0," in again.stdout   # live binds are left alone


def test_attach_with_no_live_mount_anywhere_fails_loudly(tmp_path):
    mp = str(tmp_path / "mnt")
    with mounted(mp, "--memory-limit", "512Mi") as daemon, app_namespace() as app:
        assert run_attach(app, mp).returncode == 0
        daemon.kill()
        daemon.wait()
        assert wait_for(lambda: free_total(app) != "512", 5)
        out = run_attach(app, mp)
        assert out.returncode != 0
        err = out.stderr.strip()
        assert "\n" not in err and mp in err and "daemon running" in err, err


def test_bind_fallback_when_the_mount_lives_only_in_the_target(tmp_path):
    """A guestfs mounted inside the app's namespace only (as `run` does): attach cannot
    clone it from its own namespace and binds inside the target instead."""
    mp = str(tmp_path / "inner")
    os.makedirs(mp)
    with app_namespace() as app:
        daemon = subprocess.Popen(["nsenter", "-t", str(app), "-m", sys.executable, "-m",
                                   "guestfs", "mount", mp, "--memory-limit", "384Mi"],
                                  stderr=subprocess.DEVNULL)
        try:
            assert wait_for(lambda: in_app(app, f"head -c1 {mp}/proc/meminfo") == "M", 15)
            assert not os.path.ismount(mp)   # not in our namespace
            out = run_attach(app, mp)
            assert out.returncode == 0, out.stderr
            assert "(bind)" in out.stdout
            assert free_total(app) == "384"
        finally:
            stop_process(daemon)
