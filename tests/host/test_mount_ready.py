"""`guestfs mount --ready-fd FD`, what `guestfs run` waits on for its daemon: one byte once
the mount serves, and end of file without it from a daemon that exits before (a second
mount on a served mountpoint)."""

from __future__ import annotations

import os
import select
import subprocess

import pytest

from guestfs.daemon.mountpoint import is_guestfs_mount
from guestfs.system.selfexec import guestfs_argv
from guestfs.wrap.run import RunError, start_daemon, stop_process
from tests.support.fusemount import private_mountpoint, require_fuse

pytestmark = pytest.mark.real


def spawn(mp: str) -> tuple[subprocess.Popen[bytes], int]:
    r, w = os.pipe()
    try:
        proc = subprocess.Popen(guestfs_argv(["mount", mp, "--view", "self", "--quiet",
                                              "--ready-fd", str(w)]),
                                pass_fds=(w,), cwd="/", stderr=subprocess.PIPE)
    finally:
        os.close(w)
    return proc, r


def read_all(r: int, timeout: float = 30.0) -> bytes:
    out = b""
    while select.select([r], [], [], timeout)[0]:
        chunk = os.read(r, 16)
        if not chunk:
            return out
        out += chunk
    raise AssertionError(f"no end of file in {timeout}s (read {out!r})")


def test_ready_byte_once_serving_and_eof_from_a_refused_mount() -> None:
    require_fuse()
    with private_mountpoint() as mnt:
        mp = str(mnt)
        os.makedirs(mp)
        first, r1 = spawn(mp)
        try:
            # The byte, then the descriptor closed: nothing else holds the pipe's end
            # (not the unmount watcher, nor a probe), though the daemon goes on serving.
            assert read_all(r1) == b"r"
            assert first.poll() is None
            assert is_guestfs_mount(mp)
            with open(mp + "/proc/meminfo", "rb") as f:
                assert f.read().startswith(b"MemTotal:")
            second, r2 = spawn(mp)
            try:
                assert read_all(r2) == b""   # refused: one mount per mountpoint
                assert second.wait(30) != 0
            finally:
                os.close(r2)
                stop_process(second)
        finally:
            os.close(r1)
            stop_process(first)


def test_start_daemon_gives_up_on_a_daemon_that_exits_before_serving() -> None:
    """Told by end of file, at once: no waiting out the timeout."""
    require_fuse()
    with private_mountpoint() as mnt:
        mp = str(mnt)
        os.makedirs(mp)
        first = start_daemon(mp, ["--view", "self", "--quiet"])
        try:
            with pytest.raises(RunError, match="did not come up"):
                start_daemon(mp, ["--view", "self", "--quiet"], timeout=600)
        finally:
            stop_process(first)
