"""The supervisor's side of seccomp user notification: receive a notified call, read or
write the caller's memory safely, answer it.

Answering rules, all from seccomp_unotify(2):
- the caller's memory is copied with process_vm_readv(2)/process_vm_writev(2), which
  never force: a write fails with EFAULT where the caller's page is not writable when
  the kernel takes it for the copy, as the kernel's own copy_to_user would, and the
  caller gets EFAULT as from the kernel. No map is read first, so there is no
  check-then-write window of ours (a /proc/PID/mem write may go through read-only pages:
  FOLL_FORCE). The kernel's own is narrow: mm/process_vm_access.c pins the pages under
  the mmap lock and copies right after dropping it, so an mprotect() completing in
  between lets the copy for a call already under way land just after the page turned
  read-only; a call begun after that never writes it (tests/test_real_seccomp_mprotect);
- every copy is preceded by SECCOMP_IOCTL_NOTIF_ID_VALID (CallerMemory);
- whatever cannot be answered is passed back to the kernel with
  SECCOMP_USER_NOTIF_FLAG_CONTINUE, which runs the real call: the app gets the host's
  answer, never a failure the kernel would not have given.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import logging
import os
import queue
import select
import struct
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from guestfs.system import libc

log = logging.getLogger("guestfs.seccomp")

# _IOWR('!', 0, struct seccomp_notif), _IOWR('!', 1, struct seccomp_notif_resp),
# _IOW('!', 2, __u64): the same on x86-64 and arm64.
_NOTIF = struct.Struct("=QIIiIQ6Q")        # id, pid, flags, data.nr, .arch, .ip, .args[6]
_RESP = struct.Struct("=QqiI")             # id, val, error, flags
IOCTL_NOTIF_RECV = 0xC0000000 | (_NOTIF.size << 16) | (0x21 << 8) | 0
IOCTL_NOTIF_SEND = 0xC0000000 | (_RESP.size << 16) | (0x21 << 8) | 1
IOCTL_NOTIF_ID_VALID = 0x40000000 | (8 << 16) | (0x21 << 8) | 2
IOCTL_NOTIF_SET_FLAGS = 0x40000000 | (8 << 16) | (0x21 << 8) | 4
FLAG_CONTINUE = 1
FD_SYNC_WAKE_UP = 1        # SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP, Linux 6.6


class _IOVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class _BytesIOVec(ctypes.Structure):
    # The local side of a write: a bytes object's own buffer, no copy, no cast.
    _fields_ = [("base", ctypes.c_char_p), ("len", ctypes.c_size_t)]




@dataclass(frozen=True)
class Notification:
    id: int
    pid: int        # the calling thread's id, in our pid namespace
    nr: int
    arch: int
    args: tuple[int, ...]


class Gone(Exception):
    """The caller's memory cannot be reached (its call withdrawn: it was killed or took a
    signal; or the copy is refused, EPERM): the kernel answers its call."""


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


class CallerMemory:
    """The calling thread's memory, reached by its tid with process_vm_readv/writev.

    Those address a pid, not an fd opened earlier, so the question is when the pid still
    names the caller. SECCOMP_IOCTL_NOTIF_ID_VALID succeeds only while the caller's thread
    is still blocked in this very call (not killed, not interrupted by a signal), and a
    blocked thread holds its tid. So it is checked immediately before each copy, once the
    answer is built: a call withdrawn before then is never written. Not after the copy:
    that could not undo a write, and the answer's SEND already fails (ENOENT) for a
    withdrawn call. Not a pidfd either: it pins the struct pid, not the number, which
    free_pid() releases when the task is reaped, so it cannot stop a reuse. What is left is
    the caller being killed, reaped and its tid handed to another process between the
    check and the copy, a few microseconds; the kernel allocates pids cyclically
    (idr_alloc_cyclic up to pid_max), so the same number comes back only after every other
    free pid has been handed out in between. The /proc/PID/mem scheme of the man page
    closes that window by pinning the mm at open(), at the price of writing through
    read-only pages (FOLL_FORCE) and of a maps check that races with the app's mprotect.
    """

    def __init__(self, listener: int, note: Notification) -> None:
        self.listener = listener
        self.note = note

    def _copy(self, fn: Callable[..., int], local: ctypes.Structure, addr: int,
              size: int) -> int:
        if not still_valid(self.listener, self.note.id):
            raise Gone("notification no longer valid")
        n = fn(self.note.pid, ctypes.byref(local), 1, ctypes.byref(_IOVec(addr, size)), 1, 0)
        if n >= 0:
            return n
        e = ctypes.get_errno()
        if e == errno.EFAULT:
            return 0
        raise Gone(f"process_vm copy for {self.note.pid}: {os.strerror(e)}")

    def read(self, addr: int, size: int) -> bytes:
        """``size`` bytes at ``addr``; OSError(EFAULT) where the caller could not read them."""
        buf = ctypes.create_string_buffer(size)
        local = _IOVec(ctypes.addressof(buf), size)
        if self._copy(libc.process_vm_readv, local, addr, size) != size:
            raise OSError(errno.EFAULT, f"reading {size} bytes at {addr:#x}")
        return buf.raw

    def write(self, addr: int, data: bytes) -> bool:
        """Write ``data`` where the caller may write it now; False (EFAULT: nothing, or the
        part before the first unwritable page, written) where it may not, as the kernel's
        copy_to_user."""
        n = len(data)
        return self._copy(libc.process_vm_writev, _BytesIOVec(data, n), addr, n) == n


@dataclass(frozen=True)
class Answer:
    val: int = 0
    error: int = 0          # a positive errno
    cont: bool = False      # let the kernel run the real call


CONTINUE = Answer(cont=True)
EFAULT = Answer(error=errno.EFAULT)     # a pointer the caller may not write, as the kernel
# A handler gets the notification and the caller's memory and returns the answer.
Handler = Callable[[Notification, CallerMemory], Answer]


def serve_one(listener: int, note: Notification, handlers: Mapping[int, Handler]) -> None:
    handler = handlers.get(note.nr)
    if handler is None:
        respond(listener, note.id, cont=True)
        return
    try:
        answer = handler(note, CallerMemory(listener, note))
    except Gone as e:
        # Never left unanswered: a caller we may not reach (EPERM) would block for good.
        # For one that is really gone the kernel refuses this (ENOENT).
        log.debug("syscall %d of %d: %s; the kernel answers it", note.nr, note.pid, e)
        answer = CONTINUE
    except Exception:   # noqa: BLE001 - any failure of ours: the kernel answers instead
        log.exception("answering syscall %d for %d; the kernel answers it", note.nr, note.pid)
        answer = CONTINUE
    respond(listener, note.id, answer.val, answer.error, answer.cont)


def sync_wake_up(listener: int) -> None:
    """Tell the kernel the caller and this supervisor take turns (the caller blocks until
    answered): the answer then switches to the caller on the supervisor's CPU instead of
    waking it on another. Older kernels (EINVAL) just wake it as before."""
    with contextlib.suppress(OSError):
        fcntl.ioctl(listener, IOCTL_NOTIF_SET_FLAGS, FD_SYNC_WAKE_UP)


@dataclass
class Served:
    """One listener a ListenerLoop answers, with its handlers (empty: every call goes to the
    kernel). ``on_gone`` takes it once no process of its filter is left (the listener
    then belongs to it); by default the loop closes it."""
    listener: int
    handlers: Mapping[int, Handler]
    name: str = "a listener"
    on_gone: Callable[[Served], None] | None = None
    served: int = 0


class ListenerLoop:
    """Answers seccomp listeners from one thread: `guestfs run`'s one, its successor's,
    or every container's of the seccomp agent. Listeners are added from any thread,
    through a queue and a wake-up pipe. A call of another architecture than
    ``audit_arch`` (a 32-bit one: its syscall numbers are another table's) goes to the
    kernel. With ``until_empty`` the thread ends once its last listener is gone."""

    def __init__(self, audit_arch: int | None = None, until_empty: bool = False) -> None:
        self.audit_arch = audit_arch
        self.until_empty = until_empty
        self.listeners: dict[int, Served] = {}
        self._incoming: queue.SimpleQueue[Served] = queue.SimpleQueue()
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="guestfs-seccomp",
                                        daemon=True)

    def start(self) -> ListenerLoop:
        self._thread.start()
        return self

    def add(self, served: Served) -> None:
        self._incoming.put(served)
        self._wake()

    def join(self) -> None:
        """Until the thread ends (``until_empty``: every listener gone) or stop()."""
        self._thread.join()

    def stop(self) -> None:
        self._stopping = True
        self._wake()
        self._thread.join(5)
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    def _loop(self) -> None:
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        while not self._stopping:
            for fd, ev in poller.poll():
                if fd == self._wake_r:
                    self._take_incoming(poller)
                elif ev & select.POLLIN:
                    if not self._answer(self.listeners[fd]):
                        self._drop(poller, fd)
                elif ev & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                    self._drop(poller, fd)
            if self.until_empty and not self.listeners and self._incoming.empty():
                return

    def _take_incoming(self, poller: select.poll) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self._wake_r, 4096)
        while not self._incoming.empty():
            served = self._incoming.get()
            self.listeners[served.listener] = served
            sync_wake_up(served.listener)
            poller.register(served.listener, select.POLLIN)

    def _answer(self, served: Served) -> bool:
        """One call answered; False when the listener cannot be read any more."""
        try:
            note = receive(served.listener)
        except OSError as e:
            # ENOENT: the caller was killed between poll and receive.
            if e.errno in (errno.ENOENT, errno.EINTR):
                return True
            log.warning("%s: seccomp listener: %s; no longer answered", served.name, e)
            return False
        try:
            if self.audit_arch is not None and note.arch != self.audit_arch:
                respond(served.listener, note.id, cont=True)
            else:
                serve_one(served.listener, note, served.handlers)
            served.served += 1
        except Exception:  # noqa: BLE001 - this thread answers every listener
            log.exception("%s: answering a call", served.name)
        return True

    def _drop(self, poller: select.poll, fd: int) -> None:
        """Every process of the filter has exited."""
        poller.unregister(fd)
        served = self.listeners.pop(fd)
        if served.on_gone is not None:
            served.on_gone(served)
        else:
            with contextlib.suppress(OSError):
                os.close(fd)
