"""What the container is using right now: CPU time, tasks, I/O, pressure, its age.

These are sources, like snapshot.py: the ``read_*`` functions read under a HostRoot now;
io_counters and pressure_text only look into the snapshot. Memory and swap usage are in
memory_usage.py. The value types and the pure parsers are in usage_parsers.py, which the
renderers import (never this module).
Usage is read at the cgroup level whose limit applies (the pod slice when the quota sits
there), so the numbers a tool divides match the limit it sees; the callers name that level
(EffectiveLimits.cpu_cgroup, .memory_cgroup).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from types import MappingProxyType

from guestfs.sources.cgroup_files import parse_flat_keyed
from guestfs.sources.host_root import HostRoot
from guestfs.sources.snapshot import (
    Hierarchy,
    Level,
    Snapshot,
    level_ids_below,
    level_stat,
    level_text,
)
from guestfs.sources.usage_parsers import (
    USER_HZ,
    ContainerAge,
    CpuUsage,
    IoCounters,
    TaskCounts,
    parse_blkio_recursive,
    parse_cpuacct_usage_all,
    parse_io_stat,
    stat_fields,
    task_state,
    valid_pressure,
)

# Where each pressure file lives: the blkio hierarchy carries io.pressure.
PRESSURE_CONTROLLERS = {"cpu": "cpu", "memory": "memory", "io": "blkio"}


def clk_tck() -> int:
    try:
        return int(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError):
        return USER_HZ


def level_for(h: Hierarchy, cgroup: str | None) -> Level | None:
    """The level of ``h`` named ``cgroup`` (the one whose limit applies), else the leaf."""
    return h.level_named(cgroup) or h.leaf


# ------------------------------------------------------------------ CPU time

def _cpu_usage(version: int, level: Level, read: Callable[[str], str | None]
               ) -> CpuUsage | None:
    if version == 2:
        text = read("cpu.stat")
        if text is None:
            return None
        st = parse_flat_keyed(text)
        if "user_usec" not in st or "system_usec" not in st:
            return None
        return CpuUsage(st["user_usec"], st["system_usec"], level.file_path("cpu.stat"))
    text = read("cpuacct.usage_all")
    if text:
        try:
            user, system = parse_cpuacct_usage_all(text)
            return CpuUsage(user, system, level.file_path("cpuacct.usage_all"))
        except ValueError:
            pass
    st = parse_flat_keyed(read("cpuacct.stat") or "")
    if "user" in st and "system" in st:
        # cpuacct.stat counts USER_HZ ticks.
        return CpuUsage(st["user"] * 1_000_000 // USER_HZ, st["system"] * 1_000_000 // USER_HZ,
                        level.file_path("cpuacct.stat"))
    return None


def read_cpu_usage_now(host: HostRoot, snap: Snapshot, cgroup: str | None
                       ) -> CpuUsage | None:
    """The container's CPU time, read now. /proc/stat feeds rates (vmstat, a Prometheus
    ``rate()``): a counter up to a cache TTL old, set against the reader's clock, reads as
    more than 100 % idle. Only the counter file is read again; the snapshot's limits stay
    cached."""
    h = snap.hierarchies["cpuacct"]
    level = level_for(h, cgroup)
    if level is None:
        return None
    return _cpu_usage(h.version, level, lambda name: level_text(host, level, name))


# ------------------------------------------------------------------ tasks

def _process_level(snap: Snapshot, cgroup: str | None) -> tuple[Hierarchy, Level] | None:
    """Where the container's processes are listed: the cpu hierarchy's level whose quota
    applies (the memory hierarchy's where no cpu hierarchy is visible), else the leaf."""
    h = snap.hierarchies["cpu"] if snap.hierarchies["cpu"].levels else snap.hierarchies["memory"]
    level = level_for(h, cgroup)
    return None if level is None else (h, level)


def _directory_identity(host: HostRoot, level: Level) -> object:
    # By cgroup path, not by directory: a level read through a reader's root
    # (/proc/<pid>/root/sys/fs/cgroup/...) is the same cgroup whichever reader's root
    # it was read through (the sidecar's views are built again by each reader, and every
    # new directory string restarted the container's CPU clock and age).
    st = level_stat(host, level)
    return None if st is None else (level.cgroup, st.st_dev, st.st_ino)


def container_incarnation(host: HostRoot, snap: Snapshot, cgroup: str | None) -> object:
    """Identity of the container's cgroup: the directories where its processes are listed
    and where its CPU counter is read (on v1 a cpuacct hierarchy of its own). A cgroup
    removed and created again at the same path gets another inode (kernfs numbers its
    inodes cyclically, so a path's next directory never has its last one's). None when a
    directory cannot be looked at now: the caller keeps the identity it had, since a new
    one starts the container's clock again."""
    found = _process_level(snap, cgroup)
    if found is None:
        return None
    identity = [_directory_identity(host, found[1])]
    counter = level_for(snap.hierarchies["cpuacct"], cgroup)
    if counter is not None and counter.directory != found[1].directory:
        identity.append(_directory_identity(host, counter))
    return None if None in identity else tuple(identity)


def cgroup_age(host: HostRoot, snap: Snapshot) -> float | None:
    """Seconds since the directory of the cgroup whose memory limit a view reads (else its
    cpu one) was made, by its ctime; None where it cannot be looked at."""
    for name in ("memory", "cpu"):
        levels = snap.hierarchies[name].levels
        if levels:
            st = level_stat(host, levels[0])
            return None if st is None else max(0.0, time.time() - st.st_ctime)
    return None


def read_task_counts(host: HostRoot, snap: Snapshot, cgroup: str | None,
                     exclude: frozenset[str] = frozenset()) -> TaskCounts | None:
    """Thread states of the container; ``exclude``: threads never counted (the daemon's
    own, when it lives in the container's cgroup under ``guestfs run``)."""
    found = _process_level(snap, cgroup)
    if found is None:
        return None
    h, level = found
    running = blocked = total = 0
    for tid in level_ids_below(host, level, "cgroup.threads" if h.version == 2 else "tasks"):
        if tid in exclude:
            continue
        text = host.try_read_text(f"/proc/{tid}/stat")
        if text is None:
            continue  # exited between the listing and the read
        total += 1
        try:
            state = task_state(text)
        except (ValueError, IndexError):  # a truncated stat line
            continue
        if state == "R":
            running += 1
        elif state == "D":
            blocked += 1
    return TaskCounts(running, blocked, total)


# ------------------------------------------------------------------ age

def read_start_ticks(host: HostRoot, pid: int | str) -> int | None:
    """Field 22 of /proc/<pid>/stat (clock ticks after boot): with the pid, it names one
    process for its whole life. None when unreadable."""
    text = host.try_read_small(f"/proc/{pid}/stat")
    if text is None:
        return None
    try:
        return int(stat_fields(text)[19])  # field 22, starttime
    except (ValueError, IndexError):
        return None


def pidns_init(host: HostRoot, pid: str) -> str | None:
    """Pid (in our namespace) of the init of ``pid``'s pid namespace."""
    ns = host.ns_link(pid, "pid")
    if ns is None:
        return None
    if ns == host.ns_link("1", "pid"):
        return "1"
    for entry in host.listdir("/proc"):
        if not entry.isdigit() or host.ns_link(entry, "pid") != ns:
            continue
        status = host.try_read_text(f"/proc/{entry}/status") or ""
        for line in status.splitlines():
            if line.startswith("NSpid:") and line.split()[-1] == "1":
                return entry
    return None


def _member_of(host: HostRoot, pid: str, h: Hierarchy, level: Level) -> bool:
    """Whether ``pid`` sits in ``level`` or below it in hierarchy ``h``."""
    text = host.try_read_small(f"/proc/{pid}/cgroup")
    if text is None:
        return False
    top = level.cgroup.rstrip("/")
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        ours = parts[1] == "" if h.version == 2 else h.controller in parts[1].split(",")
        if ours:
            return parts[2] == level.cgroup or parts[2].startswith(top + "/")
    return False


def read_container_age(host: HostRoot, snap: Snapshot, cgroup: str | None,
                       host_uptime: float, tck: int | None = None) -> ContainerAge | None:
    """When the container began, from the first source that belongs to it:
    1. the init of the reader's pid namespace, if it is in the container's cgroup (a
       reader in the host's pid namespace must not get the host's init);
    2. the oldest process in the container's cgroup or below it;
    3. the creation of the cgroup directory (its change time).
    The caller keeps the answer per view: this walks /proc at most once per container."""
    tck = tck or clk_tck()
    found = _process_level(snap, cgroup)
    init = pidns_init(host, snap.pid)
    if init is not None and (found is None or _member_of(host, init, *found)):
        start = read_start_ticks(host, init)
        if start is not None:
            return ContainerAge(start / tck, f"start of pid-namespace init /proc/{init}")
    if found is None:
        return None
    level = found[1]
    starts = [s for pid in level_ids_below(host, level, "cgroup.procs")
              if (s := read_start_ticks(host, pid)) is not None]
    if starts:
        return ContainerAge(min(starts) / tck, f"oldest process below {level.directory}")
    st = level_stat(host, level)
    if st is None:
        return None
    ctime = st.st_ctime
    return ContainerAge(host_uptime - max(0.0, time.time() - ctime),
                        f"creation of {level.directory}")


def read_last_pid(host: HostRoot, snap: Snapshot, cgroup: str | None) -> int | None:
    """/proc/loadavg's fifth field for a reader in another pid namespace than the daemon's:
    the newest pid among the container's processes, numbered in their own namespace (the
    last field of NSpid). ns_last_pid cannot be read for another namespace: the sysctl
    answers for the reading process's own. None when the reader shares the daemon's pid
    namespace (the host file is then exact) or nothing is visible."""
    if not snap.pid.isdigit():
        return None
    ns = host.ns_link(snap.pid, "pid")
    if ns is None or ns == host.ns_link("self", "pid"):
        return None
    found = _process_level(snap, cgroup)
    if found is None:
        return None
    newest = None
    for pid in level_ids_below(host, found[1], "cgroup.procs"):
        if host.ns_link(pid, "pid") != ns:
            continue
        for line in (host.try_read_small(f"/proc/{pid}/status") or "").splitlines():
            if line.startswith("NSpid:") and line.split()[-1].isdigit():
                inner = int(line.split()[-1])
                newest = inner if newest is None else max(newest, inner)
    return newest


# ------------------------------------------------------------------ I/O and pressure

def io_counters(snap: Snapshot) -> Mapping[tuple[int, int], IoCounters] | None:
    h = snap.hierarchies["blkio"]
    if h.leaf is None:
        return None
    if h.version == 2:
        text = h.leaf.files.get("io.stat")
        return None if text is None else MappingProxyType(parse_io_stat(text))
    b = h.leaf.files.get("blkio.throttle.io_service_bytes_recursive")
    n = h.leaf.files.get("blkio.throttle.io_serviced_recursive")
    if b is None or n is None:
        return None
    return MappingProxyType(parse_blkio_recursive(b, n))


def pressure_level(snap: Snapshot, resource: str, cgroup: str | None) -> Level | None:
    """The level whose ``<resource>.pressure`` is served (v2 only): level ``cgroup`` (the
    one whose limit applies; the leaf for None), if its file is there and well-formed.
    None: the host's /proc/pressure file is served instead. A PSI trigger written to the
    served file is registered on the same file (daemon/psi_triggers.py)."""
    h = snap.hierarchies[PRESSURE_CONTROLLERS[resource]]
    if h.version != 2:
        return None
    level = level_for(h, cgroup)
    if level is None or valid_pressure(level.files.get(f"{resource}.pressure")) is None:
        return None
    return level


def pressure_text(snap: Snapshot, resource: str, cgroup: str | None) -> str | None:
    """The cgroup's ``<resource>.pressure`` text (pressure_level's); None for none."""
    level = pressure_level(snap, resource, cgroup)
    return None if level is None else level.files.get(f"{resource}.pressure")
