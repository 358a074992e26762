"""The seccomp agent's side of its keeper guard (guestfs.syscalls.guard): find the
guard in the agent's directory, take back the listeners it kept from an earlier agent, or
start a guard when there is none.

Runtimes hand a container's listener over only when it starts, so the guard, which holds
a copy of every listener and outlives the agent, is what lets a restarted agent serve the
containers started before it. Layout of the agent's directory (0700, root's):

    agent.sock   the runtimes' listenerPath (seccomp_agent)
    guard.sock   the guard's SOCK_SEQPACKET socket: connect, receive the hand-back
    agent.lock   flock'd by an agent while it attaches: two agents starting at once
                 are serialised, and the second finds the first attached and refuses
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import select
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

from guestfs.syscalls.guard import (
    BUSY,
    END,
    HANDBACK_TIMEOUT,
    MAX_META,
    ListenerGuard,
    parse_message,
)
from guestfs.system.oneline import os_error_line
from guestfs.system.selfexec import SECCOMP_KEEPER, helper_argv

log = logging.getLogger("guestfs.seccomp")

GUARD_SOCKET = "guard.sock"
START_LOCK = "agent.lock"
Kept = list[tuple[int, bytes]]      # listener fds and their metadata
T = TypeVar("T")
BUSY_WAIT = 2.0      # seconds an agent retries a guard another agent is attached to
GUARD_POLL = 0.2     # seconds between an --external-guard agent's looks for its guard


class SocketError(OSError):
    """One line: what is wrong with a socket of the agent's directory, or the directory."""

    def __str__(self) -> str:
        return str(self.strerror if self.strerror is not None else self.args[0])


def describe(name: str, key: str | None) -> bytes:
    """The metadata the guard keeps with a listener (opaque to it)."""
    return json.dumps({"name": name, "key": key}).encode()


def described(meta: bytes) -> tuple[str, str | None]:
    """describe()'s name and key back; a key that is not one directory name is dropped
    (the kernel answers that container), so no metadata reaches outside SOURCE."""
    try:
        doc = json.loads(meta.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        doc = None
    doc = doc if isinstance(doc, dict) else {}
    name, key = doc.get("name"), doc.get("key")
    name = name[:200] if isinstance(name, str) else "a container of unknown state"
    if not isinstance(key, str) or key in ("", ".", "..") or "/" in key or "\0" in key:
        key = None
    return f"{name}, kept by the guard", key


# sockaddr_un's sun_path holds 108 bytes, the terminating NUL included.
MAX_SOCKET_PATH = 107


def owned_private_dir(d: str, sockets: tuple[str, ...] = (GUARD_SOCKET,)) -> None:
    """``d`` as a directory of ours, mode 0700, made if missing; its parent must exist: a
    typo in --socket must not make a tree of root's directories. ``sockets``: the names
    bound in it, checked first (Python's bind says only "AF_UNIX path too long")."""
    for name in sockets:
        path = os.path.join(d, name)
        if len(os.fsencode(path)) > MAX_SOCKET_PATH:
            raise SocketError(f"{path}: {len(os.fsencode(path))} bytes, longer than the "
                              f"{MAX_SOCKET_PATH} a unix socket's path may have; give a "
                              "socket directory with a shorter path")
    parent = os.path.dirname(os.path.abspath(d))
    try:
        if not stat.S_ISDIR(os.stat(parent).st_mode):
            raise NotADirectoryError
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    except (FileNotFoundError, NotADirectoryError):
        raise SocketError(f"{parent} does not exist: give a socket path in an existing "
                          "directory") from None
    except OSError as e:
        raise SocketError(e.errno, f"{d}: cannot make it ({e.strerror}): run as root, or "
                                   "give a socket directory this user may write") from None
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode):
        raise SocketError(f"{d} is not a directory (a symbolic link?)")
    if st.st_uid != os.geteuid():
        raise SocketError(f"{d} belongs to uid {st.st_uid}, not to us")
    if st.st_mode & 0o077:
        refuse_shared_dir(d, st, sockets)
        os.chmod(d, 0o700)     # ours: only root may hand the agent a listener


def refuse_shared_dir(d: str, st: os.stat_result, sockets: tuple[str, ...]) -> None:
    """A directory others may use is made 0700 only if it holds nothing but the agent's
    own files (an empty hostPath the kubelet made 0755): --socket /tmp/agent.sock or
    /run/agent.sock would otherwise have root lock every other user out of /tmp or /run."""
    ours = {*sockets, GUARD_SOCKET, START_LOCK}
    others = sorted(set(os.listdir(d)) - ours)
    if st.st_mode & stat.S_ISVTX or others:
        what = "is a shared directory (sticky)" if st.st_mode & stat.S_ISVTX else \
            f"holds other files ({', '.join(others[:3])}{', ...' if len(others) > 3 else ''})"
        raise SocketError(f"{d} {what}, mode {stat.S_IMODE(st.st_mode):04o}: the agent "
                          "makes its socket directory 0700; give the socket a directory "
                          "of its own (made if missing)")


def remove_stale(path: str, kind: int = socket.SOCK_STREAM,
                 what: str = "another seccomp agent") -> None:
    """Remove a socket nothing listens on; refuse a live one and anything else (a symlink
    planted there would otherwise have root bind or unlink where it points)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise SocketError(f"{path} exists and is not a socket (a symbolic link or a file?)")
    probe = socket.socket(socket.AF_UNIX, kind)
    try:
        probe.settimeout(1.0)
        probe.connect(path)
    except (ConnectionRefusedError, FileNotFoundError):
        os.unlink(path)        # stale: left by a process that was killed
        return
    except OSError:
        pass
    finally:
        probe.close()
    raise SocketError(f"{what} listens on {path}")


def bind_private(path: str, kind: int = socket.SOCK_STREAM) -> socket.socket:
    """A listening socket at ``path`` (its directory checked and stale socket removed by
    the caller) that no one but its owner could connect to at any moment."""
    sock = socket.socket(socket.AF_UNIX, kind)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(old)
    sock.listen(64)
    return sock


@contextlib.contextmanager
def start_lock(d: str) -> Iterator[None]:
    """Held while an agent (or a standalone guard) attaches and binds its sockets."""
    fd = os.open(os.path.join(d, START_LOCK),
                 os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def bind_keeper(d: str) -> socket.socket:
    """The guard's socket for a standalone guard (`guestfs seccomp-guard`); call it under
    start_lock. Refuses where a guard already listens."""
    path = os.path.join(d, GUARD_SOCKET)
    remove_stale(path, socket.SOCK_SEQPACKET, "a seccomp guard")
    return bind_private(path, socket.SOCK_SEQPACKET)


def _connect(path: str) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        sock.connect(path)
    except (FileNotFoundError, ConnectionRefusedError):
        sock.close()
        return None
    except OSError:
        sock.close()
        raise
    return sock


def receive_handback(sock: socket.socket, kept: Kept) -> bytes:
    """Append every listener the guard sends to ``kept``; END (and the guard's pid), BUSY,
    or b"" when the guard's end closed or stalled before END (it died mid hand-back)."""
    sock.settimeout(HANDBACK_TIMEOUT * 2)
    while True:
        try:
            msg, fds, flags, _addr = socket.recv_fds(sock, MAX_META + 1, 4)
        except OSError as e:
            log.warning("the seccomp guard's hand-back: %s", os_error_line(e))
            return b""
        got = parse_message(msg, fds, flags)
        if got is not None:
            kept.append(got)
        elif msg[:1] in (END, BUSY) or not msg:
            sock.settimeout(None)
            return msg


def attach(d: str, start: bool, kept: Kept) -> ListenerGuard | None:
    """Under start_lock: the guard of ``d``, attached, the listeners it kept appended to
    ``kept`` (fds of ours, with their metadata). No guard there: one is started, or with
    ``start`` false (the standalone guard's agent) None, and the caller waits outside the
    lock. A guard another agent is attached to: SocketError."""
    path = os.path.join(d, GUARD_SOCKET)
    busy_until = time.monotonic() + BUSY_WAIT
    while True:
        sock = _connect(path)
        if sock is None:
            break
        held = len(kept)
        end = receive_handback(sock, kept)
        if end[:1] == END:
            guard = ListenerGuard.attached(sock, int(end[1:]) if end[1:].isdigit() else 0)
            for fd, meta in kept[:held]:   # came from a guard that died mid hand-back
                guard.add(fd, meta)
            return guard
        sock.close()
        if end != BUSY:
            log.warning("the seccomp guard broke off its hand-back after %d listeners",
                        len(kept) - held)
            break
        if time.monotonic() >= busy_until:
            raise SocketError(f"another seccomp agent is attached to the guard on {path}")
        time.sleep(0.1)                  # an agent that is still stopping
    if not start:
        return None
    keeper = bind_keeper(d)
    try:
        guard = ListenerGuard(keeper)
    finally:
        keeper.close()                   # the guard's copy is the one that listens
    for fd, meta in kept:
        guard.add(fd, meta)
    return guard


def attach_waiting(d: str, start: bool, then: Callable[[], T]
                   ) -> tuple[T, ListenerGuard, Kept]:
    """Under start_lock: attach(), then ``then()`` (the agent binds its runtimes' socket),
    so two agents starting at once are serialised and the second finds the first attached
    and refuses before it could ever receive on a listener. Without ``start``, waits for
    `guestfs seccomp-guard`, outside the lock, which that guard takes to bind."""
    kept: Kept = []
    waiting = False
    while True:
        with start_lock(d):
            guard = attach(d, start, kept)
            if guard is not None:
                try:
                    return then(), guard, kept
                except BaseException:
                    guard.close()            # the guard continues their calls again
                    for fd, _meta in kept:
                        os.close(fd)
                    raise
        if not waiting:
            log.info("waiting for the seccomp guard in %s (guestfs seccomp-guard)", d)
            waiting = True
        time.sleep(GUARD_POLL)


class GuardLink:
    """The agent's guard, and every listener the agent holds with its metadata: if the
    guard dies while the agent lives (killed, its pod deleted), a watcher thread attaches
    to the next one (starting it, or waiting for the standalone one) and hands it every
    listener, so the agent's own death later still loses none."""

    def __init__(self, guard: ListenerGuard, d: str, start: bool,
                 restore: Callable[[int, bytes], None]) -> None:
        self.guard, self._dir, self._start, self._restore = guard, d, start, restore
        self._held: dict[int, bytes] = {}
        self._lock = threading.Lock()        # held and guard change together
        self._stopping = False
        threading.Thread(target=self._watch, name="guestfs-guard-watch", daemon=True).start()

    @property
    def pid(self) -> int:
        return self.guard.pid

    def add(self, listener: int, meta: bytes, hand_over: bool = True) -> None:
        with self._lock:
            self._held[listener] = meta
            if hand_over:
                self.guard.add(listener, meta)

    def forget(self, listener: int) -> None:
        """Close a listener whose processes have all exited (under the lock, so the
        watcher never hands over a closed or reused descriptor)."""
        with self._lock:
            self._held.pop(listener, None)
            os.close(listener)

    def close(self) -> None:
        with self._lock:
            self._stopping = True
            self.guard.close()

    def _watch(self) -> None:  # pragma: no cover - exercised by the real restart tests
        while True:
            poller = select.poll()
            poller.register(self.guard.fileno(), select.POLLIN)
            poller.poll()                    # the guard sends nothing: any event is its end
            if self._stopping:
                return
            log.warning("the seccomp guard (pid %d) is gone; attaching to a new one",
                        self.guard.pid)
            try:
                _none, guard, kept = attach_waiting(self._dir, self._start, lambda: None)
            except OSError as e:
                log.warning("the seccomp guard: %s; retrying", os_error_line(e))
                time.sleep(1.0)
                continue
            with self._lock:
                if self._stopping:
                    guard.close()
                    return
                self.guard.close()
                self.guard = guard
                for listener, meta in self._held.items():
                    guard.add(listener, meta)
                log.info("%d listeners handed to the new seccomp guard (guard pid %d)",
                         len(self._held), guard.pid)
            for fd, meta in kept:    # a new guard has none, but whatever it kept is ours
                self._restore(fd, meta)


def exec_standalone_guard(d: str) -> None:
    """`guestfs seccomp-guard`: bind DIR/guard.sock, then become ``python -I -S _boot.py
    --seccomp-keeper FD`` (the same pid: a container's main process), a guard that waits
    for agents and never exits on its own. Refuses where a guard already listens."""
    owned_private_dir(d)
    with start_lock(d):
        keeper = bind_keeper(d)
        os.set_inheritable(keeper.fileno(), True)
        argv = helper_argv(SECCOMP_KEEPER, str(keeper.fileno()))
        os.execv(argv[0], argv)     # the lock's fd is close-on-exec: released here
