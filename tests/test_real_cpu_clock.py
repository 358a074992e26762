"""What people watch, through `guestfs run` in real cgroups: an idle container reads idle,
a busy loop reads its share, the load starts at 0 and the uptime is the container's, also
in a cgroup that burnt CPU before the container started (a pod slice that outlives a
restart, a systemd unit, a CI job)."""

from __future__ import annotations

import os
import sys
import time

import pytest

from tests.fusemount import force_unmount, mounted
from tests.realcg import RealCgroup, v1_cgroup
from tests.test_real_run import guestfs_run, in_cgroup

pytestmark = pytest.mark.real
MiB = 1 << 20
BUSY = f"{sys.executable} -c 'import time; t=time.time()\nwhile time.time()-t<{{s}}: pass'"


def burn(cg: RealCgroup, seconds: float, procs: int) -> None:
    """``procs`` busy loops for ``seconds`` inside ``cg``; they exit before we go on."""
    script = " & ".join([BUSY.format(s=seconds)] * procs) + "; wait"
    out = in_cgroup(cg, ["sh", "-c", script], timeout=60)
    assert out.returncode == 0, out.stderr


def vmstat_last(text: str) -> dict[str, int]:
    lines = [ln.split() for ln in text.splitlines() if ln.strip()]
    header = next(ln for ln in lines if "id" in ln and "us" in ln)
    return dict(zip(header, map(int, lines[-1]), strict=True))


def top_second_cpu_line(text: str) -> dict[str, float]:
    line = [ln for ln in text.splitlines() if ln.startswith("%Cpu(s)")][-1]
    parts = line.split(":", 1)[1].replace(",", " ").split()
    return {parts[i + 1]: float(parts[i]) for i in range(0, len(parts) - 1, 2)}


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
    again: the new one's busy loop shows up in /proc/stat (it froze before)."""
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
    busy = lambda f: int(f[1]) + int(f[3])  # noqa: E731 - user + system ticks
    assert busy(before) >= 150
    assert busy(after) - busy(before) >= 100, (before, after)  # 1.5 s burnt: 150 ticks


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
