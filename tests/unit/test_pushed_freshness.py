"""Pushed freshness without a kernel: the FUSE_NOTIFY_INVAL_INODE frame, the pusher's
schedule driven by a clock of the test's own, and the daemon's operations on guestfs's
engine telling a pipe (in place of /dev/fuse) which inode changed."""

from __future__ import annotations

import errno
import os
import time

import pytest

from guestfs.daemon.fusefs import DIRECTORY_VALID, PUSHED_VALID, REVALIDATE, make_operations
from guestfs.daemon.pusher import CHANGED, GONE, HELD, SAME, Pusher
from guestfs.daemon.server import ServerConfig, ViewServer
from guestfs.fuse import abi, adapter
from guestfs.fuse.inodes import path_id
from guestfs.sources.host_root import HostRoot
from tests.conftest import fixture_root
from tests.support.fuseframes import PipeSession, TinyFs, frame, init_frame, replies

# ------------------------------------------------------------------ the frame


def test_the_inval_inode_frame_is_the_kernels_bytes():
    """struct fuse_out_header {u32 len; s32 error; u64 unique} with the notify code in
    error and unique 0, then struct fuse_notify_inval_inode_out {u64 ino; s64 off;
    s64 len}, little-endian, written by hand."""
    s = PipeSession(TinyFs())
    assert s.session.notify_inval_inode(0x0102030405060708, -1, 0) == 0
    assert s.session.notify_inval_inode(5, 0, 4096) == 0
    raw = b""
    while len(raw) < 80:
        raw += os.read(s.r, 4096)
    attrs_only = bytes.fromhex(
        "28000000" "02000000" "0000000000000000"      # len 40, code 2, unique 0
        "0807060504030201" "ffffffffffffffff" "0000000000000000")   # ino, off -1, len 0
    first_page = bytes.fromhex(
        "28000000" "02000000" "0000000000000000"
        "0500000000000000" "0000000000000000" "0010000000000000")   # ino 5, off 0, 4096
    assert raw == attrs_only + first_page
    s.close()


def test_a_successor_invalidates_what_its_predecessor_left_cached_after_the_resend():
    """A successor cannot know what its predecessor's renderings were: every id it
    adopts is invalidated, after the RESEND (whose requeued fills an invalidation waits
    for)."""
    first = PipeSession(TinyFs())
    successor = PipeSession(TinyFs(), init=False, negotiated=first.session.negotiated)
    successor.session.resolver = lambda: ["/a", "/d", "/d/b"]
    successor.session.start = lambda threads=None: None     # no workers on a pipe
    assert successor.session.take_over() == 0
    got = list(replies(successor.r))
    assert got[0].error == abi.NOTIFY_RESEND and got[0].unique == 0
    inval = [abi.NOTIFY_INVAL_INODE_OUT.unpack(r.body) for r in got[1:]]
    assert all(r.error == abi.NOTIFY_INVAL_INODE for r in got[1:])
    assert sorted(inval) == sorted((path_id(p), 0, 0) for p in ("/a", "/d", "/d/b"))
    assert successor.session.counts["invalidated at takeover"] == 3
    first.close()
    successor.close()


# ------------------------------------------------------------------ the pusher


class Fake:
    """What the pusher drives: outcomes to return by path, and what it invalidated."""

    def __init__(self) -> None:
        self.outcome: dict[str, tuple[str, float]] = {}
        self.refreshed: list[str] = []
        self.invalidated: list[str] = []
        self.answer = 0

    def refresh(self, path: str, now: float) -> tuple[str, float]:
        self.refreshed.append(path)
        return self.outcome[path]

    def invalidate(self, path: str) -> int:
        self.invalidated.append(path)
        return self.answer


def test_a_changed_file_is_invalidated_once_and_an_unchanged_one_stays_watched():
    f = Fake()
    p = Pusher(f.refresh, f.invalidate, valid_for=5.0, pace=0.01)
    assert p.tick(0.0) is None                      # nothing watched: no wake-up at all
    p.watch("/a", due=0.5, now=0.0)
    p.watch("/b", due=0.5, now=0.0)
    assert p.tick(0.1) == 0.5 and f.refreshed == []     # not due yet
    f.outcome = {"/a": (CHANGED, 1.0), "/b": (SAME, 1.0)}
    assert p.tick(0.5) == 1.0
    assert f.invalidated == ["/a"] and p.watched() == ["/b"]
    assert p.counts["invalidated"] == 1 and p.counts["refreshed"] == 2
    # /a's next GETATTR watches it again; /b is refreshed at its new deadline.
    f.outcome["/b"] = (SAME, 1.5)
    assert p.tick(1.0) == 1.5 and f.refreshed[-1] == "/b"


def test_watching_ends_when_the_kernels_attributes_expire():
    """Past valid_for the kernel asks again before it serves the file: the daemon need
    not render it, and a daemon whose files nobody reads stops waking."""
    f = Fake()
    p = Pusher(f.refresh, f.invalidate, valid_for=5.0)
    f.outcome = {"/a": (SAME, 1.0)}
    p.watch("/a", due=0.5, now=0.0)
    for now in (0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5):
        f.outcome["/a"] = (SAME, now + 0.5)
        assert p.tick(now) == min(now + 0.5, 5.0)
    assert p.tick(5.0) is None and len(p) == 0
    assert len(f.refreshed) == 9


def test_forgotten_inodes_gone_files_and_held_renderings():
    f = Fake()
    p = Pusher(f.refresh, f.invalidate, valid_for=5.0, pace=0.01)
    f.answer = errno.ENOENT                       # the kernel had forgotten the inode
    f.outcome = {"/a": (CHANGED, 1.0), "/b": (GONE, 0.0), "/c": (HELD, 0.505)}
    for path in f.outcome:
        p.watch(path, due=0.5, now=0.0)
    assert p.tick(0.5) == 0.51                    # held: looked at again soon
    assert p.watched() == ["/c"]
    assert p.counts["forgotten"] == 1 and p.counts["invalidated"] == 0
    f.outcome["/c"] = (CHANGED, 1.0)
    f.answer = errno.ENODEV
    assert p.tick(0.51) is None and p.counts["failed"] == 1


def test_each_wake_up_renders_a_bounded_batch():
    f = Fake()
    p = Pusher(f.refresh, f.invalidate, valid_for=5.0, batch=3, pace=0.01)
    for i in range(7):
        f.outcome[f"/{i}"] = (SAME, 1.0)
        p.watch(f"/{i}", due=0.5 + i / 1000, now=0.0)
    assert p.tick(0.6) == pytest.approx(0.61) and len(f.refreshed) == 3
    assert f.refreshed == ["/0", "/1", "/2"]      # the longest due first
    assert p.tick(0.61) == pytest.approx(0.62) and len(f.refreshed) == 6
    assert p.tick(0.62) == 1.0 and len(f.refreshed) == 7


def test_a_rendering_due_as_before_is_not_retried_at_once():
    """A view's caches expire a little after its deadline: a refresh then gives the old
    deadline back, and the file is looked at again a pace later, not in a loop."""
    f = Fake()
    p = Pusher(f.refresh, f.invalidate, valid_for=5.0, pace=0.01)
    f.outcome = {"/a": (SAME, 0.5)}
    p.watch("/a", due=0.5, now=0.0)
    assert p.tick(0.5) == 0.51 and len(f.refreshed) == 1


def test_no_refresh_runs_once_stop_returns():
    """The daemon's teardown closes the host files right after stopping the pusher: a
    refresh still running then would fail (EBADF) and be logged as a fallback."""
    import threading
    started, release = threading.Event(), threading.Event()
    calls: list[str] = []

    def refresh(path: str, now: float) -> tuple[str, float]:
        calls.append(path)
        started.set()
        release.wait(5)
        return SAME, now + 0.001

    p = Pusher(refresh, lambda path: 0, valid_for=60.0, pace=0.001)
    for i in range(5):
        p.watch(f"/{i}", due=0.0)
    p.start()
    assert started.wait(5)
    threading.Timer(0.2, release.set).start()
    p.stop()               # waits for the refresh in flight, and the batch stops there
    n = len(calls)
    time.sleep(0.1)
    assert n == 1 and len(calls) == 1 and not p._thread.is_alive()


# ------------------------------------------------------------------ on the engine


def _pushing(monkeypatch, layout: str = "fixed", ttl: float = 60.0):
    """The daemon's operations for ``layout`` on guestfs's engine over a pipe, with the
    pusher's thread left out (the test ticks it)."""
    monkeypatch.setattr(Pusher, "start", lambda self: None)
    srv = ViewServer(HostRoot(str(fixture_root("k8s-systemd-v2-burstable"))),
                     ServerConfig(view="self", cache_ttl=ttl))
    ops = make_operations(adapter, srv, layout, 0.0)
    fs = adapter.OperationsFilesystem(ops, attr_timeout=min(ttl, REVALIDATE),
                                      entry_timeout=0.5)
    s = PipeSession(fs, init=False)
    fs.session = s.session
    s.ask(init_frame())
    return s, ops, srv


def lookup(s: PipeSession, name: str, parent: int = abi.ROOT_ID) -> tuple[int, float, float]:
    (r,) = s.ask(frame(abi.LOOKUP, name.encode() + b"\0", nodeid=parent))
    assert r.error == 0, (name, r)
    nodeid, _, entry_s, attr_s, entry_ns, attr_ns = abi.ENTRY_OUT_HEAD.unpack_from(r.body)
    return nodeid, entry_s + entry_ns / 1e9, attr_s + attr_ns / 1e9


def test_page_cached_files_keep_attributes_long_and_files_rendered_per_read_poll(monkeypatch):
    s, ops, _ = _pushing(monkeypatch)
    assert ops.page_cache and ops.pusher is not None
    proc, entry, attr = lookup(s, "proc")
    assert (entry, attr) == (PUSHED_VALID, PUSHED_VALID)
    meminfo, entry, attr = lookup(s, "meminfo", parent=proc)
    assert (entry, attr) == (PUSHED_VALID, PUSHED_VALID)
    _, _, attr = lookup(s, "stat", parent=proc)
    assert attr == REVALIDATE                     # rendered per read: still polled
    _, _, attr = lookup(s, ".guestfs-status")
    assert attr == REVALIDATE
    assert ops.pusher.watched() == ["/proc/meminfo"]
    s.close()


def test_a_changed_rendering_invalidates_its_inode_and_an_unchanged_one_does_not(monkeypatch):
    s, ops, srv = _pushing(monkeypatch)
    proc, _, _ = lookup(s, "proc")
    meminfo, _, _ = lookup(s, "meminfo", parent=proc)
    pusher = ops.pusher
    now = time.monotonic()
    pusher.watch("/proc/meminfo", due=now)        # due now: the bytes are the same
    pusher.tick(now)
    assert list(replies(s.r)) == [] and pusher.watched() == ["/proc/meminfo"]
    # What the kernel was last told differs from what the view now renders.
    ops.generations.get("/proc/meminfo").data = b"MemTotal: 1 kB\n"
    pusher.watch("/proc/meminfo", due=now)
    pusher.tick(now)
    (note,) = replies(s.r)
    assert (note.unique, note.error) == (0, abi.NOTIFY_INVAL_INODE)
    assert abi.NOTIFY_INVAL_INODE_OUT.unpack(note.body) == (meminfo, 0, 0)
    assert pusher.watched() == [] and srv.serving["push"]["invalidated"] == 1
    assert ops.generations.get("/proc/meminfo").data == srv.render("/proc/meminfo", 0)
    s.close()


def test_no_pushing_without_the_page_cache_or_at_a_ttl_polling_matches(monkeypatch):
    s, ops, _ = _pushing(monkeypatch, layout="per-caller")
    assert ops.pusher is None and ops.attr_valid("/proc/meminfo") is None
    # Its directories never change: their attributes are kept (two GETATTRs fewer per
    # open of MP/proc/meminfo), its files' never.
    assert ops.attr_valid("/") == ops.attr_valid("/proc") == DIRECTORY_VALID > 0
    assert ops.attr_valid("/sys/devices/system/cpu") == DIRECTORY_VALID
    assert ops.attr_valid("/proc/stat") is None and ops.attr_valid("/nothing") is None
    s.close()
    s, ops, _ = _pushing(monkeypatch, ttl=REVALIDATE)
    assert ops.page_cache and ops.pusher is None
    s.close()
    s, ops, _ = _pushing(monkeypatch)
    ops.disable_page_cache("a client without no_open")
    assert ops.pusher is None and ops.attr_valid("/proc/meminfo") is None
    s.close()


def test_an_inode_the_kernel_is_still_taking_in_is_told_again():
    """ENOENT for an inode looked up and not forgotten means the kernel has not made it
    yet from the reply that named it (EAGAIN from the notifier): the pusher tells it
    again, without rendering, and stops once it is told."""
    f = Fake()
    p = Pusher(f.refresh, f.invalidate, valid_for=5.0, pace=0.01)
    f.outcome = {"/a": (CHANGED, 1.0)}
    f.answer = errno.EAGAIN
    p.watch("/a", due=0.5, now=0.0)
    assert p.tick(0.5) == 0.51 and p.watched() == ["/a"]
    assert p.tick(0.51) == 0.52 and f.refreshed == ["/a"]     # told again, not rendered
    f.answer = 0
    assert p.tick(0.52) is None and f.invalidated == ["/a"] * 3
    assert (p.counts["retried"], p.counts["invalidated"]) == (2, 1)


def test_the_notifier_says_not_yet_for_a_looked_up_inode_the_kernel_does_not_know():
    s = PipeSession(TinyFs())
    (r,) = s.ask(frame(abi.LOOKUP, b"d\0"))
    assert r.error == 0
    notifier = adapter.Notifier(s.session)
    s.session.notify_inval_inode = lambda nodeid, off=0, length=0: errno.ENOENT
    assert notifier.inval_inode("/d") == errno.EAGAIN
    assert notifier.inval_inode("/never-looked-up") == errno.ENOENT
    s.session.inodes.forget(path_id("/d"), 1)
    assert notifier.inval_inode("/d") == errno.ENOENT     # forgotten: nothing cached
    s.close()


def test_past_its_bound_the_least_recently_watched_file_is_invalidated_instead():
    f = Fake()
    p = Pusher(f.refresh, f.invalidate, valid_for=5.0, max_entries=2)
    for path in ("/a", "/b", "/a", "/c"):       # /a watched again: /b is the oldest
        p.watch(path, due=0.5, now=0.0)
    assert sorted(p.watched()) == ["/a", "/c"]
    assert p.tick(0.1) == 0.5 and f.invalidated == ["/b"] and p.counts["evicted"] == 1
