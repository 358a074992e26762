"""Read everything the limits engine needs for one pid into a frozen snapshot.

This is where the engine's cgroup files are read (the counters that change between reads,
CPU time and the container's tasks, are read again per read by usage.py). The engine
(engine/limits.py) is a pure function of what is collected here, so fixtures and the real
machine go through the same code.
"""

from __future__ import annotations

import errno
import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from guestfs.sources.cgroup_path import (
    CgroupLevelPath,
    leaves_namespace,
    level_paths,
    pick_mount,
)
from guestfs.sources.containerdirs import split_spec
from guestfs.sources.host_proc import HostInfo, read_host_info
from guestfs.sources.host_root import HostRoot
from guestfs.sources.mountinfo import CgroupMount, read_cgroup_mounts
from guestfs.sources.proc_cgroup import CgroupMembership, read_proc_cgroup
from guestfs.sources.provenance import CGROUP, Source
from guestfs.sources.reader_root import (
    Anchor,
    ReaderMount,
    ReaderTable,
    open_dir,
    read_reader_table,
    reader_mount,
)
from guestfs.sources.reader_root import alive as reader_alive
from guestfs.sources.reader_root import ids_below as anchored_ids_below
from guestfs.sources.reader_root import read_file as anchored_read_file
from guestfs.sources.reader_root import read_files as anchored_read_files
from guestfs.sources.reader_root import stat_dir as anchored_stat_dir

# Files read at every level, per controller and cgroup version.
CONTROLLER_FILES: dict[tuple[str, int], tuple[str, ...]] = {
    ("memory", 2): ("memory.max", "memory.current", "memory.stat",
                    "memory.swap.max", "memory.swap.current", "memory.pressure"),
    ("memory", 1): ("memory.limit_in_bytes", "memory.usage_in_bytes", "memory.stat",
                    "memory.memsw.limit_in_bytes", "memory.memsw.usage_in_bytes"),
    ("cpu", 2): ("cpu.max", "cpu.pressure"),
    ("cpu", 1): ("cpu.cfs_quota_us", "cpu.cfs_period_us"),
    ("cpuset", 2): ("cpuset.cpus.effective",),
    ("cpuset", 1): ("cpuset.effective_cpus", "cpuset.cpus"),
    # Usage, for /proc/stat, uptime and diskstats. On v2 cpu.stat is a core file that
    # exists whether or not the cpu controller is enabled; io.stat needs the io controller.
    ("cpuacct", 2): ("cpu.stat",),
    ("cpuacct", 1): ("cpuacct.usage_all", "cpuacct.stat", "cpuacct.usage_percpu"),
    ("blkio", 2): ("io.stat", "io.pressure"),
    ("blkio", 1): ("blkio.throttle.io_service_bytes_recursive",
                   "blkio.throttle.io_serviced_recursive"),
}
# The limits; then the usage hierarchies, named by their v1 controller.
LIMIT_CONTROLLERS = ("memory", "cpu", "cpuset")
CONTROLLERS = (*LIMIT_CONTROLLERS, "cpuacct", "blkio")
# What cgroup.controllers must list on v2 for a v1 name (None: core files, always there).
_V2_CONTROLLER = {"cpuacct": None, "blkio": "io"}


@dataclass(frozen=True)
class Level:
    cgroup: str                          # cgroup path, e.g. /kubepods.slice/pod.slice
    directory: str                       # host directory of its interface files
    files: Mapping[str, str | None]      # file name -> text; None when missing/unreadable
    # Set when the directory lies below a reader's /proc/<pid>/root (reader_root.py): every
    # later read of it goes through the same checked walk.
    anchor: Anchor | None = None

    def file_path(self, name: str) -> str:
        return f"{self.directory.rstrip('/')}/{name}"

    def source(self, name: str, note: str | None = None) -> Source:
        """Where a number read from file ``name`` at this level came from."""
        return Source(CGROUP, self.file_path(name), self.cgroup, note)

    def unparseable(self, name: str, err: Exception) -> str:
        """The warning for file ``name`` at this level when it cannot be parsed."""
        return f"{self.file_path(name)}: unparseable ({err}); ignored at this level"


@dataclass(frozen=True)
class Hierarchy:
    """One controller's view of a pid: its cgroup and the visible ancestors, leaf first."""

    controller: str
    version: int                         # 1 or 2; 0 when no hierarchy carries the controller
    mount: CgroupMount | None
    cgroup_path: str | None              # as /proc/<pid>/cgroup prints it
    levels: tuple[Level, ...] = ()       # empty when the cgroup is not visible
    problem: str | None = None           # why there are no levels
    # The pid is in a cgroup of a hierarchy the daemon has, and neither the daemon's mounts
    # nor the reader's own show it: its limits are unknown, not absent.
    unseen: bool = False

    @property
    def leaf(self) -> Level | None:
        return self.levels[0] if self.levels else None

    def level_named(self, cgroup: str | None) -> Level | None:
        """The visible level whose cgroup path is ``cgroup``, or None."""
        return next((lv for lv in self.levels if lv.cgroup == cgroup), None) \
            if cgroup is not None else None


@dataclass(frozen=True)
class Snapshot:
    pid: str
    host: HostInfo
    hierarchies: Mapping[str, Hierarchy]
    warnings: tuple[str, ...] = field(default=())


def _membership_for(memberships: list[CgroupMembership], controller: str,
                    version: int) -> CgroupMembership | None:
    for m in memberships:
        if version == 2 and m.is_v2:
            return m
        if version == 1 and controller in m.controllers:
            return m
    return None


def _v2_has_controller(host: HostRoot, mount: CgroupMount, controller: str) -> bool:
    required = _V2_CONTROLLER.get(controller, controller)
    if required is None:
        return True
    text = host.try_read_text(f"{mount.mount_point.rstrip('/')}/cgroup.controllers")
    # A fixture or a kernel without the file: assume present and let missing files say no.
    return text is None or required in text.split()


def _choose_hierarchy(host: HostRoot, mounts: list[CgroupMount],
                      memberships: list[CgroupMembership], controller: str
                      ) -> tuple[int, list[CgroupMount], CgroupMembership | None, str | None]:
    # v1 wins when a v1 hierarchy carries the controller: on hybrid hosts (this machine,
    # Ubuntu 20.04, older Kubernetes nodes) the cgroup2 mount has no controllers at all.
    v1 = [m for m in mounts if m.version == 1 and controller in m.controllers]
    if v1:
        member = _membership_for(memberships, controller, 1)
        if member is None:
            return 1, v1, None, f"no '{controller}' line in /proc/<pid>/cgroup"
        return 1, v1, member, None
    v2 = [m for m in mounts if m.version == 2]
    if v2:
        member = _membership_for(memberships, controller, 2)
        if member is None:
            return 2, v2, None, "no '0::' line in /proc/<pid>/cgroup"
        usable = [m for m in v2 if _v2_has_controller(host, m, controller)]
        if not usable:
            return 2, v2, member, f"cgroup2 does not offer the {controller} controller here"
        return 2, usable, member, None
    return 0, [], None, f"no cgroup hierarchy carries the {controller} controller"


def _read_levels(host: HostRoot, paths: list[CgroupLevelPath], names: tuple[str, ...],
                 anchor: Anchor | None) -> tuple[Level, ...]:
    if anchor is None:
        return tuple(Level(p.cgroup, p.directory, MappingProxyType(
            {n: host.try_read_text(f"{p.directory.rstrip('/')}/{n}") for n in names}))
            for p in paths)
    levels = []
    for p in paths:
        try:
            files = anchored_read_files(host, anchor, p.directory, names)
        except OSError:
            files = dict.fromkeys(names)
        levels.append(Level(p.cgroup, p.directory, MappingProxyType(files), anchor))
    return tuple(levels)


def _through_reader(host: HostRoot, candidates: list[CgroupMount], controller: str,
                    version: int, path: str, table: Callable[[], ReaderTable],
                    why: str) -> Hierarchy:
    """The hierarchy through the reader's own mounts (reader_root.py), when ours do not
    show its cgroup."""
    pid = table().pid
    found = reader_mount(host, table(), candidates, path)
    if not isinstance(found, ReaderMount):
        return Hierarchy(controller, version, candidates[0], path, unseen=True,
                         problem=f"{why}, nor through pid {pid}'s own mounts: {found}")
    paths = level_paths(found.mount, path, outside_ok=True)
    assert paths is not None  # reader_mount picked a mount that contains the path
    try:
        os.close(open_dir(host, found.anchor, paths[0].directory))
    except OSError as e:
        hint = " (reading another process's root is a ptrace-read check: CAP_SYS_PTRACE)" \
            if e.errno == errno.EACCES else ""
        return Hierarchy(controller, version, found.mount, path, unseen=True,
                         problem=f"{why}, and {paths[0].directory} cannot be opened safely: "
                                 f"{e.strerror or e}{hint}")
    levels = _read_levels(host, paths, CONTROLLER_FILES[(controller, version)], found.anchor)
    return Hierarchy(controller, version, found.mount, path, levels)


def read_hierarchy(host: HostRoot, mounts: list[CgroupMount],
                   memberships: list[CgroupMembership], controller: str,
                   reader: Callable[[], ReaderTable] | None = None) -> Hierarchy:
    """``reader``: the reader's own mount table, tried when ours do not show its cgroup
    (None for a pinned --cgroup view, which is the daemon's own)."""
    version, candidates, member, problem = _choose_hierarchy(host, mounts, memberships,
                                                             controller)
    if member is None or problem is not None:
        return Hierarchy(controller, version, candidates[0] if candidates else None,
                         member.path if member else None, problem=problem)
    path = member.path
    if leaves_namespace(path):
        why = f"cgroup {path} is outside this cgroup namespace; its files are not visible"
        if reader is not None:
            return _through_reader(host, candidates, controller, version, path, reader, why)
        return Hierarchy(controller, version, candidates[0], path, problem=why, unseen=True)
    mount = pick_mount(candidates, path)
    if mount is None:
        roots = ", ".join(sorted({m.root for m in candidates}))
        why = f"cgroup {path} is not below the mount root ({roots})"
        if reader is not None:
            return _through_reader(host, candidates, controller, version, path, reader, why)
        return Hierarchy(controller, version, candidates[0], path, problem=why, unseen=True)
    paths = level_paths(mount, path)
    assert paths is not None  # pick_mount only returns mounts that contain the path
    if not host.isdir(paths[0].directory):
        return Hierarchy(controller, version, mount, path, unseen=True,
                         problem=f"cgroup directory {paths[0].directory} does not exist "
                                 "(the cgroup vanished?)")
    levels = _read_levels(host, paths, CONTROLLER_FILES[(controller, version)], None)
    return Hierarchy(controller, version, mount, path, levels)


def read_snapshot(host: HostRoot, pid: int | str = "self") -> Snapshot:
    """Everything about ``pid`` the engine needs. Raises PidGone for a pid that is not there."""
    return snapshot_of(host, read_proc_cgroup(host, pid), pid)


def memberships_for_path(host: HostRoot, path: str) -> list[CgroupMembership]:
    """Membership lines as if a process sat in cgroup ``path`` of every hierarchy
    (``guestfs mount --cgroup PATH`` pins the view to one cgroup), or, for a
    per-container spec (``/x;cpu,cpuacct=/``, containerdirs.py), at each v1 hierarchy's
    own path."""
    main, others = split_spec(path)
    out = [CgroupMembership(0, frozenset(), main)]
    for i, m in enumerate(read_cgroup_mounts(host, "self"), start=1):
        if m.version == 1:
            own = next((p for c, p in others.items() if c & m.controllers), main)
            out.append(CgroupMembership(i, m.controllers, own))
    return out


def pinned_cgroup_dirs(host: HostRoot, path: str) -> list[str]:
    """The directories of cgroup ``path`` that exist in our cgroup mounts: empty when the
    path names no cgroup at all (a typo in ``--cgroup``, a container already gone)."""
    found = []
    for m in read_cgroup_mounts(host, "self"):
        paths = level_paths(m, path)
        if paths and host.isdir(paths[0].directory):
            found.append(paths[0].directory)
    return found


def snapshot_of(host: HostRoot, memberships: list[CgroupMembership],
                pid: int | str = "self") -> Snapshot:
    host_info = read_host_info(host)
    warnings: list[str] = []
    try:
        # Our own mount table: the cgroup paths in /proc/<pid>/cgroup are relative to
        # *our* cgroup namespace, and we read the files through *our* mounts.
        mounts = read_cgroup_mounts(host, "self")
    except OSError as e:
        mounts = []
        warnings.append(f"cannot read /proc/self/mountinfo: {e}")
    # A reader's own mounts are tried only for a real reader (not a pinned --cgroup view).
    reader = functools.cache(lambda: read_reader_table(host, str(pid))) \
        if str(pid).isdigit() else None
    hierarchies = {c: read_hierarchy(host, mounts, memberships, c, reader) for c in CONTROLLERS}
    return Snapshot(str(pid), host_info, MappingProxyType(hierarchies), tuple(warnings))


# ------------------------------------------------------------------ reading a level again

def level_text(host: HostRoot, level: Level, name: str) -> str | None:
    """File ``name`` of ``level`` read now (the counters that change between reads), the
    same way the snapshot read it: through the reader's root when it came from there."""
    if level.anchor is not None:
        return anchored_read_file(host, level.anchor, level.directory, name)
    return host.try_read_text(level.file_path(name))


def level_stat(host: HostRoot, level: Level) -> os.stat_result | None:
    if level.anchor is not None:
        return anchored_stat_dir(host, level.anchor, level.directory)
    try:
        return os.stat(host.path(level.directory))
    except OSError:
        return None


def level_ids_below(host: HostRoot, level: Level, name: str) -> list[str]:
    """The ids in file ``name`` (cgroup.procs, cgroup.threads, tasks) of ``level`` and every
    cgroup below it."""
    if level.anchor is not None:
        return anchored_ids_below(host, level.anchor, level.directory, name)
    ids: list[str] = []
    for dirpath, _dirs, files in os.walk(host.path(level.directory)):
        if name not in files:
            continue
        try:
            with open(os.path.join(dirpath, name)) as f:
                ids += f.read().split()
        except OSError:
            continue
    return ids


def anchors_alive(host: HostRoot, snap: Snapshot) -> bool:
    """Whether every reader whose root a level of ``snap`` is read through still runs."""
    anchors = {lv.anchor for h in snap.hierarchies.values() for lv in h.levels if lv.anchor}
    return all(reader_alive(host, a) for a in anchors)
