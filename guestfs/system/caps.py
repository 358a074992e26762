"""Dropping a capability for good (bounding, permitted, effective, inheritable and ambient
sets) through libc's prctl(2) and capset(2): Python has neither, and libcap would be a new
dependency for three calls."""

from __future__ import annotations

import ctypes
import errno
import os

from guestfs.system import libc

CAP_SETPCAP = 8
CAP_SYS_PTRACE = 19
CAP_SYS_ADMIN = 21
CAP_SYS_TIME = 25
CAP_NAMES = {CAP_SETPCAP: "CAP_SETPCAP", CAP_SYS_PTRACE: "CAP_SYS_PTRACE",
             CAP_SYS_ADMIN: "CAP_SYS_ADMIN", CAP_SYS_TIME: "CAP_SYS_TIME"}
PR_CAPBSET_READ = 23
PR_CAPBSET_DROP = 24
PR_SET_SECUREBITS = 28
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_LOWER = 3
PR_CAP_AMBIENT_CLEAR_ALL = 4
_LINUX_CAPABILITY_VERSION_3 = 0x20080522



class _Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def prctl(what: str, option: int, arg2: int = 0, arg3: int = 0) -> int:
    rc = libc.prctl(option, arg2, arg3, 0, 0)
    if rc < 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")
    return int(rc)


def _capget() -> tuple[_Header, ctypes.Array[_Data]]:
    header = _Header(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_Data * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"capget: {os.strerror(e)}")
    return header, data


def _bits(words: ctypes.Array[_Data], field: str) -> frozenset[int]:
    return frozenset(32 * w + b for w in range(2) for b in range(32)
                     if getattr(words[w], field) >> b & 1)


def permitted_caps() -> frozenset[int]:
    """This thread's permitted set: all capset can keep."""
    return _bits(_capget()[1], "permitted")


def effective_caps() -> frozenset[int]:
    return _bits(_capget()[1], "effective")


def cap_names(caps: frozenset[int]) -> str:
    return ", ".join(CAP_NAMES.get(c, f"capability {c}") for c in sorted(caps)) or "none"


def in_bounding_set(cap: int) -> bool:
    """False also for a capability this kernel does not know (EINVAL): gVisor has no
    /proc/sys/kernel/cap_last_cap, so last_cap() guesses past its last one."""
    try:
        return prctl("PR_CAPBSET_READ", PR_CAPBSET_READ, cap) == 1
    except OSError as e:
        if e.errno == errno.EINVAL:
            return False
        raise


def drop_capability(cap: int) -> None:
    """Remove ``cap`` from every capability set of this thread (call it single-threaded,
    right before exec). The bounding set goes first, while we still hold CAP_SETPCAP: for
    root an exec refills the permitted set from the bounding set, so without that step the
    capability would come back at the next exec (setuid-root and file capabilities too)."""
    if in_bounding_set(cap):
        try:
            prctl("PR_CAPBSET_DROP", PR_CAPBSET_DROP, cap)
        except OSError as e:
            if e.errno == errno.EPERM:
                raise OSError(e.errno, "removing it from the bounding set needs CAP_SETPCAP, "
                                       "which this process lacks") from e
            raise
    header, data = _capget()
    word, bit = divmod(cap, 32)
    mask = ~(1 << bit) & 0xFFFFFFFF
    data[word].effective &= mask
    data[word].permitted &= mask
    data[word].inheritable &= mask
    if libc.capset(ctypes.byref(header), data) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"capset: {os.strerror(e)}")
    try:
        # Already gone with the inheritable bit; said explicitly for kernels that differ.
        prctl("PR_CAP_AMBIENT_LOWER", PR_CAP_AMBIENT, PR_CAP_AMBIENT_LOWER, cap)
    except OSError as e:
        if e.errno != errno.EINVAL:  # a kernel without ambient capabilities (< 4.3)
            raise


def last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 40


def limit_bounding_to(caps: frozenset[int]) -> None:
    """Drop from the bounding set every capability not in ``caps``, so that an exec (of
    root, of a setuid-root or file-capability binary) cannot gain one this thread lacks.
    Needs CAP_SETPCAP in the effective set; raises OSError without it."""
    for cap in range(last_cap() + 1):
        if cap not in caps and in_bounding_set(cap):
            prctl("PR_CAPBSET_DROP", PR_CAPBSET_DROP, cap)


def set_caps(caps: frozenset[int]) -> None:
    """Make ``caps`` this thread's effective and permitted sets, and the inheritable set
    empty (capset can only lower what is not held)."""
    header = _Header(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_Data * 2)()
    for cap in caps:
        word, bit = divmod(cap, 32)
        data[word].effective |= 1 << bit
        data[word].permitted |= 1 << bit
    if libc.capset(ctypes.byref(header), data) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"capset: {os.strerror(e)}")
