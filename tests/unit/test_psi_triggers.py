"""PSI triggers' bookkeeping (daemon/psi_triggers.py) and their FUSE path through the
engine (fusefs.open/write/poll_events/release). The kernel's PSI file is stood in for by
a loopback TCP socket, whose urgent byte is its POLLPRI; tests/host/test_psi_triggers.py
uses the kernel's own files."""

from __future__ import annotations

import errno
import os
import socket
import threading
import time

import pytest

from guestfs.daemon.fusefs import TRIGGER_MODE, make_operations
from guestfs.daemon.psi_triggers import NO_TRIGGER, Triggers
from guestfs.daemon.server import ServerConfig, ViewServer
from guestfs.fuse import abi, adapter
from guestfs.fuse.inodes import path_id
from guestfs.sources.host_root import HostRoot
from tests.conftest import fixture_root
from tests.support.fuseframes import PipeSession, frame, init_frame
from tests.support.mounts import wait_for

PRI = abi.DEFAULT_POLLMASK | abi.POLLPRI


class Source:
    """A connected loopback TCP pair: ``fd`` is the daemon's side (a dup, which the
    code under test owns and closes), ``fire()`` sends it one urgent byte."""

    def __init__(self) -> None:
        with socket.socket() as lst:
            lst.bind(("127.0.0.1", 0))
            lst.listen(1)
            self.peer = socket.create_connection(lst.getsockname())
            self.ours, _ = lst.accept()
        self.fd = os.dup(self.ours.fileno())
        self.ours.close()

    def fire(self) -> None:
        self.peer.send(b"!", socket.MSG_OOB)

    def received(self) -> bytes:
        self.peer.settimeout(2)
        return self.peer.recv(64)

    def close(self) -> None:
        self.peer.close()


def closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError as e:
        return e.errno == errno.EBADF
    return False


@pytest.fixture
def source():
    s = Source()
    yield s
    s.close()


def test_a_trigger_fires_once_per_event_and_wakes_the_kernels_handle(source):
    woken: list[int] = []
    t = Triggers(lambda kh: woken.append(kh) or 0)
    t.add(5, source.fd, "view")
    assert t.poll(5, None) == NO_TRIGGER          # no trigger written yet: as the kernel
    assert t.write(5, b"some 20000 2000000\0") == 19
    assert source.received() == b"some 20000 2000000\0"
    assert t.poll(5, 77) == abi.DEFAULT_POLLMASK  # armed, not fired; kh 77 to wake
    source.fire()
    assert wait_for(lambda: woken == [77])
    assert t.poll(5, None) == PRI                 # reported once ...
    assert t.poll(5, None) == abi.DEFAULT_POLLMASK   # ... then consumed, as PSI does
    source.fire()
    assert wait_for(lambda: woken == [77, 77]) and t.poll(5, None) == PRI
    assert t.counts["fired"] == 2 and t.counts["armed"] == 1
    t.stop()
    assert closed(source.fd)


def test_an_event_before_anyone_polls_is_kept_for_the_first_poll(source):
    t = Triggers(lambda kh: 0)
    t.add(5, source.fd, "view")
    t.write(5, b"some 1 2\0")
    source.fire()
    assert wait_for(lambda: t.counts["fired"] == 1)
    assert t.poll(5, 9) == PRI
    t.stop()


def test_release_closes_the_source_and_a_released_handle_polls_as_untriggered(source):
    t = Triggers(lambda kh: 0)
    t.add(5, source.fd, "view")
    t.write(5, b"x")
    t.release(5)
    assert closed(source.fd) and len(t) == 0
    assert t.poll(5, None) == NO_TRIGGER
    t.release(5)                                  # the kernel's RELEASE of an unknown fh
    with pytest.raises(OSError) as e:
        t.write(5, b"x")
    assert e.value.errno == errno.EBADF
    t.stop()


def test_the_sources_refusal_is_the_writers_and_leaves_it_unarmed():
    r, w = os.pipe()
    t = Triggers(lambda kh: 0)
    t.add(5, r, "view")                           # a read end: every write fails EBADF
    with pytest.raises(OSError) as e:
        t.write(5, b"some 20000 2000000")
    assert e.value.errno == errno.EBADF
    assert t.poll(5, None) == NO_TRIGGER and t.counts["armed"] == 0
    t.stop()
    os.close(w)


def test_open_trigger_files_are_bounded_per_view_and_in_all():
    t = Triggers(lambda kh: 0, limit=5, per_view=3)
    fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(7)]
    for i in range(3):
        t.add(i, fds[i], "a")
    with pytest.raises(OSError) as e:
        t.add(3, fds[3], "a")                      # view a has its share
    assert e.value.errno == errno.EMFILE and closed(fds[3])
    t.add(4, fds[4], "b")
    t.add(5, fds[5], "b")
    with pytest.raises(OSError):
        t.add(6, fds[6], "c")                      # 5 open in all
    assert closed(fds[6]) and t.counts["refused"] == 2
    t.release(0)
    t.add(7, os.open(os.devnull, os.O_RDONLY), "a")   # a share given back is taken again
    t.stop()
    assert all(closed(fd) for fd in fds)


def test_stop_ends_the_watcher_thread(source):
    t = Triggers(lambda kh: 0)
    t.add(5, source.fd, "view")
    t.write(5, b"x")
    thread = t._thread
    assert thread is not None and thread.is_alive()
    t.stop()
    assert not thread.is_alive()
    t.stop()                                      # twice: nothing written anywhere


# ------------------------------------------------------------------ through the engine

CPU = "/proc/pressure/cpu"


def _engine(monkeypatch, layout: str, sources: list[Source]):
    """The daemon's operations on guestfs's engine over a pipe, PSI files written to
    loopback sources."""
    srv = ViewServer(HostRoot(str(fixture_root("k8s-systemd-v2-burstable"))),
                     ServerConfig(view="self", cache_ttl=60.0))
    ops = make_operations(adapter, srv, layout, 0.0)
    opened: list[tuple[object, str]] = []

    def source_for(level, resource: str) -> int:
        opened.append((level, resource))
        sources.append(s := Source())
        return s.fd

    ops.trigger_source = source_for
    fs = adapter.OperationsFilesystem(ops, attr_timeout=0.0, entry_timeout=0.0)
    s = PipeSession(fs, init=False)
    fs.session = s.session
    s.ask(init_frame())
    return s, ops, srv, opened


def _open(s: PipeSession, path: str, flags: int) -> tuple[int, int]:
    (r,) = s.ask(frame(abi.OPEN, abi.OPEN_IN.pack(flags, 0), nodeid=path_id(path)))
    return r.error, (abi.OPEN_OUT.unpack_from(r.body)[0] if r.error == 0 else 0)


def _lookup(s: PipeSession, path: str) -> None:
    parent = abi.ROOT_ID
    walked = ""
    for part in path.strip("/").split("/"):
        s.ask(frame(abi.LOOKUP, part.encode() + b"\0", nodeid=parent))
        walked += "/" + part
        parent = path_id(walked)


def test_a_served_pressure_file_takes_a_trigger_on_its_views_own_file(monkeypatch):
    sources: list[Source] = []
    s, ops, srv, opened = _engine(monkeypatch, "per-caller", sources)
    try:
        _lookup(s, CPU)
        (r,) = s.ask(frame(abi.GETATTR, abi.GETATTR_IN.pack(0, 0, 0), nodeid=path_id(CPU)))
        assert abi.unpack_attr(r.body[abi.ATTR_OUT_HEAD.size:])[1].mode == TRIGGER_MODE
        err, fh = _open(s, CPU, os.O_RDWR | os.O_NONBLOCK)
        assert err == 0 and len(opened) == 1
        level, resource = opened[0]
        # The fixture's v2 pod: cpu.pressure of the level whose cpu limit applies.
        assert resource == "cpu" and level is not None
        assert level.cgroup == srv.pressure_source(CPU, 0).cgroup
        data = b"some 20000 2000000\0"
        (r,) = s.ask(frame(abi.WRITE, abi.WRITE_IN.pack(fh, 0, len(data), 0, 0, 0, 0) + data,
                           nodeid=path_id(CPU)))
        assert r.error == 0 and abi.WRITE_OUT.unpack(r.body)[0] == len(data)
        poll = abi.POLL_IN.pack(fh, 99, abi.POLL_SCHEDULE_NOTIFY, abi.POLLPRI)
        (r,) = s.ask(frame(abi.POLL, poll, nodeid=path_id(CPU)))
        assert abi.POLL_OUT.unpack(r.body)[0] == abi.DEFAULT_POLLMASK
        sources[0].fire()
        # The kernel is told: FUSE_NOTIFY_POLL naming kh 99, in the pipe.
        got = b""
        end = time.monotonic() + 5
        while len(got) < 24 and time.monotonic() < end:
            try:
                got += os.read(s.r, 4096)
            except BlockingIOError:
                time.sleep(0.01)
        assert got == abi.out_header(8, abi.NOTIFY_POLL, 0) + abi.NOTIFY_POLL_OUT.pack(99)
        (r,) = s.ask(frame(abi.POLL, abi.POLL_IN.pack(fh, 99, 0, abi.POLLPRI),
                           nodeid=path_id(CPU)))
        assert abi.POLL_OUT.unpack(r.body)[0] == PRI
        s.ask(frame(abi.RELEASE, abi.RELEASE_IN.pack(fh, 0, 0, 0), nodeid=path_id(CPU)))
        assert len(ops.triggers) == 0 and srv.serving["psi_triggers"]["opened"] == 1
    finally:
        ops.stop()
        s.close()
        for src in sources:
            src.close()


@pytest.mark.parametrize("path, flags", [("/proc/meminfo", os.O_RDWR),
                                         (CPU, os.O_WRONLY | os.O_TRUNC)])
def test_other_writes_stay_read_only(monkeypatch, path, flags):
    sources: list[Source] = []
    s, ops, _, opened = _engine(monkeypatch, "per-caller", sources)
    try:
        _lookup(s, path)
        assert _open(s, path, flags)[0] == -errno.EROFS and opened == []
        # A pressure file opened to read polls as the kernel's without a trigger.
        _lookup(s, CPU)
        err, fh = _open(s, CPU, os.O_RDONLY)
        (r,) = s.ask(frame(abi.POLL, abi.POLL_IN.pack(fh, 1, 0, abi.POLLPRI),
                           nodeid=path_id(CPU)))
        assert abi.POLL_OUT.unpack(r.body)[0] == NO_TRIGGER
    finally:
        ops.stop()
        s.close()


def test_a_page_cached_layout_takes_no_trigger(monkeypatch):
    """Its opens never reach the daemon (no_open): a write could not be tied to one."""
    sources: list[Source] = []
    s, ops, _, opened = _engine(monkeypatch, "fixed", sources)
    try:
        assert ops.triggers is None
        _lookup(s, CPU)
        assert _open(s, CPU, os.O_RDWR)[0] == -errno.EROFS and opened == []
    finally:
        ops.stop()
        s.close()


def test_the_watcher_and_the_sources_are_gone_after_stop(monkeypatch):
    sources: list[Source] = []
    s, ops, _, _ = _engine(monkeypatch, "per-caller", sources)
    _lookup(s, CPU)
    _, fh = _open(s, CPU, os.O_RDWR)
    s.ask(frame(abi.WRITE, abi.WRITE_IN.pack(fh, 0, 1, 0, 0, 0, 0) + b"x",
                nodeid=path_id(CPU)))
    before = {t.name for t in threading.enumerate()}
    assert "guestfs-psi" in before
    ops.stop()
    assert closed(sources[0].fd)
    assert wait_for(lambda: "guestfs-psi" not in {t.name for t in threading.enumerate()})
    s.close()
    sources[0].close()


# ------------------------------------------------------------------ where a trigger is written

def _level(directory: str):
    from guestfs.sources.snapshot import Level
    return Level("/pod", directory, {})


def test_the_source_is_the_levels_pressure_file_opened_for_writing(tmp_path):
    from guestfs.daemon.psi_triggers import open_source
    (tmp_path / "cpu.pressure").write_text("some avg10=0.00\n")
    fd = open_source(HostRoot("/"), {}, _level(str(tmp_path)), "cpu")
    try:
        os.write(fd, b"some 20000 2000000")
    finally:
        os.close(fd)
    assert (tmp_path / "cpu.pressure").read_text().startswith("some 20000 2000000")


@pytest.mark.parametrize("where", ["file", "directory", "parent"])
def test_no_symlink_is_followed_to_the_source(tmp_path, where):
    from guestfs.daemon.psi_triggers import open_source
    real = tmp_path / "real"
    real.mkdir()
    (real / "cpu.pressure").write_text("")
    (tmp_path / "elsewhere").write_text("")
    if where == "file":
        level_dir = tmp_path / "lvl"
        level_dir.mkdir()
        (level_dir / "cpu.pressure").symlink_to(tmp_path / "elsewhere")
    elif where == "directory":
        level_dir = tmp_path / "link"
        level_dir.symlink_to(real)
    else:
        (tmp_path / "up").symlink_to(tmp_path)
        level_dir = tmp_path / "up" / "real"
    with pytest.raises(OSError) as e:
        os.close(open_source(HostRoot("/"), {}, _level(str(level_dir)), "cpu"))
    assert e.value.errno in (errno.ELOOP, errno.ENOTDIR)
    assert (tmp_path / "elsewhere").read_text() == ""


def test_the_host_file_is_reopened_from_its_pinned_descriptor(tmp_path):
    """Never through the path (our own mount may be bound over it)."""
    from guestfs.daemon.psi_triggers import open_source
    f = tmp_path / "pinned"
    f.write_text("")
    pin = os.open(f, os.O_RDONLY)
    try:
        fd = open_source(HostRoot("/nonexistent"), {"/proc/pressure/io": pin}, None, "io")
        os.write(fd, b"full 1 2")
        os.close(fd)
        assert f.read_text() == "full 1 2"
        with pytest.raises(OSError) as e:
            open_source(HostRoot("/"), {"/proc/pressure/io": pin}, None, "cpu")
        assert e.value.errno == errno.ENOENT
    finally:
        os.close(pin)


def test_a_source_gone_polls_as_untriggered_and_wakes_its_poller(source):
    """A removed cgroup's pressure file polls POLLERR (and PRI) from then on: the poller
    is woken once and told the trigger is gone, and the watcher does not spin on it. A
    reset connection stands in for it (EPOLLERR)."""
    import struct
    woken: list[int] = []
    t = Triggers(lambda kh: woken.append(kh) or 0)
    t.add(5, source.fd, "view")
    t.write(5, b"x")
    assert t.poll(5, 42) == abi.DEFAULT_POLLMASK
    source.peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    source.peer.close()                                   # RST: EPOLLERR on ours
    assert wait_for(lambda: t.counts["gone"] == 1)
    assert woken == [42] and t.poll(5, None) == NO_TRIGGER
    time.sleep(0.2)
    assert t.counts["gone"] == 1 and woken == [42]       # reported once, not at every wait
    t.stop()


# ------------------------------------------------------------------ kept by a holder


class Keeper:
    """held.Lease's side of the holder: what it was told, and the descriptors kept (dups,
    as SCM_RIGHTS gives the holder)."""

    def __init__(self, answer: bool = True) -> None:
        self.kept: dict[int, tuple[bytes, int]] = {}
        self.told: list[tuple[str, int]] = []
        self.answer = answer

    def keep(self, fh: int, record: bytes, fd: int | None = None) -> bool:
        self.told.append(("keep", fh))
        if fd is not None:
            self.kept[fh] = (record, os.dup(fd))
        elif fh in self.kept:
            self.kept[fh] = (record, self.kept[fh][1])
        return self.answer

    def drop(self, fh: int) -> bool:
        self.told.append(("drop", fh))
        record_fd = self.kept.pop(fh, None)
        if record_fd is not None:
            os.close(record_fd[1])
        return self.answer

    def handed_on(self) -> list[tuple[int, bytes, int]]:
        out = [(fh, rec, os.dup(fd)) for fh, (rec, fd) in self.kept.items()]
        return out

    def close(self) -> None:
        for _, fd in self.kept.values():
            os.close(fd)


def test_every_state_change_is_told_to_the_keeper_and_a_release_drops_it(source):
    k = Keeper()
    t = Triggers(lambda kh: 0, keeper=k)
    t.add(5, source.fd, "view")
    t.write(5, b"some 1 2\0")                     # armed
    t.poll(5, 77)                                 # the kernel's handle learnt
    t.poll(5, 77)                                 # nothing new: not told again
    source.fire()
    assert wait_for(lambda: t.counts["fired"] == 1)
    assert t.poll(5, 77) == PRI                   # consumed: told
    assert k.told == [("keep", 5)] * 5
    record = k.kept[5][0]
    assert b'"armed":true' in record and b'"fired":false' in record and b'"kh":77' in record
    t.release(5)
    assert k.told[-1] == ("drop", 5) and 5 not in k.kept
    t.stop()


def test_a_successor_adopts_a_trigger_as_it_was_and_sees_what_fired_meanwhile(source):
    """The predecessor dies (stop closes its descriptors; the keeper's dup keeps the
    trigger); an event fires before the successor serves; it adopts, wakes the kernel's
    handle, and reports the event once."""
    k = Keeper()
    first = Triggers(lambda kh: 0, keeper=k)
    first.add(5, source.fd, "view")
    first.write(5, b"some 1 2\0")
    first.poll(5, 77)
    first.stop()                                   # the death: its descriptor closed
    source.fire()                                  # while no daemon serves
    woken: list[int] = []
    second = Triggers(lambda kh: woken.append(kh) or 0, keeper=k)
    second.adopt(k.handed_on())
    assert second.counts["adopted"] == 1 and 5 in second
    assert wait_for(lambda: second.counts["fired"] == 1)
    assert 77 in woken                             # the waiting poll asked again
    assert second.poll(5, None) == PRI and second.poll(5, None) == abi.DEFAULT_POLLMASK
    second.release(5)
    assert 5 not in k.kept
    second.stop()
    k.close()


def test_an_adopted_unarmed_or_bad_record_is_kept_as_it_was_or_dropped():
    k = Keeper()
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    t = Triggers(lambda kh: 0, keeper=k)
    t.adopt([(1, b'{"owner":"v","armed":false,"fired":false,"gone":false,"kh":null}', r1),
             (2, b"not json", r2)])
    assert 1 in t and 2 not in t and closed(r2)
    assert t.poll(1, None) == NO_TRIGGER           # opened, no trigger written yet
    assert t._owned["v"] == 1                      # its view's share counted
    t.stop()
    assert closed(r1)
    for fd in (w1, w2):
        os.close(fd)


def test_a_keeper_that_cannot_be_told_is_counted(source):
    k = Keeper(answer=False)
    t = Triggers(lambda kh: 0, keeper=k)
    t.add(5, source.fd, "view")
    t.release(5)
    assert t.counts["untold"] == 2
    t.stop()
    k.close()
