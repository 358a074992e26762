"""A reader's cgroup seen through the reader's own mounts: /proc/<pid>/root + its mountinfo.

A per-caller daemon in a sidecar container sees only its own cgroup directory: on cgroup
v1 without a cgroup namespace (containerd 1.6) its /sys/fs/cgroup/<controller> is a
read-only bind of the sidecar's cgroup, so the app's ``/kubepods/burstable/pod<uid>/<id>``
is not below any root the daemon mounts; on v2 with private cgroup namespaces the app's
path reads ``/../<id>`` from the daemon's namespace. The app's own /sys/fs/cgroup shows
the app's cgroup, and the daemon reaches it as /proc/<pid>/root/sys/fs/cgroup/... with
ptrace-read access to the app (the sidecar's CAP_SYS_PTRACE). Which cgroup each of those
mounts shows is the ``root`` field of /proc/<pid>/mountinfo, so the level walk is the same
as through the daemon's own mounts: the reader's cgroup and its ancestors up to that root,
no higher (the pod-level ancestors stay invisible, as in any container).

Trust. The reader's mount table and files are the tenant's to shape (with CAP_SYS_ADMIN in
its own user namespace it can mount a tmpfs with a fake memory.max at /sys/fs/cgroup), so:
1. Only /proc/<pid>/mountinfo from the daemon's procfs is read, which the kernel writes:
   its fstype, major:minor and root fields are true; which mounts exist is the tenant's.
2. A mount counts only if its fstype is cgroup/cgroup2 *and* its superblock (major:minor)
   is one the daemon itself mounts for that controller: a tmpfs, or a cgroupfs of another
   hierarchy, is not the memory controller whatever its files say.
3. No other mount of the reader may sit at or below that mount point: a file bound over
   memory.limit_in_bytes or a tmpfs over a level directory refuses the mount.
4. Paths are walked from /proc/<pid>/root one component at a time with O_NOFOLLOW: a
   symlink anywhere below the reader's root is refused, never followed (an absolute link
   would resolve in the daemon's own root, not the reader's).
5. Every directory and file opened there must have the st_dev of the daemon's own mount of
   the hierarchy (a tmpfs mounted after mountinfo was read has another), files must be
   regular (opened O_NONBLOCK: a FIFO cannot block), and reads are bounded (MAX_FILE).
6. The pid's start time is checked after its root is opened: a pid reused meanwhile is
   another process, and its root is not read.
What the tenant keeps: after mountinfo is read it can bind one file of its own cgroup over
another of the same cgroup (same superblock). That misreports its own container to itself
only (a view is shared by readers of the same cgroups, i.e. the same container), which it
could do anyway by mounting a file over its /proc/meminfo.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from guestfs.sources.cgroup_path import components, pick_mount
from guestfs.sources.host_root import HostRoot
from guestfs.sources.mountinfo import (
    CgroupMount,
    MountEntry,
    mounts_of_entries,
    parse_mount_entries,
)
from guestfs.sources.usage_parsers import stat_fields

MAX_FILE = 4 << 20      # a cgroup's tasks file with 500,000 thread ids; cpuacct for 8192 CPUs
MAX_DIRS = 4096         # cgroups walked below a level when listing its processes
_DIR = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class Anchor:
    """How a level's directory is reached: below ``root`` (the host path of
    /proc/<pid>/root), on the superblock ``dev``, while ``pid`` is the process that
    started at ``start`` (clock ticks after boot)."""

    root: str
    pid: str
    start: int | None
    dev: int


def start_ticks(host: HostRoot, pid: str) -> int | None:
    text = host.try_read_small(f"/proc/{pid}/stat")
    try:
        return int(stat_fields(text)[19]) if text is not None else None
    except (ValueError, IndexError):
        return None


def alive(host: HostRoot, anchor: Anchor) -> bool:
    return start_ticks(host, anchor.pid) == anchor.start


def _check_dev(fd: int, anchor: Anchor, what: str) -> os.stat_result:
    st = os.fstat(fd)
    if st.st_dev != anchor.dev:
        raise OSError(errno.EXDEV, f"{what}: not on the cgroup hierarchy's superblock")
    return st


def open_dir(host: HostRoot, anchor: Anchor, directory: str) -> int:
    """An O_PATH fd on ``directory`` (a host path below ``anchor.root``), walked without
    following any symlink and checked to be on the hierarchy's superblock. Raises OSError."""
    if not directory.startswith(anchor.root.rstrip("/") + "/"):
        raise OSError(errno.EINVAL, f"{directory}: not below {anchor.root}")
    # The magic link /proc/<pid>/root is the one link followed: it is the reader's root.
    fd = os.open(host.path(anchor.root), os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if start_ticks(host, anchor.pid) != anchor.start:
            raise OSError(errno.ESRCH, f"pid {anchor.pid} exited")
        for part in components(directory[len(anchor.root.rstrip("/")):]):
            if part == "..":
                raise OSError(errno.EINVAL, f"{directory}: '..' component")
            nxt = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = nxt
        _check_dev(fd, anchor, directory)
        return fd
    except BaseException:
        os.close(fd)
        raise


def read_at(dir_fd: int, anchor: Anchor, name: str) -> str:
    """File ``name`` of an open level directory: a regular file on the superblock, at most
    MAX_FILE bytes. Raises OSError."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                 dir_fd=dir_fd)
    try:
        st = _check_dev(fd, anchor, name)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, f"{name}: not a regular file")
        chunks, total = [], 0
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
            total += len(chunk)
            if total > MAX_FILE:
                raise OSError(errno.EFBIG, f"{name}: larger than {MAX_FILE >> 20} MiB")
        return b"".join(chunks).decode("utf-8", "replace")
    finally:
        os.close(fd)


def read_files(host: HostRoot, anchor: Anchor, directory: str,
               names: tuple[str, ...]) -> dict[str, str | None]:
    """Files ``names`` of ``directory``; None for each one missing or refused. Raises
    OSError when the directory itself cannot be reached safely."""
    fd = open_dir(host, anchor, directory)
    try:
        out: dict[str, str | None] = {}
        for n in names:
            try:
                out[n] = read_at(fd, anchor, n)
            except OSError:
                out[n] = None
        return out
    finally:
        os.close(fd)


def read_file(host: HostRoot, anchor: Anchor, directory: str, name: str) -> str | None:
    try:
        return read_files(host, anchor, directory, (name,))[name]
    except OSError:
        return None


def stat_dir(host: HostRoot, anchor: Anchor, directory: str) -> os.stat_result | None:
    try:
        fd = open_dir(host, anchor, directory)
    except OSError:
        return None
    try:
        return os.fstat(fd)
    finally:
        os.close(fd)


def _walk(dir_fd: int, anchor: Anchor, depth: int, budget: list[int]) -> Iterator[int]:
    yield dir_fd
    if depth <= 0:
        return
    # An O_PATH fd cannot be listed: open the directory itself for scandir.
    listing = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        names = [e.name for e in os.scandir(listing) if e.is_dir(follow_symlinks=False)]
    finally:
        os.close(listing)
    for n in names:
        if budget[0] <= 0:
            return
        budget[0] -= 1
        try:
            sub = os.open(n, _DIR, dir_fd=dir_fd)
        except OSError:
            continue  # removed meanwhile
        try:
            _check_dev(sub, anchor, n)
            yield from _walk(sub, anchor, depth - 1, budget)
        except OSError:
            continue
        finally:
            os.close(sub)


def ids_below(host: HostRoot, anchor: Anchor, directory: str, name: str) -> list[str]:
    """The ids in file ``name`` (cgroup.procs, tasks) of ``directory`` and the cgroups below
    it, at most MAX_DIRS of them and 32 deep, never leaving the superblock."""
    try:
        top = open_dir(host, anchor, directory)
    except OSError:
        return []
    ids: list[str] = []
    try:
        for fd in _walk(top, anchor, 32, [MAX_DIRS]):
            try:
                ids += read_at(fd, anchor, name).split()
            except OSError:
                continue
    except OSError:
        pass
    finally:
        os.close(top)
    return ids


# ------------------------------------------------------------------ which mount

def _shadowed(entries: list[MountEntry], m: CgroupMount) -> str | None:
    """Another mount at or below ``m``'s mount point, which would hide part of it."""
    top = m.mount_point.rstrip("/")
    for e in entries:
        if e.mount_id == m.mount_id and e.mount_point == m.mount_point:
            continue
        if e.mount_point == m.mount_point or e.mount_point.startswith(top + "/"):
            return e.mount_point
    return None


@dataclass(frozen=True)
class ReaderMount:
    mount: CgroupMount   # the reader's mount, its mount point as the daemon reads it
    anchor: Anchor


@dataclass(frozen=True)
class ReaderTable:
    """A reader's mount table, read once per snapshot (every hierarchy looks in it)."""

    pid: str
    start: int | None            # read before the table: a reuse after it is caught later
    entries: tuple[MountEntry, ...] = ()
    error: str | None = None


def _read_bounded(path: str) -> str:
    """At most MAX_FILE bytes of ``path``: a tenant can make its mount table as long as
    fs.mount-max allows (100,000 mounts, some 15 MB), and it is read for every view."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        chunks, total = [], 0
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
            total += len(chunk)
            if total > MAX_FILE:
                raise OSError(errno.EFBIG, f"longer than {MAX_FILE >> 20} MiB")
        return b"".join(chunks).decode("utf-8", "replace")
    finally:
        os.close(fd)


def read_reader_table(host: HostRoot, pid: str) -> ReaderTable:
    start = start_ticks(host, pid)
    try:
        text = _read_bounded(host.path(f"/proc/{pid}/mountinfo"))
    except OSError as e:
        return ReaderTable(pid, start, error=f"cannot read /proc/{pid}/mountinfo "
                                             f"({e.strerror or e})")
    return ReaderTable(pid, start, tuple(parse_mount_entries(text)))


def reader_mount(host: HostRoot, table: ReaderTable, ours: list[CgroupMount], path: str
                 ) -> ReaderMount | str:
    """The mount in ``table`` that shows cgroup ``path`` of the hierarchy the daemon mounts
    as ``ours``, with the rules above; else why not (one line)."""
    if table.error is not None:
        return table.error
    pid = table.pid
    devs = {m.dev for m in ours if m.dev}
    try:
        expected = os.stat(host.path(ours[0].mount_point)).st_dev
    except (OSError, IndexError):
        return "the daemon's own mount of the hierarchy cannot be read"
    entries = list(table.entries)
    mounts = [m for m in mounts_of_entries(entries)
              if m.dev in devs and m.version == ours[0].version]
    if not mounts:
        return f"pid {pid} has no mount of this hierarchy (no cgroup mount of device " \
               f"{'/'.join(sorted(devs)) or '?'})"
    m = pick_mount(mounts, path, outside_ok=True)
    if m is None:
        roots = ", ".join(sorted({x.root for x in mounts}))
        return f"pid {pid}'s mounts of this hierarchy show {roots}, not {path}"
    hidden = _shadowed(entries, m)
    if hidden is not None:
        return f"pid {pid} has a mount at {hidden} over its cgroup mount {m.mount_point}"
    root = f"/proc/{pid}/root"
    shown = CgroupMount(root + m.mount_point.rstrip("/") if m.mount_point != "/" else root,
                        m.root, m.version, m.controllers, m.dev, m.mount_id)
    return ReaderMount(shown, Anchor(root, pid, table.start, expected))
