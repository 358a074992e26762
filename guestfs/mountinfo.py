"""Cgroup mounts from /proc/<pid>/mountinfo (proc(5) format).

Each line: ``id parent major:minor root mountpoint opts [optional...] - fstype source superopts``.
The ``root`` field is the cgroup path the mount exposes at its mount point; in a container
with a private cgroup namespace it is ``/``, on cgroup v1 with bind-mounted hierarchies it is
the container's host path (Docker on v1).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from guestfs.hostroot import HostRoot

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
    mount_id: int = 0


class MountinfoError(ValueError):
    pass


def parse_mountinfo(text: str) -> list[CgroupMount]:
    """Every cgroup and cgroup2 mount in ``text``, in file order. Malformed lines are skipped."""
    mounts: list[CgroupMount] = []
    for line in text.splitlines():
        fields = line.split()
        try:
            sep = fields.index("-")
        except ValueError:
            continue
        if sep < 6 or len(fields) < sep + 3:
            continue
        fstype = fields[sep + 1]
        if fstype not in ("cgroup", "cgroup2"):
            continue
        try:
            mount_id = int(fields[0])
        except ValueError:
            mount_id = 0
        root = unescape(fields[3])
        mount_point = unescape(fields[4])
        if fstype == "cgroup2":
            mounts.append(CgroupMount(mount_point, root, 2, frozenset(), mount_id))
        else:
            superopts = fields[sep + 3].split(",")
            controllers = frozenset(o for o in superopts if o not in _V1_NON_CONTROLLER_OPTS)
            mounts.append(CgroupMount(mount_point, root, 1, controllers, mount_id))
    return mounts


def read_cgroup_mounts(host: HostRoot, pid: int | str = "self") -> list[CgroupMount]:
    return parse_mountinfo(host.read_text(host.proc_path(pid, "mountinfo")))
