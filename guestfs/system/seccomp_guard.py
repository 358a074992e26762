"""A guard for seccomp listeners: a small process holding a copy of each, which passes
every notified call back to the kernel once its supervisor (`guestfs run`, the seccomp
agent) is gone.

Without it, a supervisor killed with -9 closes the last copy of each listener and the
kernel fails every notified call with ENOSYS from then on (seccomp has no "fall back to
allow" flag): `getconf _PHYS_PAGES` would start failing in every container on the node.

While the supervisor lives, the guard never receives a notification (it polls its copies
for POLLHUP only, which the kernel reports whatever the event mask): it only drops the
copy of a listener whose processes have all exited, so a node running containers for
months does not accumulate descriptors. Listeners arrive over a SOCK_SEQPACKET pair, one
per message (SCM_RIGHTS); the supervisor's end closing, even on kill -9, is the signal.

Known gap: a call the supervisor had received but not answered when it died stays
blocked until its thread takes a signal; the kernel then restarts it as a new
notification, which the guard continues. Only the guard can see that moment, and it
cannot know the pending call's id.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import socket
import subprocess

from guestfs.system.seccomp_notify import receive, respond
from guestfs.system.selfexec import SECCOMP_GUARD, helper_argv

log = logging.getLogger("guestfs.seccomp")

_DEAD = select.POLLHUP | select.POLLERR | select.POLLNVAL


class ListenerGuard:
    """The supervisor's handle on its guard: ``python -I -S _boot.py --seccomp-guard FD``
    in a session of its own (the terminal's Ctrl-C and a kill of the supervisor's process
    group are not for it), with no other inherited descriptor (a held listening socket or
    mount-users lock would outlive the supervisor in it). Exec'd, not forked: a fork of a
    threaded process may inherit a held lock, and ps shows what it is."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            fd = str(theirs.fileno())
            proc = subprocess.Popen(helper_argv(SECCOMP_GUARD, fd), pass_fds=(theirs.fileno(),),
                                    start_new_session=True, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.pid = proc.pid
        self._sock = ours

    def add(self, listener: int) -> bool:
        """Give the guard a copy of ``listener``; False if the guard is gone (the caller
        serves it anyway: the guard only matters once the supervisor dies too)."""
        try:
            socket.send_fds(self._sock, [b"L"], [listener])
        except OSError as e:
            log.warning("the seccomp guard did not take a listener: %s", e)
            return False
        return True

    def close(self) -> None:
        """Hand every listener over: the guard continues their calls from now on."""
        with contextlib.suppress(OSError):
            self._sock.close()


def guard_main(fd: int) -> None:  # pragma: no cover - in the guard
    """The guard's loop (_boot.py --seccomp-guard): until the supervisor is gone and every
    listener it handed over has hung up."""
    sock = socket.socket(fileno=fd)
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    listeners: set[int] = set()
    agent_alive = True
    while agent_alive or listeners:
        for fd, ev in poller.poll():
            if fd == sock.fileno():
                got = _take(sock) if ev & select.POLLIN else None
                if got is None:        # the supervisor is gone: serve every listener
                    agent_alive = False
                    poller.unregister(sock)
                    for lfd in listeners:
                        poller.modify(lfd, select.POLLIN)
                elif got >= 0:
                    listeners.add(got)
                    # Event mask 0 while the supervisor answers: hang-ups only.
                    poller.register(got, 0 if agent_alive else select.POLLIN)
            elif ev & select.POLLIN and not agent_alive:
                try:
                    note = receive(fd)
                except OSError as e:
                    if e.errno not in (errno.ENOENT, errno.EINTR):
                        _drop(poller, listeners, fd)
                    continue
                respond(fd, note.id, cont=True)
            elif ev & _DEAD:
                _drop(poller, listeners, fd)


def _take(sock: socket.socket) -> int | None:  # pragma: no cover - in the guard
    """The next listener (an fd), -1 for a message without one, None at end of stream."""
    try:
        msg, fds, _flags, _addr = socket.recv_fds(sock, 16, 4)
    except OSError:
        return None
    if not msg and not fds:
        return None
    for extra in fds[1:]:
        os.close(extra)
    return fds[0] if fds else -1


def _drop(poller: select.poll, listeners: set[int], fd: int) -> None:  # pragma: no cover
    with contextlib.suppress(KeyError):
        poller.unregister(fd)
    listeners.discard(fd)
    with contextlib.suppress(OSError):
        os.close(fd)
