"""mount(2), umount2(2) and unshare(2) through libc (Python 3.11 has no os.unshare)."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os

MS_RDONLY = 1
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MNT_DETACH = 2
CLONE_NEWNS = 0x00020000

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_void_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]


def _check(rc: int, what: str) -> None:
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def _b(s: str | None) -> bytes | None:
    return None if s is None else os.fsencode(s)


def mount(source: str | None, target: str, fstype: str | None = None, flags: int = 0,
          data: str | None = None) -> None:
    _check(_libc.mount(_b(source), _b(target), _b(fstype), flags, _b(data)),
           f"mount {source} {target}")


def bind(source: str, target: str, readonly: bool = False) -> None:
    mount(source, target, None, MS_BIND)
    if readonly:
        mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY)


def umount(target: str, detach: bool = False) -> None:
    _check(_libc.umount2(_b(target), MNT_DETACH if detach else 0), f"umount {target}")


def unshare_mount_namespace() -> None:
    """A private mount namespace: later mounts here are invisible to everyone else."""
    _check(_libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    try:
        mount(None, "/", None, MS_REC | MS_PRIVATE)
    except OSError as e:
        # gVisor has no mount propagation to change (EINVAL): its namespaces never share.
        if e.errno != errno.EINVAL:
            raise


def enter_mount_namespace(pid: int) -> None:
    """Join ``pid``'s mount namespace (the caller must be single-threaded)."""
    fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    try:
        _check(_libc.setns(fd, CLONE_NEWNS), f"setns(mnt of pid {pid})")
    finally:
        os.close(fd)
    os.chdir("/")


def is_stale_mount(path: str) -> bool:
    """A FUSE mount whose daemon died: every request says ENOTCONN. (A stat alone can be
    answered from the kernel's attribute cache for a while; listing the directory cannot.)"""
    try:
        os.listdir(path)
    except OSError as e:
        return e.errno == errno.ENOTCONN
    return False
