"""cgroup v2 tests that run *inside* the test VM (tests/external/vm/test_vm_v2.py boots it
and reports each of these as its own result). Not collected on the host: the name has no
test_ prefix.

The guest: Debian's 6.1 kernel, pure cgroup v2 with cpuset cpu io memory pids enabled at
the root, 4 CPUs, 128 MiB of swap on a RAM disk, the host's root read-only. Python starts
slowly under software emulation (~3 s), so one guestfs daemon and one LXCFS serve every
test and the readers are plain `cat` processes placed in the cgroups under test.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from guestfs.engine.limits import effective_limits
from guestfs.sources.host_root import HostRoot
from guestfs.sources.snapshot import read_snapshot
from tests.support.fusemount import mounted
from tests.support.lxcfsd import lxcfs_mounted
from tests.support.paths import SUPPORT
from tests.support.render_helpers import meminfo_kb

CG = "/sys/fs/cgroup"
GFS, LXCFS = "/run/gfs", "/run/lxcfs"
GFS_LOG = "/run/gfs.log"
RECORDS = "/mnt/records.jsonl"
POD_UID = "a5d4fbc7_30d6_43e8_8425_8ee6f401decc"
CID = "a991eb3b64a228cb0b269925127c28cb39d482d27c6248540e0e3b41633a907e"
POD = (f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_UID}.slice")
SCOPE = f"{POD}/cri-containerd-{CID}.scope"
CONTROLLERS = "+cpuset +cpu +io +memory +pids"


def daemon_log(lines: int = 40, path: str = GFS_LOG) -> str:
    """The tail of a guest daemon's log, for a failure's message (the VM is gone after)."""
    try:
        with open(path, errors="replace") as f:
            return "guestfs log:\n" + "".join(f.readlines()[-lines:])
    except OSError as e:
        return f"no guestfs log ({e})"


def record(test: str, **values: object) -> None:
    with open(RECORDS, "a") as f:
        f.write(json.dumps({"test": test, **values}) + "\n")


@pytest.fixture(scope="module", autouse=True)
def daemons() -> Iterator[None]:
    if not os.path.exists(f"{CG}/cgroup.subtree_control"):
        pytest.fail("not a cgroup v2 guest: run through tests/external/vm/test_vm_v2.py")
    with mounted(GFS, "--cache-ttl", "0.2", log=GFS_LOG), lxcfs_mounted(LXCFS, "/run/lxcfs.pid"):
        yield


@contextlib.contextmanager
def cgroup_tree(path: str, files: dict[str, dict[str, str]]) -> Iterator[str]:
    """Create CG/path level by level, enabling controllers for the children, write
    ``files`` ({relative level: {name: value}}); remove it all afterwards."""
    parts = path.split("/")
    made: list[str] = []
    try:
        for i in range(len(parts)):
            d = os.path.join(CG, *parts[: i + 1])
            if not os.path.isdir(d):
                os.mkdir(d)
                made.append(d)
            if i < len(parts) - 1:
                with open(f"{d}/cgroup.subtree_control", "w") as f:
                    f.write(CONTROLLERS)
        for rel, values in files.items():
            for name, value in values.items():
                with open(os.path.join(CG, rel, name), "w") as f:
                    f.write(value)
        yield os.path.join(CG, path)
    finally:
        for d in reversed(made):
            kill_all(d)
            for _ in range(100):
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:   # the test removed it itself
                    break
                except OSError:
                    time.sleep(0.05)


def kill_all(d: str) -> None:
    with contextlib.suppress(OSError), open(f"{d}/cgroup.kill", "w") as f:
        f.write("1")


def run_in(cg_dir: str, *argv: str, env: dict[str, str] | None = None) -> str:
    shell = f'echo $$ > {cg_dir}/cgroup.procs && exec "$@"'
    out = subprocess.run(["sh", "-c", shell, "_", *argv], capture_output=True, text=True,
                         timeout=300, env={**os.environ, **(env or {})})
    assert out.returncode == 0, out.stderr
    return out.stdout


def view(cg_dir: str, root: str) -> tuple[dict[str, int], int, str]:
    """(meminfo, processors in cpuinfo, cpu online) read by a process in ``cg_dir``."""
    mem = run_in(cg_dir, "cat", f"{root}/proc/meminfo")
    cpus = run_in(cg_dir, "cat", f"{root}/proc/cpuinfo").count("processor\t:")
    online = run_in(cg_dir, "cat", f"{root}/sys/devices/system/cpu/online").strip()
    return meminfo_kb(mem), cpus, online


def test_pod_slice_limit_reaches_the_scope():
    files = {POD: {"memory.max": "536870912", "cpu.max": "100000 100000"}}
    with cgroup_tree(SCOPE, files) as scope:
        with open(f"{scope}/memory.max") as f:
            assert f.read().strip() == "max"
        sleeper = subprocess.Popen(["sh", "-c", f"echo $$ > {scope}/cgroup.procs; exec sleep 60"])
        try:
            time.sleep(0.3)
            lim = effective_limits(read_snapshot(HostRoot("/"), str(sleeper.pid)))
        finally:
            sleeper.kill()
            sleeper.wait()
        assert lim.memory.value == 536870912
        assert lim.memory.source.file == f"{CG}/{POD}/memory.max"
        assert lim.cpu_count.value == 1
        mem, cpus, online = view(scope, GFS)
        lx_mem, lx_cpus, lx_online = view(scope, LXCFS)
    record("pod_slice_limit", guestfs={"MemTotal": mem["MemTotal"], "cpus": cpus, "online": online},
           lxcfs={"MemTotal": lx_mem["MemTotal"], "cpus": lx_cpus, "online": lx_online})
    assert mem["MemTotal"] == 524288 and cpus == 1 and online == "0"


def test_quota_inherited_from_the_parent():
    parent = "guestfs-quota.slice"
    with cgroup_tree(f"{parent}/leaf.scope", {parent: {"cpu.max": "50000 100000"}}) as leaf:
        with open(f"{leaf}/cpu.max") as f:
            assert f.read().split()[0] == "max"
        _, cpus, online = view(leaf, GFS)
        _, lx_cpus, lx_online = view(leaf, LXCFS)
    record("quota_inherited", guestfs={"cpus": cpus, "online": online},
           lxcfs={"cpus": lx_cpus, "online": lx_online})
    # LXCFS 5.0.3 reads cpu.max at the leaf only and shows every CPU here.
    assert cpus == 1 and online == "0"


def test_cpuset_0_1_under_a_4_cpu_quota():
    files = {"guestfs-cpuset.slice": {"cpuset.cpus": "0-1", "cpu.max": "400000 100000"}}
    with cgroup_tree("guestfs-cpuset.slice", files) as d:
        _, cpus, online = view(d, GFS)
        _, lx_cpus, lx_online = view(d, LXCFS)
    record("cpuset_0_1_quota_4", guestfs={"cpus": cpus, "online": online},
           lxcfs={"cpus": lx_cpus, "online": lx_online})
    assert os.cpu_count() == 4
    assert cpus == 2 and online == "0-1"


def test_swap_limit_is_memory_swap_max():
    with open("/proc/swaps") as f:
        assert len(f.read().splitlines()) == 2, "the guest's RAM-disk swap is missing"
    files = {POD: {"memory.max": "536870912", "memory.swap.max": "67108864"}}
    with cgroup_tree(SCOPE, files) as scope:
        mem, _, _ = view(scope, GFS)
        swaps = run_in(scope, "cat", f"{GFS}/proc/swaps")
        lx_mem, _, _ = view(scope, LXCFS)
    record("swap_max_64MiB", guestfs={"SwapTotal": mem["SwapTotal"]},
           lxcfs={"SwapTotal": lx_mem["SwapTotal"]})
    assert mem["SwapTotal"] == 65536 and 0 <= mem["SwapFree"] <= 65536, \
        f"{mem}\n{daemon_log()}"
    assert int(swaps.splitlines()[1].split()[2]) == 65536


def test_cgroup_namespace_hides_the_parent_and_the_env_restores_it():
    files = {"guestfs-ns.slice": {"memory.max": "536870912"}}
    with cgroup_tree("guestfs-ns.slice/app.scope", files) as leaf:
        # A fresh cgroup2 mount inside the new cgroup namespace shows it as the root, as a
        # container runtime sets it up; the old mount must go first (same superblock).
        inner = ("umount -l /sys/fs/cgroup && mount -t cgroup2 none /sys/fs/cgroup && "
                 f"{sys.executable} -m guestfs explain --json && echo ==== && "
                 f"GUESTFS_MEMORY_LIMIT=512Mi {sys.executable} -m guestfs show /proc/meminfo")
        out = run_in(leaf, "unshare", "--cgroup", "--mount", "sh", "-c", inner)
    explained, meminfo = out.split("====\n")
    got = json.loads(explained)
    assert got["memory"]["limited"] is False
    assert any("not the host's root" in w for w in got["warnings"]), got["warnings"]
    assert meminfo_kb(meminfo)["MemTotal"] == 524288


def test_busy_loop_moves_container_cpu_time_by_cpu_stat():
    files = {"guestfs-busy.slice": {"cpu.max": "200000 100000"}}
    with cgroup_tree("guestfs-busy.slice", files) as d:
        def stat_busy() -> int:
            first = run_in(d, "cat", f"{GFS}/proc/stat").splitlines()[0].split()
            return int(first[1]) + int(first[3])

        def usage_ticks() -> int:
            with open(f"{d}/cpu.stat") as f:
                st = dict(line.split() for line in f)
            return int(st["user_usec"]) // 10_000 + int(st["system_usec"]) // 10_000

        busy0, use0 = stat_busy(), usage_ticks()
        loop = subprocess.Popen(["sh", "-c", f"echo $$ > {d}/cgroup.procs; "
                                             "exec sh -c 'while :; do :; done'"])
        seen = [busy0]
        try:
            for _ in range(6):
                time.sleep(0.5)
                seen.append(stat_busy())
        finally:
            loop.kill()
            loop.wait()
        time.sleep(0.5)
        busy1, use1 = stat_busy(), usage_ticks()
    record("busy_loop", stat_delta_ticks=busy1 - busy0, cpu_stat_delta_ticks=use1 - use0)
    assert seen == sorted(seen) and busy1 >= seen[-1]
    assert use1 - use0 > 50
    assert abs((busy1 - busy0) - (use1 - use0)) <= 0.25 * (use1 - use0) + 5


def test_tools_inside_guestfs_run_in_the_scope():
    files = {POD: {"memory.max": "536870912", "cpu.max": "100000 100000"}}
    py = "import os; print(os.cpu_count())"
    script = (f"free -m; echo ====; top -bn1 -1 -w 512 | head -5; echo ====; "
              f"{sys.executable} -c '{py}'")
    with cgroup_tree(SCOPE, files) as scope:
        out = run_in(scope, sys.executable, "-m", "guestfs", "run", "--mountpoint",
                     "/run/gfs-run", "--", "sh", "-c", script)
    free, top, count = out.split("====\n")
    assert next(ln.split() for ln in free.splitlines() if ln.startswith("Mem:"))[1] == "512"
    assert "MiB Mem :    512.0 total" in top and top.count("%Cpu") == 1
    assert count.strip() == "1"


def test_sysinfo_and_cpu_count_under_run_in_the_scope():
    """sysinfo(2) and sched_getaffinity(0) answered for the app on a v2 kernel without
    PROCMAP_QUERY (6.1: the writability check reads /proc/<tid>/maps): the pod slice's
    512 MiB and one CPU of the guest's four."""
    files = {POD: {"memory.max": "536870912", "cpu.max": "100000 100000"}}
    probe = str(SUPPORT / "syscall_probe.py")
    with cgroup_tree(SCOPE, files) as scope:
        out = json.loads(run_in(scope, sys.executable, "-m", "guestfs", "run", "--mountpoint",
                                "/run/gfs-sysinfo", "--", sys.executable, probe))
    record("sysinfo_under_run", totalram=out["sysinfo"]["totalram"], getconf=out["getconf"],
           nproc=out["nproc"], affinity=out["affinity"], loads=out["getloadavg"])
    assert out["sysinfo"]["totalram"] == 512 << 20
    assert out["getconf"] == str((512 << 20) // out["page_size"])
    assert out["nproc"] == "1" and len(out["affinity"]) == 1
    assert out["efault_readonly"] == [14, True]


def test_long_lived_cgroup_reads_idle_under_run():
    """A cgroup that burnt CPU before `guestfs run` started in it: an idle container
    still reads idle in vmstat and top, with a load near 0 and its own short uptime."""
    files = {"guestfs-old.slice": {"cpu.max": "200000 100000", "memory.max": "536870912"}}
    with cgroup_tree("guestfs-old.slice", files) as d:
        burn = ("import time; t = time.time()\nwhile time.time() - t < 3: pass")
        run_in(d, "sh", "-c", f"{sys.executable} -c '{burn}' & "
                              f"{sys.executable} -c '{burn}' & wait")
        script = ("vmstat 1 3; echo ====; top -bn2 -d1 | grep '^%Cpu'; echo ====; "
                  "cat /proc/loadavg /proc/uptime")
        out = run_in(d, sys.executable, "-m", "guestfs", "run", "--mountpoint",
                     "/run/gfs-old", "--", "sh", "-c", script)
    vmstat, top, rest = out.split("====\n")
    last = vmstat.strip().splitlines()[-1].split()
    header = next(ln.split() for ln in vmstat.splitlines() if " id " in f" {ln} ")
    idle = int(dict(zip(header, last, strict=True))["id"])
    top_idle = float(top.strip().splitlines()[-1].split(",")[3].split()[0])
    load = float(rest.split()[0])
    age = float(rest.splitlines()[1].split()[0])
    record("long_lived_idle", vmstat_id=idle, top_id=top_idle, load1=load, uptime=age)
    assert idle >= 60 and top_idle >= 60, out   # was 0 before the per-view CPU clock
    assert load < 0.6, out                       # the daemon's own threads are not counted
    assert age < 60, out


def _vmstat_busy_idle(text: str) -> tuple[int, int]:
    header = next(ln.split() for ln in text.splitlines() if " id " in f" {ln} ")
    row = dict(zip(header, map(int, text.strip().splitlines()[-1].split()), strict=True))
    return row["us"] + row["sy"], row["id"]


def _shares(before: list[str], after: list[str], cpus: int = 2) -> tuple[float, float]:
    """(percent of ``cpus`` CPUs the busy loop used, percent the whole cgroup used) between
    two marks, each (usage_usec of cpu.stat, ns, the loop's utime + stime ticks)."""
    elapsed_us = (int(after[1]) - int(before[1])) / 1000
    loop_us = (int(after[2]) - int(before[2])) * 1e6 / os.sysconf("SC_CLK_TCK")
    return (loop_us / elapsed_us / cpus * 100,
            (int(after[0]) - int(before[0])) / elapsed_us / cpus * 100)


def test_busy_loop_reads_its_share_under_run_beside_lxcfs():
    """One busy loop in a long-lived 2-CPU cgroup (cpu.max 200000 100000 on the 4-CPU
    guest): the view's busy share in vmstat and top inside `guestfs run` lies between the
    loop's own share (about half) and the whole cgroup's (the loop, and what vmstat, top
    and the daemon cost under emulation: up to 90 % measured), both from the kernel over
    the same seconds; and vmstat is no further from half than through LXCFS's
    /proc/stat."""
    files = {"guestfs-share.slice": {"cpu.max": "200000 100000", "memory.max": "536870912"}}
    loop = "while :; do :; done"
    with cgroup_tree("guestfs-share.slice", files) as d:
        run_in(d, "sh", "-c", f"sh -c '{loop}' & p1=$!; sh -c '{loop}' & p2=$!; "
                              "sleep 3; kill $p1 $p2")
        mark = (f"echo $(sed -n 's/^usage_usec //p' {d}/cpu.stat) $(date +%s%N) "
                "$(awk '{print $14 + $15}' /proc/$p/stat)")
        inner = (f"sh -c '{loop}' & p=$!; sleep 1; {mark}; vmstat 1 3; {mark}; echo ====; "
                 f"{mark}; top -bn2 -d1 | grep '^%Cpu'; {mark}; kill $p")
        out = run_in(d, sys.executable, "-m", "guestfs", "run", "--mountpoint",
                     "/run/gfs-share", "--", "sh", "-c", inner)
        lx = run_in(d, "unshare", "--mount", "--propagation", "private", "sh", "-c",
                    f"mount --bind {LXCFS}/proc/stat /proc/stat; sh -c '{loop}' & p=$!; "
                    "sleep 1; vmstat 1 3; kill $p")
    vmstat, top = out.split("====\n")
    v, t = vmstat.strip().splitlines(), top.strip().splitlines()
    loop_v, cg_v = _shares(v[0].split(), v[-1].split())
    loop_t, cg_t = _shares(t[0].split(), t[-1].split())
    busy, idle = _vmstat_busy_idle("\n".join(v[1:-1]))
    top_busy = 100 - float(t[-2].split(",")[3].split()[0])
    lx_busy, lx_idle = _vmstat_busy_idle(lx)
    record("busy_share_under_run", vmstat_busy=busy, vmstat_id=idle, top_busy=top_busy,
           loop_share=[round(loop_v, 1), round(loop_t, 1)],
           cgroup_share=[round(cg_v, 1), round(cg_t, 1)],
           lxcfs_vmstat_busy=lx_busy, lxcfs_vmstat_id=lx_idle)
    assert loop_v - 15 <= busy <= cg_v + 15, (out, loop_v, cg_v)
    assert loop_t - 15 <= top_busy <= cg_t + 15, (out, loop_t, cg_t)
    assert abs(busy - 50) <= abs(lx_busy - 50) + 15, (out, lx)


def test_fresh_idle_container_in_every_client_under_run():
    """The real clients of tests/external/test_real_clients.py on cgroup v2: a fresh, idle 512 MiB
    / 2-CPU container reads idle, its own age, a load near 0, 512 MiB and 2 CPUs in each.
    Not htop nor node_exporter here: the guest has no pseudo-terminals for tmux and no
    loopback network to scrape; they run on v1 (tests/external/test_real_clients.py)."""
    clients = ["vmstat", "top", "mpstat", "uptime", "node", "psutil", "proc"]
    files = {"guestfs-clients.slice": {"cpu.max": "200000 100000", "memory.max": "536870912"}}
    probe = str(SUPPORT / "client_probe.py")
    with cgroup_tree("guestfs-clients.slice", files) as d:
        out = run_in(d, sys.executable, "-m", "guestfs", "run", "--mountpoint",
                     "/run/gfs-clients", "--", sys.executable, probe, *clients,
                     env={"GUESTFS_PROBE_USAGE": f"{d}/cpu.stat", "GUESTFS_PROBE_CPUS": "2"})
    r = json.loads(out.strip().splitlines()[-1])
    errors = {k: v["error"] for k, v in r.items() if "error" in v}
    assert not errors, errors
    idle = {"vmstat": r["vmstat"]["idle"], "top": r["top"]["idle"],
            "mpstat": r["mpstat"]["idle"], "node": r["node"]["idle"],
            "psutil": 100 - r["psutil"]["busy"]}
    loads = {k: r[k]["load1"] for k in ("proc", "uptime", "top", "node")}
    record("clients_fresh_idle_under_run", idle=idle, load1=loads,
           uptime=r["proc"]["uptime"], errors=errors)
    assert not errors, errors
    assert all(v >= 70 for v in idle.values()), idle   # TCG: the guest's own work is slow
    assert all(v < 0.6 for v in loads.values()), loads
    assert 0 <= r["proc"]["uptime"] < 120 and 0 <= r["node"]["uptime"] < 120
    assert r["node"]["totalmem"] == 512 << 20 and r["psutil"]["total"] == 512 << 20
    assert r["top"]["mem_total_mib"] == 512
    assert {r["node"]["cpus"], r["psutil"]["count"]} == {2}


# ------------------------------------------------------------------ PSI triggers on v2

# LXCFS's trigger (its tests/test_psi_poll.c): 20 ms stalled within a 2 s window. The
# daemon has dropped CAP_SYS_RESOURCE, so its triggers are unprivileged ones: a window
# that is a multiple of 2 s is the only kind such a writer may set (Linux >= 6.5, and
# Debian's 6.1.192 this guest boots, which has that change backported).
PSI_TRIGGER = b"some 20000 2000000\n"
PSI_THRESHOLD_US = 20_000
PSI_UNPRIVILEGED_REFUSED = b"some 20000 1000000\n"   # 1 s: CAP_SYS_RESOURCE only
PSI_SECONDS = 9.0
# Without CAP_SYS_RESOURCE, as the daemon is (so a trigger it writes is the kind the
# daemon's is: checked on PSI's 2 s averaging clock, not its fast poller).
UNPRIVILEGED = ["setpriv", "--inh-caps=-sys_resource", "--bounding-set=-sys_resource"]
PSI_MP = "/run/gfs-psi"
PSI_LOG = PSI_MP + ".log"
# A reader (argv: trigger, a refused trigger, paths): first writes the refused trigger to
# the first path and answers its errno (0: taken); then opens each path for writing,
# writes the trigger and answers each line read: "poll S": its events in S seconds of
# polling for POLLPRI ([seconds, path index, revents]); "move DIR": it moves itself into
# cgroup DIR. At the end of its input it closes the paths and exits.
PSI_READER = """
import json, os, select, sys, time
trigger, refused_trigger, paths = sys.argv[1], sys.argv[2], sys.argv[3:]
def attempt(data):
    fd = os.open(paths[0], os.O_RDWR | os.O_NONBLOCK)
    try:
        os.write(fd, data)
        return 0
    except OSError as e:
        return e.errno
    finally:
        os.close(fd)
refused = attempt(refused_trigger.encode())
fds = [os.open(p, os.O_RDWR | os.O_NONBLOCK) for p in paths]
for fd in fds:
    os.write(fd, trigger.encode())
p = select.poll()
for fd in fds:
    p.register(fd, select.POLLPRI)
print(json.dumps(refused), flush=True)
for line in sys.stdin:
    cmd, arg = line.split()
    if cmd == "poll":
        t0, events = time.monotonic(), []
        while (left := float(arg) - (time.monotonic() - t0)) > 0:
            for fd, ev in p.poll(left * 1000):
                events.append([round(time.monotonic() - t0, 2), fds.index(fd), ev])
                if ev & select.POLLERR:
                    p.unregister(fd)   # no trigger (any more): reported at every poll
        print(json.dumps(events), flush=True)
    elif cmd == "move":
        with open(arg + "/cgroup.procs", "w") as f:
            f.write(str(os.getpid()))
        print(json.dumps(arg), flush=True)
for fd in fds:
    os.close(fd)
"""

def psi_some_total(path: str) -> int:
    """The "some" stall total (µs) of a pressure file."""
    with open(path) as f:
        some = next(ln for ln in f if ln.startswith("some "))
    return int(some.split("total=")[1])


def holders(path: str, pids: list[int]) -> list[int]:
    """Which of ``pids`` hold ``path`` open (by device and inode: the daemon opens it
    through its own private sysfs, so its link need not read like ours)."""
    want = os.stat(path)
    out = []
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        with contextlib.suppress(OSError):
            for fd in os.listdir(fd_dir):
                with contextlib.suppress(OSError):
                    st = os.stat(f"{fd_dir}/{fd}")
                    if (st.st_dev, st.st_ino) == (want.st_dev, want.st_ino):
                        out.append(pid)
                        break
    return out


def unprivileged_answer(path: str, data: bytes) -> int:
    """The errno (0: taken) the kernel gives a writer without CAP_SYS_RESOURCE, as the
    daemon is, writing trigger ``data`` to ``path``."""
    code = ("import os, sys\ntry:\n os.write(os.open(sys.argv[1], os.O_RDWR), sys.argv[2]"
            ".encode())\n print(0)\nexcept OSError as e:\n print(e.errno)")
    out = subprocess.run([*UNPRIVILEGED, sys.executable, "-c", code, path, data.decode()],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return int(out.stdout)


class PsiReader:
    """PSI_READER's process, asked one line at a time."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc

    def ask(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def answer(self, timeout: float = 120) -> Any:
        """Its next answer (Python starts in ~3 s under emulation); fails with its stderr
        and the daemon's log if none comes."""
        out = self.proc.stdout
        assert out is not None
        # One line per question: nothing is left buffered behind a line read.
        line = out.readline() if select.select([out], [], [], timeout)[0] else ""
        if not line:
            self.proc.kill()
            _, err = self.proc.communicate()
            pytest.fail(f"the PSI reader gave no answer: {err}\n{daemon_log(path=PSI_LOG)}")
        return json.loads(line)

    def close(self) -> None:
        """The end of its input: it closes its trigger files and exits."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        assert self.proc.wait() == 0, self.proc.stderr.read() if self.proc.stderr else ""


@contextlib.contextmanager
def psi_reader(cg_dir: str, *paths: str, unprivileged: bool = False) -> Iterator[PsiReader]:
    """PSI_READER in ``cg_dir`` on ``paths`` (without CAP_SYS_RESOURCE if
    ``unprivileged``); killed at the end if it is still there."""
    argv = [*(UNPRIVILEGED if unprivileged else []), sys.executable, "-c", PSI_READER,
            PSI_TRIGGER.decode(), PSI_UNPRIVILEGED_REFUSED.decode(), *paths]
    proc = subprocess.Popen(["sh", "-c", f'echo $$ > {cg_dir}/cgroup.procs && exec "$@"',
                             "_", *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        yield PsiReader(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for f in (proc.stdin, proc.stdout, proc.stderr):
            if f is not None:
                f.close()


def released_since(before: dict[str, int], n: int) -> dict[str, int]:
    """The daemon's counts once ``n`` more trigger files were released (RELEASE is
    asynchronous: a close reaches the daemon shortly after), or after 10 s."""
    deadline = time.monotonic() + 10
    while (now := psi_counts())["released"] - before["released"] < n \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    return now


def psi_counts() -> dict[str, int]:
    with open(f"{PSI_MP}/.guestfs-status") as f:
        return dict(json.load(f)["psi_triggers"])


def test_psi_trigger_lands_on_the_readers_own_cgroup_file():
    """Two sibling cgroups, each with cpu.max 100000 100000 (one CPU: the limit applies
    there, so each one's served cpu pressure is its own cpu.pressure): two busy loops in
    `busy` are throttled to half their time, which PSI counts as "some" stall there (and
    on the host); `idle` holds only its reader, asleep in poll. A reader in each writes
    the trigger to the served proc/pressure/cpu and, as the references, to its own
    cgroup's cpu.pressure directly (the busy one without CAP_SYS_RESOURCE, so that its
    trigger is of the daemon's kind; the idle one also to the host's /proc/pressure/cpu),
    then all poll for POLLPRI together for 9 s. The busy reader's served file fires as
    its cgroup's own does; the idle reader's served file does not fire while its
    cgroup's own pressure stays under the threshold, though the host's file fires: the
    trigger went to the reader's cgroup, not to /proc/pressure. The daemon held each
    cgroup's file open while armed, counted the triggers opened, armed and fired, and
    let them go at close."""
    if not os.path.isdir("/proc/pressure"):
        with open("/proc/cmdline") as f:
            assert "psi=0" in f.read(), "no /proc/pressure, yet psi=0 is not set"
        pytest.skip("this kernel has PSI turned off (psi=0)")
    cpu_max = {"cpu.max": "100000 100000"}
    with cgroup_tree("guestfs-psi.slice/busy", {"guestfs-psi.slice/busy": cpu_max}) as busy, \
            cgroup_tree("guestfs-psi.slice/idle", {"guestfs-psi.slice/idle": cpu_max}) as idle, \
            mounted(PSI_MP, "--fuse-binding", "guestfs", log=PSI_LOG) as daemon:
        own = {"busy": f"{busy}/cpu.pressure", "idle": f"{idle}/cpu.pressure"}
        if not os.path.exists(own["busy"]):
            pytest.fail(f"/proc/pressure is there but {own['busy']} is not")
        unprivileged = unprivileged_answer(own["busy"], PSI_TRIGGER)
        if unprivileged == errno.EPERM:
            pytest.skip(f"Linux {os.uname().release} takes no PSI trigger from a writer "
                        "without CAP_SYS_RESOURCE, as the daemon is")
        assert unprivileged == 0, os.strerror(unprivileged)
        kernel_refused = unprivileged_answer(own["busy"], PSI_UNPRIVILEGED_REFUSED)
        before = psi_counts()
        served = f"{PSI_MP}/proc/pressure/cpu"
        with psi_reader(busy, served, own["busy"], unprivileged=True) as b_reader, \
                psi_reader(idle, served, own["idle"], "/proc/pressure/cpu") as i_reader:
            refused = [b_reader.answer(), i_reader.answer()]
            armed = psi_counts()
            # The daemon holds each reader's own cgroup file, and not the other's.
            held = {k: holders(v, [daemon.pid]) for k, v in own.items()}
            totals0 = {k: psi_some_total(v) for k, v in own.items()}
            host0 = psi_some_total("/proc/pressure/cpu")
            loops = [subprocess.Popen(["sh", "-c", f"echo $$ > {busy}/cgroup.procs && "
                                       "exec sh -c 'while :; do :; done'"])
                     for _ in range(2)]
            try:
                t0 = time.monotonic()
                b_reader.ask(f"poll {PSI_SECONDS}")
                i_reader.ask(f"poll {PSI_SECONDS}")
                b_events = b_reader.answer(PSI_SECONDS + 120)
                i_events = i_reader.answer(PSI_SECONDS + 120)
                polled = time.monotonic() - t0
            finally:
                for p in loops:
                    p.kill()
                    p.wait()
            totals1 = {k: psi_some_total(v) for k, v in own.items()}
            host1 = psi_some_total("/proc/pressure/cpu")
            b_reader.close()
            i_reader.close()
        after = released_since(before, 4)
        released_held = {k: holders(v, [daemon.pid]) for k, v in own.items()}
    stall = {k: totals1[k] - totals0[k] for k in own}
    host_stall = host1 - host0
    events = {
        "busy_served": [e for e in b_events if e[1] == 0],
        "busy_own": [e for e in b_events if e[1] == 1],
        "idle_served": [e for e in i_events if e[1] == 0],
        "idle_own": [e for e in i_events if e[1] == 1],
        "idle_host": [e for e in i_events if e[1] == 2],
    }
    record("psi_trigger_v2", kernel=os.uname().release, trigger=PSI_TRIGGER.decode().strip(),
           polled_s=round(polled, 1), poll_seconds=PSI_SECONDS,
           events={k: [e[0] for e in v] for k, v in events.items()},
           some_stall_us={**stall, "host": host_stall}, daemon_held=held,
           counts={k: after[k] - before[k] for k in after},
           refused_1s_window={"served": refused,
                              "unprivileged_own": kernel_refused})
    why = f"{events}, stall {stall}, host {host_stall}\n{daemon_log(path=PSI_LOG)}"
    # Each event is POLLPRI alone, as the kernel's own file reports a live trigger.
    assert all(e[2] == select.POLLPRI for e in b_events + i_events), why
    # The busy cgroup's pressure rose, and its served file fired as its own file did
    # (PSI reports at most one event per window: 2 s here).
    assert stall["busy"] >= PSI_THRESHOLD_US, why
    assert len(events["busy_own"]) >= 2, why
    assert len(events["busy_served"]) >= 2, why
    assert abs(len(events["busy_served"]) - len(events["busy_own"])) <= 1, why
    # ... each within a window of one on the cgroup's own file: the same kernel events,
    # told through FUSE_NOTIFY_POLL and the reader's next POLL.
    own_times = [e[0] for e in events["busy_own"]]
    lags = [min(abs(e[0] - t) for t in own_times) for e in events["busy_served"]]
    assert max(lags) < 1.9, (lags, why)
    # The idle reader's trigger is its cgroup's: it cannot fire while that cgroup
    # stalled less than the threshold in all the run, whatever the host's file does
    # (and on a loaded guest that did stall it, no more often than its own file).
    if stall["idle"] < PSI_THRESHOLD_US:
        assert events["idle_served"] == [] and events["idle_own"] == [], why
    else:
        assert len(events["idle_served"]) <= len(events["idle_own"]) + 1, why
    # ... while the same trigger on the host's file, which a trigger sent there would
    # be, fired: the check above could fail.
    assert host_stall >= PSI_THRESHOLD_US and len(events["idle_host"]) >= 1, why
    # The daemon held each reader's own cgroup file while armed, and neither after.
    assert held == {"busy": [daemon.pid], "idle": [daemon.pid]}, (held, why)
    assert released_held == {"busy": [], "idle": []}, released_held
    # Four trigger files opened (the refused 1 s windows' and the armed ones, two per
    # reader), two armed, fired at least as often as the busy reader saw, all released.
    assert {k: armed[k] - before[k] for k in ("opened", "armed")} == \
        {"opened": 4, "armed": 2}, (armed, before)
    assert after["fired"] - before["fired"] >= len(events["busy_served"]), (after, why)
    assert after["released"] - before["released"] == 4, (after, before)
    assert after["gone"] == before["gone"] and after["refused"] == before["refused"]
    # The served file refused the 1 s window as the kernel refuses it to a writer without
    # CAP_SYS_RESOURCE (the daemon), not as to the root readers.
    assert kernel_refused == errno.EINVAL
    assert refused == [kernel_refused] * 2, refused


def remove_cgroup(d: str) -> None:
    """rmdir ``d`` once its killed processes are gone (cgroup.kill is asynchronous)."""
    kill_all(d)
    for _ in range(200):
        try:
            os.rmdir(d)
            return
        except OSError:
            time.sleep(0.05)
    os.rmdir(d)


def test_psi_memory_trigger_lands_on_the_limiting_parent_and_ends_with_it():
    """The reader in a leaf under a parent with memory.max (96 MiB) and memory.high
    (24 MiB), a sibling leaf touching 40 MiB over and over (reclaim, swap and the
    over-high penalty: memory "some" stall in the parent): the served
    proc/pressure/memory's trigger goes to the parent's memory.pressure, where the limit
    applies (the daemon holds that file, not the leaf's), and fires as the same trigger
    written there directly by the reader without CAP_SYS_RESOURCE. Then the reader
    leaves and the cgroups are removed under its armed triggers: the served file reports
    POLLERR with POLLPRI ("no trigger"), as the kernel's own file does, and the daemon
    counts the trigger gone and releases it at close."""
    if not os.path.isdir("/proc/pressure"):
        pytest.skip("this kernel has PSI turned off")   # checked by the cpu test above
    parent = "guestfs-psimem.slice"
    limits = {parent: {"memory.max": str(96 << 20), "memory.high": str(24 << 20)}}
    with cgroup_tree(f"{parent}/reader.scope", limits) as leaf, \
            cgroup_tree(f"{parent}/hog.scope", {}) as hog_dir, \
            mounted(PSI_MP, "--fuse-binding", "guestfs", log=PSI_LOG) as daemon:
        top = os.path.dirname(leaf)
        own = f"{top}/memory.pressure"
        before = psi_counts()
        with psi_reader(leaf, f"{PSI_MP}/proc/pressure/memory", own,
                        unprivileged=True) as reader:
            refused = reader.answer()
            held = {"parent": holders(own, [daemon.pid]),
                    "leaf": holders(f"{leaf}/memory.pressure", [daemon.pid])}
            total0 = psi_some_total(own)
            hog = subprocess.Popen(["sh", "-c", f"echo $$ > {hog_dir}/cgroup.procs && exec "
                                    f"dd if=/dev/zero of=/dev/null bs={40 << 20} count=100000"],
                                   stderr=subprocess.DEVNULL)
            try:
                reader.ask(f"poll {PSI_SECONDS}")
                events = reader.answer(PSI_SECONDS + 120)
            finally:
                hog.kill()
                hog.wait()
            total1 = psi_some_total(own)
            # The reader leaves, and the whole tree goes under its armed triggers.
            reader.ask(f"move {CG}")
            reader.answer()
            for d in (hog_dir, leaf, top):
                remove_cgroup(d)
            reader.ask("poll 5")
            gone_events = reader.answer(125)
            gone = psi_counts()
            reader.close()
        after = released_since(before, 2)
    served = [e for e in events if e[1] == 0]
    direct = [e for e in events if e[1] == 1]
    stall = total1 - total0
    record("psi_memory_trigger_v2", polled_s=PSI_SECONDS, parent_some_stall_us=stall,
           events={"served": [e[0] for e in served], "parent_own": [e[0] for e in direct]},
           daemon_held=held, after_removal=gone_events,
           counts={k: after[k] - before[k] for k in after})
    why = f"{events}, stall {stall}\n{daemon_log(path=PSI_LOG)}"
    assert held == {"parent": [daemon.pid], "leaf": []}, (held, why)
    assert refused == errno.EINVAL, refused
    assert all(e[2] == select.POLLPRI for e in events), why
    assert stall >= PSI_THRESHOLD_US, why
    assert len(direct) >= 1 and len(served) >= 1, why
    assert abs(len(served) - len(direct)) <= 1, why
    lags = [min(abs(e[0] - d[0]) for d in direct) for e in served]
    assert max(lags) < 1.9, (lags, why)
    # Once the cgroup is gone, each file reports POLLERR once (the reader stops polling a
    # file that reports it), POLLPRI with it, as the kernel's own does.
    assert sorted(e[1] for e in gone_events) == [0, 1], gone_events
    assert all(e[2] == select.POLLERR | select.POLLPRI for e in gone_events), gone_events
    assert gone["gone"] - before["gone"] == 1, gone
    assert {k: after[k] - before[k] for k in ("opened", "armed", "released")} == \
        {"opened": 2, "armed": 1, "released": 2}, (after, before)
