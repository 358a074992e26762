"""/proc/stat and /proc/uptime's idle field: the container's own CPU clock.

top, vmstat, mpstat, htop and psutil divide *deltas* of these counters, so what matters is
that busy and idle advance together with what the container did since the previous read.
The cgroup's busy time (cpu.stat or cpuacct) is a lifetime counter: a pod-level cgroup
outlives container restarts, a systemd unit or CI job may have burnt hours before
``guestfs run`` started, and the root cgroup carries the whole host. So the served counters
are a clock of their own (CpuClock), owned by the daemon per view:

* The first reading starts it. If the cgroup's lifetime busy time fits in the container's
  age (busy <= age x N), the counters start "since the container began": busy as the
  cgroup says, idle = age x N - busy. Otherwise the history belongs to someone else and the
  counters start "since the view began": busy 0, idle = age x N.
* Every later reading adds the cgroup's busy delta, capped at elapsed x N (the most the
  N visible CPUs can give: the counter may be read at a wider cgroup than the cpuset, a
  pod whose quota spans other containers' CPUs), and idle = elapsed x N - that (never
  below 0), spread evenly over the N visible CPUs.
* A counter going backwards within one cgroup re-bases the deltas: no served counter
  decreases. A new incarnation of the cgroup (another directory at the same path) is a
  new container and gets a fresh clock from its owner (daemon.file_table.ViewState.follow),
  so its busy time shows from its first reading and idle never exceeds age x N.

Worked example (docs/files.md): N = 2, age 100 s, the cgroup has burnt 500 s before the
container (more than 2 x 100): start busy 0, idle 200 s. Ten seconds later the cgroup
has burnt 5 s more: busy 5 s, idle 200 + (2 x 10 - 5) = 215 s; top shows 25 % busy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from guestfs.sources.usage_parsers import USER_HZ, CpuUsage, TaskCounts

# user nice system idle iowait irq softirq steal guest guest_nice
NFIELDS = 10
USER, SYSTEM, IDLE = 0, 2, 3
_US = 1_000_000
# Busy time past what the CPUs could give in one interval that is served in later ones,
# per CPU: the host uptime has a 10 ms resolution and the counter is read just after it,
# so a fully busy CPU's delta runs a little past its interval's now and then. Beyond
# this it is a wider cgroup's (a pod quota over other containers' CPUs): dropped.
CARRY_USEC = 50_000


def _spread(value: int, n: int, i: int) -> int:
    return value // n + (1 if i < value % n else 0)


def _capped(du: int, ds: int, cap: int) -> tuple[int, int]:
    """The busy delta (user, system) cut to ``cap`` usec, in the same proportions."""
    if du + ds <= cap:
        return du, ds
    user = du * cap // (du + ds)
    return user, cap - user


@dataclass
class CpuClock:
    """The served CPU counters of one incarnation of one view, in microseconds (mutable,
    owned per view: a new incarnation of the cgroup gets a new clock)."""

    now: float = 0.0                      # host uptime (s) at the last reading
    busy: tuple[int, int] = (0, 0)        # the cgroup's user, system usec at that reading
    total: list[int] = field(default_factory=lambda: [0, 0, 0])  # user, system, idle
    per_cpu: dict[int, list[int]] = field(default_factory=dict)
    carry: tuple[int, int] = (0, 0)       # user, system usec past the last cap (CARRY_USEC)
    started: bool = False

    def advance(self, usage: CpuUsage, n: int, now: float, age: float) -> None:
        """Fold in one reading: the cgroup's counters at host uptime ``now`` and the
        container's ``age`` (used by the first reading only)."""
        n = max(1, n)
        user, system = usage.user_usec, usage.system_usec
        if not self.started:
            wall = round(max(0.0, age) * n * _US)
            start = (user, system) if user + system <= wall else (0, 0)
            idle = wall - start[0] - start[1]
            self.total = [start[0], start[1], idle]
            self.per_cpu = {i: [_spread(v, n, i) for v in self.total] for i in range(n)}
            self.started = True
        else:
            if user < self.busy[0] or system < self.busy[1]:
                du = ds = 0  # reset under us (a write to cpuacct.usage): deltas start here
            else:
                du, ds = user - self.busy[0], system - self.busy[1]
            dt = max(0.0, now - self.now)
            want = (du + self.carry[0], ds + self.carry[1])
            du, ds = _capped(*want, round(dt * n * _US))
            self.carry = _capped(want[0] - du, want[1] - ds, n * CARRY_USEC)
            self.total[0] += du
            self.total[1] += ds
            self.total[2] += max(0, round(dt * n * _US) - du - ds)
            for i in range(n):
                cu, cs = _spread(du, n, i), _spread(ds, n, i)
                f = self.per_cpu.setdefault(i, [0, 0, 0])
                f[0] += cu
                f[1] += cs
                f[2] += max(0, round(dt * _US) - cu - cs)
        self.now = now
        self.busy = (user, system)

    @property
    def idle_seconds(self) -> float:
        return self.total[2] / _US


def _ticks(usec: list[int]) -> list[int]:
    f = [0] * NFIELDS
    f[USER], f[SYSTEM], f[IDLE] = (v * USER_HZ // _US for v in usec)
    return f


def cpu_lines(n: int, clock: CpuClock) -> list[tuple[str, list[int]]]:
    """``cpu`` then ``cpu0``..``cpu{n-1}`` field lists, in USER_HZ ticks."""
    lines = [("cpu", _ticks(clock.total))]
    lines += [(f"cpu{i}", _ticks(clock.per_cpu.get(i, [0, 0, 0]))) for i in range(n)]
    return lines


def render_stat(host_text: str, n: int, clock: CpuClock,
                tasks: TaskCounts | None = None) -> str:
    out = []
    for name, fields in cpu_lines(n, clock):
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


def shift_btime(text: str, offset: float) -> str:
    """/proc/stat as a reader in a time namespace with boottime ``offset`` (s) sees it: the
    kernel moves btime later by the offset there, so that btime + a process's start time
    (ps's STARTED) stays wall time."""
    if not offset:
        return text
    out = []
    for line in text.splitlines():
        if line.startswith("btime "):
            line = f"btime {int(line.split()[1]) - round(offset)}"
        out.append(line)
    return "\n".join(out) + "\n"
