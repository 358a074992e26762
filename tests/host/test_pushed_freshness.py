"""Pushed freshness on a real mount (guestfs's FUSE engine): page-cached files are read
with no request reaching the daemon between changes, not even the GETATTR that polled
freshness costs every 10 ms, and a changed cgroup limit still shows within --cache-ttl.

The daemon's requests are counted from its status file (`callbacks`) and set against the
reads done; the one timed bound is the freshness promise itself (--cache-ttl + 0.1 s, as
tests/host/test_page_cache.py)."""

from __future__ import annotations

import os
import threading
import time

import pytest

from guestfs.daemon.server import YOUNG
from tests.host.test_page_cache import (
    MiB,
    layout_args,
    mem_total_kb,
    set_limit,
    status,
)
from tests.support.fusemount import mounted, private_mountpoint
from tests.support.realcg import v1_cgroup

pytestmark = pytest.mark.real
TTL = 0.5


def read_whole(path: str) -> bytes:
    """open + read to EOF + close with os calls (Python's open() asks isatty, an ioctl
    FUSE sends to the daemon on every open)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        out = b""
        while chunk := os.read(fd, 1 << 16):
            out += chunk
        return out
    finally:
        os.close(fd)


@pytest.mark.parametrize("layout", ["fixed", "per-container"])
def test_changes_are_pushed_and_reads_between_them_ask_the_daemon_nothing(layout):
    with v1_cgroup(512 * MiB, 100000, 100000) as cg, private_mountpoint() as mpp:
        mp = str(mpp)
        args, meminfo = layout_args(layout, cg, mp)
        with mounted(mp, *args, "--fuse-binding", "guestfs", "--cache-ttl", str(TTL)):
            st = status(mp)
            assert st["page_cache"] is True and "push" in st, st
            time.sleep(YOUNG)          # a young cgroup's renderings are due at once
            assert mem_total_kb(read_whole(meminfo)) == 512 * 1024
            held = os.open(meminfo, os.O_RDONLY)
            try:
                before = status(mp)
                reads = 0
                # Unchanged: thousands of reads by new openers and by a held handle
                # (pread at 0, as top does), spanning several --cache-ttl periods.
                until = time.monotonic() + 3 * TTL
                while time.monotonic() < until:
                    assert read_whole(meminfo)[:9] == b"MemTotal:"
                    assert os.pread(held, 1 << 16, 0)[:9] == b"MemTotal:"
                    reads += 2
                mid = status(mp)
                quiet = {k: mid["callbacks"][k] - before["callbacks"][k]
                         for k in mid["callbacks"]}
                # The status reads themselves (two per status(), rendered per read, so
                # polled): a GETATTR and a READ each, and a LOOKUP when its entry
                # expired. For meminfo only what its own usage changed, each change
                # one GETATTR and one READ after its invalidation.
                own = mid["push"]["invalidated"] - before["push"]["invalidated"]
                assert quiet["getattr"] <= 6 + 2 * own, (quiet, own, reads)
                assert quiet["read"] <= 4 + 2 * own, (quiet, own, reads)
                assert quiet["open"] == 0 and reads > 1000 * quiet["getattr"], (quiet, reads)

                changes = (256, 384, 512)
                for mib in changes:
                    set_limit(cg, mib * MiB)
                    waits: dict[str, float] = {}

                    def new_readers(want: int = mib * 1024,
                                    out: dict[str, float] = waits) -> None:
                        out["new"], out["new reads"] = reads_until(
                            lambda: mem_total_kb(read_whole(meminfo)), want)

                    t = threading.Thread(target=new_readers)
                    t.start()
                    waits["held"], waits["held reads"] = reads_until(
                        lambda: mem_total_kb(os.pread(held, 1 << 16, 0)), mib * 1024)
                    t.join()
                    assert waits["held"] <= TTL + 0.1 and waits["new"] <= TTL + 0.1, waits
                    reads += int(waits["held reads"] + waits["new reads"])
                after = status(mp)
            finally:
                os.close(held)
            delta = {k: after["callbacks"][k] - mid["callbacks"][k]
                     for k in after["callbacks"]}
            pushed = {k: after["push"][k] - mid["push"][k] for k in after["push"]}
            # Per change: one invalidation, then one GETATTR (meminfo's attributes were
            # dropped) and its READ refill; plus the status reads. Polled, the same reads
            # cost a GETATTR per 10 ms of reading (fusefs.REVALIDATE): dozens per change.
            assert pushed["invalidated"] >= len(changes), pushed
            assert delta["getattr"] <= 3 * len(changes) + 6, (delta, reads)
            assert reads > 100 * delta["getattr"], (delta, reads)


def reads_until(get, want: int, timeout: float = 5.0) -> tuple[float, int]:
    """(seconds from now until ``get()`` returns ``want``, reads it took), reading
    without pause."""
    start = time.monotonic()
    n = 0
    while time.monotonic() - start < timeout:
        n += 1
        if get() == want:
            return time.monotonic() - start, n
    raise AssertionError(f"still not {want} after {timeout}s ({n} reads)")


def test_an_idle_pushing_daemon_stops_rendering():
    """After the last read the daemon renders a watched file until the attributes it
    gave expire (fusefs.PUSHED_VALID), then never again while nobody reads."""
    from guestfs.daemon.fusefs import PUSHED_VALID

    with v1_cgroup(512 * MiB, 100000, 100000) as cg, private_mountpoint() as mpp:
        mp = str(mpp)
        args, meminfo = layout_args("fixed", cg, mp)
        with mounted(mp, *args, "--fuse-binding", "guestfs", "--cache-ttl", "0.2"):
            time.sleep(YOUNG)
            read_whole(meminfo)
            # A second past the attributes' expiry: the last grant may follow the read
            # (cat's close, the kernel's revalidation), and one refresh may be under way.
            time.sleep(PUSHED_VALID + 1.5)
            first = status(mp)["push"]["refreshed"]
            time.sleep(2.0)
            # The status reads are not pushed: the count stands still.
            assert status(mp)["push"]["refreshed"] == first
            assert first >= 1
