"""Map a cgroup path from /proc/<pid>/cgroup onto a directory of a cgroup mount.

directory = mount point + (path minus the mount's root), where the root is stripped only
on whole path components (``/docker/ab`` is not a prefix of ``/docker/abc``: .NET and Rust
got this wrong with a string prefix). Go ignores the root field entirely (golang/go#76390).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from guestfs.sources.mountinfo import CgroupMount


def components(path: str) -> list[str]:
    return [c for c in path.split("/") if c and c != "."]


def leaves_namespace(path: str) -> bool:
    """True when the kernel printed the path relative to a cgroup namespace it is outside of."""
    return ".." in components(path)


def relative_to_root(path: str, root: str, outside_ok: bool = False) -> list[str] | None:
    """Components of ``path`` below ``root``, or None when ``path`` is not inside ``root``.

    ``outside_ok``: the path and the root may both start outside our cgroup namespace
    (``/../app`` under a mount whose root the kernel prints as ``/../app``, as it does for
    another container's cgroup2 mount read from ours); ``..`` is then allowed in the part
    they share, never in the part below the root, which becomes a directory path."""
    p, r = components(path), components(root)
    if p[: len(r)] != r:
        return None
    if (".." in p and not outside_ok) or ".." in p[len(r):]:
        return None
    return p[len(r):]


@dataclass(frozen=True)
class CgroupLevelPath:
    cgroup: str      # the cgroup path as the kernel names it, e.g. /kubepods.slice/x.scope
    directory: str   # host directory holding its interface files


def level_paths(mount: CgroupMount, path: str, outside_ok: bool = False
                ) -> list[CgroupLevelPath] | None:
    """The cgroup and each visible ancestor up to the mount root, leaf first.

    None when the path is not visible through this mount (outside its root or outside
    our cgroup namespace).
    """
    rel = relative_to_root(path, mount.root, outside_ok)
    if rel is None:
        return None
    root_parts = components(mount.root)
    levels: list[CgroupLevelPath] = []
    for depth in range(len(rel), -1, -1):
        sub = rel[:depth]
        cgroup = "/" + "/".join(root_parts + sub)
        directory = posixpath.join(mount.mount_point, *sub) if sub else mount.mount_point
        levels.append(CgroupLevelPath(cgroup, directory))
    return levels


def pick_mount(mounts: list[CgroupMount], path: str, outside_ok: bool = False
               ) -> CgroupMount | None:
    """Among mounts of one hierarchy, the one with the deepest root containing ``path``."""
    best: CgroupMount | None = None
    for m in mounts:
        if relative_to_root(path, m.root, outside_ok) is None:
            continue
        if best is None or len(components(m.root)) > len(components(best.root)):
            best = m
    return best
