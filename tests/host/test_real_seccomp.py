"""sysinfo(2) and the CPU count under `guestfs run`, in real cgroups: real programs
(getconf, nproc, Python's os module, sort under strace) against the served files."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.support.fusemount import (
    force_unmount,
    is_guestfs_daemon,
    private_mountpoint,
    require_fuse,
    wait_for,
)
from tests.support.paths import SUPPORT
from tests.support.realcg import RealCgroup, in_cgroup, require_v1_root, v1_cgroup

pytestmark = pytest.mark.real
MiB = 1 << 20
PROBE = str(SUPPORT / "syscall_probe.py")


@pytest.fixture
def mp():
    require_fuse()
    require_v1_root()
    with private_mountpoint() as m:
        yield str(m)


def run_in(cg: RealCgroup, mp: str, argv: list[str], *opts: str) -> str:
    try:
        out = in_cgroup(cg, [sys.executable, "-m", "guestfs", "run", "--mountpoint", mp,
                             *opts, "--", *argv])
    finally:
        force_unmount(mp)
    assert out.returncode == 0, out.stderr
    return out.stdout


def probe(cg: RealCgroup, mp: str, what: str = "all", *opts: str) -> dict:
    return json.loads(run_in(cg, mp, [sys.executable, PROBE, what], *opts))


def meminfo_bytes(text: str, key: str) -> int:
    line = next(ln for ln in text.splitlines() if ln.startswith(key + ":"))
    return int(line.split()[1]) * 1024


def test_programs_see_the_pods_memory_load_uptime_and_cpu_count(mp):
    # 512 MiB and a quota of one CPU over two allowed CPUs.
    with v1_cgroup(512 * MiB, 100000, 100000, cpus="0-1") as cg:
        out = probe(cg, mp)
    page = out["page_size"]
    si = out["sysinfo"]
    assert si["mem_unit"] == 1
    assert si["totalram"] == 512 * MiB
    assert out["phys_pages"] == 512 * MiB // page          # 131072 with 4 KiB pages
    assert out["getconf"] == str(512 * MiB // page)
    assert out["grandchild"] == out["getconf"]              # the whole tree is answered
    # Free memory agrees with the served MemFree read a moment later (the app's own
    # allocations move it a little), and never exceeds the limit.
    served_free = meminfo_bytes(out["meminfo"], "MemFree")
    assert 0 < si["freeram"] <= 512 * MiB
    assert abs(si["freeram"] - served_free) < 32 * MiB
    assert abs(out["avphys_pages"] * page - si["freeram"]) < 32 * MiB
    assert si["totalswap"] == meminfo_bytes(out["meminfo"], "SwapTotal")
    # Loads: getloadavg() goes through sysinfo; the served loadavg of a fresh, idle cgroup.
    served_loads = [float(x) for x in out["loadavg"].split()[:3]]
    assert out["getloadavg"] == pytest.approx(served_loads, abs=0.05)
    assert [x / 65536 for x in si["loads"]] == pytest.approx(served_loads, abs=0.05)
    # Uptime is the container's age (seconds old), not the host's.
    served_uptime = float(out["uptime"].split()[0])
    assert abs(si["uptime"] - served_uptime) <= 2
    host_uptime = float(Path("/proc/uptime").read_text().split()[0])
    if host_uptime > 600:
        assert si["uptime"] < 300
    # procs: the cgroup's threads (the run, its daemon, a shell, Python), not the host's.
    served_threads = int(out["loadavg"].split()[3].split("/")[1])
    assert abs(si["procs"] - served_threads) <= 10
    host_threads = sum(p.info["num_threads"] or 0
                       for p in psutil.process_iter(["num_threads"]))
    assert si["procs"] < host_threads
    # The CPU count under a quota: one, CPU 0, while the real mask still allows both.
    assert out["nproc"] == "1"
    assert out["cpu_count"] == 1
    assert out["affinity"] == [0]
    assert out["allowed"] == "0-1"
    # A bad pointer still gets the kernel's EFAULT, and a read-only page stays unwritten.
    assert out["efault_null"] == 14
    assert out["efault_readonly"] == [14, True]


def test_cpuset_only_limit_is_left_to_the_kernel(mp):
    # No quota: the cpuset itself is the count, the real mask is already right.
    with v1_cgroup(512 * MiB, -1, 100000, cpus="1") as cg:
        out = probe(cg, mp)
    assert out["nproc"] == "1" and out["affinity"] == [1]


def test_many_threads_calling_sysinfo_at_once(mp):
    with v1_cgroup(512 * MiB, 100000, 100000, cpus="0-1") as cg:
        out = probe(cg, mp, "threads")
    assert out["totals"] == [512 * MiB]          # 16 threads x 200 calls, every one answered


@pytest.mark.parametrize("mode,allowed_after", [("view", "0-1"), ("pin", "0")])
def test_setting_the_told_mask_back(mp, mode, allowed_after):
    with v1_cgroup(512 * MiB, 100000, 100000, cpus="0-1") as cg:
        out = probe(cg, mp, "setaffinity", "--cpu-affinity", mode)
    assert out["told"] == [0]
    assert out["allowed_after"] == allowed_after
    assert out["told_after"] == [0]


def test_flags_give_the_kernels_answers_back(mp):
    with v1_cgroup(512 * MiB, 100000, 100000, cpus="0-1") as cg:
        out = probe(cg, mp, "all", "--no-sysinfo", "--cpu-affinity", "host")
    assert out["sysinfo"]["totalram"] == psutil.virtual_memory().total
    assert out["nproc"] == "2" and out["affinity"] == [0, 1]
    assert out["cpu_count"] == 1                  # /sys/devices/system/cpu/online is served


def test_sort_sizes_its_buffer_from_the_answered_sysinfo(mp):
    if shutil.which("strace") is None:
        pytest.fail("strace missing: .ci/setup installs it")
    with v1_cgroup(512 * MiB, 100000, 100000) as cg:
        out = run_in(cg, mp, ["sh", "-c", "strace -f -e trace=sysinfo -o /dev/stdout "
                                          "sort </dev/null"])
    # GNU sort's default buffer comes from physmem_total/available (sysinfo).
    assert "sysinfo(" in out and f"totalram={512 * MiB}" in out, out


def app_running(run_pid: int, marker: Path) -> bool:
    """The app `guestfs run` started has exec'd: a child with ``marker`` on its command
    line other than run's own (which has it too, as has the forked child before exec)."""
    with contextlib.suppress(psutil.NoSuchProcess):
        run = psutil.Process(run_pid)
        ours = run.cmdline()
        for c in run.children():
            with contextlib.suppress(psutil.NoSuchProcess):   # zombies too
                if str(marker) in " ".join(c.cmdline()) and c.cmdline() != ours:
                    return True
    return False


def test_run_killed_with_sigkill_leaves_calls_working(mp, tmp_path):
    go, done = tmp_path / "go", tmp_path / "done"
    script = (f"while [ ! -e {go} ]; do sleep 0.05; done; "
              f"getconf _PHYS_PAGES > {done}.tmp; echo $? >> {done}.tmp; mv {done}.tmp {done}")
    with v1_cgroup(512 * MiB, 100000, 100000) as cg:
        dirs = " ".join(cg.dirs.values())
        shell = f'for d in {dirs}; do echo $$ > $d/cgroup.procs; done; exec "$@"'
        run = subprocess.Popen(["sh", "-c", shell, "_", sys.executable, "-m", "guestfs", "run",
                                "--mountpoint", mp, "--", "sh", "-c", script],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
        try:
            # The app runs once its child has handed the guard the listener: a run killed
            # at once (before it has its own copy) must not matter.
            assert wait_for(lambda: app_running(run.pid, go), 30)
            run.kill()                              # the supervisor is gone for good
            run.wait()
            go.touch()
            assert wait_for(done.exists, 30)
            value, rc = done.read_text().split()
            # Not ENOSYS and a failed getconf, nor the node's pages: the guard's successor
            # answered from the app's files, which serve on after run.
            assert rc == "0" and int(value) == 512 * MiB // os.sysconf("SC_PAGE_SIZE")
            # The app has exited: the guard goes too, nothing of this run is left.
            assert wait_for(lambda: not [p for p in psutil.process_iter(["cmdline"])
                                         if mp in " ".join(p.info["cmdline"] or [])], 30)
        finally:
            go.touch()
            for p in psutil.process_iter(["cmdline"]):
                if mp in " ".join(p.info["cmdline"] or []):
                    p.send_signal(signal.SIGKILL)
            force_unmount(mp)


STOPPED_DAEMON_PROBE = r"""
import ctypes, json, os, sys, time
libc = ctypes.CDLL(None)
buf = ctypes.create_string_buffer(128)
go = sys.argv[1]
while not os.path.exists(go):
    time.sleep(0.05)
times, totals = [], []
for _ in range(3):
    t = time.monotonic()
    rc = libc.sysinfo(buf)
    times.append(time.monotonic() - t)
    totals.append(int.from_bytes(buf.raw[32:40], "little") if rc == 0 else -1)
    time.sleep(0.3)                    # past the view's 0.25 s: every call wants a re-read
print(json.dumps({"times": times, "totals": totals}), flush=True)
"""


def test_stopped_daemon_delays_sysinfo_by_at_most_the_reread_wait(mp, tmp_path):
    """SIGSTOP the FUSE daemon: a read of /proc/meminfo would hang, but sysinfo(2) is
    answered from the last good read after at most 0.2 s."""
    go = tmp_path / "go"
    with v1_cgroup(512 * MiB, 100000, 100000) as cg:
        dirs = " ".join(cg.dirs.values())
        shell = f'for d in {dirs}; do echo $$ > $d/cgroup.procs; done; exec "$@"'
        run = subprocess.Popen(["sh", "-c", shell, "_", sys.executable, "-m", "guestfs", "run",
                                "--mountpoint", mp, "--", sys.executable, "-c",
                                STOPPED_DAEMON_PROBE, str(go)],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                               start_new_session=True)
        daemon = None
        try:
            def find_daemon() -> psutil.Process | None:
                for p in psutil.Process(run.pid).children():
                    with contextlib.suppress(psutil.NoSuchProcess):   # zombies too
                        if is_guestfs_daemon(p.cmdline(), p.name()):
                            return p
                return None
            assert wait_for(lambda: find_daemon() is not None, 30)
            daemon = find_daemon()
            assert wait_for(lambda: app_running(run.pid, go), 30)
            time.sleep(0.5)                     # the first read is older than 0.25 s
            daemon.suspend()
            go.touch()
            out, _ = run.communicate(timeout=60)
        finally:
            if daemon is not None:
                with contextlib.suppress(psutil.NoSuchProcess):
                    daemon.resume()
            if run.poll() is None:
                run.kill()
                run.wait()
            force_unmount(mp)
    got = json.loads(out)
    assert got["totals"] == [512 * MiB] * 3
    assert max(got["times"]) < 1.0, got["times"]    # 0.2 s wait, plus a loaded machine
