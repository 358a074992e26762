"""guestfs beside LXCFS, read from the same real cgroup.

They must agree on what the kernel enforces: MemTotal, SwapTotal and the CPU count.
They differ, by design, where LXCFS is wrong (docs/files.md compares the two): LXCFS 5.0's
MemAvailable adds the whole page cache (tmpfs included); guestfs adds active+inactive
file and reclaimable slab only, as the kernel's own estimate does.
"""

from __future__ import annotations

import pytest

from tests.support.fusemount import mounted
from tests.support.lxcfsd import lxcfs_mounted
from tests.support.realcg import SEP, in_cgroup, v1_cgroup
from tests.support.render_helpers import meminfo_kb

pytestmark = pytest.mark.real
MiB = 1 << 20
FILES = ("proc/meminfo", "proc/cpuinfo", "sys/devices/system/cpu/online")


@pytest.mark.parametrize("mem,quota,cpus,n", [
    (512 * MiB, 150000, "0-1", 2),
    (256 * MiB, 50000, "0-1", 1),
    (512 * MiB, 150000, "0", 1),
])
def test_guestfs_and_lxcfs_agree_on_the_limits(tmp_path, mem, quota, cpus, n):
    lx, gf = str(tmp_path / "lxcfs"), str(tmp_path / "guestfs")
    with lxcfs_mounted(lx, str(tmp_path / "lxcfs.pid")), mounted(gf), \
            v1_cgroup(mem, quota, 100000, cpus=cpus) as cg:
        script = "; ".join(f"cat {root}/{f}; echo {SEP}" for root in (lx, gf) for f in FILES)
        out = in_cgroup(cg, ["sh", "-c", script])
    assert out.returncode == 0, out.stderr
    lx_mem, lx_cpu, lx_online, gf_mem, gf_cpu, gf_online, _ = out.stdout.split(SEP + "\n")
    lxm, gfm = meminfo_kb(lx_mem), meminfo_kb(gf_mem)
    assert lxm["MemTotal"] == gfm["MemTotal"] == mem // 1024
    assert lxm["SwapTotal"] == gfm["SwapTotal"]
    assert lx_cpu.count("processor\t:") == gf_cpu.count("processor\t:") == n
    assert lx_online == gf_online == ("0\n" if n == 1 else f"0-{n - 1}\n")
    # Both keep MemFree <= MemTotal here; guestfs also guarantees MemAvailable <= MemTotal.
    assert gfm["MemFree"] <= gfm["MemAvailable"] <= gfm["MemTotal"]


def test_where_they_differ_tmpfs_is_not_available_memory(tmp_path):
    """64 MiB written to tmpfs by a process in the cgroup is charged to it as shmem, which
    cannot be reclaimed without swap. LXCFS 5.0's MemAvailable adds all of total_cache and
    so counts it as available; guestfs adds only the file LRU and reclaimable slab, as the
    kernel's own estimate does. guestfs is right: those 64 MiB are not available."""
    lx, gf = str(tmp_path / "lxcfs"), str(tmp_path / "guestfs")
    shm = f"/dev/shm/guestfs-test-{tmp_path.name}"
    with lxcfs_mounted(lx, str(tmp_path / "lxcfs.pid")), mounted(gf), \
            v1_cgroup(512 * MiB, 150000, 100000) as cg:
        script = (f"dd if=/dev/zero of={shm} bs=1M count=64 2>/dev/null; "
                  f"cat {lx}/proc/meminfo; echo {SEP}; cat {gf}/proc/meminfo; rm -f {shm}")
        out = in_cgroup(cg, ["sh", "-c", script])
    assert out.returncode == 0, out.stderr
    lxm, gfm = (meminfo_kb(t) for t in out.stdout.split(SEP + "\n"))
    assert lxm["Shmem"] >= 64 * 1024 and gfm["Shmem"] >= 64 * 1024
    assert lxm["MemAvailable"] - gfm["MemAvailable"] >= 60 * 1024
    assert gfm["MemAvailable"] <= gfm["MemTotal"] - 64 * 1024
