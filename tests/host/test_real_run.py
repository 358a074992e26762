"""`guestfs run` inside real cgroups of this machine: what real tools report."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.support.fusemount import force_unmount, require_fuse, wait_for
from tests.support.realcg import SEP, RealCgroup, in_cgroup, v1_cgroup

pytestmark = pytest.mark.real
MiB = 1 << 20

PSUTIL = ("import json, os, psutil; print(json.dumps({'total': psutil.virtual_memory().total, "
          "'count': psutil.cpu_count(), 'os': os.cpu_count()}))")
TOOLS = ["free -m", "free -b", "top -bn1 -1 -w 512 | head -5", "vmstat", "uptime",
         "cat /sys/devices/system/cpu/online", "getconf _NPROCESSORS_ONLN",
         f"{sys.executable} -c \"{PSUTIL}\""]


def guestfs_run(cg: RealCgroup, mp: str, commands: list[str]) -> list[str]:
    require_fuse()
    script = "; ".join(f"{c}; echo {SEP}" for c in commands)
    try:
        out = in_cgroup(cg, [sys.executable, "-m", "guestfs", "run", "--mountpoint", mp, "--",
                             "sh", "-c", script])
    finally:
        force_unmount(mp)
    assert out.returncode == 0, out.stderr
    parts = out.stdout.split(SEP + "\n")
    assert len(parts) == len(commands) + 1, out.stdout
    return parts[:-1]


def field(text: str, label: str, index: int) -> str:
    return next(ln.split() for ln in text.splitlines() if ln.startswith(label))[index]


@pytest.mark.parametrize("cpus,n", [("0-1", 2), ("0", 1)])
def test_tools_inside_a_512mib_150000_quota_cgroup(tmp_path, cpus, n):
    with v1_cgroup(512 * MiB, 150000, 100000, cpus=cpus) as cg:
        free_m, free_b, top, vmstat, uptime, online, getconf, ps = guestfs_run(
            cg, str(tmp_path / "mnt"), TOOLS)
    assert field(free_m, "Mem:", 1) == "512"
    assert field(free_b, "Mem:", 1) == str(512 * MiB)
    assert int(field(free_b, "Mem:", 3)) <= 512 * MiB
    assert "MiB Mem :    512.0 total" in top
    assert top.count("%Cpu") == n
    assert int(vmstat.splitlines()[2].split()[3]) <= 512 * 1024  # free, kB
    assert "load average:" in uptime
    assert online.strip() == ("0" if n == 1 else f"0-{n - 1}")
    assert getconf.strip() == str(n)
    got = json.loads(ps)
    assert got == {"total": 512 * MiB, "count": n, "os": n}


def test_exit_code_and_signals_are_passed_through(tmp_path):
    require_fuse()
    mp = str(tmp_path / "mnt")
    pidfile = tmp_path / "sleep.pid"
    try:
        out = subprocess.run([sys.executable, "-m", "guestfs", "run", "--mountpoint", mp, "--",
                              "sh", "-c", "exit 7"], capture_output=True, timeout=60)
        assert out.returncode == 7
        proc = subprocess.Popen([sys.executable, "-m", "guestfs", "run", "--mountpoint", mp,
                                 "--", "sh", "-c", f"trap 'exit 42' TERM; sleep 30 & echo $! "
                                 f"> {pidfile}; wait"])
        time.sleep(3)
        proc.terminate()  # to guestfs run, which forwards it to the command
        assert proc.wait(30) == 42
        # The app's background sleep outlived it: a process of the app, so its files are
        # still served; once it is gone too, so is the daemon run started.
        assert os.path.ismount(mp)
        os.kill(int(pidfile.read_text()), signal.SIGKILL)
        assert wait_for(lambda: not os.path.ismount(mp), 10)
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
        force_unmount(mp)


def test_a_busy_loop_shows_as_the_containers_usage(tmp_path):
    """One busy CPU in a 2-CPU view reads ~50 %, while the host (busy on both CPUs
    because of a second loop outside the cgroup) reads ~100 %."""
    outside = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        measure = ("import subprocess, sys, psutil, time; "
                   "b = subprocess.Popen([sys.executable, '-c', 'while True: pass']); "
                   "time.sleep(1); psutil.cpu_percent(); time.sleep(3); "
                   "print(psutil.cpu_percent()); b.kill()")
        with v1_cgroup(512 * MiB, 150000, 100000, cpus="0-1") as cg:
            psutil.cpu_percent()
            (inside,) = guestfs_run(cg, str(tmp_path / "mnt"),
                                    [f'{sys.executable} -c "{measure}"'])
            host = psutil.cpu_percent()
    finally:
        outside.kill()
        outside.wait()
    inside_pct = float(inside)
    assert 30 <= inside_pct <= 70, (inside_pct, host)
    assert host >= inside_pct + 20, (inside_pct, host)


def test_a_run_in_another_cgroup_does_not_reuse_a_mount_serving_the_first():
    """run serves the view of its own cgroup (--view self, page-cached): a second run
    from another cgroup must not be handed the first one's limits through the shared
    mountpoint; one from the same cgroup reuses it."""
    from tests.support.fusemount import private_mountpoint, wait_for

    with v1_cgroup(512 * MiB, 100000, 100000) as a, v1_cgroup(256 * MiB, 100000, 100000) as b, \
            private_mountpoint() as mpp:
        mp = str(mpp)
        dirs = " ".join(a.dirs.values())
        first = subprocess.Popen(
            ["sh", "-c", f'for d in {dirs}; do echo $$ > $d/cgroup.procs; done; exec "$@"',
             "_", sys.executable, "-m", "guestfs", "run", "--mountpoint", mp, "--",
             "sh", "-c", f"head -1 /proc/meminfo; while [ ! -e {mp}.stop ]; do sleep 0.1; "
                         "done"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert wait_for(lambda: os.path.exists(f"{mp}/proc/meminfo"), 30)
            other = in_cgroup(b, [sys.executable, "-m", "guestfs", "run", "--mountpoint", mp,
                                  "--", "head", "-1", "/proc/meminfo"])
            assert other.returncode != 0
            assert "served for another cgroup" in other.stderr
            same = in_cgroup(a, [sys.executable, "-m", "guestfs", "run", "--mountpoint", mp,
                                 "--", "head", "-1", "/proc/meminfo"])
            assert same.returncode == 0, same.stderr
            assert same.stdout.split()[1] == "524288"
        finally:
            open(f"{mp}.stop", "w").close()
            out, err = first.communicate(timeout=60)
            force_unmount(mp)
        assert first.returncode == 0, err
        assert out.split()[1] == "524288"
