"""guestfs/fuse/session.py, inodes.py and adapter.py without a kernel: frames built by
hand go into Session.handle, its replies come back through a pipe."""

from __future__ import annotations

import errno
import os

import pytest

from guestfs.daemon.fusefs import make_operations
from guestfs.daemon.server import ServerConfig, ViewServer
from guestfs.fuse import abi, adapter
from guestfs.fuse.inodes import InodeTable, path_id
from guestfs.fuse.session import Negotiated, Options
from guestfs.sources.host_root import HostRoot
from tests.conftest import fixture_root
from tests.support.fuseframes import (
    KERNEL_FLAGS_6_18,
    PipeSession,
    TinyFs,
    frame,
    init_frame,
    replies,
)


@pytest.fixture
def tiny():
    fs = TinyFs()
    s = PipeSession(fs)
    yield s, fs
    s.close()


def lookup(s: PipeSession, name: str, parent: int = abi.ROOT_ID) -> tuple[int, abi.Attr]:
    (r,) = s.ask(frame(abi.LOOKUP, name.encode() + b"\0", nodeid=parent))
    assert r.error == 0, r
    nodeid = abi.ENTRY_OUT_HEAD.unpack_from(r.body)[0]
    return nodeid, abi.unpack_attr(r.body[abi.ENTRY_OUT_HEAD.size:])[1]


def dirents(body: bytes) -> list[tuple[str, int]]:
    out = []
    while body:
        _, _, namelen, dtype = abi.DIRENT_HEAD.unpack_from(body)
        out.append((body[24:24 + namelen].decode(), dtype))
        body = body[-(-(24 + namelen) // 8) * 8:]
    return out


def read(s: PipeSession, nodeid: int, size: int = 4096, offset: int = 0) -> bytes:
    (r,) = s.ask(frame(abi.READ, abi.READ_IN.pack(11, offset, size, 0, 0, 0, 0),
                       nodeid=nodeid))
    assert r.error == 0
    return r.body


# ------------------------------------------------------------------ INIT

def test_init_negotiates_the_smaller_minor_and_offers_idmap_where_the_kernel_does(tiny):
    s, fs = tiny
    out = abi.INIT_OUT.unpack(s.init_reply.body)
    major, minor, readahead, flags, _, _, max_write, gran, max_pages, _, flags2 = out[:11]
    assert (major, minor, readahead, max_write, gran, max_pages) == (7, 41, 131072, 4096,
                                                                     1, 256)
    both = flags | flags2 << 32
    assert both & abi.ALLOW_IDMAP and both & abi.AUTO_INVAL_DATA and both & abi.MAX_PAGES
    assert not both & abi.DO_READDIRPLUS
    assert fs.negotiated == s.session.negotiated
    assert fs.negotiated.kernel_minor == 44 and fs.negotiated.offered(abi.HAS_RESEND)


def test_idmap_is_not_asked_for_without_default_permissions_nor_when_not_offered():
    for options, flags in ((Options(default_permissions=False), KERNEL_FLAGS_6_18),
                           (Options(), KERNEL_FLAGS_6_18 & ~abi.ALLOW_IDMAP)):
        s = PipeSession(TinyFs(), options, init=False)
        (r,) = s.ask(init_frame(flags=flags))
        assert not s.session.negotiated.flags & abi.ALLOW_IDMAP
        assert abi.INIT_OUT.unpack(r.body)[10] & (abi.ALLOW_IDMAP >> 32) == 0
        s.close()


def test_an_old_kernel_gets_the_short_init_reply_and_no_flags2():
    s = PipeSession(TinyFs(), init=False)
    (r,) = s.ask(init_frame(minor=22, flags=abi.ASYNC_READ | abi.AUTO_INVAL_DATA))
    assert len(r.body) == 24 and s.session.negotiated.minor == 22
    s.close()


def test_nothing_is_served_before_init_and_a_successor_serves_with_its_parameters():
    s = PipeSession(TinyFs(), init=False)
    (r,) = s.ask(frame(abi.GETATTR, abi.GETATTR_IN.pack(0, 0, 0)))
    assert r.error == -errno.EIO
    s.close()
    first = PipeSession(TinyFs())
    neg = Negotiated.from_json(first.session.negotiated.to_json())
    assert neg == first.session.negotiated
    successor = PipeSession(TinyFs(), init=False, negotiated=neg)
    nodeid, _ = lookup(successor, "a")
    assert read(successor, nodeid) == b"alpha\n"
    first.close()
    successor.close()


def test_a_successor_names_its_predecessors_node_ids_from_the_paths_it_serves():
    """The kernel keeps the ids the first daemon gave: a successor's table is empty, and
    its resolver (every path it may serve) names them by their hash; an id that no
    path hashes to stays ESTALE, and the resolver is not asked again at once."""
    first = PipeSession(TinyFs())
    d, _ = lookup(first, "d")
    b, _ = lookup(first, "b", parent=d)
    asked: list[int] = []

    def resolver() -> list[str]:
        asked.append(1)
        return ["/a", "/d", "/d/b"]

    successor = PipeSession(TinyFs(), init=False, negotiated=first.session.negotiated)
    successor.session.resolver = resolver
    assert read(successor, b) == b"bravo\n"            # an id the successor never gave
    (r,) = successor.ask(frame(abi.GETATTR, abi.GETATTR_IN.pack(0, 0, 0), nodeid=d))
    assert r.error == 0 and len(asked) == 1             # adopted once, all of them
    (r,) = successor.ask(frame(abi.GETATTR, abi.GETATTR_IN.pack(0, 0, 0), nodeid=12345))
    assert r.error == -errno.ESTALE and len(asked) == 1   # asked a moment ago: not again
    successor.session._resolved_at -= 1.0                 # a second later
    (r,) = successor.ask(frame(abi.GETATTR, abi.GETATTR_IN.pack(0, 0, 0), nodeid=12345))
    assert r.error == -errno.ESTALE and len(asked) == 2
    assert successor.session.counts["resolved"] == 3
    first.close()
    successor.close()


# ------------------------------------------------------------------ requests

def test_lookup_getattr_open_read_release(tiny):
    s, fs = tiny
    nodeid, attr = lookup(s, "a")
    assert nodeid == path_id("/a") and attr.size == 6
    (r,) = s.ask(frame(abi.GETATTR, abi.GETATTR_IN.pack(0, 0, 0), nodeid=nodeid))
    assert abi.unpack_attr(r.body[abi.ATTR_OUT_HEAD.size:]) == (nodeid, attr)
    (r,) = s.ask(frame(abi.OPEN, abi.OPEN_IN.pack(os.O_RDONLY, 0), nodeid=nodeid))
    assert abi.OPEN_OUT.unpack(r.body) == (11, abi.FOPEN_DIRECT_IO, 0)
    assert read(s, nodeid, 3, 2) == b"pha"
    (r,) = s.ask(frame(abi.RELEASE, abi.RELEASE_IN.pack(11, 0, 0, 0), nodeid=nodeid))
    assert r.error == 0 and r.body == b""
    assert set(fs.pids) == {4242}       # the in_header's pid, seen through current()


def test_a_nested_lookup_and_enoent(tiny):
    s, _ = tiny
    d, attr = lookup(s, "d")
    b, _ = lookup(s, "b", parent=d)
    assert attr.mode == 0o40555 and read(s, b) == b"bravo\n"
    (r,) = s.ask(frame(abi.LOOKUP, b"nope\0"))
    assert r.error == -errno.ENOENT
    assert len(s.session.inodes) == 2            # failed lookups are not remembered


def test_unknown_node_ids_are_stale(tiny):
    s, _ = tiny
    (r,) = s.ask(frame(abi.GETATTR, abi.GETATTR_IN.pack(0, 0, 0), nodeid=123456))
    assert r.error == -errno.ESTALE
    (r,) = s.ask(frame(abi.LOOKUP, b"x\0", nodeid=123456))
    assert r.error == -errno.ESTALE


def test_forget_and_batch_forget_count_lookups_down(tiny):
    s, _ = tiny
    a, _ = lookup(s, "a")
    lookup(s, "a")
    d, _ = lookup(s, "d")
    assert s.session.inodes.counts() == {"/a": 2, "/d": 1}
    assert s.ask(frame(abi.FORGET, abi.FORGET_IN.pack(1), nodeid=a)) == []   # no reply
    assert s.session.inodes.counts() == {"/a": 1, "/d": 1}
    batch = abi.BATCH_FORGET_IN.pack(2, 0) + abi.FORGET_ONE.pack(a, 1) + \
        abi.FORGET_ONE.pack(d, 1)
    assert s.ask(frame(abi.BATCH_FORGET, batch)) == []
    assert len(s.session.inodes) == 0


@pytest.mark.parametrize("opcode", sorted(abi.MUTATING))
def test_every_mutating_opcode_is_erofs(tiny, opcode):
    s, _ = tiny
    (r,) = s.ask(frame(opcode, b"\0" * 64))
    assert r.error == -errno.EROFS


def _lookup_a(s) -> int:
    (r,) = s.ask(frame(abi.LOOKUP, b"a\0"))
    return abi.ENTRY_OUT_HEAD.unpack_from(r.body)[0]


def test_a_write_goes_to_the_filesystem_whose_answer_is_the_size_written(tiny):
    s, fs = tiny
    a = _lookup_a(s)
    data = b"some 20000 2000000\0"
    (r,) = s.ask(frame(abi.WRITE, abi.WRITE_IN.pack(9, 0, len(data), 0, 0, 0o2, 0) + data,
                       nodeid=a))
    assert r.error == 0 and abi.WRITE_OUT.unpack(r.body) == (len(data), 0)
    assert fs.written == [(9, 0, data)]
    (r,) = s.ask(frame(abi.WRITE, abi.WRITE_IN.pack(9, 0, 1, 0, 0, 0, 0) + b"x"))
    assert r.error == -errno.EROFS            # the root directory: the filesystem refuses


@pytest.mark.parametrize("size, carried, why", [(10, 5, "carrying"), (5, 10, "carrying"),
                                                 (5000, 5000, "negotiated")])
def test_a_write_whose_size_lies_or_passes_max_write_is_einval(tiny, size, carried, why):
    s, fs = tiny
    a = _lookup_a(s)
    (r,) = s.ask(frame(abi.WRITE, abi.WRITE_IN.pack(9, 0, size, 0, 0, 0, 0) + b"x" * carried,
                       nodeid=a))
    assert r.error == -errno.EINVAL and fs.written == []


def test_poll_names_kh_only_when_the_kernel_will_wait_for_a_notification(tiny):
    s, fs = tiny
    a = _lookup_a(s)
    for flags in (abi.POLL_SCHEDULE_NOTIFY, 0):
        (r,) = s.ask(frame(abi.POLL, abi.POLL_IN.pack(9, 77, flags, abi.POLLPRI), nodeid=a))
        assert r.error == 0
        assert abi.POLL_OUT.unpack(r.body) == (abi.DEFAULT_POLLMASK | abi.POLLPRI, 0)
    assert fs.polled == [(9, 77, abi.POLLPRI), (9, None, abi.POLLPRI)]


def test_the_notify_poll_frame_is_the_kernels_bytes():
    """struct fuse_out_header with code 1 (FUSE_NOTIFY_POLL) and unique 0, then struct
    fuse_notify_poll_wakeup_out {u64 kh}, written by hand."""
    s = PipeSession(TinyFs())
    assert s.session.notify_poll(0x0102030405060708) == 0
    raw = os.read(s.r, 4096)
    assert raw == bytes.fromhex("18000000" "01000000" "0000000000000000"
                                "0807060504030201")
    s.close()


@pytest.mark.parametrize("opcode", [abi.READLINK, abi.GETXATTR, abi.LISTXATTR, abi.IOCTL,
                                    abi.LSEEK, abi.STATX, abi.BMAP, abi.FSYNC,
                                    abi.READDIRPLUS, abi.GETLK, 4000])
def test_what_is_not_served_is_enosys(tiny, opcode):
    s, _ = tiny
    (r,) = s.ask(frame(opcode, b"\0" * 64))
    assert r.error == -errno.ENOSYS


def test_interrupt_gets_no_reply_and_flush_passes_enosys(tiny):
    s, _ = tiny
    assert s.ask(frame(abi.INTERRUPT, abi.INTERRUPT_IN.pack(5))) == []
    a, _ = lookup(s, "a")
    (r,) = s.ask(frame(abi.FLUSH, abi.FLUSH_IN.pack(11, 0, 0, 0), nodeid=a))
    assert r.error == -errno.ENOSYS


def test_readdir_pages_through_offsets(tiny):
    s, _ = tiny
    names, offset = [], 0
    while True:
        # Room for one entry per READDIR: each offset is the next entry's index.
        (r,) = s.ask(frame(abi.READDIR, abi.READ_IN.pack(0, offset, 32, 0, 0, 0, 0)))
        if not r.body:
            break
        ino, off, namelen, dtype = abi.DIRENT_HEAD.unpack_from(r.body)
        names.append((r.body[24:24 + namelen].decode(), dtype, ino))
        offset = off
    assert names == [(".", 4, abi.ROOT_ID), ("..", 4, abi.ROOT_ID), ("a", 8, path_id("/a")),
                     ("d", 4, path_id("/d"))]


def test_statfs_and_access(tiny):
    s, _ = tiny
    (r,) = s.ask(frame(abi.STATFS))
    assert abi.KSTATFS.unpack(r.body)[5:8] == (4096, 255, 4096)
    (r,) = s.ask(frame(abi.ACCESS, abi.ACCESS_IN.pack(os.R_OK, 0), nodeid=path_id("/a")))
    assert r.error == -errno.ESTALE                 # never looked up
    a, _ = lookup(s, "a")
    (r,) = s.ask(frame(abi.ACCESS, abi.ACCESS_IN.pack(os.R_OK, 0), nodeid=a))
    assert r.error == 0


def test_a_bug_in_an_answer_is_eio_and_the_loop_goes_on(tiny):
    s, fs = tiny
    fs.files = None      # every getattr of a file now raises TypeError
    (r,) = s.ask(frame(abi.LOOKUP, b"a\0"))
    assert r.error == -errno.EIO and s.session.counts["exceptions"] == 1
    (r,) = s.ask(frame(abi.STATFS))
    assert r.error == 0


def test_destroy_is_answered_and_ends_the_session(tiny):
    s, _ = tiny
    (r,) = s.ask(frame(abi.DESTROY))
    assert r.error == 0 and s.session.ended.is_set()


# ------------------------------------------------------------------ inode table

def test_the_inode_table_is_bounded_whatever_is_looked_up():
    t = InodeTable(limit=100)
    for i in range(10_000):
        t.remember(f"/f{i}")
    assert len(t) == 100 and t.evicted == 9_900
    assert t.path(path_id("/f9999")) == "/f9999" and t.path(path_id("/f0")) is None
    t.forget(path_id("/f0"), 1)              # forgotten after eviction: ignored
    t.forget(path_id("/f9999"), 1)
    assert len(t) == 99


def test_colliding_hashes_take_the_next_free_id(monkeypatch):
    monkeypatch.setattr("guestfs.fuse.inodes.path_id", lambda path: 1000)
    t = InodeTable()
    assert (t.remember("/x"), t.remember("/y"), t.remember("/x")) == (1000, 1001, 1000)
    assert t.counts() == {"/x": 2, "/y": 1}


def test_node_ids_are_the_same_in_any_process():
    assert path_id("/proc/meminfo") == path_id("/proc/meminfo") > abi.ROOT_ID
    assert path_id("/proc/meminfo") != path_id("/proc/cpuinfo")
    assert path_id("/proc/meminfo") < 1 << 63


# ------------------------------------------------------------------ adapter

def test_guestfs_operations_serve_through_the_engine():
    """The daemon's own make_operations, given this engine's module, on a fixture root:
    what a READ returns is what the server renders for the in_header's pid."""
    srv = ViewServer(HostRoot(str(fixture_root("k8s-systemd-v2-burstable"))),
                     ServerConfig(cache_ttl=60))
    ops = make_operations(adapter, srv, "per-caller", 0.0)
    fs = adapter.OperationsFilesystem(ops, attr_timeout=0.0, entry_timeout=0.5)
    s = PipeSession(fs)
    proc, attr = lookup(s, "proc")
    meminfo, attr = lookup(s, "meminfo", parent=proc)
    want = srv.render("/proc/meminfo", 7)
    assert attr.mode == 0o100444 and attr.size == 4096 >= len(want)
    (r,) = s.ask(frame(abi.OPEN, abi.OPEN_IN.pack(os.O_RDONLY, 0), nodeid=meminfo, pid=7))
    fh, open_flags, _ = abi.OPEN_OUT.unpack(r.body)
    assert open_flags == abi.FOPEN_DIRECT_IO and fh > 0
    (r,) = s.ask(frame(abi.READ, abi.READ_IN.pack(fh, 0, 65536, abi.READ_LOCKOWNER, 1, 0, 0),
                       nodeid=meminfo, pid=7))
    assert r.body == want
    (r,) = s.ask(frame(abi.OPEN, abi.OPEN_IN.pack(os.O_WRONLY, 0), nodeid=meminfo))
    assert r.error == -errno.EROFS
    (r,) = s.ask(frame(abi.STATFS))
    assert abi.KSTATFS.unpack(r.body)[5] == 4096
    s.close()


@pytest.mark.parametrize(("options", "idmap"), [(Options(), True),
                                               (Options(default_permissions=False), False)])
def test_the_status_says_whether_idmapped_binds_are_accepted(options, idmap):
    """Negotiated FUSE_ALLOW_IDMAP (only with default_permissions) shows in the status as
    idmapped_binds; the kernel then sends no uid or gid with a read (FUSE_INVALID_UIDGID),
    and the reader is still told by its pid alone."""
    srv = ViewServer(HostRoot(str(fixture_root("k8s-systemd-v2-burstable"))),
                     ServerConfig(cache_ttl=60))
    ops = make_operations(adapter, srv, "per-caller", 0.0)
    s = PipeSession(adapter.OperationsFilesystem(ops, attr_timeout=0.0), options)
    assert srv.serving["idmapped_binds"] is idmap
    assert s.session.negotiated.idmap is idmap
    no_id = {"uid": abi.INVALID_UIDGID, "gid": abi.INVALID_UIDGID, "pid": 7}
    proc, _ = lookup(s, "proc")
    meminfo, _ = lookup(s, "meminfo", parent=proc)
    (r,) = s.ask(frame(abi.OPEN, abi.OPEN_IN.pack(os.O_RDONLY, 0), nodeid=meminfo, **no_id))
    fh = abi.OPEN_OUT.unpack(r.body)[0]
    (r,) = s.ask(frame(abi.READ, abi.READ_IN.pack(fh, 0, 65536, abi.READ_LOCKOWNER, 1, 0, 0),
                       nodeid=meminfo, **no_id))
    assert r.error == 0 and r.body == srv.render("/proc/meminfo", 7)
    s.close()


def test_an_open_answered_enosys_reaches_the_kernel_and_opendir_is_answered():
    class Ops(adapter.Operations):
        use_ns = True

        def getattr(self, path, fh=None):
            return {"st_mode": 0o100444 if path != "/" else 0o40555, "st_mtime": 3 * 10**9}

        def open(self, path, fi):
            raise adapter.FuseOSError(errno.ENOSYS)

        def readdir(self, path, fh):
            return [".", "..", ("f", {"st_mode": 0o100444}, 0)]

    fs = adapter.OperationsFilesystem(Ops(), attr_timeout=0.01)
    s = PipeSession(fs)
    f, attr = lookup(s, "f")
    assert attr.mtime_ns == 3 * 10**9
    (r,) = s.ask(frame(abi.OPEN, abi.OPEN_IN.pack(os.O_RDONLY, 0), nodeid=f))
    assert r.error == -errno.ENOSYS                 # the kernel then opens without asking
    (r,) = s.ask(frame(abi.OPENDIR, abi.OPEN_IN.pack(0, 0)))
    # No opendir: answered, not ENOSYS (no_opendir would cache listings: FOPEN_CACHE_DIR).
    assert r.error == 0 and abi.OPEN_OUT.unpack(r.body) == (0, 0, 0)
    (r,) = s.ask(frame(abi.READDIR, abi.READ_IN.pack(0, 0, 4096, 0, 0, 0, 0)))
    assert dirents(r.body) == [(".", 0), ("..", 0), ("f", 8)]   # a bare name: DT_UNKNOWN
    (r,) = s.ask(frame(abi.ACCESS, abi.ACCESS_IN.pack(os.R_OK, 0)))
    assert r.error == -errno.ENOSYS                 # libfuse's answer without access
    s.close()


def test_init_with_config_sees_libfuse_capability_bits_and_its_timeout_is_live():
    seen = {}

    class Ops(adapter.Operations):
        def init_with_config(self, conn, config):
            seen.update(capable=conn.capable, want=conn.want)
            config.attr_timeout = 0.25

        def getattr(self, path, fh=None):
            return {"st_mode": 0o40555}

    fs = adapter.OperationsFilesystem(Ops(), attr_timeout=0.0)
    s = PipeSession(fs)
    assert seen["capable"] & (1 << 17) and seen["capable"] & (1 << 12)   # no_open, inval
    assert seen["want"] & (1 << 12) and not seen["want"] & (1 << 17)
    (r,) = s.ask(frame(abi.GETATTR, abi.GETATTR_IN.pack(0, 0, 0)))
    assert abi.ATTR_OUT_HEAD.unpack_from(r.body)[:2] == (0, 250_000_000)
    s.close()


def test_fuse_get_context_is_the_request_being_answered():
    assert adapter.fuse_get_context() == (0, 0, 0)      # outside any request
    got = []

    class Ops(adapter.Operations):
        def getattr(self, path, fh=None):
            got.append(adapter.fuse_get_context())
            return {"st_mode": 0o40555}

    s = PipeSession(adapter.OperationsFilesystem(Ops()))
    s.ask(frame(abi.GETATTR, abi.GETATTR_IN.pack(0, 0, 0), uid=5, gid=6, pid=77))
    assert got == [(5, 6, 77)]
    s.close()


def test_before_init_a_forget_gets_no_reply():
    s = PipeSession(TinyFs(), init=False)
    assert s.ask(frame(abi.FORGET, abi.FORGET_IN.pack(1), nodeid=5)) == []
    s.close()


def test_a_failed_device_read_ends_the_session_with_its_reason():
    r, w = os.pipe()
    os.close(w)
    session = adapter.Session(r, TinyFs())
    session._end(errno.EINVAL)      # what a too small read buffer gets from the kernel
    assert session.ended.is_set() and "Invalid argument" in session.failure
    os.close(r)
    ok = adapter.Session(0, TinyFs())
    ok._end(errno.ENODEV)           # unmounted: a clean end
    assert ok.failure is None


def test_notifications_are_the_kernels_frames(tiny):
    """Each notification is one write: an out header with unique 0 and the notify code
    in its error field, then its struct (fuse.h's fuse_notify_*_out)."""
    s, _ = tiny
    assert s.session.notify_inval_inode(0x1234, 0, 0) == 0
    assert s.session.notify_inval_entry(abi.ROOT_ID, "proc") == 0
    assert s.session.notify_resend() == 0
    raw = os.read(s.r, 4096)
    inode = abi.OUT_HEADER.pack(16 + 24, abi.NOTIFY_INVAL_INODE, 0) + \
        abi.NOTIFY_INVAL_INODE_OUT.pack(0x1234, 0, 0)
    entry = abi.OUT_HEADER.pack(16 + 16 + 5, abi.NOTIFY_INVAL_ENTRY, 0) + \
        abi.NOTIFY_INVAL_ENTRY_OUT.pack(abi.ROOT_ID, 4, 0) + b"proc\0"
    resend = abi.OUT_HEADER.pack(16, abi.NOTIFY_RESEND, 0)
    assert raw == inode + entry + resend
    assert (abi.NOTIFY_INVAL_INODE, abi.NOTIFY_INVAL_ENTRY, abi.NOTIFY_RESEND) == (2, 3, 7)


def test_a_quiesced_session_answers_nothing_and_waits_for_the_answers_under_way():
    """What a stopping daemon relies on before it closes the host files answers read:
    a request being answered finishes, one read later is left to the kernel (resent to
    a successor, or failed when the connection ends)."""
    import threading

    fs = TinyFs()
    s = PipeSession(fs)
    nodeid, _ = lookup(s, "a")
    entered, release = threading.Event(), threading.Event()
    slow = fs.getattr

    def getattr_slowly(path, fh):  # type: ignore[no-untyped-def]
        entered.set()
        release.wait(5)
        return slow(path, fh)

    fs.getattr = getattr_slowly  # type: ignore[method-assign]
    t = threading.Thread(target=s.session.handle,
                         args=(frame(abi.GETATTR, abi.GETATTR_IN.pack(0, 0, 0), nodeid=nodeid),))
    t.start()
    assert entered.wait(5)
    assert s.session.quiesce(timeout=0.1) is False      # one is still being answered
    release.set()
    t.join(5)
    assert s.session.quiesce(timeout=1) is True
    assert len(list(replies(s.r))) == 1                  # that one was answered
    assert s.ask(frame(abi.GETATTR, abi.GETATTR_IN.pack(0, 0, 0), nodeid=nodeid)) == []
    assert s.session.counts["left unanswered"] == 1
    s.close()
