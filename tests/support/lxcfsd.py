"""LXCFS (Debian's lxcfs package) on a mountpoint of our own, for side-by-side tests."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from guestfs.commands.run import stop_process
from tests.support.fusemount import force_unmount, require_fuse, wait_for


@contextlib.contextmanager
def lxcfs_mounted(mp: str, pidfile: str) -> Iterator[subprocess.Popen[bytes]]:
    require_fuse()
    binary = shutil.which("lxcfs")
    if binary is None:
        pytest.fail("lxcfs is missing: .ci/setup installs Debian's lxcfs")
    os.makedirs(mp, exist_ok=True)
    # -l: loadavg, --enable-cfs: CPU view from the quota (what guestfs always does).
    proc = subprocess.Popen([binary, "-f", "-l", "--enable-cfs", "-p", pidfile, mp],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: os.path.exists(f"{mp}/proc/meminfo")
                        or proc.poll() is not None, 20), "lxcfs did not come up"
        assert proc.poll() is None, f"lxcfs exited with {proc.returncode}"
        yield proc
    finally:
        stop_process(proc)
        force_unmount(mp)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(pidfile)
