"""The serving loop over a /dev/fuse descriptor: INIT, then requests to a path-based
``Filesystem`` and their replies.

Several worker threads read the same descriptor (the kernel hands each request to one
reader); each request is decoded (``decode``), its node id turned into a path
(``inodes``), answered by the filesystem, and its reply written with one ``os.writev``.
Nothing a request does escapes the loop: an OSError from the filesystem is its errno,
anything else EIO (logged once per opcode). Every mutating opcode but WRITE is answered
EROFS (a WRITE goes to the filesystem, which takes PSI triggers and refuses the rest),
every other opcode this engine does not serve ENOSYS (the kernel then stops sending most
of them).

The parameters INIT agreed on are kept in a frozen ``Negotiated``: a process that takes
over an initialised connection (whose kernel sends no second INIT) serves it by passing
them to ``Session(..., negotiated=...)`` and may then ask the kernel to send again the
requests its predecessor read but never answered (``notify_resend``, 7.40).
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Protocol

from guestfs.fuse import abi
from guestfs.fuse.decode import (
    GetattrIn,
    InitIn,
    Malformed,
    OpenIn,
    PollIn,
    ReadIn,
    ReleaseIn,
    Request,
    WriteIn,
    decode,
)
from guestfs.fuse.inodes import DEFAULT_LIMIT, InodeTable, child, path_id

log = logging.getLogger("guestfs.fuse")

# The smallest the kernel allows: the only writes taken are PSI triggers (a line of text).
MAX_WRITE = 4096
MAX_PAGES = 256       # one READ of up to 1 MiB: a large host's cpuinfo in one request
# What one read(2) of the device must have room for: the kernel refuses a buffer smaller
# than FUSE_MIN_READ_BUFFER or than a WRITE of max_write with its headers.
BUFSIZE = abi.MIN_READ_BUFFER + MAX_WRITE
# Asked for wherever the kernel offers them. AUTO_INVAL_DATA: a changed mtime or size
# drops the cached pages (the page-cache path relies on it); ASYNC_READ and
# PARALLEL_DIROPS: readers are not serialised per inode; INIT_EXT: flags2.
WANT = (abi.ASYNC_READ | abi.BIG_WRITES | abi.AUTO_INVAL_DATA | abi.PARALLEL_DIROPS
        | abi.MAX_PAGES | abi.INIT_EXT)
OLDEST_MINOR = 12     # notifications (7.11-7.12); every kernel since 2.6.29
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
RESOLVE_INTERVAL = 0.2


@dataclass(frozen=True)
class Negotiated:
    """What INIT agreed on: all a successor needs to serve the same connection."""
    major: int
    minor: int             # min(kernel's, ours)
    kernel_minor: int
    kernel_flags: int      # what the kernel offered (flags | flags2 << 32)
    flags: int             # what was replied
    max_readahead: int
    max_write: int
    max_pages: int
    time_gran: int

    @property
    def max_read(self) -> int:
        return self.max_pages * 4096 if self.flags & abi.MAX_PAGES else 32 * 4096

    def offered(self, flag: int) -> bool:
        return bool(self.kernel_flags & flag)

    @property
    def idmap(self) -> bool:
        return bool(self.flags & abi.ALLOW_IDMAP)

    # json only when handing over (1.2 MiB of RSS otherwise, for every daemon).
    def to_json(self) -> str:
        import json
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Negotiated:
        import json
        return cls(**{k: int(v) for k, v in json.loads(text).items()})


@dataclass(frozen=True)
class Opened:
    fh: int = 0
    open_flags: int = 0      # abi.FOPEN_*


@dataclass(frozen=True)
class StatFs:
    bsize: int = 4096
    frsize: int = 4096
    namelen: int = 255
    blocks: int = 0
    bfree: int = 0
    bavail: int = 0
    files: int = 0
    ffree: int = 0


class Filesystem(Protocol):
    """Path-based operations; errors are raised as OSError(errno)."""
    entry_timeout: float

    def init(self, negotiated: Negotiated) -> None: ...
    def getattr(self, path: str, fh: int | None) -> tuple[abi.Attr, float]: ...
    def open(self, path: str, flags: int) -> Opened: ...
    def read(self, path: str, fh: int, offset: int, size: int, lock_owner: int,
             flags: int) -> bytes: ...
    def release(self, path: str, fh: int, flags: int) -> None: ...
    def opendir(self, path: str, flags: int) -> Opened: ...
    def readdir(self, path: str, fh: int) -> Sequence[tuple[str, int]]: ...
    def releasedir(self, path: str, fh: int) -> None: ...
    def statfs(self, path: str) -> StatFs: ...
    def access(self, path: str, mask: int) -> None: ...
    def flush(self, path: str, fh: int, lock_owner: int) -> None: ...
    def write(self, path: str, fh: int, offset: int, data: bytes) -> int: ...
    def poll(self, path: str, fh: int, kh: int | None, events: int) -> int: ...
    def destroy(self) -> None: ...


@dataclass(frozen=True)
class Options:
    # Workers reading the connection. Each request is a little Python between two system
    # calls, and every worker woken competes for the GIL. On 2 CPUs, per-caller reads/s
    # against LXCFS's in the same rounds (benchmarks/bench_workers.py, 3 rounds of 1000):
    # meminfo, 4 readers: 0.63x with 4 workers, 0.94x with 2, 1.39x with 1; 1 reader:
    # 1.06x, 1.28x, 0.89x (one worker makes a reader's asynchronous RELEASE wait in front
    # of its next open); stat, 4 readers: 0.30x, 0.35x, 0.54x. Two: better than four in
    # every row, and a slow request (a big cgroup's tasks read) never holds every reader,
    # as it would with one.
    threads: int = 2
    # default_permissions is a mount option; FUSE_ALLOW_IDMAP is only accepted with it
    # (without, the kernel fails the whole INIT), so it is offered only then.
    default_permissions: bool = True
    allow_idmap: bool = True
    inode_limit: int = DEFAULT_LIMIT


_context = threading.local()


def current() -> Request | None:
    """The request the calling worker thread is answering (its uid, gid and pid)."""
    return getattr(_context, "request", None)


class _Error(Exception):
    def __init__(self, err: int) -> None:
        self.err = err


class Session:
    def __init__(self, fd: int, fs: Filesystem, options: Options = Options(),
                 negotiated: Negotiated | None = None, wake_fd: int | None = None,
                 on_init: Callable[[Negotiated], None] | None = None,
                 resolver: Callable[[], Iterable[str]] | None = None) -> None:
        self.fd = fd
        self.fs = fs
        self.options = options
        self.inodes = InodeTable(options.inode_limit)
        self.negotiated = negotiated
        # Told once INIT is answered, or a taken-over connection serves (the holder).
        self.on_init = on_init
        # A successor's: every path it may serve, to name the node ids its predecessor
        # gave out (inodes.path_id is a hash of the path). Asked again, at most every
        # RESOLVE_INTERVAL, for an id not in the table.
        self.resolver = resolver
        self._resolved_at = -RESOLVE_INTERVAL
        self._resolve_lock = threading.Lock()
        self.wake_fd = wake_fd            # told (one byte) when the connection ends
        self.ended = threading.Event()
        self.initialised = threading.Event()
        if negotiated is not None:
            self.initialised.set()
        self.counts: Counter[str] = Counter()
        self.failure: str | None = None
        # quiesce(): no request is answered any more, and those being answered are done.
        self._stopping = False
        self._active = 0
        self._idle = threading.Condition()
        self._logged: set[str] = set()
        self._threads: list[threading.Thread] = []
        self._handlers: dict[int, Callable[[Request, str], None]] = {
            abi.GETATTR: self._getattr, abi.OPEN: self._open, abi.READ: self._read,
            abi.RELEASE: self._release, abi.OPENDIR: self._opendir,
            abi.READDIR: self._readdir, abi.RELEASEDIR: self._releasedir,
            abi.STATFS: self._statfs, abi.ACCESS: self._access, abi.FLUSH: self._flush,
            abi.WRITE: self._write, abi.POLL: self._poll,
        }

    # ------------------------------------------------------------ the loop

    def start(self, threads: int | None = None) -> None:
        for i in range(threads or self.options.threads):
            t = threading.Thread(target=self._worker, name=f"guestfs-fuse-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def _worker(self) -> None:
        # Stop signals are the main thread's (the adapter's FUSE() waits for them there).
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        while not self.ended.is_set():
            try:
                frame = os.read(self.fd, BUFSIZE)
            except OSError as e:
                if e.errno in (errno.EINTR, errno.EAGAIN, errno.ENOENT):
                    continue    # ENOENT: interrupted as it was read (libfuse restarts too)
                self._end(e.errno)
                return
            if not frame:
                self._end(0)
                return
            self.handle(frame)

    def _end(self, err: int) -> None:
        """The connection is over: unmounted or aborted (ENODEV, ECONNABORTED), or
        ``failure`` says why not."""
        if self.ended.is_set():
            return
        if err not in (0, errno.ENODEV, errno.ECONNABORTED):
            self.failure = f"reading /dev/fuse failed: {os.strerror(err)}"
        self.ended.set()
        if self.wake_fd is not None:
            with contextlib.suppress(OSError):
                os.write(self.wake_fd, b"\0")

    def quiesce(self, timeout: float = 5.0) -> bool:
        """Answer nothing from now on, and wait up to ``timeout`` for the requests being
        answered: what serve() calls before it closes anything those answers read. A
        request read afterwards is left unanswered: the kernel sends it again to a
        successor (RESEND), or fails it when the connection ends. False on timeout."""
        with self._idle:
            self._stopping = True
            return self._idle.wait_for(lambda: self._active == 0, timeout)

    def handle(self, frame: bytes) -> None:
        """Answer one frame (unless quiesced); never raises."""
        with self._idle:
            if self._stopping:
                self.counts["left unanswered"] += 1
                return
            self._active += 1
        try:
            self._handle(frame)
        finally:
            with self._idle:
                self._active -= 1
                # Only quiesce() waits (it sets _stopping under this lock first): no
                # notify per request otherwise.
                if self._active == 0 and self._stopping:
                    self._idle.notify_all()

    def _handle(self, frame: bytes) -> None:
        neg = self.negotiated
        req = decode(frame, neg.max_read, neg.max_write) if neg else decode(frame)
        if isinstance(req, Malformed):
            self.counts["malformed"] += 1
            self._log_once(f"bad {req.opcode}", "refused a request (%s): %s",
                           abi.opcode_name(req.opcode), req.reason)
            if req.reply:
                self._reply(req.unique, -req.errno)
            return
        _context.request = req
        err = 0
        try:
            self._dispatch(req)
        except _Error as e:
            err = e.err
        except OSError as e:
            err = e.errno if isinstance(e.errno, int) and e.errno > 0 else errno.EIO
        except Exception:   # noqa: BLE001 - a bug in one answer must not end the mount
            self.counts["exceptions"] += 1
            self._log_once(f"exc {req.opcode}", "%s failed; answering EIO",
                           abi.opcode_name(req.opcode), exc=True)
            err = errno.EIO
        finally:
            _context.request = None
        if err and req.opcode not in abi.NO_REPLY:
            self._reply(req.unique, -err)

    def _log_once(self, key: str, msg: str, *args: object, exc: bool = False) -> None:
        """Log a kind of trouble once (at most 256 kinds: bounded whatever comes)."""
        if key in self._logged or len(self._logged) > 256:
            return
        self._logged.add(key)
        log.warning(msg, *args, exc_info=exc)

    def _dispatch(self, req: Request) -> None:
        op = req.opcode
        if op == abi.INIT:
            self._init(req)
            return
        if self.negotiated is None:
            # As libfuse: nothing is served before INIT (a connection adopted without
            # its parameters would land here).
            if op in abi.NO_REPLY:
                return
            raise _Error(errno.EIO)
        handler = self._handlers.get(op)
        if handler is not None:
            handler(req, self._path(req.nodeid))
        elif op == abi.LOOKUP:
            self._lookup(req)
        elif op == abi.FORGET:
            self.inodes.forget(req.nodeid, req.arg)
        elif op == abi.BATCH_FORGET:
            for nodeid, nlookup in req.arg:
                self.inodes.forget(nodeid, nlookup)
        elif op == abi.INTERRUPT:
            # Every request is answered as soon as it is done; nothing to cut short.
            self.counts["interrupts"] += 1
        elif op == abi.DESTROY:
            self.fs.destroy()
            self._reply(req.unique, 0)
            self._end(0)
        elif op in abi.MUTATING:
            raise _Error(errno.EROFS)
        else:
            raise _Error(errno.ENOSYS)

    # ------------------------------------------------------------ replies

    def _reply(self, unique: int, error: int, *payload: bytes) -> bool:
        size = sum(map(len, payload)) if error == 0 else 0
        parts = [abi.out_header(size, error, unique), *payload] if error == 0 else \
            [abi.out_header(0, error, unique)]
        try:
            os.writev(self.fd, parts)
        except OSError as e:
            if e.errno == errno.ENOENT:   # interrupted, or aborted: nobody waits for it
                self.counts["unanswered"] += 1
                return False
            if e.errno in (errno.ENODEV, errno.ECONNABORTED):
                self._end(e.errno)
                return False
            self._log_once(f"reply {e.errno}", "a reply was refused: %s", e)
            return False
        return True

    def _notify(self, code: int, payload: bytes) -> int:
        """Send a notification; 0, or the errno the kernel answered the write with."""
        try:
            os.writev(self.fd, [abi.out_header(len(payload), code, 0), payload])
        except OSError as e:
            return e.errno or errno.EIO
        return 0

    def notify_inval_inode(self, nodeid: int, offset: int = 0, length: int = 0) -> int:
        """Drop the kernel's cached attributes of ``nodeid`` and its pages from
        ``offset`` (``length`` 0: to the end; a negative offset: attributes only).
        ENOENT: the kernel holds no such inode."""
        return self._notify(abi.NOTIFY_INVAL_INODE,
                            abi.NOTIFY_INVAL_INODE_OUT.pack(nodeid, offset, length))

    def notify_inval_entry(self, parent: int, name: str) -> int:
        raw = name.encode("utf-8", "surrogateescape")
        return self._notify(abi.NOTIFY_INVAL_ENTRY,
                            abi.NOTIFY_INVAL_ENTRY_OUT.pack(parent, len(raw), 0) + raw + b"\0")

    def notify_poll(self, kh: int) -> int:
        """Wake whoever sleeps in poll on the open file ``kh`` (FUSE_NOTIFY_POLL): the
        kernel polls it again. ENOENT: nobody polls it any more."""
        return self._notify(abi.NOTIFY_POLL, abi.NOTIFY_POLL_OUT.pack(kh))

    def notify_resend(self) -> int:
        """Have the kernel queue again every request read from this connection and not
        answered (7.40): what a successor sends once it serves."""
        return self._notify(abi.NOTIFY_RESEND, b"")

    # ------------------------------------------------------------ INIT

    def _init(self, req: Request) -> None:
        arg: InitIn = req.arg
        if arg.major > abi.MAJOR:
            # Ours is older: say which major we speak; the kernel sends INIT again.
            self._reply(req.unique, 0, abi.INIT_OUT.pack(abi.MAJOR, abi.MINOR, *(0,) * 11))
            return
        if arg.major < abi.MAJOR or arg.minor < OLDEST_MINOR:
            log.error("the kernel speaks FUSE %d.%d; this engine needs 7.%d or later",
                      arg.major, arg.minor, OLDEST_MINOR)
            raise _Error(errno.EPROTO)
        want = WANT
        if self.options.allow_idmap and self.options.default_permissions:
            want |= abi.ALLOW_IDMAP
        flags = arg.flags & want
        if not arg.flags & abi.INIT_EXT:
            flags &= (1 << 32) - 1
        neg = Negotiated(abi.MAJOR, min(arg.minor, abi.MINOR), arg.minor, arg.flags, flags,
                         arg.max_readahead, MAX_WRITE, MAX_PAGES, 1)
        self.fs.init(neg)
        out = abi.INIT_OUT.pack(abi.MAJOR, neg.minor, neg.max_readahead, flags & 0xFFFFFFFF,
                                0, 0, MAX_WRITE, neg.time_gran, MAX_PAGES, 0, flags >> 32,
                                0, 0)
        if arg.minor < 23:   # FUSE_COMPAT_22_INIT_OUT_SIZE
            out = out[:24]
        self.negotiated = neg
        if self._reply(req.unique, 0, out):
            self.initialised.set()
            if self.on_init is not None:
                self.on_init(neg)
            log.debug("FUSE %d.%d negotiated, flags %#x of %#x", neg.major, neg.minor,
                      flags, arg.flags)

    # ------------------------------------------------------------ requests

    def _path(self, nodeid: int) -> str:
        path = self.inodes.path(nodeid)
        if path is None and self.resolver is not None:
            path = self._resolve(nodeid)
        if path is None:
            raise _Error(errno.ESTALE)
        return path

    def _resolve(self, nodeid: int) -> str | None:
        """An id the kernel got from a predecessor: the resolver's paths adopted again
        (bounded by the table's limit), at most every RESOLVE_INTERVAL."""
        with self._resolve_lock:
            path = self.inodes.path(nodeid)
            now = time.monotonic()
            if path is None and now - self._resolved_at >= RESOLVE_INTERVAL:
                self._resolved_at = now
                assert self.resolver is not None
                self.counts["resolved"] += self.inodes.adopt(self.resolver())
                path = self.inodes.path(nodeid)
            return path

    def take_over(self) -> int:
        """A successor's first steps on an initialised connection, before its workers
        start: the filesystem's init, the predecessor's ids named, then every request it
        read and never answered sent again (0, or the errno of the RESEND)."""
        assert self.negotiated is not None
        self.fs.init(self.negotiated)
        if self.resolver is not None:
            self._resolve(abi.ROOT_ID + 1)
        self.start()
        err = self.notify_resend()
        self.counts["invalidated at takeover"] += self._invalidate_adopted()
        if self.on_init is not None:
            self.on_init(self.negotiated)    # the holder: this successor serves
        return err

    def _invalidate_adopted(self) -> int:
        """Drop what the kernel cached from the predecessor: attributes it may keep for
        long (a filesystem that pushes its changes gives long timeouts) of renderings
        this process never made, and so could never tell the kernel had changed. After
        the RESEND, with the workers running: an invalidation waits for the pages being
        filled, and those fills are requests the predecessor left for us to answer.
        ENOENT (an id the kernel never held or has forgotten) is the common answer."""
        return sum(self.notify_inval_inode(nodeid) == 0 for nodeid in self.inodes.adopted())

    def _lookup(self, req: Request) -> None:
        parent = self._path(req.nodeid)
        path = child(parent, req.arg.decode("utf-8", "surrogateescape"))
        attr, attr_valid = self.fs.getattr(path, None)
        nodeid = self.inodes.remember(path)
        out = abi.entry_out(nodeid, attr, self.fs.entry_timeout, attr_valid)
        if not self._reply(req.unique, 0, out):
            self.inodes.forget(nodeid, 1)     # the kernel never took this lookup

    def _getattr(self, req: Request, path: str) -> None:
        arg: GetattrIn = req.arg
        attr, valid = self.fs.getattr(path, arg.fh if arg.flags & abi.GETATTR_FH else None)
        self._reply(req.unique, 0, abi.attr_out(req.nodeid, attr, valid))

    def _open(self, req: Request, path: str) -> None:
        arg: OpenIn = req.arg
        o = self.fs.open(path, arg.flags)
        self._reply(req.unique, 0, abi.OPEN_OUT.pack(o.fh, o.open_flags, 0))

    def _read(self, req: Request, path: str) -> None:
        arg: ReadIn = req.arg
        lock_owner = arg.lock_owner if arg.read_flags & abi.READ_LOCKOWNER else 0
        data = self.fs.read(path, arg.fh, arg.offset, arg.size, lock_owner, arg.flags)
        self._reply(req.unique, 0, data[:arg.size])

    def _write(self, req: Request, path: str) -> None:
        arg: WriteIn = req.arg
        n = self.fs.write(path, arg.fh, arg.offset, arg.data)
        self._reply(req.unique, 0, abi.WRITE_OUT.pack(n, 0))

    def _poll(self, req: Request, path: str) -> None:
        """``kh`` goes to the filesystem only when the kernel will sleep on the file and
        waits for a NOTIFY_POLL naming it (notify_poll)."""
        arg: PollIn = req.arg
        kh = arg.kh if arg.flags & abi.POLL_SCHEDULE_NOTIFY else None
        revents = self.fs.poll(path, arg.fh, kh, arg.events)
        self._reply(req.unique, 0, abi.POLL_OUT.pack(revents, 0))

    def _release(self, req: Request, path: str) -> None:
        arg: ReleaseIn = req.arg
        self.fs.release(path, arg.fh, arg.flags)
        self._reply(req.unique, 0)

    def _opendir(self, req: Request, path: str) -> None:
        arg: OpenIn = req.arg
        o = self.fs.opendir(path, arg.flags)
        self._reply(req.unique, 0, abi.OPEN_OUT.pack(o.fh, o.open_flags, 0))

    def _readdir(self, req: Request, path: str) -> None:
        """Entries from index ``offset`` on, as many as fit in ``size``; each entry's
        offset is the index of the next (the kernel's next READDIR starts there)."""
        arg: ReadIn = req.arg
        entries = self.fs.readdir(path, arg.fh)
        parent = path.rsplit("/", 1)[0] or "/"
        out: list[bytes] = []
        used = 0
        for i in range(arg.offset, len(entries)):
            name, mode = entries[i]
            target = path if name == "." else parent if name == ".." else child(path, name)
            ino = abi.ROOT_ID if target == "/" else path_id(target)
            rec = abi.dirent(ino, i + 1, name.encode("utf-8", "surrogateescape"),
                             (mode & 0o170000) >> 12)
            if used + len(rec) > arg.size:
                break
            out.append(rec)
            used += len(rec)
        self._reply(req.unique, 0, b"".join(out))

    def _releasedir(self, req: Request, path: str) -> None:
        arg: ReleaseIn = req.arg
        self.fs.releasedir(path, arg.fh)
        self._reply(req.unique, 0)

    def _statfs(self, req: Request, path: str) -> None:
        s = self.fs.statfs(path)
        self._reply(req.unique, 0, abi.KSTATFS.pack(s.blocks, s.bfree, s.bavail, s.files,
                                                    s.ffree, s.bsize, s.namelen, s.frsize, 0))

    def _access(self, req: Request, path: str) -> None:
        self.fs.access(path, req.arg)
        self._reply(req.unique, 0)

    def _flush(self, req: Request, path: str) -> None:
        arg: ReleaseIn = req.arg
        self.fs.flush(path, arg.fh, arg.lock_owner)
        self._reply(req.unique, 0)
