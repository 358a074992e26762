"""A guard for seccomp listeners: a small process holding a copy of each, which passes
every notified call back to the kernel while no supervisor (`guestfs run`, the seccomp
agent) serves them, and keeps them for the next agent.

Without it, a supervisor killed with -9 closes the last copy of each listener and the
kernel fails every notified call with ENOSYS from then on (seccomp has no "fall back to
allow" flag): `getconf _PHYS_PAGES` would start failing in every container on the node.

While a supervisor serves, the guard never receives a notification (it polls its copies
for POLLHUP only, which the kernel reports whatever the event mask): it only drops the
copy of a listener whose processes have all exited, so a node running containers for
months does not accumulate descriptors. Listeners arrive over a SOCK_SEQPACKET
connection, one per message (SCM_RIGHTS) with opaque metadata (the agent's JSON: the
container's pid, id and key); the supervisor's end closing, even on kill -9, is the
signal to continue every call.

The keeper (the seccomp agent's guard): it also listens on a unix socket (guard.sock in
the agent's 0700 directory). An agent that connects while none is attached gets every
live listener back, with its metadata, then b"E" and the guard's pid; from then on it is
the attached supervisor. One that connects while another is attached gets b"B" (busy) and nothing.
The guard stops receiving before it sends the first listener, and only starts again once
that connection is gone, so never do two processes receive on one listener.

Known gap: a call the supervisor had received but not answered when it died stays
blocked until its thread takes a signal; the kernel then restarts it as a new
notification, which the guard continues. Only the guard can see that moment, and it
cannot know the pending call's id.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import logging
import os
import resource
import select
import signal
import socket
import struct
import subprocess
import time

from guestfs.syscalls.notify import receive, respond
from guestfs.system import forked
from guestfs.system.selfexec import SECCOMP_GUARD, SECCOMP_SUCCESSOR, THEN_ANSWER, helper_argv

log = logging.getLogger("guestfs.seccomp")

_DEAD = select.POLLHUP | select.POLLERR | select.POLLNVAL
MAX_META = 4096            # bytes of metadata kept per listener; the agent sends ~200
HANDBACK_TIMEOUT = 5.0     # seconds a hand-back may take before the guard gives up on it
# A successor that keeps dying leaves the calls to the kernel: at most this many starts in
# SUCCESSOR_WINDOW seconds.
SUCCESSOR_STARTS, SUCCESSOR_WINDOW = 3, 60.0
GUARD_NAME = b"guestfs-guard"   # a forked guard's /proc/PID/comm
# Message kinds, the first byte of each message.
LISTENER, END, BUSY = b"L", b"E", b"B"


def listener_message(meta: bytes) -> bytes:
    """What goes with a listener fd, both ways: b"L" and its metadata, cut to MAX_META."""
    return LISTENER + meta[:MAX_META]


def parse_message(msg: bytes, fds: list[int], flags: int = 0) -> tuple[int, bytes] | None:
    """A supervisor's message: (listener fd, metadata) for b"L" with an fd; None for
    anything else. Every other fd received is closed: whatever arrives, the guard keeps
    no stray descriptor and never raises. Truncated metadata (MSG_TRUNC) is dropped, the
    listener kept (the next agent serves it with the kernel's answers)."""
    keep = fds[0] if fds and msg[:1] == LISTENER else None
    for fd in fds:
        if fd != keep:
            with contextlib.suppress(OSError):
                os.close(fd)
    if keep is None:
        return None
    return keep, b"" if flags & socket.MSG_TRUNC else msg[1:]


def peer_creds(sock: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end, as the kernel saw it connect."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", creds)
    return pid, uid


class ListenerGuard:
    """A supervisor's attachment to a guard. ``ListenerGuard()`` starts one: ``python -I
    -S _boot.py --seccomp-guard FD [KEEPER_FD]`` in a session of its own (the terminal's
    Ctrl-C and a kill of the supervisor's process group are not for it), with no other
    inherited descriptor (a held listening socket or mount-users lock would outlive the
    supervisor in it). Exec'd, not forked: a fork of a threaded process may inherit a held
    lock, and ps shows what it is. ``keeper``, a listening socket, makes it a keeper.
    ``successor`` (a mountpoint and Interception.spelled()): once this supervisor is gone,
    the guard starts a successor that answers from the files served there (`guestfs run`'s
    app, whose files keep serving after run is killed)."""

    def __init__(self, keeper: socket.socket | None = None,
                 successor: tuple[str, str] | None = None) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            fds = [theirs.fileno()] + ([keeper.fileno()] if keeper is not None else [])
            then = [THEN_ANSWER, *successor] if successor is not None else []
            proc = subprocess.Popen(helper_argv(SECCOMP_GUARD, *map(str, fds), *then),
                                    pass_fds=fds, start_new_session=True,
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.pid = proc.pid
        self._sock = ours
        # A stopped guard's full socket must not block the supervisor (the agent adds
        # under a lock its serving thread also takes): add() gives up instead.
        ours.settimeout(HANDBACK_TIMEOUT)

    @classmethod
    def forked(cls, successor: tuple[str, str] | None = None) -> ListenerGuard:
        """As ListenerGuard(successor=...), in a fork of this process when it has a
        single thread: the guard's imports are this process's already (40-50 ms of CPU
        an exec'd guard spends at the app's start, which a 1-CPU pod pays in full). The
        fork is named guestfs-guard; its command line is its parent's."""
        if not forked.single_threaded():
            return cls(successor=successor)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = forked.fork()
        if pid == 0:  # pragma: no cover - the guard: never returns
            ours.close()
            _guard_in_fork(theirs.fileno(), successor)
        theirs.close()
        self = cls.__new__(cls)
        self.pid, self._sock = pid, ours
        ours.settimeout(HANDBACK_TIMEOUT)
        return self

    @classmethod
    def attached(cls, sock: socket.socket, pid: int) -> ListenerGuard:
        """The supervisor's end of a keeper's hand-back connection (after b"E")."""
        self = cls.__new__(cls)
        self.pid, self._sock = pid, sock
        sock.settimeout(HANDBACK_TIMEOUT)
        return self

    def add(self, listener: int, meta: bytes = b"") -> bool:
        """Give the guard a copy of ``listener``; False if the guard is gone (the caller
        serves it anyway: the guard only matters once the supervisor dies too)."""
        try:
            socket.send_fds(self._sock, [listener_message(meta)], [listener])
        except OSError as e:
            log.warning("the seccomp guard did not take a listener: %s", e)
            return False
        return True

    def fileno(self) -> int:
        return self._sock.fileno()

    def close(self) -> None:
        """Hand every listener over: the guard continues their calls from now on."""
        with contextlib.suppress(OSError):
            self._sock.close()


class _Guard:  # pragma: no cover - in the guard process (tests/test_seccomp_guard.py)
    def __init__(self, session: socket.socket | None, keeper: socket.socket | None,
                 stay: bool, successor: tuple[str, str] | None = None) -> None:
        self.poller = select.poll()
        self.listeners: dict[int, bytes] = {}
        self.session: socket.socket | None = None
        self.keeper = keeper
        self.stay = stay                # a standalone keeper outlives its last listener
        self.successor = successor
        self._started: list[float] = []   # monotonic times successors were started
        self._children: list[subprocess.Popen[bytes]] = []
        if session is not None:
            self._attach(session)
        if keeper is not None:
            keeper.setblocking(False)
            self.poller.register(keeper, select.POLLIN)

    def run(self) -> None:
        while self.stay or self.session is not None or self.listeners:
            for fd, ev in self.poller.poll():
                try:
                    self._event(fd, ev)
                except Exception:  # noqa: BLE001 - the guard's death would fail every call
                    time.sleep(0.01)       # never a busy loop on an error that repeats

    def _event(self, fd: int, ev: int) -> None:
        if self.session is not None and fd == self.session.fileno():
            self._from_session(ev)
        elif self.keeper is not None and fd == self.keeper.fileno():
            self._accept()
        elif fd not in self.listeners:
            return                    # dropped earlier in this same poll round
        elif ev & select.POLLIN and self.session is None:
            self._continue(fd)
        elif ev & _DEAD:
            self._drop(fd)

    def _attach(self, sock: socket.socket) -> None:
        # Event mask 0 while a supervisor answers: hang-ups only.
        for lfd in self.listeners:
            self.poller.modify(lfd, 0)
        self.session = sock
        self.poller.register(sock, select.POLLIN)

    def _detach(self) -> None:
        assert self.session is not None
        self.poller.unregister(self.session)
        with contextlib.suppress(OSError):
            self.session.close()
        self.session = None
        for lfd in self.listeners:
            self.poller.modify(lfd, select.POLLIN)

    def _from_session(self, ev: int) -> None:
        assert self.session is not None
        try:
            msg, fds, flags, _addr = socket.recv_fds(self.session, MAX_META + 1, 4)
        except OSError:
            msg, fds, flags = b"", [], 0
        if not msg and not fds:             # end of stream: the supervisor is gone
            self._detach()
            if self.successor is not None:
                self._start_successor(self.successor)
            return
        got = parse_message(msg, fds, flags)
        if got is not None and got[0] not in self.listeners:
            self.listeners[got[0]] = got[1]
            self.poller.register(got[0], 0)

    def _accept(self) -> None:
        assert self.keeper is not None
        try:
            conn, _ = self.keeper.accept()
        except OSError:
            return
        # An agent killed just before its successor connected: its end of stream may wait
        # behind this connection in the same poll round. Read it first, or the successor
        # would be told "busy" by a dead agent.
        while self.session is not None and select.select([self.session], [], [], 0)[0]:
            self._from_session(select.POLLIN)
        try:
            conn.setblocking(True)
            if self.session is not None or peer_creds(conn)[1] not in (0, os.geteuid()):
                with contextlib.suppress(OSError):
                    conn.send(BUSY)
                conn.close()
                return
        except OSError:
            conn.close()
            return
        self._hand_back(conn)

    def _start_successor(self, successor: tuple[str, str]) -> None:
        """The supervisor is gone and its listeners still have processes: start a successor
        and hand them to it, as to a keeper's next agent. Their calls wait in the kernel
        meanwhile (no POLLIN is asked for), rather than be answered with the host's
        numbers. Within the budget only; after it, the kernel answers."""
        self._children = [p for p in self._children if p.poll() is None]
        self._drop_dead()
        now = time.monotonic()
        self._started = [t for t in self._started if now - t < SUCCESSOR_WINDOW]
        if not self.listeners or len(self._started) >= SUCCESSOR_STARTS:
            return
        self._started.append(now)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._children.append(subprocess.Popen(
                helper_argv(SECCOMP_SUCCESSOR, str(theirs.fileno()), *successor),
                pass_fds=[theirs.fileno()], start_new_session=True,
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL))
        except OSError:
            ours.close()
            return
        finally:
            theirs.close()
        self._hand_back(ours)

    def _drop_dead(self) -> None:
        for lfd in list(self.listeners):
            probe = select.poll()
            probe.register(lfd, 0)
            if any(ev & _DEAD for _fd, ev in probe.poll(0)):
                self._drop(lfd)

    def _hand_back(self, conn: socket.socket) -> None:
        """Every listener to ``conn``, which becomes the attached supervisor."""
        try:
            conn.setblocking(True)
            self._attach(conn)              # stops receiving before the first send
            deadline = time.monotonic() + HANDBACK_TIMEOUT
            for lfd, meta in list(self.listeners.items()):
                conn.settimeout(max(deadline - time.monotonic(), 0.001))
                socket.send_fds(conn, [listener_message(meta)], [lfd])
            conn.sendall(END + str(os.getpid()).encode())   # SO_PEERCRED names the binder
            conn.settimeout(None)
        except OSError:                     # the agent died or stalled mid hand-back
            if self.session is conn:
                self._detach()
            else:
                conn.close()

    def _continue(self, fd: int) -> None:
        try:
            note = receive(fd)
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.EINTR):
                self._drop(fd)
            return
        with contextlib.suppress(OSError):    # the caller gone meanwhile, and the like
            respond(fd, note.id, cont=True)

    def _drop(self, fd: int) -> None:
        with contextlib.suppress(KeyError):
            self.poller.unregister(fd)
        self.listeners.pop(fd, None)
        with contextlib.suppress(OSError):
            os.close(fd)


def _guard_in_fork(fd: int, successor: tuple[str, str] | None
                   ) -> None:  # pragma: no cover - in the guard
    """ListenerGuard.forked's child: cut off from its parent as an exec'd guard is (and
    its signals ignored, as _boot.py does); its inherited objects are already frozen out
    of the garbage collector (forked.fork), whose passes would otherwise copy every page
    it shares with the parent. Never returns."""
    try:
        forked.cut_off((fd,), devnull_stdio=True)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
            signal.signal(sig, signal.SIG_IGN)
        gc.enable()   # off while run starts (cli/main.py); the guard lives on
        forked.name_process(GUARD_NAME)
        guard_main(fd, successor=successor)
    finally:
        os._exit(0)


def _more_fds() -> None:  # pragma: no cover - in the guard
    """One descriptor per container: a node's hundreds must not hit a 1024 soft limit."""
    with contextlib.suppress(ValueError, OSError):
        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def guard_main(fd: int | None, keeper_fd: int | None = None, stay: bool = False,
               successor: tuple[str, str] | None = None
               ) -> None:  # pragma: no cover - in the guard
    """The guard's loop (_boot.py --seccomp-guard, --seccomp-keeper): until no supervisor
    is attached and every listener handed over has hung up (forever with ``stay``)."""
    _more_fds()
    session = socket.socket(fileno=fd) if fd is not None else None
    keeper = socket.socket(fileno=keeper_fd) if keeper_fd is not None else None
    _Guard(session, keeper, stay, successor).run()
