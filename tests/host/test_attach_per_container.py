"""`guestfs attach` on a per-container mount: the target gets the files of its own
directory, MP/<key of its cgroup>/..., not another container's, and not MP/proc/..."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

import pytest

from guestfs.inject import attach as attach_mod
from guestfs.sources.containerdirs import dir_key, key_of_cgroup_text, path_of_key, split_spec
from tests.host.test_attach import free_total
from tests.support.fusemount import mounted, wait_for
from tests.support.realcg import process_in, v1_cgroup

pytestmark = pytest.mark.real
MiB = 1 << 20


def guestfs_attach(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "guestfs", "attach", *args],
                          capture_output=True, text=True, timeout=60)


def test_attach_binds_the_targets_own_directory():
    top = tempfile.mkdtemp(prefix="guestfs-attach-pc-")
    mp = os.path.join(top, "mnt")
    with v1_cgroup(256 * MiB, -1, 100000) as app_cg, v1_cgroup(384 * MiB, -1, 100000) as other, \
            process_in(other) as decoy:
        app = subprocess.Popen(["unshare", "--mount", "--propagation", "private",
                                "sleep", "600"])
        try:
            app_cg.add(app.pid)
            assert wait_for(lambda: os.readlink(f"/proc/{app.pid}/ns/mnt")
                            != os.readlink("/proc/self/ns/mnt"), 5)
            with open(f"/proc/{app.pid}/cgroup") as f:
                key = key_of_cgroup_text(f.read())
            with mounted(mp, "--per-container"):
                # Each controller at its own path (here memory sits under this sandbox's
                # cgroup, cpu and cpuset at the root's children): the key says where.
                main, others = split_spec(path_of_key(key))
                assert main == app_cg.paths["memory"]
                for c in ("cpu", "cpuset"):
                    assert next((p for k, p in others.items() if c in k), main) == \
                        app_cg.paths[c]
                assert key.startswith(dir_key(main))
                assert not os.path.exists(os.path.join(mp, "proc"))
                assert free_total(app.pid) not in ("256", "384")
                # Told it is shared, attach finds no MP/proc: it says so, binds nothing.
                shared = guestfs_attach("--pid", str(app.pid), "--source", mp, "--shared")
                assert shared.returncode == 1 and "holds no served file" in shared.stderr
                # Detected: the layout, and the target's own key.
                out = guestfs_attach("--pid", str(app.pid), "--source", mp)
                assert out.returncode == 0, out.stderr
                assert f"from {mp}/{key}" in out.stdout and "bound " in out.stdout
                assert free_total(app.pid) == "256"
                # Forced: the same directory; its live binds are left alone.
                again = guestfs_attach("--pid", str(app.pid), "--source", mp,
                                       "--per-container")
                assert again.returncode == 0, again.stderr
                assert "bound 0," in again.stdout and f"from {mp}/{key}" in again.stdout
                assert decoy.poll() is None
            # Without the target's directory (and no MP/proc) the error names both.
            pcm_less = guestfs_attach("--pid", str(app.pid), "--source", top)
            assert pcm_less.returncode == 1
            assert "neither" in pcm_less.stderr and "container's directory" in pcm_less.stderr
        finally:
            app.kill()
            app.wait()
            shutil.rmtree(top, ignore_errors=True)


def test_forced_per_container_without_the_targets_directory_fails():
    """--per-container on a shared-layout mount: MP/<key> is missing, a one-line error."""
    top = tempfile.mkdtemp(prefix="guestfs-attach-pc-")
    mp = os.path.join(top, "mnt")
    app = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sleep", "600"])
    try:
        assert wait_for(lambda: os.readlink(f"/proc/{app.pid}/ns/mnt")
                        != os.readlink("/proc/self/ns/mnt"), 5)
        with mounted(mp, "--memory-limit", "200Mi"):
            out = guestfs_attach("--pid", str(app.pid), "--source", mp, "--per-container")
            assert out.returncode == 1
            assert attach_mod.container_key(app.pid) in out.stderr
            assert "holds no served file" in out.stderr
            auto = guestfs_attach("--pid", str(app.pid), "--source", mp)
            assert auto.returncode == 0, auto.stderr
            assert f"from {mp}\n" in auto.stdout
            assert free_total(app.pid) == "200"
    finally:
        app.kill()
        app.wait()
        shutil.rmtree(top, ignore_errors=True)
