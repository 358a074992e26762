"""/proc/stat with the container's own CPU time.

top, vmstat, htop and psutil take deltas of these counters, so every counter served to a
reader only ever grows: StatCounters remembers what was served last and never goes below
it, across cache expiry and limit changes. Busy time is the cgroup's (cpu.stat or
cpuacct), spread evenly over the N visible CPUs; idle makes each CPU's busy + idle advance
with the container's wall time. LXCFS serves host time here on v2 (its issue #593).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from guestfs.usage import USER_HZ, CpuUsage, TaskCounts

# user nice system idle iowait irq softirq steal guest guest_nice
NFIELDS = 10
USER, SYSTEM, IDLE = 0, 2, 3


@dataclass
class StatCounters:
    """Last served counters of one view (mutable; owned by the daemon per cgroup)."""

    per_cpu: dict[int, list[int]] = field(default_factory=dict)
    total: list[int] = field(default_factory=lambda: [0] * NFIELDS)


def _spread(ticks: int, n: int, i: int) -> int:
    return ticks // n + (1 if i < ticks % n else 0)


def cpu_lines(n: int, usage: CpuUsage, age_seconds: float,
              state: StatCounters | None = None) -> list[tuple[str, list[int]]]:
    """``cpu`` then ``cpu0``..``cpu{n-1}`` field lists; updates ``state``."""
    state = state if state is not None else StatCounters()
    user = usage.user_usec * USER_HZ // 1_000_000
    system = usage.system_usec * USER_HZ // 1_000_000
    wall = round(age_seconds * USER_HZ)
    lines: list[tuple[str, list[int]]] = []
    for i in range(n):
        f = [0] * NFIELDS
        f[USER] = _spread(user, n, i)
        f[SYSTEM] = _spread(system, n, i)
        f[IDLE] = max(0, wall - f[USER] - f[SYSTEM])
        prev = state.per_cpu.get(i)
        if prev is not None:
            f = [max(a, b) for a, b in zip(f, prev, strict=True)]
        state.per_cpu[i] = f
        lines.append((f"cpu{i}", f))
    total = [sum(col) for col in zip(*(f for _, f in lines), strict=True)]
    total = [max(a, b) for a, b in zip(total, state.total, strict=True)]
    state.total = total
    return [("cpu", total), *lines]


def render_stat(host_text: str, n: int, usage: CpuUsage, age_seconds: float,
                tasks: TaskCounts | None = None, state: StatCounters | None = None) -> str:
    out = []
    for name, fields in cpu_lines(n, usage, age_seconds, state):
        # The kernel prints "cpu  " (two spaces) for the aggregate line.
        out.append(f"{name:<5}" + " ".join(map(str, fields)) if name == "cpu"
                   else f"{name} " + " ".join(map(str, fields)))
    for line in host_text.splitlines():
        if line.startswith("cpu"):
            continue
        if tasks is not None and line.startswith("procs_running "):
            line = f"procs_running {max(1, tasks.running)}"
        elif tasks is not None and line.startswith("procs_blocked "):
            line = f"procs_blocked {tasks.blocked}"
        out.append(line)
    return "\n".join(out) + "\n"
