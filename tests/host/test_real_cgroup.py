"""`guestfs explain` on a real v1 cgroup of this machine."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.paths import REPO
from tests.support.realcg import process_in, v1_cgroup

pytestmark = pytest.mark.real


def explain_json(*args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "guestfs", "explain", "--json", *args],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def test_real_v1_cgroup_512mib_and_150000_quota():
    with v1_cgroup(512 * 1024 * 1024, 150000, 100000) as cg, process_in(cg) as proc:
        got = explain_json("--pid", str(proc.pid))
        assert got["memory"]["limit_bytes"] == 536870912
        assert got["memory"]["limited"] is True
        src = got["memory"]["source"]
        assert src["file"] == f"{cg.dirs['memory']}/memory.limit_in_bytes"
        assert src["cgroup"] == cg.paths["memory"]
        assert got["cpu"]["count"] == 2
        assert got["cpu"]["quota"] == {"cpus": 1.5, "numerator": 3, "denominator": 2}
        assert got["cpu"]["quota_source"]["file"] == f"{cg.dirs['cpu']}/cpu.cfs_quota_us"
        assert got["cpu"]["source"]["file"] == f"{cg.dirs['cpu']}/cpu.cfs_quota_us" \
            or len(got["cpu"]["cpuset"]) == 2
        # Usage is the kernel's own counter for that cgroup (a sleeping process moved in
        # brings no charge with it on v1, so it is small and stable).
        with open(f"{cg.dirs['memory']}/memory.usage_in_bytes") as f:
            assert got["memory"]["usage"]["bytes"] == int(f.read())
        assert got["memory"]["usage"]["source"]["cgroup"] == cg.paths["memory"]


def test_real_v1_cpuset_binds_tighter_than_quota():
    with v1_cgroup(256 * 1024 * 1024, 150000, 100000, cpus="0") as cg, process_in(cg) as proc:
        got = explain_json("--pid", str(proc.pid))
        assert got["memory"]["limit_bytes"] == 268435456
        assert got["cpu"]["count"] == 1 and got["cpu"]["visible_cpus"] == [0]
        assert got["cpu"]["source"]["file"] in (
            f"{cg.dirs['cpuset']}/cpuset.effective_cpus", f"{cg.dirs['cpuset']}/cpuset.cpus")


def test_exited_pid_is_a_clear_error_exit_1():
    proc = subprocess.Popen(["true"])
    proc.wait()
    out = subprocess.run([sys.executable, "-m", "guestfs", "explain", "--pid", str(proc.pid)],
                         capture_output=True, text=True)
    assert out.returncode == 1
    assert f"pid {proc.pid}" in out.stderr and "Traceback" not in out.stderr


def show(*args: str) -> str:
    return subprocess.run([sys.executable, "-m", "guestfs", "show", *args], check=True,
                          capture_output=True, text=True).stdout


def test_show_on_a_real_cgroup():
    with v1_cgroup(512 * 1024 * 1024, 50000, 100000) as cg, process_in(cg) as proc:
        pid = str(proc.pid)
        meminfo = show("/proc/meminfo", "--pid", pid)
        assert meminfo.startswith("MemTotal:         524288 kB\n")
        assert show("/sys/devices/system/cpu/online", "--pid", pid) == "0\n"
        assert show("/proc/cpuinfo", "--pid", pid).count("processor\t:") == 1
        stat = show("/proc/stat", "--pid", pid).splitlines()
        assert stat[0].startswith("cpu  ") and stat[1].startswith("cpu0 ")
        assert not stat[2].startswith("cpu")
        # The cgroup's own CPU time: a sleeping process has used next to none of it.
        acct = cg.dirs.get("cpuacct", cg.dirs["cpu"])
        with open(f"{acct}/cpuacct.usage") as f:
            used_ticks = int(f.read()) // 10_000_000
        user, system = int(stat[0].split()[1]), int(stat[0].split()[3])
        assert user + system <= used_ticks + 1


def test_the_readme_demo_runs_and_cleans_up():
    import os
    import shutil
    from pathlib import Path

    repo = REPO
    guestfs = shutil.which("guestfs", path=str(Path(sys.executable).parent))
    assert guestfs, "guestfs console script missing: .ci/setup installs it"
    out = subprocess.run(["bash", str(repo / ".ci/demo")], capture_output=True, text=True,
                         env={**os.environ, "GUESTFS": guestfs}, timeout=120)
    assert out.returncode == 0, out.stderr
    host_part, guest_part = out.stdout.split("guestfs run -- free -m")
    assert "Mem:             512 " in guest_part
    assert "os.cpu_count() = 1" in guest_part
    assert "Mem:             512 " not in host_part
    leftovers = subprocess.run("grep -l guestfs-demo /proc/*/cgroup 2>/dev/null; "
                               "find /sys/fs/cgroup -maxdepth 4 -name 'guestfs-demo-*'",
                               shell=True, capture_output=True, text=True).stdout
    assert leftovers.strip() == ""
