"""LXCFS on a mountpoint of our own in a test: skipped without FUSE, failed without lxcfs
(.ci/setup installs it); the process itself: tests/support/lxcfs.py."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from tests.support.fusemount import require_fuse
from tests.support.lxcfs import MISSING, lxcfs_process


@contextlib.contextmanager
def lxcfs_mounted(mp: str, pidfile: str) -> Iterator[subprocess.Popen[bytes]]:
    require_fuse()
    if shutil.which("lxcfs") is None:
        pytest.fail(MISSING)
    with lxcfs_process(mp, pidfile, timeout=20.0) as proc:
        yield proc
