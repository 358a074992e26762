"""Waiting and unmounting by the mount table, shared by the tests (tests/support/fusemount.py)
and the benchmarks: no pytest, so a benchmark imports it as it is."""

from __future__ import annotations

import contextlib
import time

from guestfs.daemon.mountpoint import mount_entry
from guestfs.system import sysmount


def wait_for(pred, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return False


def force_unmount(mp: str) -> None:
    # From the mount table: a stat or listing of a mount whose daemon is stopped would
    # block the caller for good.
    for _ in range(3):
        if mount_entry(mp) is None:
            return
        with contextlib.suppress(OSError):
            sysmount.umount(mp, detach=True)
