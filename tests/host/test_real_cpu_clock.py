"""What people watch, through `guestfs run` in real cgroups: an idle container reads idle,
a busy loop reads its share, the load starts at 0 and the uptime is the container's, also
in a cgroup that burnt CPU before the container started (a pod slice that outlives a
restart, a systemd unit, a CI job)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.host.test_real_run import guestfs_run
from tests.support.cgroupfs import empty_and_remove
from tests.support.fusemount import force_unmount, mounted
from tests.support.realcg import BUSY, RealCgroup, burn, in_cgroup, v1_cgroup

pytestmark = pytest.mark.real
MiB = 1 << 20
def vmstat_last(text: str) -> dict[str, int]:
    lines = [ln.split() for ln in text.splitlines() if ln.strip()]
    header = next(ln for ln in lines if "id" in ln and "us" in ln)
    return dict(zip(header, map(int, lines[-1]), strict=True))


def top_second_cpu_line(text: str) -> dict[str, float]:
    line = [ln for ln in text.splitlines() if ln.startswith("%Cpu(s)")][-1]
    parts = line.split(":", 1)[1].replace(",", " ").split()
    return {parts[i + 1]: float(parts[i]) for i in range(0, len(parts) - 1, 2)}


def acct_ticks(cg: RealCgroup) -> float:
    """The cgroup's user + system time in USER_HZ ticks, from the file the daemon reads
    (cpuacct.usage_all: its sum runs ahead of cpuacct.usage's by up to ~0.1 s here)."""
    acct = os.path.join(cg.dirs.get("cpuacct", cg.dirs["cpu"]), "cpuacct.usage_all")
    with open(acct) as f:
        rows = [ln.split() for ln in f.read().splitlines()[1:]]
    return sum(int(r[1]) + int(r[2]) for r in rows) / 1e7


def recreate_cpu(cg: RealCgroup) -> None:
    for c in ("cpu", "cpuacct"):
        d = cg.dirs.get(c)
        if d is None:
            continue
        os.rmdir(d)
        os.mkdir(d)
        if c == "cpu":
            for name, value in (("cpu.cfs_period_us", "100000"),
                                ("cpu.cfs_quota_us", "200000")):
                with open(os.path.join(d, name), "w") as f:
                    f.write(value)


@pytest.mark.parametrize("history", ["fresh", "long-lived"])
def test_idle_container_reads_idle_with_load_0_and_its_own_age(tmp_path, history):
    with v1_cgroup(512 * MiB, 200000, 100000, cpus="0-1") as cg:
        if history == "long-lived":
            burn(cg, 2.5, 2)      # 5 CPU-seconds, more than the container's age x 2
        vmstat, top, mpstat, loadavg, uptime = guestfs_run(cg, str(tmp_path / "mnt"), [
            "vmstat 1 3", "top -bn2 -d1 | grep '^%Cpu'", "LC_ALL=C mpstat 1 1",
            "cat /proc/loadavg", "cat /proc/uptime"])
    v = vmstat_last(vmstat)
    assert v["id"] >= 80, vmstat          # was 0 (us 63 sy 37) in a long-lived cgroup
    assert top_second_cpu_line(top)["id"] >= 80, top
    average = next(ln.split() for ln in mpstat.splitlines() if ln.startswith("Average:"))
    assert float(average[-1]) >= 80, mpstat     # %idle, the last column
    assert float(loadavg.split()[0]) < 0.5, loadavg   # was 1.00: the daemon's own thread
    age, idle = (float(x) for x in uptime.split())
    assert age < 30, uptime               # the container's, not the host's
    assert idle > 0, uptime


def test_busy_loop_reads_its_share_of_a_two_cpu_view(tmp_path):
    with v1_cgroup(512 * MiB, 200000, 100000, cpus="0-1") as cg:
        burn(cg, 2.5, 2)
        # One busy thread in a 2-CPU view: 50 % busy.
        script = f"{BUSY.format(s=8)} & sleep 1; vmstat 1 4; kill $! 2>/dev/null; wait"
        (vmstat,) = guestfs_run(cg, str(tmp_path / "mnt"), [script])
    v = vmstat_last(vmstat)
    assert 30 <= v["us"] + v["sy"] <= 70, vmstat
    assert 30 <= v["id"] <= 70, vmstat


def test_recreated_cgroup_gets_a_clock_of_its_own(tmp_path):
    """One daemon (pinned to a cgroup path) serving while the cgroup is removed and made
    again: the new one is a new container, with a clock of its own. Its busy time is what
    it burnt (its own cpuacct usage), not the old one's plus a part of it (a carried
    clock held it, or froze it before that), and uptime's idle is within its age x 2."""
    mp = tmp_path / "mnt"
    with (v1_cgroup(512 * MiB, 200000, 100000, cpus="0-1") as cg,
          mounted(str(mp), "--cgroup", cg.paths["cpu"], "--cache-ttl", "0.1")):
        burn(cg, 2.0, 1)
        before = (mp / "proc/stat").read_text().split("\n")[0].split()
        recreate_cpu(cg)   # removed and made again at the same path, same limits
        time.sleep(0.3)
        (mp / "proc/stat").read_text()      # the new incarnation's first reading
        burn(cg, 1.5, 1)
        time.sleep(0.3)
        after = (mp / "proc/stat").read_text().split("\n")[0].split()
        age, idle = (float(x) for x in (mp / "proc/uptime").read_text().split())
        burnt = acct_ticks(cg)              # the new cgroup's lifetime
    busy = lambda f: int(f[1]) + int(f[3])  # noqa: E731 - user + system ticks
    assert busy(before) >= 150
    assert burnt - 5 <= busy(after) <= burnt + 3, (before, after, burnt)
    assert idle <= age * 2 + 0.02, (age, idle)   # was 2.5 s more than the new age x 2


# Without CAP_SYS_RESOURCE (root here lacks it, as in most pods) the kernel takes only
# windows that are multiples of 2 s.
PSI = ("import os, select\n"
       "fd = os.open('/proc/pressure/cpu', os.O_RDWR | os.O_NONBLOCK)\n"
       "os.write(fd, b'some 150000 2000000\\0')\n"
       "p = select.poll(); p.register(fd, select.POLLPRI)\n"
       "p.poll(100)\n"
       "print('trigger armed')\n")


def test_psi_trigger_works_under_run_and_is_refused_with_bind_pressure(tmp_path):
    """systemd-oomd-style monitors write a trigger to /proc/pressure/* and poll it; the
    kernel's file must stay in place unless --bind-pressure asks for ours."""
    import os as _os

    if not _os.path.exists("/proc/pressure/cpu"):
        pytest.skip("this kernel has no PSI (/proc/pressure)")
    with v1_cgroup(512 * MiB, 200000, 100000, cpus="0-1") as cg:
        (out,) = guestfs_run(cg, str(tmp_path / "mnt"), [
            f"{sys.executable} -c \"{PSI}\"; head -1 /proc/meminfo"])
        assert "trigger armed" in out and "524288 kB" in out, out
        script = f"{sys.executable} -c \"{PSI}\" 2>&1 | tail -1"
        res = in_cgroup(cg, [sys.executable, "-m", "guestfs", "run", "--bind-pressure",
                             "--mountpoint", str(tmp_path / "mnt2"), "--", "sh", "-c",
                             script])
        force_unmount(str(tmp_path / "mnt2"))
    assert "Read-only file system" in res.stdout, res.stdout + res.stderr


FRESH = r'''
import os, subprocess, sys, time
def free_kb(f):
    f.seek(0)
    return int(next(l for l in f.read().splitlines() if l.startswith("MemFree:")).split()[1])
held = open("/proc/meminfo")            # a long-lived reader, re-reading after lseek(0)
before = free_kb(held)
alloc = subprocess.Popen([sys.executable, "-c",
    "import sys, time; b = bytearray(200 << 20); sys.stdout.write('x'); sys.stdout.flush();"
    " time.sleep(30)"], stdout=subprocess.PIPE)
alloc.stdout.read(1)                    # the 200 MiB are touched
time.sleep(0.6)                         # --cache-ttl 0.5 + 0.1
held_kb = free_kb(held)
with open("/proc/meminfo") as f:
    new_kb = free_kb(f)
alloc.kill()
print(before, held_kb, new_kb)
'''


def test_one_freshness_bound_for_held_and_new_readers(tmp_path):
    """A number is at most --cache-ttl old, for a reader holding the file open (procps
    re-reads after lseek) as for a new process; both see the allocation."""
    with v1_cgroup(512 * MiB, 200000, 100000, cpus="0-1") as cg:
        script = tmp_path / "fresh.py"
        script.write_text(FRESH)
        (out,) = guestfs_run(cg, str(tmp_path / "mnt"), [f"{sys.executable} {script}"])
    before, held, new = (int(x) for x in out.split())
    assert before - held >= 180 * 1024, out     # 200 MiB allocated: MemFree fell
    assert abs(held - new) <= 16 * 1024, out     # both readers agree


def test_loadavg_last_pid_is_the_containers(tmp_path):
    """A reader in its own pid namespace (a container read through a host daemon) gets its
    namespace's last pid, not the daemon's."""
    mp = tmp_path / "mnt"
    with mounted(str(mp)), v1_cgroup(512 * MiB, 200000, 100000, cpus="0-1") as cg:
        out = in_cgroup(cg, ["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c",
                             f"sleep 30 & true; cat {mp}/proc/loadavg; kill $!"])
    assert out.returncode == 0, out.stderr
    last = int(out.stdout.split()[4])
    assert 1 <= last < 20, out.stdout      # sleep is pid 2 or so there; the host is in the 1000s


def _child(cg: RealCgroup, name: str, cpus: str) -> dict[str, str]:
    """A child of ``cg`` in its cpu, cpuacct and cpuset hierarchies, pinned to ``cpus``."""
    made = {}
    for c in ("cpu", "cpuacct", "cpuset"):
        if c not in cg.dirs:
            continue
        made[c] = os.path.join(cg.dirs[c], name)
        os.mkdir(made[c])
    with open(os.path.join(cg.dirs["cpuset"], "cpuset.mems")) as f:
        mems = f.read().strip()
    for name, value in (("cpuset.mems", mems), ("cpuset.cpus", cpus)):
        with open(os.path.join(made["cpuset"], name), "w") as out:
            out.write(value)
    return made


def _busy_in(dirs: dict[str, str], seconds: float) -> subprocess.Popen[bytes]:
    shell = f'for d in {" ".join(dirs.values())}; do echo $$ > $d/cgroup.procs; done; exec "$@"'
    return subprocess.Popen(["sh", "-c", shell, "_", "sh", "-c", BUSY.format(s=seconds)])


def _served(mp) -> tuple[int, int, float]:
    """(busy ticks of the cpu line, busy + idle ticks of cpu0, uptime's first field)."""
    lines = (mp / "proc/stat").read_text().splitlines()
    total = [int(x) for x in lines[0].split()[1:]]
    cpu0 = [int(x) for x in lines[1].split()[1:]]
    return total[0] + total[2], cpu0[0] + cpu0[2] + cpu0[3], \
        float((mp / "proc/uptime").read_text().split()[0])


@pytest.mark.parametrize("quota", [200000, -1], ids=["2-cpu-quota", "no-quota"])
def test_a_one_cpu_view_under_a_two_cpu_cgroup_is_at_most_one_cpu_busy(tmp_path, quota):
    """A pod and two containers pinned to CPU 0 and CPU 1 (Kubernetes' static CPU
    manager), both busy: the view of the CPU 0 container shows 1 CPU. With the 2-CPU
    quota at the pod, its clock follows the pod's counter (where the quota sits), which
    grows by up to 2 CPUs; with no quota, the container's own. Its busy time may grow by
    at most one CPU's worth of the served uptime, and never by more than that counter's
    cgroup burnt (its cpuacct usage); cpu0's line by no more than the uptime."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("needs 2 CPUs to pin two containers apart")
    mp = tmp_path / "mnt"
    with v1_cgroup(512 * MiB, quota, 100000, cpus="0-1") as pod:
        kids = [_child(pod, "c0", "0"), _child(pod, "c1", "1")]
        counter = pod if quota > 0 else RealCgroup(kids[0], {})
        loops = [_busy_in(k, 20) for k in kids]
        try:
            with mounted(str(mp), "--cgroup", f"{pod.paths['cpu']}/c0", "--cache-ttl", "0.1"):
                assert (mp / "sys/devices/system/cpu/online").read_text() == "0\n"
                time.sleep(0.5)
                busy0, all0, up0 = _served(mp)
                used0 = acct_ticks(counter)
                time.sleep(2)
                used1 = acct_ticks(counter)
                busy1, all1, up1 = _served(mp)
        finally:
            for p in loops:
                p.kill()
                p.wait()
            for k in kids:
                for d in reversed(list(k.values())):
                    empty_and_remove(d)
    ticks = (up1 - up0) * 100
    burnt = used1 - used0                       # the counter's cgroup's usage, in ticks
    assert busy1 - busy0 <= ticks + 3, (busy0, busy1, up0, up1, burnt)   # was ~ burnt
    assert busy1 - busy0 <= burnt + 3, (busy0, busy1, burnt)
    assert all1 - all0 <= ticks + 3, (all0, all1, up0, up1)
    print(f"{quota=}: the counter's cgroup burnt {burnt / ticks:.2f} CPUs; the view showed "
          f"{(busy1 - busy0) / ticks:.2f} busy of its 1 CPU")
