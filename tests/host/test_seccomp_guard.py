"""The seccomp guard as the keeper of listeners across agent lives (its message format:
tests/unit/test_seccomp_guard_messages.py): malformed input (which never kills it nor leaks
a descriptor in it), the hand-back to the next agent, one agent at a time, and an agent
dying mid hand-back. A real guard process with a real listener of a forked child; no
container."""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import socket
import tempfile
from collections.abc import Iterator

import pytest

from guestfs.syscalls.guard import (
    BUSY,
    END,
    MAX_META,
    ListenerGuard,
)
from guestfs.syscalls.keeper import (
    GUARD_SOCKET,
    SocketError,
    attach,
    bind_keeper,
    describe,
    described,
    start_lock,
)
from guestfs.syscalls.notify import receive, respond
from tests.support.fusemount import wait_for
from tests.support.procs import alive

pytestmark = pytest.mark.real

# ------------------------------------------------------------------ a real guard process

def live_listener_child(go: int, out: int, sock: socket.socket) -> None:  # pragma: no cover
    """Install a notifying filter, send its listener, then sysconf once per byte on go."""
    from guestfs.syscalls.filter import Interception, install_listener

    try:
        socket.send_fds(sock, [b"L"], [install_listener(Interception())])
        while os.read(go, 1):
            os.write(out, f"{os.sysconf('SC_PHYS_PAGES')}\n".encode())
    finally:
        os._exit(0)


@contextlib.contextmanager
def guard_with_a_live_listener() -> Iterator[tuple[str, ListenerGuard, int, int, int]]:
    """A keeper guard in a 0700 directory, attached, holding the listener of a child
    blocked on a pipe: (dir, guard, listener, go fd, out fd)."""
    if os.geteuid() != 0:
        pytest.skip("installing a filter without NoNewPrivs needs CAP_SYS_ADMIN")
    d = tempfile.mkdtemp(prefix="guestfs-guard-test-")
    os.chmod(d, 0o700)
    go_r, go_w = os.pipe()
    out_r, out_w = os.pipe()
    a, b = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # pragma: no cover
        os.close(go_w)             # or the child never sees the end of go
        os.close(out_r)
        live_listener_child(go_r, out_w, b)
    os.close(go_r)
    os.close(out_w)
    b.close()
    guard = None
    try:
        _msg, (listener,), _f, _a = socket.recv_fds(a, 16, 1)
        with start_lock(d):
            keeper = bind_keeper(d)
            guard = ListenerGuard(keeper)
            keeper.close()
        assert guard.add(listener, describe("child", "k1"))
        yield d, guard, listener, go_w, out_r
    finally:
        if guard is not None:
            guard.close()              # the guard continues: no call of the child waits
        os.close(go_w)                 # the child exits; its listener hangs up
        # A failed test may leave a session attached that never answers the child's call.
        if not wait_for(lambda: os.waitpid(pid, os.WNOHANG)[0] != 0, 5):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(out_r)
        a.close()
        shutil.rmtree(d, ignore_errors=True)
        if guard is not None and not wait_for(lambda: not alive(guard.pid), 5):
            os.kill(guard.pid, signal.SIGKILL)
            pytest.fail("the guard outlived its agent and listeners")


def child_pages(go: int, out: int) -> int:
    os.write(go, b"x")
    return int(os.read(out, 64))


def connect(d: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.connect(os.path.join(d, GUARD_SOCKET))
    s.settimeout(10)
    return s


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_malformed_messages_leave_the_guard_alive_and_holding_no_stray_fd():
    host = os.sysconf("SC_PHYS_PAGES")
    with guard_with_a_live_listener() as (d, guard, _listener, go, out):
        base = fd_count(guard.pid)
        r, w = os.pipe()
        sock = guard._sock
        sock.send(b"garbage without an fd")
        sock.send(b"L")                                   # a listener message, no fd
        socket.send_fds(sock, [b"X"], [r, w])             # an unknown kind, two fds
        socket.send_fds(sock, [b"L" + b"m" * (MAX_META * 4)], [r])   # truncated, a pipe
        os.close(w)          # the "listener" that is a pipe hangs up: dropped
        os.close(r)
        assert wait_for(lambda: fd_count(guard.pid) == base, 5), (base, fd_count(guard.pid))
        with connect(d) as other:     # an agent is attached: a second one is refused
            assert other.recv(16) == BUSY
        guard.close()                 # the agent is gone: the guard continues
        assert child_pages(go, out) == host
        assert alive(guard.pid)


def test_the_next_agent_gets_every_listener_back_and_the_guard_stops_receiving():
    """After the hand-back only the new agent receives: the child's call waits for us."""
    with guard_with_a_live_listener() as (d, guard, listener, go, out):
        os.close(listener)           # the test's copy: only the guard's remains
        guard.close()
        with start_lock(d):
            kept: list[tuple[int, bytes]] = []
            second = attach(d, False, kept)
        assert second is not None
        assert second.pid == guard.pid
        ((fd, meta),) = kept
        assert described(meta) == ("child, kept by the guard", "k1")
        with start_lock(d), pytest.raises(SocketError, match="another seccomp agent"):
            attach(d, False, [])
        os.write(go, b"x")
        assert select.select([fd], [], [], 10)[0], "the call never reached the new agent"
        note = receive(fd)           # ours, not the guard's: it has stopped receiving
        respond(fd, note.id, cont=True)
        assert int(os.read(out, 64)) == os.sysconf("SC_PHYS_PAGES")
        second.close()
        os.close(fd)
        assert child_pages(go, out) == os.sysconf("SC_PHYS_PAGES")   # the guard again


@pytest.mark.parametrize("how", ["close at once", "read the first message, then close"])
def test_an_agent_dying_mid_hand_back_leaves_the_guard_continuing(how):
    with guard_with_a_live_listener() as (d, guard, listener, go, out):
        os.close(listener)
        guard.close()
        s = connect(d)
        if how != "close at once":
            _msg, fds, _f, _a = socket.recv_fds(s, MAX_META + 1, 4)
            for fd in fds:
                os.close(fd)
        s.close()
        assert child_pages(go, out) == os.sysconf("SC_PHYS_PAGES")
        with start_lock(d):
            kept: list[tuple[int, bytes]] = []
            again = attach(d, False, kept)      # and it still hands them back
        assert again is not None
        assert len(kept) == 1 and again.pid == guard.pid and \
            kept[0][1] == describe("child", "k1")
        again.close()
        os.close(kept[0][0])
        s2 = connect(d)
        assert s2.recv(MAX_META + 1).startswith(b"L")
        assert s2.recv(16) == END + str(guard.pid).encode()
        s2.close()
