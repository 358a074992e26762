"""The seccomp agent's parts that need no container: the state message runc sends, the
listening socket's safety rules, and hand-offs that are not what runc sends."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import stat
import threading

import pytest

from guestfs.commands.seccomp_agent import (
    MAX_DEPTH,
    MAX_STATE,
    Agent,
    AgentError,
    StateError,
    listen_at,
    parse_state,
    receive_handoff,
)
from guestfs.system.seccomp_filter import ARCHES, Interception, install_listener, this_arch
from tests.support.fusemount import wait_for

# What runc 1.1 sends (libcontainer/process_linux.go, sendContainerProcessState).
RUNC_STATE = {"ociVersion": "1.0.2-dev", "fds": ["seccompFd"], "pid": 4242,
              "metadata": "x=1",
              "state": {"ociVersion": "1.0.2-dev", "id": "web-1", "status": "creating",
                        "pid": 4242, "bundle": "/run/b",
                        "annotations": {"io.kubernetes.pod.name": "web"}}}


def state_bytes(**changes: object) -> bytes:
    doc = dict(RUNC_STATE)
    doc.update(changes)
    return json.dumps(doc).encode()


def test_runc_state_parses():
    st = parse_state(state_bytes())
    assert (st.pid, st.container_id, st.fd_index) == (4242, "web-1", 0)
    # Brackets and quotes inside strings are not nesting; one level under the limit is.
    tricky = state_bytes(metadata='[[[{"\\"}]]', annotations={"k": "}}]]"},
                         nested=json.loads("[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1)))
    assert parse_state(b"  \n" + tricky + b"\n").pid == 4242


def test_state_pid_falls_back_to_the_containers_and_the_fd_is_found_by_name():
    doc = dict(RUNC_STATE, fds=["other", "seccompFd"])
    del doc["pid"]
    st = parse_state(json.dumps(doc).encode())
    assert (st.pid, st.fd_index) == (4242, 1)
    assert parse_state(state_bytes(state="nonsense")).container_id == "pid 4242"


@pytest.mark.parametrize("data", [
    b"", b"\xff\xfe", b"garbage{", b"[]", b"null", b'"seccompFd"',
    state_bytes(fds=[]), state_bytes(fds="seccompFd"), state_bytes(fds=None),
    state_bytes(pid=0, state={}), state_bytes(pid=-1), state_bytes(pid=True),
    state_bytes(pid="4242"), state_bytes(pid=1.5),
    # Nesting json.loads would recurse into (RecursionError, not a refusal) ...
    b"[" * 100_000, b'{"a": ' + b"[" * 100_000, b'{"a": ' + b"{\"b\": " * 100_000,
    # ... and the deepest a state may not be, beside one level more than runc's.
    state_bytes(metadata=json.loads("[" * MAX_DEPTH + "]" * MAX_DEPTH)),
    # Unfinished, or followed by more.
    state_bytes()[:-1], state_bytes() + b"{}", state_bytes() + b"x",
])
def test_bad_states_are_refused(data):
    with pytest.raises(StateError):
        parse_state(data)


def test_a_split_state_is_read_whole_and_ends_at_its_json_object():
    """runc keeps its end open after sending; a stream may deliver the state in parts."""
    a, b = socket.socketpair()
    r, w = os.pipe()
    data = state_bytes()
    try:
        socket.send_fds(a, [data[:10]], [r])
        t = threading.Timer(0.1, a.sendall, [data[10:]])
        t.start()
        fds: list[int] = []
        got = receive_handoff(b, fds)
        t.join()
        assert got == data and len(fds) == 1
        assert os.fstat(fds[0]).st_ino == os.fstat(r).st_ino
        os.close(fds[0])
    finally:
        for fd in (r, w):
            os.close(fd)
        a.close()
        b.close()


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("payload,with_fd", [
    (b"garbage{{", False), (b"", False), (state_bytes(), False), (state_bytes(), True),
    (b"garbage{{", True),
])
def test_hand_offs_without_a_listener_are_closed_and_nothing_is_served(payload, with_fd):
    agent = Agent(ARCHES["x86_64"], "/nonexistent", True, "view", guard=None)
    before = open_fds()
    a, b = socket.socketpair()
    r, w = os.pipe()
    if with_fd:
        socket.send_fds(a, [payload or b" "], [r])
    elif payload:
        a.sendall(payload)
    a.close()
    agent.handle_connection(b)        # never raises
    os.close(r)
    os.close(w)
    assert agent._incoming.empty()
    assert open_fds() == before       # the received pipe end was closed, and b too


def test_socket_directory_is_private_and_a_stale_socket_is_replaced(tmp_path):
    path = tmp_path / "agent" / "agent.sock"
    sock = listen_at(str(path))
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) & 0o077 == 0
    with pytest.raises(AgentError, match="another seccomp agent"):
        listen_at(str(path))
    sock.close()                      # the agent died: its socket file stays
    listen_at(str(path)).close()


def test_a_symlink_or_a_file_at_the_socket_path_is_refused(tmp_path):
    (tmp_path / "d").mkdir(mode=0o700)
    target = tmp_path / "victim"
    target.write_text("keep")
    (tmp_path / "d" / "agent.sock").symlink_to(target)
    with pytest.raises(AgentError, match="not a socket"):
        listen_at(str(tmp_path / "d" / "agent.sock"))
    assert target.read_text() == "keep"
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "agent.sock").write_text("x")
    with pytest.raises(AgentError, match="not a socket"):
        listen_at(str(tmp_path / "e" / "agent.sock"))


def test_a_symlinked_socket_directory_is_refused(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(AgentError, match="not a directory"):
        listen_at(str(tmp_path / "link" / "agent.sock"))


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
    kept = agent._incoming.get_nowait()
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
