"""guestfs's mfusepy-style operations served through this engine: the module
``--fuse-binding guestfs`` loads in place of mfusepy.

``guestfs.daemon.fusefs.make_operations(fuse, ...)`` is written against mfusepy's API
with ``raw_fi=True``; this module is a ``fuse`` for it offering exactly what it uses:
``Operations`` (a base whose missing methods mean "not implemented", as mfusepy skips
them), ``FuseOSError``, ``fuse_get_context()`` (the uid, gid and pid of the request being
answered, from its in_header) and ``FUSE(ops, mountpoint, raw_fi=True, **options)``,
which serves until SIGTERM, SIGINT, SIGHUP or SIGQUIT, or until the mount goes.

What libfuse3's high-level layer does for such an object, ``OperationsFilesystem`` does
here: paths for node ids, ``init_with_config(conn, config)`` with libfuse3's capability
bits and a config whose ``attr_timeout`` is read at every reply (fusefs lowers it when it
leaves the page cache), file-info objects whose ``fh``, ``direct_io``, ``keep_cache``,
``nonseekable`` and ``noflush`` become the OPEN reply, the libfuse defaults for callbacks
the object leaves out (open, release, opendir, releasedir succeed; flush, access answer
ENOSYS, so the kernel stops sending them), and an ENOSYS from open passed to the kernel
(which then opens without asking: no_open).
"""

from __future__ import annotations

import errno
import logging
import os
import select
import signal
import threading
from collections.abc import Sequence
from typing import Any

from guestfs.fuse import abi, mountfd
from guestfs.fuse.session import (
    STOP_SIGNALS,
    Negotiated,
    Opened,
    Options,
    Session,
    StatFs,
    current,
)

log = logging.getLogger("guestfs.fuse")

# libfuse3's FUSE_CAP_* (fuse_common.h) for the kernel's INIT flags: conn.capable and
# conn.want speak these. Most share the kernel's bit; PARALLEL_DIROPS and the rest differ.
LIBFUSE_CAPS = {
    abi.ASYNC_READ: 1 << 0, abi.POSIX_LOCKS: 1 << 1, abi.ATOMIC_O_TRUNC: 1 << 3,
    abi.EXPORT_SUPPORT: 1 << 4, abi.DONT_MASK: 1 << 6, abi.SPLICE_WRITE: 1 << 7,
    abi.SPLICE_MOVE: 1 << 8, abi.SPLICE_READ: 1 << 9, abi.FLOCK_LOCKS: 1 << 10,
    abi.HAS_IOCTL_DIR: 1 << 11, abi.AUTO_INVAL_DATA: 1 << 12, abi.DO_READDIRPLUS: 1 << 13,
    abi.READDIRPLUS_AUTO: 1 << 14, abi.ASYNC_DIO: 1 << 15, abi.WRITEBACK_CACHE: 1 << 16,
    abi.NO_OPEN_SUPPORT: 1 << 17, abi.PARALLEL_DIROPS: 1 << 18, abi.POSIX_ACL: 1 << 19,
    abi.HANDLE_KILLPRIV: 1 << 20, abi.CACHE_SYMLINKS: 1 << 23,
    abi.NO_OPENDIR_SUPPORT: 1 << 24, abi.EXPLICIT_INVAL_DATA: 1 << 25,
}


def libfuse_caps(flags: int) -> int:
    return sum(cap for bit, cap in LIBFUSE_CAPS.items() if flags & bit)


class FuseOSError(OSError):
    def __init__(self, err: int) -> None:
        super().__init__(err, os.strerror(err))


class Operations:
    """Base of an operations class: a callback it does not define is not implemented."""


def fuse_get_context() -> tuple[int, int, int]:
    req = current()
    return (0, 0, 0) if req is None else (req.uid, req.gid, req.pid)


class FileInfo:
    """The struct fuse_file_info fields a raw_fi operations object reads and sets."""
    __slots__ = ("flags", "fh", "direct_io", "keep_cache", "nonseekable", "noflush",
                 "cache_readdir", "lock_owner", "flush", "writepage",
                 "parallel_direct_writes")

    def __init__(self, fh: int = 0, flags: int = 0, lock_owner: int = 0) -> None:
        self.flags = flags
        self.fh = fh
        self.lock_owner = lock_owner
        self.direct_io = self.keep_cache = self.nonseekable = self.noflush = 0
        self.cache_readdir = self.flush = self.writepage = self.parallel_direct_writes = 0

    def open_flags(self) -> int:
        return ((abi.FOPEN_DIRECT_IO if self.direct_io else 0)
                | (abi.FOPEN_KEEP_CACHE if self.keep_cache else 0)
                | (abi.FOPEN_NONSEEKABLE if self.nonseekable else 0)
                | (abi.FOPEN_NOFLUSH if self.noflush else 0)
                | (abi.FOPEN_CACHE_DIR if self.cache_readdir else 0))


class ConnInfo:
    """libfuse3's struct fuse_conn_info, as far as an init_with_config reads it."""

    def __init__(self, neg: Negotiated) -> None:
        self.proto_major = neg.major
        self.proto_minor = neg.minor
        self.max_write = neg.max_write
        self.max_read = neg.max_read
        self.max_readahead = neg.max_readahead
        self.capable = libfuse_caps(neg.kernel_flags)
        self.want = libfuse_caps(neg.flags)
        self.max_background = 0
        self.congestion_threshold = 0
        self.time_gran = neg.time_gran
        # Not libfuse's: FUSE_ALLOW_IDMAP was negotiated (idmapped binds are accepted).
        self.idmap = neg.idmap


class Config:
    """libfuse3's struct fuse_config: the timeouts every reply carries."""

    def __init__(self, attr_timeout: float, entry_timeout: float) -> None:
        self.attr_timeout = attr_timeout
        self.entry_timeout = entry_timeout
        self.negative_timeout = 0.0
        self.use_ino = self.direct_io = self.kernel_cache = self.auto_cache = 0
        self.set_uid = self.set_gid = self.set_mode = self.uid = self.gid = self.umask = 0


def _times(attrs: dict[str, Any], key: str, use_ns: bool) -> int:
    value = attrs.get(key, 0)
    return int(value) if use_ns else int(round(float(value) * 10**9))


def to_attr(attrs: dict[str, Any], use_ns: bool) -> abi.Attr:
    return abi.Attr(mode=int(attrs.get("st_mode", 0)), size=int(attrs.get("st_size", 0)),
                    nlink=int(attrs.get("st_nlink", 1)),
                    mtime_ns=_times(attrs, "st_mtime", use_ns),
                    ctime_ns=_times(attrs, "st_ctime", use_ns),
                    atime_ns=_times(attrs, "st_atime", use_ns),
                    uid=int(attrs.get("st_uid", 0)), gid=int(attrs.get("st_gid", 0)),
                    blocks=int(attrs.get("st_blocks", 0)),
                    blksize=int(attrs.get("st_blksize", 4096)))


def _checked(rc: Any) -> Any:
    # fusepy's convention beside raising: a negative int return is -errno.
    if isinstance(rc, int) and rc < 0:
        raise OSError(-rc, os.strerror(-rc))
    return rc


class Notifier:
    """The kernel notifications an operations object may send, by path: what it is given
    (``use_notifier``) once INIT is answered or a taken-over connection serves. Each
    returns 0 or the errno the kernel answered with (ENOENT: it holds no such inode or
    entry, the normal answer for one it has forgotten)."""

    def __init__(self, session: Session) -> None:
        self._session = session

    def inval_inode(self, path: str, pages: bool = True) -> int:
        """Drop ``path``'s cached attributes, and its cached pages unless ``pages`` is
        False (FUSE_NOTIFY_INVAL_INODE)."""
        nodeid = self._session.inodes.nodeid(path)
        if nodeid is None:     # never looked up, or forgotten: nothing cached to drop
            return errno.ENOENT
        err = self._session.notify_inval_inode(nodeid, 0 if pages else -1, 0)
        if err == errno.ENOENT and self._session.inodes.nodeid(path) == nodeid:
            # Looked up and not forgotten, yet unknown to the kernel: the reply that
            # named it is still being taken in (measured: a notification sent while the
            # kernel made the inode of a LOOKUP just answered failed so, and the
            # attributes that reply carried then stayed cached). Not yet, rather than
            # never: the caller tries again.
            return errno.EAGAIN
        return err

    def poll(self, kh: int) -> int:
        """Wake the poll() sleeping on open file ``kh`` (FUSE_NOTIFY_POLL)."""
        return self._session.notify_poll(kh)

    def inval_entry(self, parent: str, name: str) -> int:
        """Drop the kernel's entry ``name`` of directory ``parent``
        (FUSE_NOTIFY_INVAL_ENTRY): the kernel then forgets the inodes under it."""
        nodeid = self._session.inodes.nodeid(parent)
        if nodeid is None:
            return errno.ENOENT
        return self._session.notify_inval_entry(nodeid, name)


class OperationsFilesystem:
    """session.Filesystem over an mfusepy-style (raw_fi) operations object. Beyond
    mfusepy's API, an object may define ``use_notifier(Notifier)`` (called after its
    init) and ``attr_valid(path)``, the attribute timeout of one path's replies (None:
    the config's), which libfuse's one timeout for every reply cannot offer."""

    def __init__(self, ops: Any, attr_timeout: float = 1.0, entry_timeout: float = 1.0) -> None:
        self.ops = ops
        self.config = Config(attr_timeout, entry_timeout)
        self.use_ns = bool(getattr(ops, "use_ns", False))
        self.session: Session | None = None     # set by FUSE once it has one
        self._attr_valid = self._op("attr_valid")

    @property
    def entry_timeout(self) -> float:
        return float(self.config.entry_timeout)

    def _op(self, name: str) -> Any:
        return getattr(self.ops, name, None)

    def _call(self, name: str, *args: Any) -> Any:
        try:
            return _checked(getattr(self.ops, name)(*args))
        except OSError:
            raise
        except Exception:
            # mfusepy's answer to a callback's bug, logged as it logs it.
            log.exception("FUSE operation %s raised; answering EINVAL", name)
            raise OSError(errno.EINVAL, "operation failed") from None

    def init(self, negotiated: Negotiated) -> None:
        if self._op("init_with_config") is not None:
            self._call("init_with_config", ConnInfo(negotiated), self.config)
        elif self._op("init") is not None:
            self._call("init", "/")
        if self.session is not None and self._op("use_notifier") is not None:
            self._call("use_notifier", Notifier(self.session))

    def getattr(self, path: str, fh: int | None) -> tuple[abi.Attr, float]:
        attrs = self._call("getattr", path, None if fh is None else FileInfo(fh))
        valid = self._attr_valid(path) if self._attr_valid is not None else None
        return to_attr(attrs, self.use_ns), float(
            self.config.attr_timeout if valid is None else valid)

    def open(self, path: str, flags: int) -> Opened:
        fi = FileInfo(flags=flags)
        if self._op("open") is not None:
            self._call("open", path, fi)
        return Opened(int(fi.fh), fi.open_flags())

    def read(self, path: str, fh: int, offset: int, size: int, lock_owner: int,
             flags: int) -> bytes:
        if self._op("read") is None:
            raise OSError(errno.ENOSYS, "no read")
        data = self._call("read", path, size, offset, FileInfo(fh, flags, lock_owner))
        return bytes(data or b"")

    def release(self, path: str, fh: int, flags: int) -> None:
        if self._op("release") is not None:
            self._call("release", path, FileInfo(fh, flags))

    def opendir(self, path: str, flags: int) -> Opened:
        if self._op("opendir") is None:
            # Answered, as libfuse does, rather than ENOSYS: a kernel that then opens
            # directories itself (no_opendir) also caches their listing (FOPEN_CACHE_DIR),
            # and a per-container root's listing grows as containers are looked up.
            return Opened(0, 0)
        return Opened(int(self._call("opendir", path) or 0), 0)

    def readdir(self, path: str, fh: int) -> Sequence[tuple[str, int]]:
        if self._op("readdir") is None:
            raise OSError(errno.ENOSYS, "no readdir")
        out: list[tuple[str, int]] = []
        for item in self._call("readdir", path, fh):
            if isinstance(item, str):
                out.append((item, 0))
                continue
            name, attrs = item[0], item[1]
            mode = attrs if isinstance(attrs, int) else \
                int(attrs.get("st_mode", 0)) if isinstance(attrs, dict) else 0
            out.append((name, mode))
        return out

    def releasedir(self, path: str, fh: int) -> None:
        if self._op("releasedir") is not None:
            self._call("releasedir", path, fh)

    def statfs(self, path: str) -> StatFs:
        if self._op("statfs") is None:
            return StatFs(bsize=512, frsize=512)   # libfuse's answer without one
        st = self._call("statfs", path)
        return StatFs(bsize=int(st.get("f_bsize", 512)), frsize=int(st.get("f_frsize", 0)),
                      namelen=int(st.get("f_namemax", 255)),
                      blocks=int(st.get("f_blocks", 0)), bfree=int(st.get("f_bfree", 0)),
                      bavail=int(st.get("f_bavail", 0)), files=int(st.get("f_files", 0)),
                      ffree=int(st.get("f_ffree", 0)))

    def access(self, path: str, mask: int) -> None:
        if self._op("access") is None:
            raise OSError(errno.ENOSYS, "no access")
        self._call("access", path, mask)

    def flush(self, path: str, fh: int, lock_owner: int) -> None:
        if self._op("flush") is None:
            raise OSError(errno.ENOSYS, "no flush")   # the kernel stops sending FLUSH
        self._call("flush", path, FileInfo(fh, 0, lock_owner))

    def write(self, path: str, fh: int, offset: int, data: bytes) -> int:
        if self._op("write") is None:
            raise OSError(errno.EROFS, "read-only")
        return int(self._call("write", path, data, offset, FileInfo(fh)))

    def poll(self, path: str, fh: int, kh: int | None, events: int) -> int:
        """Not mfusepy's poll (libfuse3's hands a poll handle): ``poll_events(path, fi,
        kh, events)`` returns the revents, and a ``kh`` given is named to Notifier.poll when
        they change. Without one, what a file without poll support reports (answering
        ENOSYS would turn poll off for the whole connection)."""
        if self._op("poll_events") is None:
            return abi.DEFAULT_POLLMASK
        return int(self._call("poll_events", path, FileInfo(fh), kh, events))

    def destroy(self) -> None:
        if self._op("destroy") is not None:
            self._call("destroy", "/")


def _connection(mountpoint: str, options: dict[str, Any]) -> tuple[int, mountfd.Mounted | None]:
    """The descriptor to serve: ours to read (a dup of a given /dev/fd/N, as libfuse3
    takes one) and the mount made for it, if we made it."""
    if mountpoint.startswith("/dev/fd/"):
        return os.dup(int(mountpoint[len("/dev/fd/"):])), None
    spec = mountfd.MountSpec(mountpoint, str(options.get("fsname", "guestfs")),
                             str(options.get("subtype", options.get("fsname", "guestfs"))),
                             bool(options.get("allow_other")),
                             bool(options.get("default_permissions")),
                             bool(options.get("ro", True)))
    m = mountfd.mount(spec)
    return os.dup(m.fd), m


def run_session(session: Session, wake_r: int) -> None:
    """Serve until a stop signal (main thread only) or the end of the connection. A
    session given its predecessor's parameters takes the connection over."""
    stopped: list[int] = []
    main = threading.current_thread() is threading.main_thread()
    previous: dict[int, Any] = {}
    old_wakeup = -1
    if main:
        old_wakeup = signal.set_wakeup_fd(session.wake_fd)   # type: ignore[arg-type]
        for sig in STOP_SIGNALS:
            previous[sig] = signal.signal(sig, lambda s, _f: stopped.append(s))
    try:
        if session.initialised.is_set():
            err = session.take_over()
            if err:
                log.warning("FUSE_NOTIFY_RESEND failed (%s): requests the previous daemon "
                            "read and never answered stay unanswered", os.strerror(err))
        else:
            session.start()
        while not stopped and not session.ended.is_set():
            select.select([wake_r], [], [])
            while True:
                try:
                    if not os.read(wake_r, 64):
                        break
                except BlockingIOError:
                    break
    finally:
        if main:
            signal.set_wakeup_fd(old_wakeup)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    if stopped:
        log.debug("stopping on signal %d", stopped[0])


class FUSE:
    """Mount (or take ``/dev/fd/N``), serve ``operations`` and return once stopped.
    Options as guestfs's mount passes them to mfusepy: attr_timeout, entry_timeout,
    fsname, subtype, allow_other, default_permissions, ro; the libfuse-only ones
    (foreground, nothreads, max_idle_threads) mean nothing here. The engine's own:
    ``negotiated`` (a successor's: the predecessor's INIT parameters, as JSON),
    ``on_negotiated`` (told them, as JSON, once INIT is answered) and ``resolver``
    (every path the operations may serve: a successor's names for the predecessor's
    node ids)."""

    def __init__(self, operations: Any, mountpoint: str, raw_fi: bool = False,
                 **options: Any) -> None:
        if not raw_fi:
            raise TypeError("the guestfs FUSE engine serves raw_fi operations only")
        fs = OperationsFilesystem(operations, float(options.get("attr_timeout", 1.0)),
                                  float(options.get("entry_timeout", 1.0)))
        try:
            fd, made = _connection(mountpoint, options)
        except OSError as e:
            # As libfuse's FUSE() fails: the daemon logs it in one line and exits 1.
            raise RuntimeError(f"cannot mount {mountpoint}: {e.strerror or e}") from None
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        given = options.get("negotiated")
        told = options.get("on_negotiated")
        self.session = Session(
            fd, fs, Options(default_permissions=bool(options.get("default_permissions"))),
            negotiated=Negotiated.from_json(given) if given else None, wake_fd=wake_w,
            on_init=(lambda neg: told(neg.to_json())) if told else None,
            resolver=options.get("resolver"))
        fs.session = self.session
        try:
            run_session(self.session, wake_r)
        finally:
            # Before anything the answers read is closed: a worker answering from a host
            # file whose descriptor number was closed and reused would serve another file.
            if not self.session.quiesce():
                log.warning("requests still being answered 5 s after the stop")
            os.close(wake_r)
            if made is not None:
                mountfd.unmount(made)
                os.close(made.fd)
        # ``fd`` stays open: a worker may still be blocked reading it, and a closed number
        # could be reused under it. The unmount ends the connection (ENODEV wakes the
        # workers); the process's exit closes the descriptor.
        if self.session.failure:
            raise RuntimeError(self.session.failure)
