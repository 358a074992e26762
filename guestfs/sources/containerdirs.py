"""Names of the per-container directories of a `guestfs mount --per-container` mount.

Such a mount serves ``MOUNT/<key>/proc/meminfo`` (and every other served file) for each
container, where ``<key>`` names the container's cgroup: the files under it are that
cgroup's view whoever reads them, so the kernel can serve them from its page cache
(docs/mount.md). The key is the cgroup path itself, percent-encoded into one path
component: it is stable across daemon restarts and container restarts in place, and a
binding made by `attach` or the OCI hook can be recomputed from the container's pid.
"""

from __future__ import annotations

from urllib.parse import quote, unquote

from guestfs.sources.cgroup_path import level_paths
from guestfs.sources.host_root import HostRoot
from guestfs.sources.mountinfo import read_cgroup_mounts
from guestfs.sources.proc_cgroup import CgroupMembership, parse_proc_cgroup

# The controller whose path names a container on a v1 or hybrid host: memory carries the
# limit people ask about, and runtimes give every controller the same path.
KEY_CONTROLLER = "memory"
MAX_KEY = 255  # one path component (NAME_MAX)


class BadKey(ValueError):
    pass


def dir_key(cgroup_path: str) -> str:
    """The directory name for ``cgroup_path`` ("/kubepods/pod1/abc" ->
    "%2Fkubepods%2Fpod1%2Fabc")."""
    if not cgroup_path.startswith("/") or "\0" in cgroup_path:
        raise BadKey(f"not an absolute cgroup path: {cgroup_path!r}")
    key = quote(cgroup_path, safe="")
    if len(key) > MAX_KEY:
        raise BadKey(f"cgroup path too long for one directory name: {cgroup_path!r}")
    return key


def path_of_key(key: str) -> str:
    """The cgroup path a directory name stands for; BadKey for names that are not keys
    (every key starts with an encoded "/", so ".", ".." and plain names are not)."""
    if not key.startswith("%2F"):
        raise BadKey(f"not a container directory: {key!r}")
    path = unquote(key, errors="strict")
    if dir_key(path) != key:  # one spelling per path: no aliases of one container
        raise BadKey(f"not the canonical spelling of {path!r}: {key!r}")
    if path != "/" and any(p in ("", ".", "..") for p in path[1:].split("/")):
        raise BadKey(f"cgroup path with empty, '.' or '..' components: {path!r}")
    return path


def container_cgroup(memberships: list[CgroupMembership]) -> str | None:
    """The cgroup path that names a process's container: its memory controller's on v1
    and hybrid hosts, else its cgroup v2 path."""
    for m in memberships:
        if KEY_CONTROLLER in m.controllers:
            return m.path
    for m in memberships:
        if m.is_v2:
            return m.path
    return None


def key_of_cgroup_text(text: str) -> str | None:
    """The directory key for a process whose /proc/<pid>/cgroup reads ``text``."""
    path = container_cgroup(parse_proc_cgroup(text))
    return dir_key(path) if path is not None else None


def cgroup_exists(host: HostRoot, path: str) -> bool:
    """Whether ``path`` is a cgroup directory in any hierarchy the daemon sees: a directory
    is served only for a container that exists (once served, a vanished one keeps its
    last good numbers, as every view does)."""
    try:
        mounts = read_cgroup_mounts(host, "self")
    except OSError:
        return False
    for m in mounts:
        levels = level_paths(m, path)
        if levels and host.isdir(levels[0].directory):
            return True
    return False
