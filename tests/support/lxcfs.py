"""LXCFS (Debian's lxcfs package) on a mountpoint of our own, for the side-by-side tests
(tests/support/lxcfsd.py) and benchmarks; no pytest."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator

from guestfs.wrap.run import stop_process
from tests.support.mounts import force_unmount, wait_for

MISSING = "lxcfs is missing: .ci/setup installs Debian's lxcfs"


class LxcfsError(RuntimeError):
    """LXCFS is not installed, did not come up or exited."""


@contextlib.contextmanager
def lxcfs_process(mp: str, pidfile: str, timeout: float = 30.0
                  ) -> Iterator[subprocess.Popen[bytes]]:
    """``lxcfs mp`` until the block ends, then stopped, unmounted and its pid file gone."""
    binary = shutil.which("lxcfs")
    if binary is None:
        raise LxcfsError(MISSING)
    os.makedirs(mp, exist_ok=True)
    # -l: loadavg, --enable-cfs: CPU view from the quota (what guestfs always does); cwd /
    # so that nothing is looked up in the caller's directory.
    proc = subprocess.Popen([binary, "-f", "-l", "--enable-cfs", "-p", pidfile, mp],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/")
    try:
        if not wait_for(lambda: os.path.exists(f"{mp}/proc/meminfo")
                        or proc.poll() is not None, timeout):
            raise LxcfsError("lxcfs did not come up")
        if proc.poll() is not None:
            raise LxcfsError(f"lxcfs exited with {proc.returncode}")
        yield proc
    finally:
        stop_process(proc)
        force_unmount(mp)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(pidfile)
