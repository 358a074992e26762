"""A real runc container with guestfs's files as OCI bind mounts over /proc (what
containerd does with a hostPath volume), limits set by runc itself."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid

import pytest

from guestfs.view import SERVED_FILES
from tests.fusemount import mounted
from tests.test_real_run import SEP

pytestmark = pytest.mark.real
MiB = 1 << 20
HOST_DIRS = ("/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc")


def bundle(path, mp: str, script: str, mem: int, quota: int, period: int = 100000) -> str:
    rootfs = path / "rootfs"
    rootfs.mkdir(parents=True)
    subprocess.run(["runc", "spec"], cwd=path, check=True)
    cfg = json.loads((path / "config.json").read_text())
    cfg["root"] = {"path": str(rootfs), "readonly": True}
    cfg["process"].update(terminal=False, args=["/bin/sh", "-c", script],
                          env=["PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/tmp"])
    mounts = cfg["mounts"]
    mounts.append({"destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
                   "options": ["nosuid", "nodev", "mode=1777"]})
    for d in HOST_DIRS:  # the host's binaries, read-only: python3, procps, getconf
        if os.path.islink(d):
            (rootfs / d.lstrip("/")).symlink_to(os.readlink(d))
        elif os.path.isdir(d):
            (rootfs / d.lstrip("/")).mkdir()
            mounts.append({"destination": d, "type": "bind", "source": d,
                           "options": ["rbind", "ro"]})
    for f in SERVED_FILES:
        # runc refuses mounts inside /proc except a fixed list (cpuinfo, diskstats, meminfo,
        # stat, swaps, uptime, loadavg, ...), which has no /proc/pressure/*.
        if os.path.exists(f) and not f.startswith("/proc/pressure/"):
            mounts.append({"destination": f, "type": "bind", "source": mp + f,
                           "options": ["bind", "ro"]})
    cfg["linux"]["resources"] = {"memory": {"limit": mem},
                                 "cpu": {"quota": quota, "period": period}}
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
