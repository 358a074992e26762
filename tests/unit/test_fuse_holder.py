"""The FUSE holder's messages and decisions, without FUSE: a pipe stands in for the
/dev/fuse descriptor (its write end closed is the connection's end), and the successors
it starts are small scripts that ask for the connection as a daemon does."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from guestfs.cli.mount import respawn_argv
from guestfs.fuse import holdwire
from guestfs.system import kernel
from guestfs.system.selfexec import FUSE_HOLDER, helper_argv
from tests.support.mounts import wait_for

# A successor: asks, and on a grant writes its pid and the descriptors' kinds to OUT,
# says it serves, then waits for its lease to end (a yield) or for ever.
SUCCESSOR = r"""
import os, socket, sys, time
sys.path.insert(0, sys.argv[3])
from guestfs.fuse import holdwire
from guestfs.system import kernel
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect(sys.argv[1])
holdwire.send(s, b"serve", str(os.getpid()).encode())
verb, payload, fds = holdwire.recv(s)
kept = []
while verb == b"kept":        # the triggers kept, before the grant: each written to
    os.write(fds[0], b"k")
    os.close(fds[0])
    kept.append(payload.replace(b"\n", b":").decode())
    verb, payload, fds = holdwire.recv(s)
if kept:
    with open(sys.argv[2], "a") as f:
        f.write(f"{os.getpid()} kept {','.join(kept)}\n")
with open(sys.argv[2], "a") as f:
    f.write(f"{os.getpid()} {verb.decode()} {len(fds)} {payload.decode()}\n")
if verb == b"granted":
    if sys.argv[4] == "die":
        os._exit(3)
    holdwire.send(s, b"negotiated", payload)
    msg = holdwire.recv(s)
    with open(sys.argv[2], "a") as f:
        f.write(f"{os.getpid()} {msg[0].decode() if msg else 'eof'}\n")
"""
ROOT = str(Path(__file__).resolve().parents[2])


class Fake:
    def __init__(self, tmp: Path, mode: str = "serve") -> None:
        self.sock_path = str(tmp / "h.holder")
        self.out = tmp / "out.txt"
        self.out.touch()
        self.fuse_r, self.fuse_w = os.pipe()
        self.lock_fd = os.open(tmp / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        script = tmp / "successor.py"
        script.write_text(SUCCESSOR)
        respawn = [sys.executable, str(script), self.sock_path, str(self.out), ROOT, mode]
        argv = helper_argv(FUSE_HOLDER, str(theirs.fileno()), str(self.fuse_r),
                           str(self.lock_fd), str(tmp / "mnt"), self.sock_path, "--",
                           *respawn)
        self.log = tmp / "holder.log"
        self._asked: socket.socket | None = None
        with open(self.log, "wb") as err:
            self.proc = subprocess.Popen(argv, pass_fds=(theirs.fileno(), self.fuse_r,
                                                         self.lock_fd), stderr=err)
        theirs.close()
        self.lease = ours
        ours.settimeout(10)
        msg = holdwire.recv(ours)
        assert msg is not None and msg[0] == b"ready"

    def lines(self) -> list[str]:
        return self.out.read_text().splitlines()

    def ask(self) -> tuple[bytes, bytes, list[int]] | None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        s.settimeout(10)
        s.connect(self.sock_path)
        holdwire.send(s, b"serve", b"1")
        self._asked = s
        return holdwire.recv(s)

    def close(self) -> None:
        """The connection's end, and every daemon gone: the holder must then exit."""
        with contextlib.suppress(OSError):
            os.close(self.fuse_w)
        self.lease.close()
        if self._asked is not None:
            self._asked.close()
        for line in self.lines():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(line.split()[0]), 9)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("the holder outlived its connection")


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[Fake]:
    f = Fake(tmp_path)
    try:
        yield f
    finally:
        f.close()


def test_messages_round_trip_with_descriptors() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    r, w = os.pipe()
    holdwire.send(a, b"granted", b'{"major": 7}', (r, w))
    verb, payload, fds = holdwire.recv(b)  # type: ignore[misc]
    assert (verb, payload, len(fds)) == (b"granted", b'{"major": 7}', 2)
    assert all(not os.get_inheritable(fd) for fd in fds)
    os.write(fds[1], b"x")
    assert os.read(r, 1) == b"x"
    for fd in (r, w, *fds):
        os.close(fd)
    a.close()
    assert holdwire.recv(b) is None


def test_a_foreign_message_is_refused_and_its_descriptors_closed() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    r, w = os.pipe()
    socket.send_fds(a, [b"rm -rf\nx"], [r])
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(holdwire.BadMessage):
        holdwire.recv(b)
    assert len(os.listdir("/proc/self/fd")) == before
    a.send(b"x" * (holdwire.MAX_MESSAGE + 10))
    with pytest.raises(holdwire.BadMessage):
        holdwire.recv(b)
    with pytest.raises(holdwire.BadMessage):
        holdwire.send(a, b"exec", b"")


def test_the_successor_command_line_drops_what_only_the_first_start_means() -> None:
    argv = respawn_argv(["mount", "/m", "--daemon", "--ready-fd", "7", "--hold",
                         "--ready-fd=9", "--pid-file", "/p"])
    assert argv[1:3] == ["-I", argv[2]] and argv[2].endswith("_boot.py")
    assert argv[3:] == ["mount", "/m", "--hold", "--pid-file", "/p"]


@pytest.mark.parametrize("release,resends", [("6.9.0", True), ("6.18.44-fc-v1045", True),
                                             ("6.8.12-1-amd64", False), ("5.15.0", False),
                                             ("4.4.0", False), ("7.0", True), ("x", False)])
def test_resend_needs_linux_6_9(release: str, resends: bool) -> None:
    assert kernel.kernel_resends(release) is resends


def test_a_dead_daemon_is_succeeded_by_the_holders_own(fake: Fake) -> None:
    holdwire.send(fake.lease, b"negotiated", b"PARAMS")
    fake.lease.close()                       # the daemon died
    assert wait_for(lambda: len(fake.lines()) >= 1)
    pid, verb, nfds, payload = fake.lines()[0].split()
    assert (verb, nfds, payload) == ("granted", "2", "PARAMS")
    assert b"started pid" in fake.log.read_bytes()


def test_a_daemon_that_asks_is_given_way_by_the_holders_own(fake: Fake) -> None:
    holdwire.send(fake.lease, b"negotiated", b"PARAMS")
    fake.lease.close()
    assert wait_for(lambda: len(fake.lines()) >= 1)
    msg = fake.ask()                          # a restarted DaemonSet container
    assert msg is not None and msg[0] == b"granted" and len(msg[2]) == 2
    for fd in msg[2]:
        os.close(fd)
    assert wait_for(lambda: len(fake.lines()) >= 2)
    assert fake.lines()[1].endswith("yield")


def test_a_daemon_that_asks_while_another_serves_is_refused(fake: Fake) -> None:
    holdwire.send(fake.lease, b"negotiated", b"PARAMS")
    msg = fake.ask()
    assert msg is not None and msg[0] == b"refused" and not msg[2]
    assert b"serves it" in msg[1]


def test_an_uninitialised_connection_is_never_handed_on(fake: Fake) -> None:
    msg = fake.ask()
    assert msg is not None and msg[0] == b"refused"
    fake.lease.close()                        # died before INIT was answered
    assert fake.proc.wait(10) == 1
    assert fake.lines() == []


def test_a_clean_stop_ends_the_holder_and_its_socket(fake: Fake) -> None:
    holdwire.send(fake.lease, b"negotiated", b"PARAMS")
    holdwire.send(fake.lease, b"stop")
    assert fake.proc.wait(10) == 0
    assert not os.path.exists(fake.sock_path)


def test_the_connections_end_ends_the_holder_while_no_daemon_serves(fake: Fake) -> None:
    holdwire.send(fake.lease, b"negotiated", b"PARAMS")
    os.close(fake.fuse_w)                     # POLLHUP, as POLLERR once unmounted
    with pytest.raises(subprocess.TimeoutExpired):
        fake.proc.wait(0.5)                   # not watched while a daemon serves
    fake.lease.close()
    assert fake.proc.wait(10) == 0
    assert fake.lines() == []                 # no successor for a connection gone


def test_a_crash_loop_ends_the_connection(tmp_path: Path) -> None:
    f = Fake(tmp_path, mode="die")
    try:
        holdwire.send(f.lease, b"negotiated", b"PARAMS")
        f.lease.close()
        assert f.proc.wait(30) == 1
    finally:
        f.close()
    # Every successor took the lease and died before saying it serves.
    assert b"young deaths in a row" in (tmp_path / "holder.log").read_bytes()


def _opts(binding: str = "auto"):  # type: ignore[no-untyped-def]
    from guestfs.daemon.mount import MountOptions
    from guestfs.engine.explicit import ExplicitLimits

    return MountOptions("/m", "caller", None, 0.5, ExplicitLimits(), "nearest",
                        binding=binding, hold=True)


def test_hold_on_a_kernel_without_resend_serves_without_a_holder(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from guestfs.daemon.mount import _check_hold

    monkeypatch.setattr(kernel, "kernel_resends", lambda release=None: False)
    assert _check_hold(_opts()).hold is False
    assert "--hold needs Linux 6.9 or later" in caplog.text
    monkeypatch.setattr(kernel, "kernel_resends", lambda release=None: True)
    assert _check_hold(_opts()).hold is True


def test_hold_with_a_libfuse_binding_is_one_line() -> None:
    from guestfs.daemon.mount import _check_hold
    from guestfs.daemon.mountpoint import MountError

    with pytest.raises(MountError, match="--hold needs guestfs's own FUSE engine"):
        _check_hold(_opts("mfusepy3"))


def test_triggers_kept_are_handed_to_the_successor_before_its_grant(fake: Fake) -> None:
    """keep (a descriptor, then a record update), drop, and the death: the successor is
    handed each trigger still kept, with the same open file, before the connection."""
    holdwire.send(fake.lease, b"negotiated", b"PARAMS")
    pipes = [os.pipe() for _ in range(3)]
    try:
        for fh, (_, w) in zip((7, 8, 9), pipes, strict=True):
            holdwire.send(fake.lease, b"keep", b"%d\nfirst" % fh, (w,))
        holdwire.send(fake.lease, b"keep", b"7\narmed")        # the state, updated
        holdwire.send(fake.lease, b"drop", b"8")
        holdwire.send(fake.lease, b"keep", b"10\nno descriptor")  # unknown: ignored
        holdwire.send(fake.lease, b"keep", b"x\nbad handle", (os.dup(pipes[2][1]),))
        fake.lease.close()                                     # the daemon died
        assert wait_for(lambda: len(fake.lines()) >= 2)
        pid, verb, kept = fake.lines()[0].split()
        assert verb == "kept" and sorted(kept.split(",")) == ["7:armed", "9:first"]
        assert fake.lines()[1].split()[1:3] == ["granted", "2"]
        for (r, _), fh in zip(pipes, (7, 8, 9), strict=True):
            os.set_blocking(r, False)
            try:
                got = os.read(r, 8)
            except BlockingIOError:
                got = b""
            assert got == (b"" if fh == 8 else b"k"), fh
    finally:
        for r, w in pipes:
            os.close(r)
            os.close(w)


def test_the_holder_bounds_what_it_keeps(fake: Fake) -> None:
    from guestfs.fuse import holder

    holdwire.send(fake.lease, b"negotiated", b"PARAMS")
    r, w = os.pipe()
    try:
        big = b"x" * (holder.MAX_RECORD + 1)
        holdwire.send(fake.lease, b"keep", b"1\n" + big, (w,))
        for fh in range(2, holder.MAX_KEPT + 10):
            holdwire.send(fake.lease, b"keep", b"%d\nr" % fh, (w,))
        # Every descriptor the holder would keep past its bound is closed: it holds
        # MAX_KEPT of the pipe's write end, and the record too large none.
        pid = fake.proc.pid
        assert wait_for(lambda: _pipe_fds(pid, w) == holder.MAX_KEPT, 10), _pipe_fds(pid, w)
    finally:
        os.close(r)
        os.close(w)


def _pipe_fds(pid: int, fd: int) -> int:
    target = os.readlink(f"/proc/self/fd/{fd}")
    n = 0
    for name in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            n += os.readlink(f"/proc/{pid}/fd/{name}") == target
    return n
