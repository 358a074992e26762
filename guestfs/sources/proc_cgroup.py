"""Membership lines of /proc/<pid>/cgroup: ``hierarchy-id:controllers:path``.

v1 lines name their controllers (``4:memory:/docker/abc``, ``2:cpu,cpuacct:/x``,
``1:name=systemd:/x``); the v2 line is ``0::/path``. Paths are relative to the *reading*
process's cgroup namespace, so a process outside it shows ``/../..`` components.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass

from guestfs.sources.host_root import HostReadError, HostRoot


@dataclass(frozen=True)
class CgroupMembership:
    hierarchy_id: int
    controllers: frozenset[str]  # empty for the v2 line
    path: str

    @property
    def is_v2(self) -> bool:
        return self.hierarchy_id == 0 and not self.controllers


class PidGone(LookupError):
    """The pid does not exist (or exited) under the root."""


def parse_proc_cgroup(text: str) -> list[CgroupMembership]:
    out: list[CgroupMembership] = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, ctrls, path = parts
        try:
            hierarchy_id = int(hid)
        except ValueError:
            continue
        if not path.startswith("/"):
            continue
        controllers = frozenset(c for c in ctrls.split(",") if c)
        out.append(CgroupMembership(hierarchy_id, controllers, path))
    return out


def read_proc_cgroup(host: HostRoot, pid: int | str) -> list[CgroupMembership]:
    try:
        text = host.read_text(host.proc_path(pid, "cgroup"))
    except HostReadError as e:
        if e.errno == errno.ENOENT:
            raise PidGone(f"pid {pid}: no such process (/proc/{pid}/cgroup does not exist; "
                          "has it exited?)") from e
        raise PidGone(f"pid {pid}: cannot read {e}") from e
    return parse_proc_cgroup(text)
