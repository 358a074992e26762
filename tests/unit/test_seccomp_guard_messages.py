"""The seccomp guard's message format and the metadata it keeps with a listener; no guard
process (a real one: tests/host/test_seccomp_guard.py)."""

from __future__ import annotations

import contextlib
import json
import os
import socket

import pytest

from guestfs.system.seccomp_guard import MAX_META, listener_message, parse_message
from guestfs.system.seccomp_keeper import describe, described


def is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def test_a_listener_message_carries_its_metadata_and_only_its_first_fd_is_kept():
    fds = list(os.pipe()) + list(os.pipe())
    try:
        assert parse_message(listener_message(b'{"k": 1}'), fds[:3]) == (fds[0], b'{"k": 1}')
        assert is_open(fds[0]) and not is_open(fds[1]) and not is_open(fds[2])
        assert listener_message(b"x" * (MAX_META + 10)) == b"L" + b"x" * MAX_META
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


@pytest.mark.parametrize("msg,nfds,flags", [
    (b"", 0, 0), (b"L", 0, 0), (b"X", 1, 0), (b"E", 2, 0), (b"B", 1, 0), (b"\xff" * 50, 3, 0),
])
def test_anything_but_a_listener_message_is_refused_and_its_fds_closed(msg, nfds, flags):
    fds = [os.open("/dev/null", os.O_RDONLY) for _ in range(nfds)]
    assert parse_message(msg, fds, flags) is None
    assert not any(is_open(fd) for fd in fds)


def test_truncated_metadata_is_dropped_but_the_listener_kept():
    fd = os.open("/dev/null", os.O_RDONLY)
    assert parse_message(b"L" + b"x" * MAX_META, [fd], socket.MSG_TRUNC) == (fd, b"")
    os.close(fd)


def test_metadata_round_trips_and_a_bad_key_never_leaves_the_source():
    assert described(describe("container web (pid 4)", "abc")) == \
        ("container web (pid 4), kept by the guard", "abc")
    for bad in (b"", b"\xff", b"garbage{", b"[]", b"null",
                json.dumps({"name": 5, "key": "../etc"}).encode(),
                json.dumps({"key": "a/b"}).encode(), json.dumps({"key": ".."}).encode(),
                json.dumps({"key": "a\0"}).encode(), json.dumps({"key": 7}).encode()):
        name, key = described(bad)
        assert key is None and name.endswith("kept by the guard"), bad
