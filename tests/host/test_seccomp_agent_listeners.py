"""The seccomp agent with real listeners of forked children (root: installing a filter
without NoNewPrivs needs CAP_SYS_ADMIN); its parsing and socket rules without a listener:
tests/unit/test_seccomp_agent.py."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import threading

import pytest

from guestfs.inject.seccomp_agent import (
    MAX_STATE,
    Agent,
)
from guestfs.syscalls.filter import Interception, install_listener, this_arch
from tests.support.fusemount import wait_for
from tests.support.procs import open_fds

pytestmark = pytest.mark.real


def real_listener() -> int:
    """A seccomp listener installed by a forked child that then exits."""
    a, b = socket.socketpair()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            socket.send_fds(b, [b"L"], [install_listener(Interception())])
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    _msg, fds, _flags, _addr = socket.recv_fds(a, 16, 1)
    a.close()
    b.close()
    return fds[0]


def test_a_listener_with_a_bad_state_is_kept_and_its_calls_go_to_the_kernel():
    """Closing it would fail its processes' calls with ENOSYS."""
    if os.geteuid() != 0 or this_arch() is None:
        pytest.skip("installing a filter without NoNewPrivs needs CAP_SYS_ADMIN")
    agent = Agent(this_arch(), "/nonexistent", True, "view", guard=None)
    listener = real_listener()
    a, b = socket.socketpair()
    socket.send_fds(a, [b"garbage{"], [listener])
    os.close(listener)
    a.close()
    agent.handle_connection(b)
    kept = agent.loop._incoming.get_nowait()
    assert kept.handlers == {} and "unknown" in kept.name
    os.close(kept.listener)


def sysinfo_child(payload: bytes) -> tuple[int, socket.socket, int]:
    """A forked child that installs a notifying filter, hands its listener over the
    returned socket with ``payload`` (sent in full by a thread of the child while its main
    thread goes on), then calls sysinfo(2) and writes its result (0, or -errno) to the
    returned pipe. Returns (pid, our end of the socket, the pipe's read end)."""
    ours, theirs = socket.socketpair()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            import ctypes

            ours.close()
            listener = install_listener(Interception(sysinfo=True))
            socket.send_fds(theirs, [payload[:1]], [listener])
            os.close(listener)
            threading.Thread(target=lambda: _send_rest(theirs, payload[1:]),
                             daemon=True).start()
            libc = ctypes.CDLL(None, use_errno=True)
            rc = libc.sysinfo(ctypes.create_string_buffer(112))
            os.write(w, str(rc if rc == 0 else -ctypes.get_errno()).encode())
        finally:
            os._exit(0)
    theirs.close()
    os.close(w)
    return pid, ours, r


def _send_rest(sock: socket.socket, rest: bytes) -> None:  # pragma: no cover - child
    # OSError: the agent stopped reading (MAX_STATE) and closed its end.
    with contextlib.suppress(OSError):
        sock.sendall(rest)


@pytest.mark.parametrize("payload", [
    b"[" * 100_000,                                   # what made json recurse
    b'{"fds": ["seccompFd"], "pid": 1, "x": ' + b"[" * 100_000,
    b'{"fds": ["seccompFd"], "x": "' + b"x" * (MAX_STATE + (1 << 16)) + b'"}',  # oversized
    b"\x00garbage",
], ids=["deep", "deep-in-object", "oversized", "garbage"])
def test_a_listener_with_a_bad_state_keeps_its_calls_answered_and_no_fd_leaks(payload):
    """The container's sysinfo(2) still returns (passed to the kernel, 0), and once its
    process is gone the agent holds no descriptor more than before the hand-off."""
    if os.geteuid() != 0 or this_arch() is None:
        pytest.skip("installing a filter without NoNewPrivs needs CAP_SYS_ADMIN")
    agent = Agent(this_arch(), "/nonexistent", True, "view", guard=None).start()
    before = open_fds()
    pid, conn, result = sysinfo_child(payload)
    try:
        agent.handle_connection(conn)         # never raises; closes conn
        # A generous bound that only a blocked call reaches (no claim on speed).
        assert select.select([result], [], [], 60)[0], "the container's sysinfo blocked"
        assert os.read(result, 16) == b"0"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(result)
    # The child is gone: its listener polls POLLHUP and the serving thread closes it.
    assert wait_for(lambda: open_fds() == before, 10), (before, open_fds())
