"""sysinfo(2) and the CPU count for an app whose `guestfs run` is gone (killed with -9, an
OOM kill): its guard starts this successor and hands it the app's listener, as a keeper
hands listeners back to a restarted agent (guestfs.syscalls.guard).

The app's files keep serving after run is gone: the app holds a share of the mount's
users lock (run.share_users_lock), so its daemon does not stop. The successor answers
from those same files, in run's mount namespace (the guard's), as run did, until the
app's last filtered process has exited; without it the guard would pass every call to the
kernel, and the app would see the node's memory again while its files show its own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket

from guestfs.syscalls.answers import ServedView, make_handlers, texts_under
from guestfs.syscalls.filter import Interception, this_arch
from guestfs.syscalls.guard import END, ListenerGuard
from guestfs.syscalls.keeper import Kept, receive_handback
from guestfs.syscalls.notify import ListenerLoop, Served

log = logging.getLogger("guestfs.seccomp")


def serve_handed_over(fd: int, mountpoint: str, calls: str) -> int:
    """Take the listeners the guard sends on ``fd``, answer them from ``mountpoint``'s
    files until every one has hung up; 0, or 1 when the hand-over broke off (the guard
    then answers with the kernel, or starts another successor)."""
    sock = socket.socket(fileno=fd)
    kept: Kept = []
    end = receive_handback(sock, kept)
    if end[:1] != END:
        for lfd, _meta in kept:
            with contextlib.suppress(OSError):
                os.close(lfd)
        sock.close()
        return 1
    guard = ListenerGuard.attached(sock, int(end[1:]) if end[1:].isdigit() else 0)
    if not kept:
        guard.close()
        return 0
    arch = this_arch()
    view = ServedView(texts_under(mountpoint))
    handlers = make_handlers(arch, view, Interception.parse(calls)) if arch else {}
    loop = ListenerLoop(arch.audit_arch if arch else None, until_empty=True)
    for lfd, _meta in kept:
        loop.add(Served(lfd, handlers, "the app's listener"))   # closed once it hangs up
    loop.start().join()
    guard.close()
    return 0
