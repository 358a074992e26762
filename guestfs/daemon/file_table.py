"""Which files guestfs serves, and how one guest path is rendered for one reader.

The FUSE layer and `guestfs show` both go through render_file, so what show prints is
what a mount serves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from guestfs.engine.limits import EffectiveLimits
from guestfs.render.cpu import render_cpu_list, render_cpuinfo
from guestfs.render.diskstats import render_diskstats
from guestfs.render.loadavg import LoadAverage, render_loadavg
from guestfs.render.meminfo import render_meminfo, render_swaps
from guestfs.render.served import CPU_LIST_FILES, PRESSURE_FILES, SERVED_FILES
from guestfs.render.stat import CpuClock, render_stat, shift_btime
from guestfs.render.uptime import render_uptime
from guestfs.sources.host_proc import parse_uptime
from guestfs.sources.host_root import HostRoot
from guestfs.sources.snapshot import Snapshot
from guestfs.sources.usage import (
    io_counters,
    pressure_text,
    read_container_age,
    read_cpu_usage_now,
    read_last_pid,
    read_task_counts,
)
from guestfs.sources.usage_parsers import ContainerAge, CpuUsage, TaskCounts


@dataclass
class ViewState:
    """What persists between reads of one view: its CPU clock (/proc/stat, uptime's idle),
    when the container began, and its load average (view_load). `show` starts from a
    fresh one."""

    clock: CpuClock = field(default_factory=CpuClock)
    load: LoadAverage | None = None
    age: ContainerAge | None = None
    incarnation: object = None     # identity of the container's cgroup (set by the daemon)
    # A sampler (the daemon's) folds the load in every SAMPLE_SECONDS, from the first read.
    sampled: bool = False

    def follow(self, incarnation: object) -> None:
        """A container re-created at the same cgroup path is a new container: its age,
        load and CPU clock start again, as after a boot. A clock carried over would hold
        its busy time until the new cgroup's counter passed the old one's and keep the old
        idle time against the new age (idle > age x N in /proc/uptime); tools that divide
        deltas (top, vmstat, a Prometheus rate()) take the one decrease as a restart."""
        if incarnation != self.incarnation:
            self.incarnation = incarnation
            self.age = None
            self.load = None
            self.clock = CpuClock()


def host_uptime(host: HostRoot) -> float:
    return parse_uptime(host.read_text("/proc/uptime"))


@dataclass(frozen=True)
class RenderContext:
    host: HostRoot
    snap: Snapshot
    lim: EffectiveLimits
    state: ViewState
    exclude: frozenset[str] = frozenset()   # threads never counted as the container's
    # Readings shared by the renders of one view while it is cached (one --cache-ttl).
    memo: dict[str, object] = field(default_factory=dict)
    boot_offset: float = 0.0     # the reader's time namespace boottime offset (timens.py)

    def tasks(self) -> TaskCounts | None:
        """The container's thread states, kept in the view's ``memo``. A read of
        /proc/<tid>/stat per thread of the container: once per view, not per read of
        /proc/stat or loadavg (a top refreshing every second, a 1,000-thread JVM), nor
        again for the load's first sample."""
        if "tasks" not in self.memo:
            self.memo["tasks"] = read_task_counts(self.host, self.snap, self.lim.cpu_cgroup,
                                                  self.exclude)
        return self.memo["tasks"]  # type: ignore[return-value]


def _age_seconds(ctx: RenderContext, up: float) -> float:
    """The container's age; its start is found once per view, so every reader of the view
    gets the same age whatever pid built it, and /proc is not walked per read."""
    if ctx.state.age is None:
        ctx.state.age = read_container_age(ctx.host, ctx.snap, ctx.lim.cpu_cgroup, up)
    return ctx.state.age.seconds(up) if ctx.state.age is not None else up


def _tick_clock(ctx: RenderContext, up: float | None = None) -> None:
    # The counter is read again now (the view's snapshot may be a TTL old) and paired
    # with the host uptime read just before it (``up``, when the caller has it).
    if up is None:
        up = host_uptime(ctx.host)
    usage = read_cpu_usage_now(ctx.host, ctx.snap, ctx.lim.cpu_cgroup)
    clock = ctx.state.clock
    if usage is None:
        # No readable CPU counter (a missing or corrupt cpu.stat): hold busy where it was
        # and let idle advance, so the file keeps the view's CPU count and its shape.
        usage = CpuUsage(*clock.busy, "held")
    clock.advance(usage, ctx.lim.cpu_count.value, up, _age_seconds(ctx, up))


def _stat(ctx: RenderContext, text: str) -> str:
    text = shift_btime(text, ctx.boot_offset)
    lim = ctx.lim
    if not lim.cpu_time_limited:
        return text
    _tick_clock(ctx)
    tasks = ctx.tasks()
    return render_stat(text, lim.cpu_count.value, ctx.state.clock, tasks)


def _uptime(ctx: RenderContext, text: str) -> str:
    if not ctx.lim.any_limited:
        return text
    up = parse_uptime(text)
    age = _age_seconds(ctx, up)
    _tick_clock(ctx, up)
    return render_uptime(age, ctx.state.clock.idle_seconds)


def view_load(ctx: RenderContext) -> LoadAverage | None:
    """The view's load average; the one place it begins. A sampled view's begins with its
    first read of any file (under `guestfs run` that is the container's start, so a
    monitor that looks after a minute of work sees that minute), as the kernel's avenrun:
    0, with one sample of the running and blocked threads folded in now; the sampler
    folds in the rest. An unsampled one (`show`) serves that one sample as all three
    averages, as had the load been constant. None: no threads in sight."""
    state = ctx.state
    if state.load is not None:
        return state.load
    tasks = ctx.tasks()
    if not state.sampled:
        return None if tasks is None else LoadAverage.single_sample(
            tasks.running + tasks.blocked)
    state.load = LoadAverage()
    if tasks is not None:
        state.load.sample(tasks.running + tasks.blocked)
    return state.load


def _loadavg(ctx: RenderContext, text: str) -> str:
    if not ctx.lim.any_limited:
        return text
    tasks = ctx.tasks()
    load = view_load(ctx)
    if tasks is None or load is None:
        return text
    return render_loadavg(text, load, tasks.running, tasks.total,
                          read_last_pid(ctx.host, ctx.snap, ctx.lim.cpu_cgroup))


def _diskstats(ctx: RenderContext, text: str) -> str:
    if not ctx.lim.any_limited:
        return text
    return render_diskstats(text, io_counters(ctx.snap))


def pressure_cgroup(lim: EffectiveLimits, resource: str) -> str | None:
    """The cgroup whose pressure file a view serves: the one whose limit applies (io:
    the leaf)."""
    return {"cpu": lim.cpu_cgroup, "memory": lim.memory_cgroup}.get(resource)


def _pressure(resource: str) -> Callable[[RenderContext, str], str]:
    def render(ctx: RenderContext, text: str) -> str:
        return pressure_text(ctx.snap, resource, pressure_cgroup(ctx.lim, resource)) or text
    return render


RENDERERS: dict[str, Callable[[RenderContext, str], str]] = {
    "/proc/meminfo": lambda ctx, text: render_meminfo(text, ctx.lim),
    "/proc/swaps": lambda ctx, text: render_swaps(text, ctx.lim),
    "/proc/cpuinfo": lambda ctx, text: render_cpuinfo(text, ctx.lim),
    "/proc/stat": _stat,
    "/proc/uptime": _uptime,
    "/proc/loadavg": _loadavg,
    "/proc/diskstats": _diskstats,
    **{p: _pressure(p.rsplit("/", 1)[1]) for p in PRESSURE_FILES},
    **{p: (lambda ctx, text: render_cpu_list(text, ctx.lim)) for p in CPU_LIST_FILES},
}
assert set(RENDERERS) == set(SERVED_FILES)


def render_file(path: str, host: HostRoot, snap: Snapshot, lim: EffectiveLimits,
                state: ViewState | None = None, exclude: frozenset[str] = frozenset(),
                memo: dict[str, object] | None = None, boot_offset: float = 0.0) -> str:
    """The text guestfs serves at guest ``path``; the host file is read under ``host``."""
    renderer = RENDERERS.get(path)
    if renderer is None:
        raise KeyError(f"not a served file: {path}")
    ctx = RenderContext(host, snap, lim, state or ViewState(), exclude,
                        memo if memo is not None else {}, boot_offset)
    if ctx.state.sampled:
        view_load(ctx)   # begun by the first read of any file, even one that fails
    return renderer(ctx, host.read_text(path))
