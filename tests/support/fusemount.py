"""A real guestfs mount for tests: started as a subprocess, always unmounted."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from guestfs.daemon.mountpoint import is_guestfs_mount
from guestfs.fuse.holder import NAME as HOLDER_NAME
from guestfs.wrap.daemon_process import DAEMON_NAME
from guestfs.wrap.run import stop_process
from tests.support.mounts import force_unmount, wait_for


def require_fuse() -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting FUSE here needs root")
    if not os.path.exists("/dev/fuse"):
        pytest.skip("this kernel has no /dev/fuse")
    if shutil.which("fusermount3") is None and shutil.which("fusermount") is None:
        pytest.fail("fuse3/libfuse2 missing: .ci/setup installs them")


def is_guestfs_daemon(argv: list[str], name: str) -> bool:
    """A serving daemon, by its command line and name (psutil's cmdline() and name()): an
    executed `guestfs mount`, or the first daemon of a `guestfs run`, forked from it and
    named guestfs-mount (its command line is run's). Not a FUSE holder, whose command line
    holds its successors' `mount`."""
    if name == HOLDER_NAME.decode() or any(a.startswith("--fuse-holder") for a in argv):
        return False
    return name == DAEMON_NAME.decode() or "mount" in argv


@contextlib.contextmanager
def private_mountpoint() -> Iterator[Path]:
    """A mount point of our own under /tmp (mktemp): pytest's shared tmp_path may be renamed
    under us by other test sessions cleaning up, and a mount there could not be found.
    Whatever is mounted there is detached at the end."""
    d = Path(tempfile.mkdtemp(prefix="guestfs-run-test-"))
    try:
        yield d / "mnt"
    finally:
        force_unmount(str(d / "mnt"))
        shutil.rmtree(d, ignore_errors=True)


@contextlib.contextmanager
def mounted(mp: str, *args: str, log: str | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """``guestfs mount mp args`` until the block ends; SIGTERM, then forced cleanup."""
    require_fuse()
    with contextlib.suppress(FileExistsError):  # a stale mount point is not a dir to stat
        os.makedirs(mp)
    with contextlib.ExitStack() as stack:
        err = stack.enter_context(open(log, "wb")) if log else subprocess.DEVNULL
        proc = subprocess.Popen([sys.executable, "-m", "guestfs", "mount", mp, *args],
                                stderr=err)
        try:
            if not wait_for(lambda: is_guestfs_mount(mp) or proc.poll() is not None):
                raise AssertionError(f"guestfs mount {mp} did not come up")
            assert proc.poll() is None, f"guestfs mount exited with {proc.returncode}"
            yield proc
        finally:
            stop_process(proc)
            force_unmount(mp)
