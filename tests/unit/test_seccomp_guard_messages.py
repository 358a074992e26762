"""The seccomp guard's message format and the metadata it keeps with a listener; no guard
process (a real one: tests/host/test_seccomp_guard.py)."""

from __future__ import annotations

import contextlib
import json
import os
import socket

import pytest

from guestfs.syscalls.filter import Interception
from guestfs.syscalls.guard import MAX_META, listener_message, parse_message
from guestfs.syscalls.keeper import describe, described


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


@pytest.mark.parametrize("what, word", [
    (Interception(), "sysinfo,getaffinity,setaffinity"),
    (Interception(sysinfo=True, getaffinity=True, setaffinity=False), "sysinfo,getaffinity"),
    (Interception(sysinfo=False, getaffinity=False, setaffinity=False), "-"),
])
def test_the_calls_a_successor_answers_as_one_word(what, word):
    """What run's guard passes its successor on the command line (--then-answer)."""
    assert what.spelled() == word
    assert Interception.parse(word) == what


@pytest.mark.parametrize("word", ["sysinfo,open", "", "SYSINFO", "sysinfo;rm"])
def test_a_word_naming_other_calls_is_refused(word):
    with pytest.raises(ValueError):
        Interception.parse(word)


def test_the_guard_command_line_with_and_without_a_successor():
    boot = _boot_module()
    assert boot._guard_args(["5"]) == (["5"], None)
    assert boot._guard_args(["5", "7"]) == (["5", "7"], None)
    assert boot._guard_args(["5", "--then-answer", "/run/g", "sysinfo"]) == \
        (["5"], ("/run/g", "sysinfo"))
    with pytest.raises(SystemExit):
        boot._guard_args(["5", "--then-answer", "/run/g"])


def _boot_module():
    """guestfs/_boot.py as a module (it is a script: the package never imports it)."""
    import importlib.util

    from guestfs.system.selfexec import BOOT

    spec = importlib.util.spec_from_file_location("guestfs_boot_under_test", BOOT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
