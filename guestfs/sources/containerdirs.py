"""Names of the per-container directories of a `guestfs mount --per-container` mount.

Such a mount serves ``MOUNT/<key>/proc/meminfo`` (and every other served file) for each
container, where ``<key>`` names the container's cgroup: the files under it are that
cgroup's view whoever reads them, so the kernel can serve them from its page cache
(docs/mount.md). The key is the cgroup path itself, percent-encoded into one path
component: it is stable across daemon restarts and container restarts in place, and a
binding made by `attach` or the OCI hook can be recomputed from the container's pid.

Runtimes give every controller the same path, but not every host does (systemd setups,
this kind of sandbox: memory at /x, cpu and cpuset at /): read at the memory controller's
path, such a container's CPU files would be another cgroup's or nobody's. So where a
controller guestfs reads sits elsewhere, the key says so: its cgroup "spec" is the main
path followed by ``;CONTROLLERS=PATH`` for each such v1 hierarchy (``/x;cpu,cpuacct=/``),
and a container whose controllers agree keeps the plain path as its key.
"""

from __future__ import annotations

from collections.abc import Iterable

from guestfs.sources.cgroup_path import level_paths
from guestfs.sources.host_root import HostRoot
from guestfs.sources.mountinfo import read_cgroup_mounts
from guestfs.sources.proc_cgroup import CgroupMembership, parse_proc_cgroup

# The controller whose path names a container on a v1 or hybrid host: memory carries the
# limit people ask about, and runtimes give every controller the same path.
KEY_CONTROLLER = "memory"
MAX_KEY = 255  # one path component (NAME_MAX)
# The v1 controllers a view reads (sources/snapshot.py's CONTROLLERS): only where one of
# these sits at another path does the key carry it.
READ_CONTROLLERS = frozenset({"memory", "cpu", "cpuset", "cpuacct", "blkio"})


class BadKey(ValueError):
    pass


def dir_key(cgroup_path: str) -> str:
    """The directory name for ``cgroup_path`` ("/kubepods/pod1/abc" ->
    "%2Fkubepods%2Fpod1%2Fabc")."""
    if not cgroup_path.startswith("/") or "\0" in cgroup_path:
        raise BadKey(f"not an absolute cgroup path: {cgroup_path!r}")
    from urllib.parse import quote  # per container only: with ipaddress, ~3 ms of a start

    key = quote(cgroup_path, safe="")
    if len(key) > MAX_KEY:
        raise BadKey(f"cgroup path too long for one directory name: {cgroup_path!r}")
    return key


def _check_path(path: str, spec: str) -> None:
    if not path.startswith("/") or (
            path != "/" and any(p in ("", ".", "..") for p in path[1:].split("/"))):
        raise BadKey(f"cgroup path with empty, '.' or '..' components: {spec!r}")


def split_spec(spec: str) -> tuple[str, dict[frozenset[str], str]]:
    """(main path, {v1 controllers: path}) of a cgroup spec; a plain path has no others."""
    main, *rest = spec.split(";")
    others: dict[frozenset[str], str] = {}
    for part in rest:
        ctrls, sep, path = part.partition("=")
        if not sep or not ctrls:
            raise BadKey(f"not a cgroup spec: {spec!r}")
        others[frozenset(ctrls.split(","))] = path
    return main, others


def join_spec(main: str, others: dict[frozenset[str], str]) -> str:
    """The one spelling of a spec: others sorted, controllers sorted, none at main's path."""
    parts = sorted(f"{','.join(sorted(c))}={p}" for c, p in others.items() if p != main)
    return ";".join([main, *parts])


def path_of_key(key: str) -> str:
    """The cgroup spec a directory name stands for; BadKey for names that are not keys
    (every key starts with an encoded "/", so ".", ".." and plain names are not)."""
    if not key.startswith("%2F"):
        raise BadKey(f"not a container directory: {key!r}")
    try:
        from urllib.parse import unquote

        spec = unquote(key, errors="strict")
    except UnicodeDecodeError:
        raise BadKey(f"not a container directory: {key!r}") from None
    if dir_key(spec) != key:  # one spelling per path: no aliases of one container
        raise BadKey(f"not the canonical spelling of {spec!r}: {key!r}")
    main, others = split_spec(spec)
    if join_spec(main, others) != spec:
        raise BadKey(f"not the canonical spelling of {spec!r}: {key!r}")
    for path in (main, *others.values()):
        _check_path(path, spec)
    return spec


def container_cgroup(memberships: list[CgroupMembership]) -> str | None:
    """The cgroup spec that names a process's container: its memory controller's path on
    v1 and hybrid hosts (with the paths of the other controllers a view reads where they
    differ), else its cgroup v2 path."""
    main = next((m.path for m in memberships if KEY_CONTROLLER in m.controllers), None)
    if main is None:
        return next((m.path for m in memberships if m.is_v2), None)
    others = {m.controllers: m.path for m in memberships
              if not m.is_v2 and m.controllers & READ_CONTROLLERS and m.path != main}
    return join_spec(main, others)


def key_of_cgroup_text(text: str) -> str | None:
    """The directory key for a process whose /proc/<pid>/cgroup reads ``text``."""
    path = container_cgroup(parse_proc_cgroup(text))
    return dir_key(path) if path is not None else None


def process_keys(host: HostRoot, limit: int = 4096) -> list[str]:
    """The directory keys of the containers that have a running process, at most
    ``limit`` (what a successor daemon may be asked about: guestfs.daemon.held)."""
    keys: dict[str, None] = {}
    try:
        pids = [p for p in host.listdir("/proc") if p.isdigit()]
    except OSError:
        return []
    for pid in pids:
        text = host.try_read_small(f"/proc/{pid}/cgroup")
        if text is None:
            continue
        try:
            key = key_of_cgroup_text(text)
        except BadKey:
            continue
        if key is not None:
            keys[key] = None
            if len(keys) >= limit:
                break
    return list(keys)


def cgroup_exists(host: HostRoot, spec: str) -> bool:
    """Whether the main path of ``spec`` is a cgroup directory in any hierarchy the daemon
    sees: a directory is served only for a container that exists (once served, a vanished
    one keeps its last good numbers for a while, as every view does)."""
    return spec in existing_cgroups(host, [spec])


def existing_cgroups(host: HostRoot, specs: Iterable[str]) -> set[str]:
    """The specs of ``specs`` that cgroup_exists would answer True for, with one read of
    the mount table for all (the daemon checks every container it serves every 5 s)."""
    try:
        mounts = read_cgroup_mounts(host, "self")
    except OSError:
        return set()
    found = set()
    for spec in specs:
        path = split_spec(spec)[0]
        for m in mounts:
            levels = level_paths(m, path)
            if levels and host.isdir(levels[0].directory):
                found.add(spec)
                break
    return found
