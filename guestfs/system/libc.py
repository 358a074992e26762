"""The C library, loaded once, and each foreign function guestfs calls declared once with
its argument and result types. A module that needs a libc call imports it from here.

dlopen(NULL), the library this interpreter is linked with, not find_library("c"): that
runs `ldconfig -p` in a child process on every call, at every start. Each function is its
own object (LIBC[name]), so one declaration's types never change another's.
"""

from __future__ import annotations

import ctypes
from typing import Any

LIBC = ctypes.CDLL(None, use_errno=True)


def _declare(name: str, restype: Any, *argtypes: Any) -> Any:
    """``name`` from libc with these types; None where this libc lacks it (musl has no
    tgkill before 1.2, and gVisor's may be older)."""
    try:
        fn = LIBC[name]
    except AttributeError:
        return None
    fn.restype = restype
    if argtypes:
        fn.argtypes = list(argtypes)
    return fn


c_int, c_long, c_ulong, c_char_p, c_void_p = (ctypes.c_int, ctypes.c_long, ctypes.c_ulong,
                                              ctypes.c_char_p, ctypes.c_void_p)

mount = _declare("mount", c_int, c_char_p, c_char_p, c_char_p, c_ulong, c_void_p)
umount2 = _declare("umount2", c_int, c_char_p, c_int)
unshare = _declare("unshare", c_int, c_int)
setns = _declare("setns", c_int, c_int, c_int)
fstatfs = _declare("fstatfs", c_int, c_int, c_void_p)
# Variadic: every argument is passed as a c_long by the caller.
syscall = _declare("syscall", c_long)
prctl = _declare("prctl", c_int, c_int, c_ulong, c_ulong, c_ulong, c_ulong)
prctl_name = _declare("prctl", c_int, c_int, c_char_p, c_ulong, c_ulong, c_ulong)
# Given a header and a data array by reference (system/caps.py).
capget = _declare("capget", c_int)
capset = _declare("capset", c_int)
tgkill = _declare("tgkill", c_int, c_int, c_int, c_int)
# pid, local iov, count, remote iov, count, flags (0)
process_vm_readv = _declare("process_vm_readv", ctypes.c_ssize_t, c_int, c_void_p, c_ulong,
                            c_void_p, c_ulong, c_ulong)
process_vm_writev = _declare("process_vm_writev", ctypes.c_ssize_t, c_int, c_void_p,
                             c_ulong, c_void_p, c_ulong, c_ulong)
# glibc's; musl has one that does nothing.
mallopt = _declare("mallopt", c_int, c_int, c_int)
# glibc's only (musl has none): hands the free pages of malloc's heap back to the kernel.
malloc_trim = _declare("malloc_trim", c_int, ctypes.c_size_t)
