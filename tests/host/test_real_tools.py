"""Real tools parse what guestfs renders: free, vmstat, top, uptime, getconf, Python and
psutil read the files bind-mounted over /proc and /sys in a private mount namespace."""

from __future__ import annotations

import json
import sys

import pytest

from tests.conftest import fixture_root
from tests.support.overlay import run_overlaid
from tests.support.render_helpers import meminfo_kb, render_all

pytestmark = pytest.mark.real

OVERLAID = ("/proc/meminfo", "/proc/stat", "/proc/cpuinfo", "/proc/uptime", "/proc/loadavg",
            "/proc/swaps", "/sys/devices/system/cpu/online")
PSUTIL = ("import json, os, psutil; vm = psutil.virtual_memory(); sw = psutil.swap_memory(); "
          "print(json.dumps({'total': vm.total, 'available': vm.available, 'free': vm.free, "
          "'swap': sw.total, 'count': psutil.cpu_count(), 'os': os.cpu_count(), "
          "'percpu': len(psutil.cpu_times(percpu=True)), "
          "'user': psutil.cpu_times().user}))")


def tools(name: str, tmp_path) -> tuple[dict[str, str], list[str]]:
    files = render_all(fixture_root(name))
    outs = run_overlaid({p: files[p] for p in OVERLAID}, [
        "free -m", "free -b", "vmstat -s", "top -bn1 | head -5", "uptime",
        "getconf _NPROCESSORS_ONLN", f"{sys.executable} -c 'import os; print(os.cpu_count())'",
        f'{sys.executable} -c "{PSUTIL}"', "vmstat 1 1",
    ], tmp_path)
    return files, outs


def row(text: str, label: str) -> list[str]:
    return next(ln.split() for ln in text.splitlines() if ln.startswith(label))


@pytest.mark.parametrize("name,total_mib,n", [
    ("k8s-systemd-v2-burstable", 512, 1),
    ("docker-v1", 512, 2),
    ("minikube-nested-v2", 572, 2),   # 600000000 B = 585937 kB = 572 MiB
])
def test_tools_see_the_limits(tmp_path, name, total_mib, n):
    files, (free_m, free_b, vmstat_s, top, uptime, getconf, cpu_count, ps, vmstat) = \
        tools(name, tmp_path)
    mem = meminfo_kb(files["/proc/meminfo"])
    assert row(free_m, "Mem:")[1] == str(total_mib)
    mem_b = row(free_b, "Mem:")
    assert int(mem_b[1]) == mem["MemTotal"] * 1024
    assert int(mem_b[3]) == mem["MemFree"] * 1024
    assert int(mem_b[6]) == mem["MemAvailable"] * 1024
    assert int(row(free_b, "Swap:")[1]) == mem["SwapTotal"] * 1024
    assert f"{mem['MemTotal']} K total memory" in vmstat_s
    assert f"{mem['MemFree']} K free memory" in vmstat_s
    mib_mem = next(ln for ln in top.splitlines() if "Mem :" in ln)
    assert f"{mem['MemTotal'] / 1024:.1f} total" in mib_mem
    assert "up 8 min" in uptime                    # the container is 512 s old
    assert "load average: " in uptime
    assert getconf.strip() == str(n)
    assert cpu_count.strip() == str(n)
    got = json.loads(ps)
    assert got["total"] == mem["MemTotal"] * 1024
    assert got["available"] == mem["MemAvailable"] * 1024
    assert got["swap"] == mem["SwapTotal"] * 1024
    assert got["count"] == got["os"] == got["percpu"] == n
    stat_user = int(files["/proc/stat"].split()[1])
    assert got["user"] == pytest.approx(stat_user / 100)
    # vmstat's one-shot line: the free column is MemFree in kB.
    assert int(vmstat.splitlines()[2].split()[3]) == mem["MemFree"]


def test_loadavg_through_uptime(tmp_path):
    _, outs = tools("k8s-systemd-v2-burstable", tmp_path)
    assert "load average: 3.00, 3.00, 3.00" in outs[4]
