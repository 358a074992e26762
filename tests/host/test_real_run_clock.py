"""Under `guestfs run` the app's uptime is the container's, and so is its boot clock:
`ps` ELAPSED (uptime − start time) and STARTED (btime + start time) stay right. Without
the time namespace, ELAPSED of every container process printed as garbage such as
`441077233-19:06:40` (served uptime small, start times counted from the host's boot)."""

from __future__ import annotations

import sys
import time

import pytest

from tests.host.test_real_run import guestfs_run
from tests.support.fusemount import force_unmount
from tests.support.realcg import in_cgroup, v1_cgroup

pytestmark = pytest.mark.real
MiB = 1 << 20
BOOTTIME = "import time; print(time.clock_gettime(time.CLOCK_BOOTTIME))"


def test_ps_elapsed_and_started_under_run(tmp_path):
    before = time.time()
    with v1_cgroup(512 * MiB, 100000, 100000) as cg:
        etimes, lstart, uptime, boottime = guestfs_run(cg, str(tmp_path / "mnt"), [
            "sleep 2; ps -o etimes= -p $$", "LC_ALL=C ps -o lstart= -p $$",
            "cat /proc/uptime", f"{sys.executable} -c '{BOOTTIME}'"])
    after = time.time()
    assert 2 <= int(etimes) <= 30, etimes          # was 441077233-19:06:40 and the like
    started = time.mktime(time.strptime(lstart.strip(), "%a %b %d %H:%M:%S %Y"))
    assert before - 2 <= started <= after + 1, (lstart, before, after)
    age = float(uptime.split()[0])
    assert 0 <= age < 60, uptime
    # The kernel's own clock in the app's namespace: the container's age too.
    assert abs(float(boottime) - age) < 5, (boottime, uptime)


def test_host_clock_keeps_the_hosts_boot_clock(tmp_path):
    mp = str(tmp_path / "mnt")
    with v1_cgroup(512 * MiB, 100000, 100000) as cg:
        try:
            out = in_cgroup(cg, [sys.executable, "-m", "guestfs", "run", "--host-clock",
                                 "--mountpoint", mp, "--", sys.executable, "-c", BOOTTIME])
        finally:
            force_unmount(mp)
    assert out.returncode == 0, out.stderr
    assert abs(float(out.stdout) - time.clock_gettime(time.CLOCK_BOOTTIME)) < 30, out.stdout
