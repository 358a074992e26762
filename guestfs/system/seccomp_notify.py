"""The supervisor's side of seccomp user notification: receive a notified call, read or
write the caller's memory safely, answer it.

Answering rules, all from seccomp_unotify(2):
- the caller's memory is reached through /proc/<tid>/mem opened *before* the notification
  is checked again with SECCOMP_IOCTL_NOTIF_ID_VALID, so a caller killed meanwhile (and
  its pid reused) is never written to;
- /proc/<tid>/mem writes ignore page protections, so the target range is checked writable
  first (PROCMAP_QUERY, or /proc/<tid>/maps on kernels before 6.11) and never more than
  the kernel itself would write is written;
- whatever cannot be answered is passed back to the kernel with
  SECCOMP_USER_NOTIF_FLAG_CONTINUE, which runs the real call: the app gets the host's
  answer, never a failure the kernel would not have given.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import select
import struct
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

log = logging.getLogger("guestfs.seccomp")

# _IOWR('!', 0, struct seccomp_notif), _IOWR('!', 1, struct seccomp_notif_resp),
# _IOW('!', 2, __u64): the same on x86-64 and arm64.
_NOTIF = struct.Struct("=QIIiIQ6Q")        # id, pid, flags, data.nr, .arch, .ip, .args[6]
_RESP = struct.Struct("=QqiI")             # id, val, error, flags
IOCTL_NOTIF_RECV = 0xC0000000 | (_NOTIF.size << 16) | (0x21 << 8) | 0
IOCTL_NOTIF_SEND = 0xC0000000 | (_RESP.size << 16) | (0x21 << 8) | 1
IOCTL_NOTIF_ID_VALID = 0x40000000 | (8 << 16) | (0x21 << 8) | 2
FLAG_CONTINUE = 1

# PROCMAP_QUERY: _IOWR('f', 17, struct procmap_query), Linux 6.11: size, query_flags,
# query_addr, vma_start, vma_end, vma_flags, vma_page_size, vma_offset, inode, dev_major,
# dev_minor, vma_name_size, build_id_size, vma_name_addr, build_id_addr.
_PROCMAP = struct.Struct("=9Q4I2Q")
_IOCTL_PROCMAP_QUERY = 0xC0000000 | (_PROCMAP.size << 16) | (0x66 << 8) | 17
_VMA_WRITABLE = 0x02


@dataclass(frozen=True)
class Notification:
    id: int
    pid: int        # the calling thread's id, in our pid namespace
    nr: int
    arch: int
    args: tuple[int, ...]


class Gone(Exception):
    """The caller's memory cannot be reached (it died, or /proc/<tid>/mem is refused):
    the kernel answers its call."""


def receive(listener: int) -> Notification:
    buf = bytearray(_NOTIF.size)          # RECV requires a zeroed struct
    fcntl.ioctl(listener, IOCTL_NOTIF_RECV, buf, True)
    nid, pid, _flags, nr, arch, _ip, *args = _NOTIF.unpack(buf)
    return Notification(nid, pid, nr, arch, tuple(args))


def respond(listener: int, nid: int, val: int = 0, error: int = 0,
            cont: bool = False) -> None:
    """Answer: a return value, a negated errno, or CONTINUE (the kernel runs the call).
    ENOENT means the caller is gone (killed, or its call interrupted): nothing to do."""
    with contextlib.suppress(FileNotFoundError):
        fcntl.ioctl(listener, IOCTL_NOTIF_SEND,
                    _RESP.pack(nid, val, -error if error else 0, FLAG_CONTINUE if cont else 0))


def still_valid(listener: int, nid: int) -> bool:
    try:
        fcntl.ioctl(listener, IOCTL_NOTIF_ID_VALID, struct.pack("=Q", nid))
    except FileNotFoundError:
        return False
    return True


def _range_writable_procmap(maps_fd: int, addr: int, end: int) -> bool:
    while addr < end:
        q = bytearray(_PROCMAP.pack(_PROCMAP.size, 0, addr, *[0] * 12))
        try:
            fcntl.ioctl(maps_fd, _IOCTL_PROCMAP_QUERY, q, True)
        except FileNotFoundError:       # no mapping covers addr
            return False
        fields = _PROCMAP.unpack(q)
        vma_end, vma_flags = fields[4], fields[5]
        if not vma_flags & _VMA_WRITABLE:
            return False
        addr = vma_end
    return True


def _range_writable_maps(text: str, addr: int, end: int) -> bool:
    for line in text.splitlines():
        span, perms = line.split()[:2]
        lo, hi = (int(x, 16) for x in span.split("-"))
        if hi <= addr:
            continue
        if lo > addr or perms[1] != "w":
            return False
        addr = hi
        if addr >= end:
            return True
    return False


def range_writable(pid: int, addr: int, size: int) -> bool:
    """Whether the caller could write [addr, addr+size) itself, as copy_to_user needs."""
    if addr <= 0 or size <= 0 or addr + size > 1 << 64:
        return False
    fd = os.open(f"/proc/{pid}/maps", os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            return _range_writable_procmap(fd, addr, addr + size)
        except OSError as e:
            if e.errno not in (errno.ENOTTY, errno.EINVAL):
                raise
        chunks = []
        while data := os.read(fd, 1 << 16):
            chunks.append(data)
        return _range_writable_maps(b"".join(chunks).decode("ascii", "replace"),
                                    addr, addr + size)
    finally:
        os.close(fd)


class CallerMemory:
    """The calling thread's memory, opened before the notification is re-validated."""

    def __init__(self, listener: int, note: Notification) -> None:
        try:
            self.fd = os.open(f"/proc/{note.pid}/mem", os.O_RDWR | os.O_CLOEXEC)
        except OSError as e:
            raise Gone(f"/proc/{note.pid}/mem: {e.strerror}") from e
        self.pid = note.pid
        if not still_valid(listener, note.id):
            os.close(self.fd)
            raise Gone("notification no longer valid")

    def read(self, addr: int, size: int) -> bytes:
        return os.pread(self.fd, size, addr)

    def write(self, addr: int, data: bytes) -> bool:
        """Write all of ``data`` where the caller may write; False (nothing written) where
        it may not, so the kernel's own EFAULT can answer."""
        if not range_writable(self.pid, addr, len(data)):
            return False
        return os.pwrite(self.fd, data, addr) == len(data)

    def close(self) -> None:
        os.close(self.fd)


@dataclass(frozen=True)
class Answer:
    val: int = 0
    error: int = 0          # a positive errno
    cont: bool = False      # let the kernel run the real call


CONTINUE = Answer(cont=True)
# A handler gets the notification and the caller's memory and returns the answer.
Handler = Callable[[Notification, CallerMemory], Answer]


def serve_one(listener: int, note: Notification, handlers: Mapping[int, Handler]) -> None:
    handler = handlers.get(note.nr)
    if handler is None:
        respond(listener, note.id, cont=True)
        return
    try:
        mem = CallerMemory(listener, note)
    except Gone as e:
        # Never left unanswered: a caller we may not open (EACCES, a sandboxed /proc) would
        # block for good. For one that is really gone the kernel refuses this (ENOENT).
        log.debug("syscall %d of %d: %s; the kernel answers it", note.nr, note.pid, e)
        respond(listener, note.id, cont=True)
        return
    try:
        answer = handler(note, mem)
    except Exception:   # noqa: BLE001 - any failure of ours: the kernel answers instead
        log.exception("answering syscall %d for %d; the kernel answers it", note.nr, note.pid)
        answer = CONTINUE
    finally:
        mem.close()
    respond(listener, note.id, answer.val, answer.error, answer.cont)


class NotificationLoop:
    """Answers one listener in a thread of its own, until every filtered process has
    exited (the listener then polls POLLHUP) or stop() is called."""

    def __init__(self, listener: int, handlers: Mapping[int, Handler]) -> None:
        self.listener = listener
        self.handlers = handlers
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC)
        self._thread = threading.Thread(target=self._loop, name="guestfs-seccomp", daemon=True)

    def start(self) -> NotificationLoop:
        self._thread.start()
        return self

    def _loop(self) -> None:
        poller = select.poll()
        poller.register(self.listener, select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while True:
            events = dict(poller.poll())
            if self._wake_r in events:
                return
            ev = events.get(self.listener, 0)
            if ev & select.POLLIN:
                try:
                    note = receive(self.listener)
                except OSError as e:
                    # ENOENT: the caller was killed between poll and recv.
                    if e.errno not in (errno.ENOENT, errno.EINTR):
                        log.warning("seccomp listener: %s", e)
                        return
                    continue
                serve_one(self.listener, note, self.handlers)
            elif ev & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                return

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        self._thread.join(5)
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)
