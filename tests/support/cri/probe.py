"""What an app reads, as the pattern tests see it: a shell program that prints the app's
readings of its limits over and over (the app's own program in the shipped manifests), and
the parser of those readings from the container's log.

The app itself must do the reading: under the wrapper only the app's mount namespace has
the files (an exec'd process does not), and an exec'd process also carries a seccomp
listener of its own. So the program prints, every PERIOD seconds, one block between
``probe-begin N`` and ``probe-end N``; the test reads the log as ``kubectl logs`` would.

``T`` is the tool prefix: "" for the image's own tools (GNU/procps in a Debian userland,
busybox applets in a busybox image) or "busybox " to run busybox's applets in a Debian
userland. busybox ``free`` asks sysinfo(2), busybox ``cat`` reads with sendfile(2), procps
``free`` reads /proc/meminfo, ``nproc`` asks sched_getaffinity(2), Python's os.cpu_count()
reads /sys/devices/system/cpu/online (glibc's get_nprocs) and SC_PHYS_PAGES asks sysinfo.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

PERIOD = 0.5
FILES = ("/proc/meminfo", "/proc/cpuinfo", "/proc/stat", "/proc/uptime", "/proc/loadavg",
         "/proc/swaps", "/proc/diskstats", "/sys/devices/system/cpu/online")

SCRIPT = r"""
T="$1"
i=0
while :; do
  i=$((i+1))
  echo "probe-begin $i"
  echo "memtotal $($T cat /proc/meminfo | $T grep MemTotal)"
  echo "free $($T free -m | $T grep Mem:)"
  echo "nproc $($T nproc)"
  echo "online $($T cat /sys/devices/system/cpu/online)"
  echo "top $($T top -bn1 | $T grep -i -m1 'cpu')"
  echo "cpu $($T head -n 1 /proc/stat)"
  for u in /sys/fs/cgroup/cpuacct/cpuacct.usage /sys/fs/cgroup/cpu,cpuacct/cpuacct.usage; do
    [ -r "$u" ] && { echo "cgusage $($T cat $u)"; break; }
  done
  echo "capeff $($T grep CapEff /proc/self/status)"
  for f in /proc/meminfo /proc/stat /proc/uptime /proc/loadavg /proc/swaps /proc/diskstats \
           /sys/devices/system/cpu/online; do
    echo "file $f $($T cat $f | $T wc -c) $($T cat $f | $T tail -n 1)"
  done
  c=/proc/cpuinfo
  echo "file $c $($T cat $c | $T wc -c) $($T cat $c | $T grep -c ^processor)"
  if command -v python3 >/dev/null 2>&1; then
    python3 -c 'import os
print("py", os.cpu_count(), os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"),
      open("/proc/meminfo").read().split()[1])'
  fi
  echo "probe-end $i"
  sleep PERIOD
done
""".replace("PERIOD", str(PERIOD))

# The last line of each file as the kernel lays it out (cpuinfo: its processor count).
LAST_LINE = {
    "/proc/meminfo": r"\w+(\(\w+\))?:\s+\d+( kB)?",
    "/proc/stat": r"softirq( \d+)+",
    "/proc/uptime": r"\d+\.\d\d \d+\.\d\d",
    "/proc/loadavg": r"\d+\.\d\d \d+\.\d\d \d+\.\d\d \d+/\d+ \d+",
    "/proc/swaps": r"(Filename\s+Type\s+Size\s+Used\s+Priority|/\S+\s+\w+(\s+-?\d+){3})",
    "/proc/diskstats": r"\s*\d+\s+\d+ \S+( \d+)+",
    "/sys/devices/system/cpu/online": r"\d+(-\d+)?",
    "/proc/cpuinfo": r"\d+",
}


def program(tools: str = "") -> list[str]:
    """The app's program (what `programs={"app": ...}` substitutes in a manifest)."""
    return ["sh", "-c", SCRIPT, "probe", tools]


@dataclass
class Reading:
    """One probe block."""

    n: int
    memtotal_kb: int | None = None
    free_total_mib: int | None = None
    nproc: int | None = None
    online: str = ""
    top_idle: float | None = None
    files: dict[str, tuple[int, str]] = field(default_factory=dict)
    py_cpu_count: int | None = None
    py_phys_bytes: int | None = None
    py_memtotal_kb: int | None = None
    cap_eff: int | None = None        # the probe's own effective capabilities
    cpu_ticks: tuple[int, ...] = ()   # /proc/stat's aggregate line: user nice system idle ...
    # The container's own CPU time in ns (cgroup v1 cpuacct.usage, the kernel's), if visible
    cg_usage_ns: int | None = None

    @property
    def processors(self) -> int:
        return int(self.files["/proc/cpuinfo"][1])

    def unwhole_files(self) -> list[str]:
        """The files whose read through cat was empty or cut (its last line malformed)."""
        bad = []
        for f, pattern in LAST_LINE.items():
            size, last = self.files.get(f, (0, ""))
            if size == 0 or not re.fullmatch(pattern, last.strip() if f.endswith("diskstats")
                                             else last):
                bad.append(f"{f}: {size} bytes, last line {last!r}")
        return bad


def _int(text: str) -> int | None:
    m = re.search(r"-?\d+", text)
    return int(m.group()) if m else None


def _idle(line: str) -> float | None:
    # busybox: "CPU:  0% usr  0% sys  0% nic 99% idle ..."; procps: "%Cpu(s):  0.0 us, ...
    # 99.5 id, ..."
    m = re.search(r"([\d.]+)%?\s+id(le)?\b", line)
    return float(m.group(1)) if m else None


def parse(log: str) -> list[Reading]:
    """Every complete block of the log, oldest first."""
    out: list[Reading] = []
    cur: Reading | None = None
    for line in log.splitlines():
        word, _, rest = line.partition(" ")
        if word == "probe-begin":
            cur = Reading(int(rest))
        elif cur is None:
            continue
        elif word == "probe-end":
            out.append(cur)
            cur = None
        elif word == "memtotal":
            cur.memtotal_kb = _int(rest)
        elif word == "free":
            parts = rest.split()
            cur.free_total_mib = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() \
                else None
        elif word == "nproc":
            cur.nproc = _int(rest)
        elif word == "online":
            cur.online = rest.strip()
        elif word == "top":
            cur.top_idle = _idle(rest)
        elif word == "file":
            path, _, tail = rest.partition(" ")
            size, _, last = tail.partition(" ")
            cur.files[path] = (int(size) if size.isdigit() else 0, last)
        elif word == "capeff":
            cur.cap_eff = int(rest.split()[-1], 16)
        elif word == "cgusage":
            cur.cg_usage_ns = _int(rest)
        elif word == "cpu":
            cur.cpu_ticks = tuple(int(x) for x in rest.split()[1:])
        elif word == "py":
            count, phys, mem = rest.split()
            cur.py_cpu_count, cur.py_phys_bytes, cur.py_memtotal_kb = \
                int(count), int(phys), int(mem)
    return out


def idle_share(a: Reading, b: Reading) -> float:
    """The idle share between two readings' /proc/stat, as vmstat and mpstat compute it."""
    delta = [y - x for x, y in zip(a.cpu_ticks, b.cpu_ticks, strict=True)]
    total = sum(delta[:8])
    return delta[3] / total if total else 1.0


def own_idle_share(a: Reading, b: Reading, hz: int = 100) -> float | None:
    """The idle share the container's own CPU time leaves between two readings: its
    cpuacct.usage (the kernel's) over the view's capacity in that time (its /proc/stat
    total, CPUs x elapsed ticks). None where the usage is not visible."""
    if a.cg_usage_ns is None or b.cg_usage_ns is None:
        return None
    total = sum(y - x for x, y in zip(a.cpu_ticks[:8], b.cpu_ticks[:8], strict=True))
    used = (b.cg_usage_ns - a.cg_usage_ns) * hz / 1e9
    return 1 - used / total if total else None


def wait_for_reading(logs: Callable[[], str], ok: Callable[[Reading], bool],
                     timeout: float = 30.0, after: int = 0) -> tuple[Reading, float]:
    """The first block numbered above ``after`` for which ``ok`` holds, and the seconds
    waited for it; AssertionError with the last block when none comes within timeout."""
    t0 = time.monotonic()
    last: Reading | None = None
    while True:
        for r in parse(logs()):
            if r.n > after:
                last = r
                if ok(r):
                    return r, time.monotonic() - t0
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"no reading as expected within {timeout}s; last: {last}\n"
                                 f"log tail: {logs()[-3000:]}")
        time.sleep(PERIOD / 2)
