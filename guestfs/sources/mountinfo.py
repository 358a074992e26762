"""Cgroup mounts from /proc/<pid>/mountinfo (proc(5) format).

Each line: ``id parent major:minor root mountpoint opts [optional...] - fstype source superopts``.
The ``root`` field is the cgroup path the mount exposes at its mount point; in a container
with a private cgroup namespace it is ``/``, on cgroup v1 with bind-mounted hierarchies it is
the container's host path (Docker on v1).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from guestfs.sources.host_root import HostRoot

_OCTAL = re.compile(r"\\([0-7]{3})")

# v1 superblock options that are not controller names.
_V1_NON_CONTROLLER_OPTS = frozenset(
    {"rw", "ro", "nosuid", "nodev", "noexec", "relatime", "noatime", "clone_children",
     "noprefix", "xattr", "cpuset_v2_mode", "favordynmods"}
)


def unescape(field: str) -> str:
    """Undo the kernel's octal escaping of space, tab, newline and backslash (``\\040``)."""
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


@dataclass(frozen=True)
class CgroupMount:
    mount_point: str
    root: str
    version: int  # 1 or 2
    # v1: controller names (and ``name=systemd`` style names); v2: empty, the controllers
    # are read from cgroup.controllers at the mount point.
    controllers: frozenset[str]
    # The superblock's major:minor (field 3): one per v1 hierarchy, one for cgroup2,
    # whichever mount namespace or cgroup namespace shows it.
    dev: str = ""
    mount_id: int = 0


@dataclass(frozen=True)
class MountEntry:
    """One line of mountinfo, with the kernel's octal escapes undone."""

    mount_id: int          # 0 when the field is not a number
    root: str
    mount_point: str
    fstype: str
    source: str
    superopts: str
    dev: str = ""          # major:minor of the superblock


def _parse_line(line: str) -> MountEntry | None:
    # The kernel escapes space, tab, newline and backslash in paths (\040 ...), so fields
    # never contain whitespace. The separator is searched for after the six fixed fields:
    # a root or mount point spelled "-" must not be taken for it.
    fields = line.split()
    try:
        sep = fields.index("-", 6)
    except ValueError:
        return None
    if len(fields) < sep + 3:  # no fstype or no source: truncated
        return None
    try:
        mount_id = int(fields[0])
    except ValueError:
        mount_id = 0
    rest = fields[sep + 1:] + [""]  # a line cut after the source has no superopts
    return MountEntry(mount_id, unescape(fields[3]), unescape(fields[4]), rest[0],
                      unescape(rest[1]), rest[2], fields[2])


def parse_mount_entries(text: str) -> list[MountEntry]:
    """Every mount in ``text``, in file order (a later mount on the same point is on top).
    Malformed lines are skipped."""
    return [e for e in map(_parse_line, text.splitlines()) if e is not None]


def parse_mountinfo(text: str) -> list[CgroupMount]:
    """Every cgroup and cgroup2 mount in ``text``, in file order. Malformed lines are skipped."""
    return mounts_of_entries(parse_mount_entries(text))


def mounts_of_entries(entries: list[MountEntry]) -> list[CgroupMount]:
    """The cgroup and cgroup2 mounts among ``entries``, in their order."""
    mounts: list[CgroupMount] = []
    for e in entries:
        if e.fstype == "cgroup2":
            mounts.append(CgroupMount(e.mount_point, e.root, 2, frozenset(), e.dev,
                                      e.mount_id))
        elif e.fstype == "cgroup":
            controllers = frozenset(o for o in e.superopts.split(",")
                                    if o and o not in _V1_NON_CONTROLLER_OPTS)
            mounts.append(CgroupMount(e.mount_point, e.root, 1, controllers, e.dev,
                                      e.mount_id))
    return mounts


def read_cgroup_mounts(host: HostRoot, pid: int | str = "self") -> list[CgroupMount]:
    return parse_mountinfo(host.read_text(host.proc_path(pid, "mountinfo")))
