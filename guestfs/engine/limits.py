"""The limits engine: effective limits of one pid, each with the source that set it.

Pure: (Snapshot, ExplicitLimits, rounding) -> EffectiveLimits. No file is read here.

The effective limit is the minimum over the cgroup and every visible ancestor, because the
kernel enforces every level: on cgroup v2 with systemd the container scope says ``max``
and the pod's 512Mi sits on the pod slice (gVisor #9580, JDK-8322420, the Go runtime).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from types import MappingProxyType

from guestfs.engine.explicit import ExplicitLimits
from guestfs.engine.provenance import Candidate, Resolved, pick_min
from guestfs.engine.quantity import ROUNDERS, ROUNDINGS  # noqa: F401 - ROUNDINGS re-exported
from guestfs.sources.cgroup_files import (
    V1_UNLIMITED,
    parse_cfs,
    parse_cpu_list,
    parse_cpu_max,
    parse_flat_keyed,
    parse_limit_bytes,
)
from guestfs.sources.host_proc import HostInfo
from guestfs.sources.memory_usage import (
    MemoryUsage,
    host_memory_usage,
    memory_usage_at,
    swap_usage_at,
    swap_usage_name,
)
from guestfs.sources.provenance import CGROUP, CGROUP_HIERARCHICAL, HOST, Source
from guestfs.sources.snapshot import LIMIT_CONTROLLERS, Hierarchy, Level, Snapshot


@dataclass(frozen=True)
class EffectiveLimits:
    pid: str
    host: HostInfo
    memory: Resolved[int]                  # bytes, > 0, <= host MemTotal
    memory_usage: MemoryUsage | None       # at the level that set the limit
    leaf_memory_usage: MemoryUsage | None  # at the pid's own cgroup
    swap: Resolved[int]                    # bytes, 0 <= swap <= host SwapTotal
    swap_usage: Resolved[int]              # bytes, 0 <= usage
    cpu_quota: Resolved[Fraction | None]   # CPUs (quota/period), None: no quota
    cpuset: Resolved[tuple[int, ...]]
    cpu_count: Resolved[int]               # >= 1
    visible_cpus: tuple[int, ...]          # first cpu_count CPUs of the cpuset
    cpu_rounding: str
    cgroup_versions: Mapping[str, int]     # controller -> 1/2 (0: none)
    warnings: tuple[str, ...]

    # Is this view limited? Decided here once; a renderer serves the host's file as it is
    # when the limit it renders is not set.
    @property
    def memory_limited(self) -> bool:
        return self.memory.limited or self.swap.value != self.host.swap_total

    @property
    def cpus_limited(self) -> bool:
        """Fewer CPUs visible than the host has online (cpuset or quota rounding)."""
        return tuple(self.visible_cpus) != tuple(self.host.online_cpus)

    @property
    def cpu_time_limited(self) -> bool:
        """The container's CPU clock differs from the host's: fewer CPUs or a quota."""
        return self.cpus_limited or self.cpu_quota.limited

    @property
    def any_limited(self) -> bool:
        """Without any limit the process sees the host, and guestfs is transparent."""
        return self.memory_limited or self.cpu_time_limited

    @property
    def cpu_cgroup(self) -> str | None:
        """The cgroup whose CPU quota applies: CPU time, tasks and age are read there.
        None when no cgroup sets it (the pid's own cgroup is used)."""
        src = self.cpu_quota.source
        return src.cgroup if src.kind == CGROUP else None

    @property
    def memory_cgroup(self) -> str | None:
        """The cgroup whose memory limit applies, or None."""
        src = self.memory.source
        return src.cgroup if src.kind == CGROUP else None


class _Warnings(list[str]):
    def bad_file(self, level: Level, name: str, err: Exception) -> None:
        self.append(level.unparseable(name, err))


# ---------------------------------------------------------------- memory

def _byte_limit_candidates(h: Hierarchy, name: str, unlimited_at: int | None,
                           unlimited_note: str, w: _Warnings,
                           missing_note: str | None = None) -> list[Candidate[int]]:
    """One candidate per level from a bytes limit file (``max`` = no limit). A value at or
    above ``unlimited_at`` is no limit either. A missing file is a no-limit candidate with
    ``missing_note``, or skipped without one; an unparseable one is skipped with a warning."""
    out: list[Candidate[int]] = []
    for level in h.levels:
        text = level.files.get(name)
        if text is None:
            if missing_note is not None:
                out.append(Candidate(None, level.source(name, missing_note)))
            continue
        try:
            value = parse_limit_bytes(text)
        except ValueError as e:
            w.bad_file(level, name, e)
            continue
        note = None
        if value is not None and unlimited_at is not None and value >= unlimited_at:
            value, note = None, unlimited_note
        out.append(Candidate(value, level.source(name, note)))
    return out


def _memory_candidates(h: Hierarchy, host_total: int, w: _Warnings) -> list[Candidate[int]]:
    name = "memory.max" if h.version == 2 else "memory.limit_in_bytes"
    out: list[Candidate[int]] = []
    if h.version == 1 and h.leaf is not None and h.leaf.files.get("memory.stat"):
        # The kernel's own minimum over *all* ancestors, including those above a mount
        # root we cannot see (Docker on v1 bind-mounts only the container's directory).
        hier = parse_flat_keyed(h.leaf.files["memory.stat"] or "").get(
            "hierarchical_memory_limit")
        if hier is not None:
            value = None if hier >= min(V1_UNLIMITED, host_total) else hier
            out.append(Candidate(value, Source(
                CGROUP_HIERARCHICAL, h.leaf.file_path("memory.stat"), h.leaf.cgroup,
                "hierarchical_memory_limit")))
    out += _byte_limit_candidates(h, name, host_total, "at/above host RAM: no limit", w,
                                  missing_note="missing: no limit here")
    return out


def _level_of(h: Hierarchy, source: Source) -> Level | None:
    if source.kind != CGROUP:
        return None
    return h.level_named(source.cgroup)


def _resolve_memory(snap: Snapshot, explicit: ExplicitLimits, w: _Warnings
                    ) -> tuple[Resolved[int], MemoryUsage | None, MemoryUsage | None]:
    host_total = snap.host.mem_total
    h = snap.hierarchies["memory"]
    cands: list[Candidate[int]] = []
    for c in explicit.memory:
        if c.value is not None and c.value >= host_total:
            c = Candidate(None, Source(c.source.kind, c.source.file, c.source.cgroup,
                                       f"{c.source.note}: at/above host RAM, no limit"))
        cands.append(c)
    for c in _memory_candidates(h, host_total, w):
        if c.value is not None and c.value <= 0:
            # A 0 (or a negative hierarchical_memory_limit) at one level is a corrupt or
            # transient file, not a limit: the kernel refuses to set 0 on a populated
            # cgroup. Ignore that level so its parents' limits still apply.
            w.append(f"{c.source.describe()}: limit {c.value} ignored at this level")
            c = Candidate(None, Source(c.source.kind, c.source.file, c.source.cgroup,
                                       f"{c.value}: ignored"))
        cands.append(c)
    best = pick_min(cands)
    host_src = Source(HOST, "/proc/meminfo", note="MemTotal")
    if best is None:
        resolved = Resolved(host_total, host_src, False, tuple(cands))
    else:
        value = cands[best].value or 0
        if value <= 0:
            # A limit of 0 would make every tool divide by zero; the kernel rejects it anyway.
            w.append(f"{cands[best].source.describe()}: limit 0 ignored")
            resolved = Resolved(host_total, host_src, False, tuple(cands))
        else:
            resolved = Resolved(value, cands[best].source, True, tuple(cands))
    leaf_usage = (memory_usage_at(h, h.leaf, w) if h.leaf is not None
                  else host_memory_usage(snap.host))
    level = _level_of(h, resolved.source)
    usage = leaf_usage
    if level is not None and level is not h.leaf:
        usage = memory_usage_at(h, level, w) or leaf_usage
    return resolved, usage, leaf_usage


# ---------------------------------------------------------------- swap

def _resolve_swap(snap: Snapshot, memory: Resolved[int], w: _Warnings
                  ) -> tuple[Resolved[int], Resolved[int]]:
    host_swap = snap.host.swap_total
    h = snap.hierarchies["memory"]
    none = Source(HOST, note="no swap accounting in this cgroup")
    zero_usage = Resolved(0, none, False)
    if not h.levels:
        return Resolved(host_swap, Source(HOST, "/proc/meminfo", note="SwapTotal"), False), \
            zero_usage
    limit_name = "memory.swap.max" if h.version == 2 else "memory.memsw.limit_in_bytes"
    if h.leaf is None or h.leaf.files.get(swap_usage_name(h)) is None:
        return Resolved(0, none, True), zero_usage
    cands = _byte_limit_candidates(h, limit_name, V1_UNLIMITED if h.version == 1 else None,
                                   "v1's unlimited value", w)
    best = pick_min(cands)
    host_src = Source(HOST, "/proc/meminfo", note="SwapTotal")
    if best is None:
        swap = Resolved(host_swap, host_src, False, tuple(cands))
    else:
        value = cands[best].value or 0
        if h.version == 1:
            # memsw limits memory+swap together: what is left for swap is the difference.
            value = max(0, value - memory.value)
        if value >= host_swap:
            swap = Resolved(host_swap, host_src, False, tuple(cands))
        else:
            swap = Resolved(value, cands[best].source, True, tuple(cands))
    used = swap_usage_at(h, _level_of(h, swap.source) or h.leaf, w)
    if used is None:
        return swap, zero_usage
    return swap, Resolved(*used, True)


# ---------------------------------------------------------------- cpu

def _cpu_candidates(h: Hierarchy, w: _Warnings) -> list[Candidate[Fraction]]:
    out: list[Candidate[Fraction]] = []
    for level in h.levels:
        try:
            if h.version == 2:
                text = level.files.get("cpu.max")
                if text is None:
                    continue
                value = parse_cpu_max(text)
                src = level.source("cpu.max", text.strip())
            else:
                quota = level.files.get("cpu.cfs_quota_us")
                period = level.files.get("cpu.cfs_period_us")
                if quota is None or period is None:
                    continue
                value = parse_cfs(quota, period)
                src = level.source("cpu.cfs_quota_us",
                                    f"{quota.strip()}/{period.strip()}")
        except ValueError as e:
            w.bad_file(level, "cpu.max" if h.version == 2 else "cpu.cfs_quota_us", e)
            continue
        out.append(Candidate(value, src))
    return out


def _resolve_cpuset(snap: Snapshot, w: _Warnings) -> Resolved[tuple[int, ...]]:
    h = snap.hierarchies["cpuset"]
    names = ("cpuset.cpus.effective",) if h.version == 2 else (
        "cpuset.effective_cpus", "cpuset.cpus")
    online = set(snap.host.online_cpus)
    # Walk up while empty: a v2 child without the cpuset controller enabled has no file,
    # and a v1 child can have an empty cpuset.cpus until someone writes it.
    for level in h.levels:
        for name in names:
            text = level.files.get(name)
            if text is None or not text.strip():
                continue
            try:
                cpus = parse_cpu_list(text)
            except ValueError as e:
                w.bad_file(level, name, e)
                continue
            visible = tuple(c for c in cpus if c in online)
            if not visible:
                # Only offline (or absent) CPUs: the kernel runs the tasks on the parent's
                # effective CPUs, and cpuinfo has no block for these to show.
                w.bad_file(level, name, ValueError(f"{text.strip()!r} names no online CPU"))
                continue
            limited = set(visible) != online
            return Resolved(visible, level.source(name, text.strip()), limited)
    return Resolved(snap.host.online_cpus,
                    Source(HOST, "/sys/devices/system/cpu/online"), False)


def quota_to_count(quota: Fraction, rounding: str) -> int:
    """``rounding`` is one of ROUNDINGS: checked once, where effective_limits is entered
    (and on the command line before that)."""
    return max(1, ROUNDERS[rounding](quota))


def _resolve_cpu(snap: Snapshot, explicit: ExplicitLimits, rounding: str, w: _Warnings
                 ) -> tuple[Resolved[Fraction | None], Resolved[tuple[int, ...]],
                            Resolved[int], tuple[int, ...]]:
    host_n = len(snap.host.online_cpus)
    cands: list[Candidate[Fraction]] = []
    for c in explicit.cpu:
        if c.value is not None and c.value >= host_n:
            c = Candidate(None, Source(c.source.kind, c.source.file, c.source.cgroup,
                                       f"{c.source.note}: at/above host CPUs, no limit"))
        cands.append(c)
    cands += _cpu_candidates(snap.hierarchies["cpu"], w)
    best = pick_min(cands)
    if best is None:
        quota: Resolved[Fraction | None] = Resolved(
            None, Source(HOST, note="no CPU quota"), False, tuple(cands))
    else:
        quota = Resolved(cands[best].value, cands[best].source, True, tuple(cands))
    cpuset = _resolve_cpuset(snap, w)
    count_n, count_src, limited = len(cpuset.value), cpuset.source, cpuset.limited
    if quota.value is not None:
        by_quota = quota_to_count(quota.value, rounding)
        if by_quota < count_n:
            count_n, count_src, limited = by_quota, quota.source, True
    count_n = max(1, count_n)
    count = Resolved(count_n, count_src, limited)
    return quota, cpuset, count, cpuset.value[:count_n]


# ---------------------------------------------------------------- all

# Interface files the kernel hides on the real root cgroup. Seeing one at the top level
# means that "/" is a cgroup namespace root (Docker/Kubernetes on v2), not the host's.
_NOT_ON_ROOT = {"memory": ("memory.max",), "cpu": ("cpu.max",)}


def _top_is_not_host_root(h: Hierarchy) -> bool:
    if not h.levels:
        return False
    top = h.levels[-1]
    if top.cgroup != "/":
        return True  # the mount's root field is below the hierarchy root (v1 bind mount)
    if h.version != 2:
        return False
    return any(top.files.get(n) is not None for n in _NOT_ON_ROOT.get(h.controller, ()))


def effective_limits(snap: Snapshot, explicit: ExplicitLimits | None = None,
                     cpu_rounding: str = "ceil") -> EffectiveLimits:
    if cpu_rounding not in ROUNDINGS:
        raise ValueError(f"unknown cpu rounding {cpu_rounding!r}; use one of {ROUNDINGS}")
    explicit = explicit or ExplicitLimits()
    w = _Warnings(snap.warnings)
    w.extend(explicit.warnings)
    for h in (snap.hierarchies[c] for c in LIMIT_CONTROLLERS):
        if h.problem:
            w.append(f"{h.controller}: {h.problem}")
        elif _top_is_not_host_root(h):
            w.append(f"{h.controller}: the top visible cgroup ({h.levels[-1].directory}) is "
                     "not the host's root; limits set above it are invisible here and need "
                     "explicit settings (--memory-limit/--cpu-limit, env, --limits-dir)")
    memory, usage, leaf_usage = _resolve_memory(snap, explicit, w)
    swap, swap_usage = _resolve_swap(snap, memory, w)
    quota, cpuset, count, visible = _resolve_cpu(snap, explicit, cpu_rounding, w)
    return EffectiveLimits(
        pid=snap.pid, host=snap.host, memory=memory, memory_usage=usage,
        leaf_memory_usage=leaf_usage, swap=swap, swap_usage=swap_usage, cpu_quota=quota,
        cpuset=cpuset, cpu_count=count, visible_cpus=visible, cpu_rounding=cpu_rounding,
        cgroup_versions=MappingProxyType(
            {c: snap.hierarchies[c].version for c in LIMIT_CONTROLLERS}),
        warnings=tuple(dict.fromkeys(w)),
    )
