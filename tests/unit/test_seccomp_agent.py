"""The seccomp agent's parts that need no container: the state message runc sends, the
listening socket's safety rules, and hand-offs that are not what runc sends (real
listeners of forked children: tests/host/test_seccomp_agent_listeners.py)."""

from __future__ import annotations

import json
import os
import socket
import stat
import threading

import pytest

from guestfs.inject.seccomp_agent import (
    MAX_DEPTH,
    Agent,
    AgentError,
    StateError,
    listen_at,
    parse_state,
    receive_handoff,
)
from guestfs.syscalls.filter import ARCHES
from tests.support.procs import open_fds

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
    assert agent.loop._incoming.empty()
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
