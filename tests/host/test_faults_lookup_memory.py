"""A tenant's failed lookups cost the daemon nothing that lasts: any uid can stat names that
do not exist under an allow_other mount (and the app can under `guestfs run`), so each
must leave no memory behind. One shared exception object re-raised for every ENOENT grew
its traceback by ~2 KB per lookup: 10^5 stats took the daemon from 19 to 292 MB."""

from __future__ import annotations

import os

import pytest

from tests.support.fusemount import mounted, private_mountpoint

pytestmark = pytest.mark.real
LOOKUPS = 100_000


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def stat_missing(base: str, start: int, count: int) -> None:
    for i in range(start, start + count):
        try:
            os.stat(f"{base}/no-such-{i}")
        except FileNotFoundError:
            continue
        raise AssertionError(f"{base}/no-such-{i} exists")


@pytest.mark.parametrize("args", [[], ["--per-container"]], ids=["per-caller", "per-container"])
def test_failed_lookups_leave_no_memory_behind(args):
    with private_mountpoint() as mp, mounted(str(mp), *args) as daemon:
        base = f"{mp}/proc" if not args else str(mp)
        stat_missing(base, 0, 5_000)          # warm: caches, thread stacks, arenas
        before = rss_kb(daemon.pid)
        stat_missing(base, 5_000, LOOKUPS)
        grown = rss_kb(daemon.pid) - before
        assert grown <= 5 * 1024, f"{LOOKUPS} failed lookups grew the daemon by {grown} kB"
