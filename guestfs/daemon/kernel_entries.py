"""Telling the kernel to drop a directory entry of the mount (libfuse3's notify_inval_entry).

The kernel keeps the dentries and inodes of every path looked up under a FUSE mount until
memory runs short, and libfuse keeps a node per inode until the kernel forgets it: ~20 per
per-container directory read (a few KB each container, for ever after it is gone). When
the daemon forgets a vanished container it asks the kernel to drop its directory's entry,
so the kernel forgets the subtree's inodes and libfuse frees their nodes. With guestfs's
own engine it sends the notification itself (fuse/adapter.py's Notifier, used by
fusefs.forget_vanished); with libfuse3 through mfusepy, libfuse does (EntryDropper);
libfuse2's call takes a channel and fusepy exposes neither: there a no-op, and the
entries go when the kernel reclaims them.
"""

from __future__ import annotations

import ctypes
import logging
from types import ModuleType
from typing import Any

log = logging.getLogger("guestfs.fusefs")
FUSE_ROOT_ID = 1


class EntryDropper:
    def __init__(self, module: ModuleType) -> None:
        self._lib: Any = None
        self._session: int | None = None
        lib = getattr(module, "_libfuse", None)
        name = getattr(lib, "_name", None)
        if not isinstance(name, str) or "fuse3" not in name:
            return
        try:
            # A handle of our own: setting argtypes on mfusepy's would change its calls.
            own = ctypes.CDLL(name)
            own.fuse_get_context.restype = ctypes.POINTER(ctypes.c_void_p)
            own.fuse_get_session.restype = ctypes.c_void_p
            own.fuse_get_session.argtypes = [ctypes.c_void_p]
            own.fuse_lowlevel_notify_inval_entry.restype = ctypes.c_int
            own.fuse_lowlevel_notify_inval_entry.argtypes = [
                ctypes.c_void_p, ctypes.c_uint64, ctypes.c_char_p, ctypes.c_size_t]
        except (OSError, AttributeError):
            return
        self._lib = own

    def capture(self) -> None:
        """Find the session; called in a FUSE request (init), where libfuse's context is
        set. struct fuse_context begins with its struct fuse pointer."""
        if self._lib is None:
            return
        ctx = self._lib.fuse_get_context()
        if ctx and ctx[0]:
            self._session = self._lib.fuse_get_session(ctx[0]) or None

    def drop(self, name: str) -> bool:
        """Ask the kernel to drop the mount root's entry ``name``; False if it cannot."""
        if self._session is None:
            return False
        raw = name.encode()
        rc = self._lib.fuse_lowlevel_notify_inval_entry(self._session, FUSE_ROOT_ID, raw,
                                                        len(raw))
        if rc not in (0, -2):  # -ENOENT: the kernel had already forgotten it
            log.debug("notify_inval_entry(%s) = %d", name, rc)
        return rc == 0

