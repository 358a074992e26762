"""Mountpoint helpers every command shares: the mount table's entry at a path, probing a
FUSE mount from a child process (a stopped daemon blocks its readers forever), telling a
live guestfs mount from a stale one, and polling until something holds.

Neutral ground: `guestfs mount`, `run`, `attach`, the run supervisor and the daemon's
status reader import these from here rather than from each other."""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable

from guestfs.sources.mountinfo import MountEntry, parse_mount_entries
from guestfs.system import forked

STATUS_PATH = "/.guestfs-status"   # the daemon's status, at the root of every layout

FSNAME = "guestfs"
PROBE_FILE = "/sys/devices/system/cpu/online"  # served with a sysfs-style size of 4096
PROBE_TIMEOUT = 5.0  # how long a probe waits for a FUSE mount to answer


class MountError(RuntimeError):
    pass


class MountUnresponsive(OSError):
    """A FUSE mount whose daemon does not answer (stopped with SIGSTOP, or wedged): any
    stat, listing or read of it would block forever, so our probes give up with this."""

    def __str__(self) -> str:
        return str(self.strerror)


def canonical_mountpoint(path: str) -> str:
    """``path`` as the mount table spells it, found without a stat of ``path`` itself (a
    stat of a mount served by a stopped daemon never returns): only its parent is resolved."""
    path = os.path.abspath(path)
    parent, name = os.path.split(path)
    return os.path.join(os.path.realpath(parent), name) if name else path


def mount_entry(path: str) -> MountEntry | None:
    """The topmost mount at ``path`` in our mount table, or None. Reads only
    /proc/self/mountinfo, never the mount itself, so it cannot hang."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            text = f.read()
    except OSError:
        return None
    path = canonical_mountpoint(path)
    found = [e for e in parse_mount_entries(text) if e.mount_point == path]
    return found[-1] if found else None


# Run by a child: list the mount point, then read up to LIMIT bytes of one file under it;
# print the errno of the first failure (0 for none) on the first line, the data after it.
_PROBE = """import os, sys
mp, name, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
try:
    os.listdir(mp)
    data = b""
    if name:
        with open(mp + name, "rb") as f:
            data = f.read(limit)
except OSError as e:
    sys.stdout.write(str(e.errno or 0) + "\\n")
else:
    sys.stdout.buffer.write(b"0\\n" + data)
"""


def probe_mount(mp: str, name: str = "", timeout: float = PROBE_TIMEOUT,
                limit: int = 4096, nice: int = 0) -> tuple[int, bytes]:
    """List ``mp`` (and read up to ``limit`` bytes of ``mp + name``) from a child process:
    (errno or 0, data).

    Never from this process: a FUSE request to a stopped daemon waits forever, and only a
    fatal signal ends it, so the child is killed after ``timeout`` and MountUnresponsive
    raised. A process with one thread forks it (a new interpreter's start-up cost more
    than the probe: `guestfs run` probed twice before its app started); with threads, the
    child is our own interpreter by absolute path, isolated (-I -S): nothing is imported
    from the working directory. ``nice``: the child's nice value, for a probe that must
    not take the CPU from the readers it is started beside."""
    if forked.single_threaded():
        return _probe_forked(mp, name, timeout, limit)
    proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _PROBE, mp, name, str(limit)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, close_fds=True)
    if nice:
        with contextlib.suppress(OSError):   # raising one's nice needs no privilege
            os.setpriority(os.PRIO_PROCESS, proc.pid, nice)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        # A FUSE wait is killable; should the child still not go, it is not waited for.
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=1.0)
        raise _unresponsive(mp, timeout) from None
    return _parse_probe(out)


def _unresponsive(mp: str, timeout: float) -> MountUnresponsive:
    return MountUnresponsive(
        errno.ETIMEDOUT, f"{mp}: the FUSE mount does not answer within {timeout:g}s "
        f"(its daemon is stopped or hung: SIGCONT it, or detach it with umount -l)")


def _parse_probe(out: bytes) -> tuple[int, bytes]:
    head, _, data = out.partition(b"\n")
    try:
        return int(head), data
    except ValueError:
        return errno.EIO, b""   # the child died before answering


def _probe_forked(mp: str, name: str, timeout: float, limit: int) -> tuple[int, bytes]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child; answers through the pipe
        try:
            # Nothing of ours kept in it but the pipe: a lock (run's users lock) held by
            # a child stuck in an unkillable wait would outlive us.
            os.closerange(0, w)
            os.closerange(w + 1, os.sysconf("SC_OPEN_MAX"))
            os.write(w, _probe_here(mp, name, limit))
        finally:
            os._exit(0)
    os.close(w)
    try:
        out, deadline = b"", time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0 and select.select([r], [], [], left)[0]:
            chunk = os.read(r, 65536)
            if not chunk:
                break
            out += chunk
        else:
            os.kill(pid, signal.SIGKILL)
            # A FUSE wait is killable; should the child still not go, it is not waited for.
            wait_until(lambda: os.waitpid(pid, os.WNOHANG)[0] != 0, 1.0)
            raise _unresponsive(mp, timeout)
    finally:
        os.close(r)
    os.waitpid(pid, 0)
    return _parse_probe(out)


def _probe_here(mp: str, name: str, limit: int) -> bytes:
    """What _PROBE prints, for the forked child."""
    try:
        os.listdir(mp)
        data = b""
        if name:
            fd = os.open(mp + name, os.O_RDONLY | os.O_CLOEXEC)
            try:
                while len(data) < limit and (chunk := os.read(fd, limit - len(data))):
                    data += chunk
            finally:
                os.close(fd)
    except OSError as e:
        return f"{e.errno or 0}\n".encode()
    return b"0\n" + data


def is_guestfs_mount(path: str) -> bool:
    """A live guestfs mount at ``path``: our mount table names it, and a child process
    reads the daemon's status file there (raises MountUnresponsive when the daemon does
    not answer).

    A read, not a listing, and the table is read again after the probe: a stale mount
    detached between the two (a new daemon replacing it) would otherwise have the plain
    directory beneath it listed and taken for a live mount (a test then opened
    proc/meminfo there and got ENOENT)."""
    entry = mount_entry(path)
    if entry is None:
        return False
    mp = entry.mount_point
    if entry.fstype == f"fuse.{FSNAME}":
        err, data = probe_mount(mp, STATUS_PATH)
        live = err == 0 and bool(data)
    elif entry.fstype == "fuse":
        # gVisor shows neither the subtype nor the fsname: look at the layout.
        live = _serves(mp)
    else:
        return False
    return live and mount_entry(path) == entry


def is_stale_mount(path: str) -> bool:
    """A FUSE mount at ``path`` whose daemon died ("Transport endpoint is not connected"),
    found without touching the mount from this process."""
    entry = mount_entry(path)
    return (entry is not None and entry.fstype.startswith("fuse")
            and probe_mount(entry.mount_point)[0] == errno.ENOTCONN)


def _serves(mp: str) -> bool:
    """``mp`` answers with guestfs's layout (its sysfs-style file has a non-zero size)."""
    err, data = probe_mount(mp, PROBE_FILE)
    return err == 0 and bool(data)


def wait_until(ready: Callable[[], bool], timeout: float, interval: float = 0.02) -> bool:
    """Poll ``ready`` until it holds (True) or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
    return True


def refuse_symlink(mp: str) -> None:
    """mount(2) follows a symlink at its target: one planted in /tmp by another user would
    have root mount the filesystem over whatever it points to (/etc). Only looked at when
    ``mp`` is not a mount (an lstat of a stopped daemon's mount point would hang)."""
    if mount_entry(mp) is None and os.path.islink(mp):
        raise MountError(f"{mp} is a symbolic link; give the directory itself")


def refuse_non_directory(mp: str) -> None:
    """A FUSE mount's root is a directory (rootmode=40000): mount(2) on a regular file
    fails with ENOTDIR, and libfuse then mounted it through fusermount over the file.
    Looked at only when ``mp`` is not a mount, as refuse_symlink."""
    if mount_entry(mp) is None and os.path.lexists(mp) and not os.path.isdir(mp):
        raise MountError(f"{mp} is not a directory; give a directory to mount on (or a "
                         "path in an existing directory, where one is made)")


def refuse_foreign_mount(mp: str) -> None:
    """Another filesystem's root mounted at ``mp`` (a tmpfs, a volume): a guestfs mount
    would hide it. FUSE mounts are left to the caller, which tells a live guestfs mount
    (reused) and a stale one (replaced) from the rest."""
    entry = mount_entry(mp)
    if entry is not None and entry.root == "/" and not entry.fstype.startswith("fuse"):
        raise MountError(f"{mp} is already a mount point ({entry.fstype}); give a "
                         "directory nothing is mounted on")


FUSE_DEVICE = "/dev/fuse"


def check_fuse_device(path: str = FUSE_DEVICE) -> None:
    """MountError, one line with the fix, when the FUSE device cannot be opened: libfuse
    would otherwise print "fuse: device not found" and a bare error number. Kubernetes
    gives a non-privileged container /dev/fuse only through a device plugin's resource: a
    hostPath of it is bound but refused by the device cgroup (EPERM)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        raise MountError(f"{path} does not exist here: give the container the FUSE device "
                         "(Kubernetes: resources.limits squat.ai/fuse: 1 from the FUSE "
                         "device plugin, or privileged; docker/podman: --device "
                         "/dev/fuse)") from None
    except PermissionError as e:
        try:
            st = os.stat(path)
            mode = f"mode {stat.filemode(st.st_mode)}, owner uid {st.st_uid}"
        except OSError:
            mode = "mode unknown"
        if os.geteuid() != 0 and not os.access(path, os.R_OK | os.W_OK):
            raise MountError(f"{path} cannot be opened by uid {os.geteuid()} ({mode}): run "
                             "as root, or make it readable and writable by this user "
                             "(udev's default is 0666)") from None
        raise MountError(f"{path} cannot be opened ({e.strerror}, {mode}): the device "
                         "cgroup forbids it; a hostPath /dev/fuse is not enough in a "
                         "non-privileged container, request the FUSE device plugin's "
                         "resource (squat.ai/fuse) or --device /dev/fuse") from None
    except OSError as e:
        raise MountError(f"{path} cannot be opened: {e.strerror or e}") from None
    os.close(fd)

