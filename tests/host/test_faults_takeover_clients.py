"""Real clients over a minute across takeovers: `vmstat 1`, `top -b -d 1`, `free -s 1` and a
/proc/uptime poller run for about 60 s in a real cgroup (512 MiB, 2 CPUs, one busy loop
beside them), reading a held mount's files bound over /proc in a private mount namespace,
while the serving daemon is killed with -9 every 10 s (every other kill followed at once by
a new `guestfs mount --hold MP`, the rest left to the holder). Every sample of every client
is checked: no error line, the memory total the limit, CPU shares within 0..100 whose idle
agrees with the cgroup's own usage (cpuacct, sampled by the test) over the second each
sample covers and over the minute, an uptime that never runs backwards, and no sample
missing against the time the clients ran."""

from __future__ import annotations

import math
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from guestfs.daemon.mountpoint import is_guestfs_mount
from tests.host.test_faults_takeover import require_resend
from tests.host.test_real_cpu_clock import acct_ticks
from tests.support.heldmount import HeldMount, holders_of
from tests.support.mounts import wait_for
from tests.support.realcg import BUSY, RealCgroup, v1_cgroup

pytestmark = pytest.mark.real

MiB = 1 << 20
LIMIT = 512 * MiB
CPUS = 2
DURATION = 60.0
KILL_EVERY = 10.0
# In percentage points. vmstat prints whole percents and top tenths; the cgroup's usage is
# sampled every 0.1 s, and a client's sample is stamped only to the second (what its
# second covered is bounded, not known); the minute's means also differ by the dropped
# first samples and a stop that is not at a sample's edge.
IDLE_TOLERANCE = 10.0


@pytest.fixture
def held_mount() -> Iterator[HeldMount]:
    require_resend()
    for tool in ("vmstat", "top", "free"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} (procps) is missing: .ci/setup installs it")
    root = Path(tempfile.mkdtemp(prefix="guestfs-held-clients-"))
    m = HeldMount(root)
    try:
        yield m
    finally:
        m.cleanup()
        shutil.rmtree(root, ignore_errors=True)


def clients_script(mp: str, out: Path) -> str:
    """The clients, in the mount namespace the caller made: every file the mount serves
    under proc/ (and the CPU list under sys/) bound over the kernel's, then each client
    in the background, its stdout and stderr in files of its own."""
    binds = [f"/proc/{f}" for f in sorted(os.listdir(f"{mp}/proc"))
             if os.path.isfile(f"/proc/{f}")]
    if os.path.isfile(f"{mp}/sys/devices/system/cpu/online"):
        binds.append("/sys/devices/system/cpu/online")
    lines = ["set -e"] + [f"mount --bind {mp}{b} {b}" for b in binds] + ["set +e"]
    busy = BUSY.format(s=DURATION + 30)
    # stdbuf -oL: a sample is in its file once printed, whenever the client is killed.
    for name, cmd in (("vmstat", "stdbuf -oL vmstat -n -t 1"),
                      ("top", "stdbuf -oL top -b -d 1 -w 200"), ("free", "stdbuf -oL free -s 1"),
                      ("uptime", "while :; do cat /proc/uptime || echo ERROR; sleep 0.5; done"),
                      ("busy", busy)):
        lines.append(f"({cmd}) > {out}/{name}.out 2> {out}/{name}.err &")
    lines += [f"touch {out}/started", "wait"]
    return "\n".join(lines)


def start_clients(cg: RealCgroup, mp: str, out: Path) -> subprocess.Popen[bytes]:
    dirs = " ".join(cg.dirs.values())
    join = f"for d in {dirs}; do echo $$ > $d/cgroup.procs; done"
    return subprocess.Popen(
        ["sh", "-c", f'{join}; exec unshare -m --propagation private sh -c "$1"', "_",
         clients_script(mp, out)], start_new_session=True)


def vmstat_samples(text: str) -> list[dict[str, float]]:
    """vmstat -t's rows: its columns, and "at", the local wall-clock second it printed."""
    lines = [ln.split() for ln in text.splitlines() if ln.strip()]
    header = next(ln for ln in lines if "id" in ln and "us" in ln)[:-1]   # less the zone
    rows = [ln for ln in lines if ln and ln[0].isdigit()]
    return [{**dict(zip(header, map(float, r[:len(header)]), strict=True)),
             "at": time.mktime(time.strptime(" ".join(r[-2:]), "%Y-%m-%d %H:%M:%S"))}
            for r in rows]


def top_frames(text: str) -> list[dict[str, object]]:
    frames = []
    for block in text.split("top - ")[1:]:
        lines = block.splitlines()
        cpu = next(ln for ln in lines if ln.startswith("%Cpu(s)"))
        parts = cpu.split(":", 1)[1].replace(",", " ").split()
        mem = next(ln for ln in lines if ln.startswith("MiB Mem"))
        frames.append({"cpu": {parts[i + 1]: float(parts[i]) for i in range(0, len(parts), 2)},
                       "total": float(mem.split(":", 1)[1].split()[0]),
                       "at": lines[0].split()[0]})            # HH:MM:SS, local time
    return frames


def top_time(hms: str, near: float) -> float:
    """The wall-clock time of a top frame's HH:MM:SS, on the day that puts it nearest to
    ``near`` (a run across midnight)."""
    day = time.localtime(near)
    h, m, sec = map(int, hms.split(":"))
    t = time.mktime((day.tm_year, day.tm_mon, day.tm_mday, h, m, sec, 0, 0, -1))
    return min((t - 86400, t, t + 86400), key=lambda x: abs(x - near))


class UsageSampler:
    """The cgroup's own CPU time (cpuacct), every 0.1 s with the wall-clock time, so the
    busy share of any second of the run can be told afterwards."""

    def __init__(self, cg: RealCgroup) -> None:
        self.cg, self.rows = cg, [(time.time(), acct_ticks(cg))]
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.done.wait(0.1):
            try:
                self.rows.append((time.time(), acct_ticks(self.cg)))
            except OSError:
                return          # the cgroup removed under a failed test

    def stop(self) -> None:
        self.done.set()
        self.thread.join()

    def _ticks_at(self, t: float) -> float | None:
        before = [r for r in self.rows if r[0] <= t]
        after = [r for r in self.rows if r[0] >= t]
        if not before or not after:
            return None
        (t0, u0), (t1, u1) = before[-1], after[0]
        return u0 if t1 == t0 else u0 + (u1 - u0) * (t - t0) / (t1 - t0)

    def busy_range(self, printed: float) -> tuple[float, float] | None:
        """The least and greatest busy share (% of the CPUS) of the cgroup over a second
        ending where a sample printed at wall-clock second ``printed`` may have read its
        files (a client rounds down, and reads before it prints), or None outside the
        sampled stretch."""
        shares = []
        for tenth in range(-5, 16):
            end = printed + tenth / 10
            a, b = self._ticks_at(end - 1.0), self._ticks_at(end)
            if a is not None and b is not None:
                shares.append(100.0 * (b - a) / 100.0 / CPUS)
        return (min(shares), max(shares)) if shares else None


def off_by(busy: float, window: tuple[float, float] | None) -> float:
    """How far a sample's busy share lies outside the cgroup's for that second (0 inside;
    0 for a sample outside the sampled stretch)."""
    if window is None:
        return 0.0
    return max(0.0, window[0] - busy, busy - window[1])


def free_totals(text: str) -> list[int]:
    return [int(ln.split()[1]) for ln in text.splitlines() if ln.startswith("Mem:")]


def test_clients_over_a_minute_see_no_takeover(held_mount: HeldMount, tmp_path: Path) -> None:
    m = held_mount
    m.start()
    assert wait_for(lambda: is_guestfs_mount(m.mp) and m.serving_pid() is not None), \
        Path(m.log).read_text()
    out = tmp_path / "clients"
    out.mkdir()
    kills = 0
    usage: UsageSampler | None = None
    with v1_cgroup(LIMIT, CPUS * 100000, 100000, cpus="0-1") as cg:
        clients = start_clients(cg, m.mp, out)
        try:
            assert wait_for(lambda: (out / "started").exists() or clients.poll() is not None,
                            15)
            assert clients.poll() is None, "the binds failed"
            began, began_wall, ticks_at_start = time.monotonic(), time.time(), acct_ticks(cg)
            usage = UsageSampler(cg)
            for k in range(int(DURATION // KILL_EVERY)):
                time.sleep(max(0.0, began + KILL_EVERY / 2 + k * KILL_EVERY - time.monotonic()))
                victim = m.serving_pid()
                assert victim is not None, Path(m.log).read_text()[-3000:]
                os.kill(victim, signal.SIGKILL)
                kills += 1
                if k % 2 == 0:
                    m.start()           # a restarted container's mount asks the holder
                assert wait_for(lambda v=victim: m.serving_pid() not in (None, v), 15), \
                    f"kill {k}: no successor\n" + Path(m.log).read_text()[-3000:]
            time.sleep(max(0.0, began + DURATION - time.monotonic()))
            elapsed, ticks = time.monotonic() - began, acct_ticks(cg) - ticks_at_start
        finally:
            if usage is not None:
                usage.stop()
            # The clients never end by themselves; their output is line-buffered (stdbuf),
            # so none is lost with them.
            if clients.poll() is None:
                os.killpg(clients.pid, signal.SIGKILL)
            clients.wait(10)
    assert len(holders_of(m.mp)) == 1
    # What the cgroup itself used over the minute, as a share of its 2 CPUs.
    cgroup_idle = 100.0 * (1.0 - ticks / 100.0 / (CPUS * elapsed))
    # vmstat, top and free print their first sample at once, then one each second.
    expected = math.floor(elapsed) + 1

    errors = {n: (out / f"{n}.err").read_text() for n in ("vmstat", "top", "free", "uptime")}
    vm = vmstat_samples((out / "vmstat.out").read_text())
    top = top_frames((out / "top.out").read_text())
    free = free_totals((out / "free.out").read_text())
    up_lines = (out / "uptime.out").read_text().splitlines()
    # The served uptime is a clock of its own: the longest step between two of the
    # poller's readings (0.5 s apart) is its longest wait, a takeover's included.
    ages = [float(ln.split()[0]) for ln in up_lines if len(ln.split()) == 2]
    steps = [b - a for a, b in zip(ages, ages[1:], strict=False)]
    vm_idle = sum(s["id"] for s in vm[1:]) / max(1, len(vm) - 1)
    top_idle = sum(f["cpu"]["id"] for f in top[1:]) / max(1, len(top) - 1)  # type: ignore[index]
    assert usage is not None
    # Each sample but the first (the clients' start-up, not one second) against the
    # cgroup's own share of the second it covered.
    vm_off = [off_by(100 - s["id"], usage.busy_range(s["at"])) for s in vm[1:]]
    top_off = [off_by(100 - f["cpu"]["id"],                      # type: ignore[index]
                      usage.busy_range(top_time(str(f["at"]), began_wall))) for f in top[1:]]
    print(f"\nclients over {elapsed:.1f} s, {kills} kill -9s: vmstat {len(vm)}, top {len(top)}, "
          f"free {len(free)} samples of {expected}, uptime {len(up_lines)} reads (longest step "
          f"{max(steps, default=0):.2f} s); idle: "
          f"vmstat {vm_idle:.1f} %, top {top_idle:.1f} %, cgroup {cgroup_idle:.1f} %; a "
          f"sample's busy share off the cgroup's second by at most {max(vm_off, default=0):.1f} "
          f"(vmstat), {max(top_off, default=0):.1f} (top) points")

    assert errors == dict.fromkeys(errors, ""), errors
    # A sample a takeover delayed may push the last one past the stop: one per kill.
    for name, n in (("vmstat", len(vm)), ("top", len(top)), ("free", len(free))):
        assert expected - 1 - kills <= n <= expected + 1, (name, n, expected)
    assert len(up_lines) >= 2 * (expected - 1 - kills), len(up_lines)

    limit_kb = LIMIT // 1024
    assert free == [limit_kb] * len(free), free
    assert [f["total"] for f in top] == [LIMIT / MiB] * len(top), [f["total"] for f in top]
    for s in vm:
        assert s["free"] + s["buff"] + s["cache"] <= limit_kb, s
        shares = [s[c] for c in ("us", "sy", "id", "wa", "st")]
        assert all(0 <= x <= 100 for x in shares) and 98 <= sum(shares) <= 102, s
    for f in top:
        cpu = f["cpu"]
        assert all(0.0 <= x <= 100.0 for x in cpu.values()), f   # type: ignore[union-attr]
        assert 99.0 <= sum(cpu.values()) <= 101.0, f            # type: ignore[union-attr]
    assert abs(vm_idle - cgroup_idle) <= IDLE_TOLERANCE, (vm_idle, cgroup_idle)
    assert abs(top_idle - cgroup_idle) <= IDLE_TOLERANCE, (top_idle, cgroup_idle)
    assert max(vm_off) <= IDLE_TOLERANCE, [(s, o) for s, o in zip(vm[1:], vm_off, strict=True)
                                           if o > IDLE_TOLERANCE]
    assert max(top_off) <= IDLE_TOLERANCE, [(f, o) for f, o in zip(top[1:], top_off,
                                                                    strict=True)
                                            if o > IDLE_TOLERANCE]

    ups = [ln.split() for ln in up_lines]
    assert all(len(u) == 2 for u in ups), [ln for ln in up_lines if len(ln.split()) != 2]
    assert all(x >= 0 for x in steps), ages
    assert max(steps) < 5.0, steps      # a hang guard: a poll waited for no successor
    assert all(float(u[1]) >= 0 for u in ups)
    # The container's age, not the host's: it started with the cgroup, a minute ago.
    assert ages[-1] - ages[0] <= elapsed + 1 and ages[-1] < elapsed + 30, ages[-1]
