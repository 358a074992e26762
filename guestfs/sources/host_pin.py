"""Read the host's copies of the served files without going through our own mount.

When the daemon's files are bind-mounted over /proc/meminfo in the daemon's own mount
namespace (or a previous daemon left such binds behind), opening /proc/meminfo would ask
the daemon itself: a hang, or ENOTCONN. So the daemon opens the host files once, from a
fresh private procfs/sysfs instance that has no overmounts, detaches that instance, and
re-reads the descriptors with pread at offset 0 (seq files regenerate there).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from guestfs.sources.host_root import HostReadError, HostRoot, pread_all
from guestfs.system import sysmount
from guestfs.system.safefile import make_private_dir

log = logging.getLogger("guestfs.hostpin")

_FS_FOR_PREFIX = (("/proc/", "proc"), ("/sys/", "sysfs"))


@dataclass(frozen=True)
class PinnedHost(HostRoot):
    pins: Mapping[str, int] = field(default_factory=dict)
    _locks: Mapping[str, threading.Lock] = field(default_factory=dict)
    origin: str = ""

    def read_text(self, host_path: str) -> str:
        fd = self.pins.get(host_path)
        if fd is None:
            return super().read_text(host_path)
        try:
            with self._locks[host_path]:
                data = pread_all(fd)
        except OSError as e:
            raise HostReadError(e.errno, f"{host_path} (pinned): {e.strerror}") from e
        return data.decode("utf-8", "replace")

    def close(self) -> None:
        for fd in self.pins.values():
            with contextlib.suppress(OSError):
                os.close(fd)


def _open_from_private_instance(fstype: str, prefix: str, paths: list[str]) -> dict[str, int]:
    fds: dict[str, int] = {}
    top = make_private_dir(f"guestfs-{fstype}-")
    try:
        sysmount.mount(fstype, top, fstype, 0x2 | 0x4 | 0x8)  # nosuid, nodev, noexec
        try:
            for p in paths:
                with contextlib.suppress(FileNotFoundError):
                    fds[p] = os.open(os.path.join(top, p[len(prefix):]), os.O_RDONLY | os.O_CLOEXEC)
        finally:
            sysmount.umount(top, detach=True)
    finally:
        os.rmdir(top)
    return fds


def _open_in_place(paths: list[str]) -> dict[str, int]:
    fds: dict[str, int] = {}
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        # An overmounted file lives on another device than its directory.
        if os.fstat(fd).st_dev != os.stat(os.path.dirname(p)).st_dev:
            os.close(fd)
            raise OSError(f"{p} is overmounted and no private procfs/sysfs could be mounted; "
                          "start guestfs before binding its files over /proc")
        fds[p] = fd
    return fds


def pin_host_files(paths: Iterable[str]) -> PinnedHost:
    """A HostRoot for "/" whose reads of ``paths`` never go through an overmount."""
    fds: dict[str, int] = {}
    origins = []
    for prefix, fstype in _FS_FOR_PREFIX:
        group = [p for p in paths if p.startswith(prefix)]
        if not group:
            continue
        try:
            fds.update(_open_from_private_instance(fstype, prefix, group))
            origins.append(f"private {fstype}")
        except OSError as e:
            log.info("cannot mount a private %s (%s); opening %s in place", fstype, e, prefix)
            fds.update(_open_in_place(group))
            origins.append(f"{prefix} in place")
    return PinnedHost("/", fds, {p: threading.Lock() for p in fds}, ", ".join(origins))
