"""The node's cgroup root (kubelet's --cgroup-root) in every hierarchy this machine mounts.

This machine is a cgroup v1 hybrid: one mount per v1 controller (cpu and cpuacct apart),
name=systemd, and a cgroup2 tree at /sys/fs/cgroup/unified. runc (cgroupfs driver) puts a
container at the same path in all of them, so the kubelet stand-in creates the pod's cgroup
in all of them too, and teardown removes the whole root from every one.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass

from guestfs.sources.mountinfo import parse_mountinfo


@dataclass(frozen=True)
class Hierarchy:
    mount_point: str
    controllers: frozenset[str]      # empty for the unified tree
    version: int

    def dir(self, cgroup_path: str) -> str:
        return os.path.join(self.mount_point, cgroup_path.lstrip("/"))


def hierarchies() -> tuple[Hierarchy, ...]:
    """Every cgroup hierarchy mounted here, each at the root of its tree (runc resolves a
    cgroups path from the mount's root: a namespaced mount root would shift it)."""
    with open("/proc/self/mountinfo") as f:
        mounts = parse_mountinfo(f.read())
    seen: dict[frozenset[str] | str, Hierarchy] = {}
    for m in mounts:
        if m.root != "/":
            raise RuntimeError(f"cgroup mount {m.mount_point} shows {m.root}, not its root")
        key = m.controllers if m.version == 1 else "unified"
        seen.setdefault(key, Hierarchy(m.mount_point, m.controllers, m.version))
    return tuple(seen.values())


def find(hs: tuple[Hierarchy, ...], controller: str) -> Hierarchy | None:
    for h in hs:
        if controller in h.controllers:
            return h
    return None


def ensure(hs: tuple[Hierarchy, ...], cgroup_path: str) -> None:
    """mkdir -p of cgroup_path in every hierarchy; a new cpuset dir gets its parent's cpus
    and mems (an empty cpuset admits no task)."""
    parts = [p for p in cgroup_path.split("/") if p]
    for h in hs:
        for i in range(1, len(parts) + 1):
            d = h.dir("/".join(parts[:i]))
            try:
                os.mkdir(d)
            except FileExistsError:
                continue
            if "cpuset" in h.controllers:
                for name in ("cpuset.cpus", "cpuset.mems"):
                    with open(os.path.join(os.path.dirname(d), name)) as f:
                        value = f.read().strip()
                    write(h, "/".join(parts[:i]), name, value)


def write(h: Hierarchy, cgroup_path: str, name: str, value: str | int) -> None:
    with open(os.path.join(h.dir(cgroup_path), name), "w") as f:
        f.write(str(value))


def read(h: Hierarchy, cgroup_path: str, name: str) -> str:
    with open(os.path.join(h.dir(cgroup_path), name)) as f:
        return f.read().strip()


def remove_tree(hs: tuple[Hierarchy, ...], cgroup_path: str) -> list[str]:
    """Remove cgroup_path and everything below it in every hierarchy, deepest first; a
    task still inside is killed (and named in the result, which lists what was left)."""
    killed: list[str] = []
    for h in hs:
        top = h.dir(cgroup_path)
        if not os.path.isdir(top):
            continue
        dirs = [root for root, _, _ in os.walk(top)]
        for d in sorted(dirs, key=len, reverse=True):
            killed += _empty_and_rmdir(d)
    return killed


def _empty_and_rmdir(d: str) -> list[str]:
    killed = []
    for _ in range(100):
        try:
            with open(os.path.join(d, "cgroup.procs")) as f:
                pids = [int(p) for p in f.read().split()]
        except FileNotFoundError:
            return killed
        for pid in pids:
            killed.append(f"{pid} in {d}")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        try:
            os.rmdir(d)
            return killed
        except FileNotFoundError:
            return killed
        except OSError:
            time.sleep(0.05)
    os.rmdir(d)         # raise: a cgroup that cannot go must fail loudly
    return killed


def leftovers(hs: tuple[Hierarchy, ...], cgroup_path: str) -> list[str]:
    return [h.dir(cgroup_path) for h in hs if os.path.exists(h.dir(cgroup_path))]
