"""A real runc container with guestfs's files as OCI bind mounts over /proc (what
containerd does with a hostPath volume), limits set by runc itself."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid

import pytest

from guestfs.daemon.file_table import SERVED_FILES
from tests.support.fusemount import mounted
from tests.support.paths import REPO
from tests.support.realcg import SEP

pytestmark = pytest.mark.real
MiB = 1 << 20
HOST_DIRS = ("/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc")


def bundle(path, mp: str | None, script: str, mem: int, quota: int, period: int = 100000,
           fuse_inside: bool = False, caps: list[str] | None = None,
           no_new_privs: bool = True, minimal: bool = False,
           privileged: bool = False) -> str:
    """A runc bundle running ``script`` with the host's binaries read-only. With ``mp``,
    guestfs's files from the host are OCI binds over /proc (the DaemonSet pattern); with
    ``fuse_inside``, the container gets /dev/fuse, CAP_SYS_ADMIN and this checkout so
    guestfs runs inside it (the wrapper pattern).

    ``caps``: exactly these capabilities, as containerd gives a root process for
    Kubernetes' ``drop: [ALL]`` + ``add``: bounding = effective = permitted, inheritable
    and ambient empty; ``no_new_privs``: ``allowPrivilegeEscalation: false``.
    ``minimal``: no /run, /tmp or /var at all (the root stays read-only).
    ``privileged``: nothing masked or read-only under /proc and /sys, as for a privileged
    container (pass its capabilities in ``caps``)."""
    rootfs = path / "rootfs"
    rootfs.mkdir(parents=True)
    subprocess.run(["runc", "spec"], cwd=path, check=True)
    cfg = json.loads((path / "config.json").read_text())
    cfg["root"] = {"path": str(rootfs), "readonly": True}
    cfg["process"].update(terminal=False, args=["/bin/sh", "-c", script],
                          env=["PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/tmp"])
    cfg["process"]["noNewPrivileges"] = no_new_privs
    mounts = cfg["mounts"]
    if not minimal:
        mounts.append({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
                       "options": ["nosuid", "nodev", "mode=1777"]})
    for d in HOST_DIRS:  # the host's binaries, read-only: python3, procps, getconf
        if os.path.islink(d):
            (rootfs / d.lstrip("/")).symlink_to(os.readlink(d))
        elif os.path.isdir(d):
            (rootfs / d.lstrip("/")).mkdir()
            mounts.append({"destination": d, "type": "bind", "source": d,
                           "options": ["rbind", "ro"]})
    for f in SERVED_FILES if mp else ():
        # runc refuses mounts inside /proc except a fixed list (cpuinfo, diskstats, meminfo,
        # stat, swaps, uptime, loadavg, ...), which has no /proc/pressure/*.
        if os.path.exists(f) and not f.startswith("/proc/pressure/"):
            mounts.append({"destination": f, "type": "bind", "source": mp + f,
                           "options": ["bind", "ro"]})
    if fuse_inside:
        for d in (str(REPO), sys.prefix, os.path.realpath(sys.base_prefix)):
            (rootfs / d.lstrip("/")).mkdir(parents=True, exist_ok=True)
            mounts.append({"destination": d, "type": "bind", "source": d,
                           "options": ["rbind", "ro"]})
        if not minimal:
            (rootfs / "run").mkdir(exist_ok=True)
            mounts.append({"destination": "/run", "type": "tmpfs", "source": "tmpfs",
                           "options": ["nosuid", "nodev", "mode=755"]})
        spec_caps = cfg["process"]["capabilities"]
        if caps is not None:
            spec_caps.update(bounding=list(caps), effective=list(caps),
                             permitted=list(caps), inheritable=[], ambient=[])
        else:
            # SETPCAP, which Docker's and containerd's defaults have and runc's spec
            # lacks: run needs it to take SYS_ADMIN out of the app's bounding set.
            for kind in ("bounding", "effective", "permitted"):
                spec_caps.setdefault(kind, []).extend(["CAP_SYS_ADMIN", "CAP_SETPCAP"])
        st = os.stat("/dev/fuse")
        cfg["linux"]["devices"] = [{"path": "/dev/fuse", "type": "c",
                                    "major": os.major(st.st_rdev),
                                    "minor": os.minor(st.st_rdev), "fileMode": 0o666}]
        cfg["linux"]["resources"]["devices"] = [
            {"allow": False, "access": "rwm"},
            {"allow": True, "type": "c", "major": os.major(st.st_rdev),
             "minor": os.minor(st.st_rdev), "access": "rwm"},
            {"allow": True, "type": "c", "major": 1, "minor": 3, "access": "rwm"}]
        # /proc paths are masked and read-only by default in runc's spec; guestfs run
        # mounts over /proc files in its own namespace.
        cfg["linux"]["readonlyPaths"] = []
        if privileged:
            cfg["linux"]["maskedPaths"] = []
    cfg["linux"].setdefault("resources", {}).update(
        {"memory": {"limit": mem}, "cpu": {"quota": quota, "period": period}})
    cfg["linux"]["cgroupsPath"] = f"guestfs-test-{uuid.uuid4().hex[:8]}"
    (path / "config.json").write_text(json.dumps(cfg))
    return str(path)


@pytest.mark.parametrize("quota,n", [(150000, 2), (50000, 1)])
def test_runc_container_sees_its_limits(tmp_path, quota, n):
    if shutil.which("runc") is None:
        pytest.fail("runc is missing: .ci/setup installs it")
    mp = str(tmp_path / "mnt")
    script = "; ".join(f"{c}; echo {SEP}" for c in (
        "free -m", "python3 -c 'import os; print(os.cpu_count())'",
        "getconf _NPROCESSORS_ONLN", "cat /sys/devices/system/cpu/online",
        "grep -c ^processor /proc/cpuinfo"))
    cid = f"guestfs-test-{uuid.uuid4().hex[:8]}"
    with mounted(mp):
        b = bundle(tmp_path / "bundle", mp, script, 512 * MiB, quota)
        try:
            out = subprocess.run(["runc", "run", "--bundle", b, cid], capture_output=True,
                                 text=True, timeout=120)
        finally:
            subprocess.run(["runc", "delete", "--force", cid], capture_output=True)
    assert out.returncode == 0, out.stderr
    free, cpu_count, getconf, online, processors, _ = out.stdout.split(SEP + "\n")
    assert next(ln.split() for ln in free.splitlines() if ln.startswith("Mem:"))[1] == "512"
    assert cpu_count.strip() == getconf.strip() == processors.strip() == str(n)
    assert online.strip() == ("0" if n == 1 else f"0-{n - 1}")


def run_container(b: str, cid: str) -> subprocess.Popen[str]:
    return subprocess.Popen(["runc", "run", "--bundle", b, cid], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_wrapper_pattern_guestfs_is_the_entrypoint(tmp_path):
    """The container's own process is `guestfs run -- free -m`: guestfs mounts inside the
    container (/dev/fuse, CAP_SYS_ADMIN) and finds the limits runc set on its cgroup."""
    if shutil.which("runc") is None:
        pytest.fail("runc is missing: .ci/setup installs it")
    inner = ("free -m; echo " + SEP + "; python3 -c 'import os; print(os.cpu_count())'; echo "
             + SEP + "; grep CapBnd /proc/self/status")
    script = f"{sys.executable} -m guestfs run -- sh -c \"{inner}\""
    cid = f"guestfs-test-{uuid.uuid4().hex[:8]}"
    b = bundle(tmp_path / "bundle", None, script, 512 * MiB, 150000, fuse_inside=True)
    try:
        out = subprocess.run(["runc", "run", "--bundle", b, cid], capture_output=True,
                             text=True, timeout=120)
    finally:
        subprocess.run(["runc", "delete", "--force", cid], capture_output=True)
    assert out.returncode == 0, out.stdout + out.stderr
    free, count, bounding = out.stdout.split(SEP + "\n")
    assert next(ln.split() for ln in free.splitlines() if ln.startswith("Mem:"))[1] == "512"
    assert count.strip() == "2"
    assert not int(bounding.split()[1], 16) & (1 << 21)  # the app has no CAP_SYS_ADMIN


def test_daemonset_pattern_gives_each_container_its_own_view(tmp_path):
    """One guestfs on the host, files passed to two containers as OCI binds: per-caller
    views give each its own limits, read at the same time."""
    if shutil.which("runc") is None:
        pytest.fail("runc is missing: .ci/setup installs it")
    mp = str(tmp_path / "mnt")
    script = "sleep 1; free -m; echo " + SEP + "; grep -c ^processor /proc/cpuinfo"
    ids = [f"guestfs-test-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    with mounted(mp, "--allow-other"):
        specs = [(512 * MiB, 150000), (256 * MiB, 50000)]
        bundles = [bundle(tmp_path / f"b{i}", mp, script, mem, quota)
                   for i, (mem, quota) in enumerate(specs)]
        procs = [run_container(b, cid) for b, cid in zip(bundles, ids, strict=True)]
        try:
            outs = [p.communicate(timeout=120) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            for cid in ids:
                subprocess.run(["runc", "delete", "--force", cid], capture_output=True)
    got = []
    for (stdout, stderr), p in zip(outs, procs, strict=True):
        assert p.returncode == 0, stderr
        free, cpus = stdout.split(SEP + "\n")
        got.append((next(ln.split() for ln in free.splitlines()
                         if ln.startswith("Mem:"))[1], cpus.strip()))
    assert got == [("512", "2"), ("256", "1")]
