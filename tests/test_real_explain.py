"""`guestfs explain` on a real v1 cgroup of this machine."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.realcg import process_in, v1_cgroup

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
