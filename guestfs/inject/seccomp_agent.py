"""`guestfs seccomp-agent`: answers sysinfo(2) and sched_{get,set}affinity(2) for
containers guestfs does not start, each from its own directory of a per-container mount.

An OCI runtime whose seccomp profile notifies those calls (SCMP_ACT_NOTIFY) and names a
``listenerPath`` connects to that unix socket once per container process and sends, in
one sendmsg, the JSON container process state with the seccomp listener as SCM_RIGHTS
(runc's sendContainerProcessState, libcontainer/process_linux.go; crun does the same):

    {"ociVersion": "1.0.2", "fds": ["seccompFd"], "pid": 4242, "metadata": "...",
     "state": {"ociVersion": ..., "id": "ctr", "status": "creating", "pid": 4242,
               "bundle": "/path", "annotations": {...}}}

runc keeps its end open afterwards, so the state ends where its JSON object does (found
by JsonExtent, which also bounds its nesting before json.loads ever sees it). Hand-offs
are read concurrently, each in a thread of its own with its own deadline and size bound
(at most MAX_HANDOFFS at once), so a connection that says nothing delays no other
container's start. The agent finds the container's cgroup from /proc/<pid>/cgroup and answers from
SOURCE/<dir_key(cgroup)>/proc/meminfo and so on, the same directory the OCI hook binds
into that container, so its files and its system calls agree. One thread answers every
container (a node runs hundreds; calls are rare and answered in tens of microseconds);
hand-offs never hold it.

Every listener is also given to a guard (guestfs.syscalls.guard) with its
container's name and key; it continues their calls while no agent runs and hands them
back to the next agent, which serves them again at start (guestfs.syscalls.keeper).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from guestfs.sources.containerdirs import BadKey, container_cgroup, dir_key
from guestfs.sources.proc_cgroup import parse_proc_cgroup
from guestfs.syscalls.answers import (
    ServedView,
    interception_for,
    make_handlers,
    texts_under,
)
from guestfs.syscalls.filter import Arch, this_arch
from guestfs.syscalls.guard import peer_creds
from guestfs.syscalls.keeper import (
    GUARD_SOCKET,
    GuardLink,
    SocketError,
    attach_waiting,
    bind_private,
    describe,
    described,
    owned_private_dir,
    remove_stale,
)
from guestfs.syscalls.notify import Handler, ListenerLoop, Served
from guestfs.system.oneline import os_error_line

log = logging.getLogger("guestfs.seccomp")

# Not under /run/guestfs, `guestfs run`'s default mountpoint: a directory of our own,
# 0700 root, so only root (the runtime) can connect.
DEFAULT_AGENT_SOCKET = "/run/guestfs-seccomp/agent.sock"
MAX_STATE = 1 << 20       # bytes; runc's state carries the annotations, a few KiB at most
# Nesting of runc's and crun's state: the message, "state", "annotations" (3); more is
# not a state, and json.loads would recurse once per level (100k "[": RecursionError).
MAX_DEPTH = 8
HANDOFF_TIMEOUT = 2.0     # seconds a connection may take to send its whole state
MAX_HANDOFFS = 64         # hand-offs read at once; more wait for one of them to end
AGENT_WAIT = 0.02         # seconds a call waits for a view re-read (one loop serves all)
FIRST_READ_WAIT = 0.5     # seconds the hand-off waits for a container's first read
_SECCOMP_FD_LINK = "anon_inode:seccomp notify"


AgentError = SocketError


class StateError(ValueError):
    """A hand-off that is not a container process state."""


@dataclass(frozen=True)
class ProcessState:
    pid: int            # the process whose filter sent the listener, in our pid namespace
    container_id: str
    fd_index: int       # where "seccompFd" is among the fds received


class JsonExtent:
    """Where the JSON object at the start of a stream ends, fed chunk by chunk, without
    parsing it: brackets are counted outside strings. StateError when the stream does not
    start with an object or nests deeper than ``max_depth``."""

    def __init__(self, max_depth: int = MAX_DEPTH) -> None:
        self.max_depth = max_depth
        self.depth = 0
        self.seen = 0               # bytes scanned so far
        self._in_string = False
        self._escaped = False

    def feed(self, chunk: bytes) -> int | None:
        """The end (exclusive, counted from the stream's start) once the object closes."""
        for i, c in enumerate(chunk):
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif c == 0x5C:                     # backslash
                    self._escaped = True
                elif c == 0x22:                     # quote
                    self._in_string = False
            elif c == 0x22:
                self._in_string = True
            elif c in b"{[":
                if self.depth == 0 and c != 0x7B:
                    raise StateError("not a JSON object")
                self.depth += 1
                if self.depth > self.max_depth:
                    raise StateError(f"nested deeper than {self.max_depth} levels")
            elif c in b"}]":
                self.depth -= 1
                if self.depth <= 0:
                    return self.seen + i + 1
            elif self.depth == 0 and c not in b" \t\r\n":
                raise StateError("not a JSON object")
        self.seen += len(chunk)
        return None


def parse_state(data: bytes) -> ProcessState:
    """The fields the agent uses from runc's JSON; StateError for anything else."""
    end = JsonExtent().feed(data)
    if end is None:
        raise StateError("not JSON: an unfinished object")
    if data[end:].strip():
        raise StateError("not JSON: data after the object")
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise StateError(f"not JSON: {e}") from e
    if not isinstance(doc, dict):
        raise StateError("not a JSON object")
    fds = doc.get("fds")
    if not isinstance(fds, list) or "seccompFd" not in fds:
        raise StateError(f"no \"seccompFd\" in fds {fds!r:.80}")
    state = doc.get("state")
    state = state if isinstance(state, dict) else {}
    pid = doc.get("pid", state.get("pid"))
    # bool is an int in Python: true is not a pid.
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        raise StateError(f"no process id (pid {pid!r:.40})")
    cid = state.get("id")
    return ProcessState(pid, cid if isinstance(cid, str) else f"pid {pid}",
                        fds.index("seccompFd"))


def container_key(pid: int) -> str | None:
    """The per-container directory of ``pid``'s cgroup, or None where the agent cannot
    tell it (pid gone, or a cgroup namespace showing the container's cgroup as "/")."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            path = container_cgroup(parse_proc_cgroup(f.read()))
    except OSError as e:
        log.warning("pid %d: /proc/%d/cgroup: %s", pid, pid, e.strerror or e)
        return None
    if path is None or path == "/" or path.startswith("/.."):
        log.warning("pid %d: cgroup %r names no container as the agent sees it (a cgroup "
                    "namespace?)", pid, path)
        return None
    try:
        return dir_key(path)
    except BadKey as e:
        log.warning("pid %d: %s", pid, e)
        return None


# ------------------------------------------------------------------- the listening socket

def listen_at(path: str) -> socket.socket:
    path = os.path.abspath(path)
    owned_private_dir(os.path.dirname(path), (os.path.basename(path),))
    remove_stale(path)
    return bind_private(path)


def receive_handoff(conn: socket.socket, fds: list[int]) -> bytes:
    """The runtime's state; the fds that came with it are appended to ``fds`` as they
    arrive, so the caller holds them whatever happens here. runc does not close its end
    after sending (it closes a dup), so the state ends where its JSON object does, not at
    end of stream; a stream may split the one sendmsg, whose fds come with its first
    byte. Reading stops there, at end of stream, at what is plainly not a state
    (JsonExtent), at MAX_STATE, or HANDOFF_TIMEOUT after the first recv, whichever comes
    first; never raises."""
    deadline = time.monotonic() + HANDOFF_TIMEOUT
    data = bytearray()
    extent = JsonExtent()
    while len(data) <= MAX_STATE:
        left = deadline - time.monotonic()
        if left <= 0:
            log.debug("hand-off read: no whole state in %g s", HANDOFF_TIMEOUT)
            break
        try:
            conn.settimeout(left)
            msg, got, _flags, _addr = socket.recv_fds(conn, 1 << 16, 8)
        except OSError as e:        # TimeoutError included
            log.debug("hand-off read: %s", e)
            break
        fds += got
        if not msg:
            break
        data += msg
        try:
            if extent.feed(msg) is not None:
                break               # one whole JSON object: runc sends nothing more
        except StateError:
            break                   # parse_state says why
    return bytes(data)


def is_listener(fd: int) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == _SECCOMP_FD_LINK
    except OSError:
        return False


def peer_uid(conn: socket.socket) -> int:
    return peer_creds(conn)[1]


class Handoffs:
    """Hand-offs read concurrently, each in a thread of its own (its read bounded by
    receive_handoff's deadline and size), at most ``limit`` at once: idle or slow
    connections delay no other container's start while fewer than ``limit`` are open."""

    def __init__(self, handle: Callable[[socket.socket], None],
                 limit: int = MAX_HANDOFFS) -> None:
        self._handle = handle
        self._slots = threading.BoundedSemaphore(limit)
        self._running: set[threading.Thread] = set()
        self._lock = threading.Lock()

    def start(self, conn: socket.socket) -> None:
        self._slots.acquire()
        t = threading.Thread(target=self._run, args=(conn,), name="guestfs-handoff",
                             daemon=True)
        with self._lock:
            self._running.add(t)
        t.start()

    def _run(self, conn: socket.socket) -> None:
        # The stop signals are the main thread's; a hand-off is never cut short by them.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        try:
            self._handle(conn)
        finally:
            with self._lock:
                self._running.discard(threading.current_thread())
            self._slots.release()

    def wait(self, timeout: float) -> None:
        """Let the hand-offs under way finish (a listener not yet with the guard would be
        closed by our exit), for at most ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._lock:
            running = list(self._running)
        for t in running:
            t.join(max(0.0, deadline - time.monotonic()))


# ------------------------------------------------------------------------ serving

class Agent:
    """Answers every container's listener from one thread (syscalls.notify.ListenerLoop);
    listeners come from accept() in another."""

    def __init__(self, arch: Arch, source: str, sysinfo: bool, affinity: str,
                 guard: GuardLink | None) -> None:
        self.arch = arch
        self.source = source
        self.what = interception_for(sysinfo, affinity)
        self.guard = guard
        # Every container's listener, answered from one thread; a 32-bit call (its
        # numbers are another table's: i386 sysinfo is 116) goes to the kernel.
        self.loop = ListenerLoop(arch.audit_arch)

    def start(self) -> Agent:
        self.loop.start()
        return self

    # -- hand-offs (the accepting thread)

    def handle_connection(self, conn: socket.socket) -> None:
        """One runtime hand-off; never raises. A seccomp listener received is kept and
        served whatever else is wrong: closing it would fail its processes' calls with
        ENOSYS, and leaving it unserved would block them. The connection and anything
        else received are closed."""
        fds: list[int] = []
        try:
            uid = peer_uid(conn)
            if uid not in (0, os.geteuid()):
                log.warning("hand-off from uid %d refused", uid)
                return
            data = receive_handoff(conn, fds)
            listeners = [fd for fd in fds if is_listener(fd)]
            state = self._state_of(data, bool(listeners))
            if state is not None and state.fd_index < len(fds) \
                    and fds[state.fd_index] in listeners:
                listener = fds[state.fd_index]
            elif listeners:
                listener, state = listeners[0], None
            else:
                log.warning("hand-off without a seccomp listener fd: ignored")
                return
            fds.remove(listener)
            self.add(listener, state)
        except Exception:  # noqa: BLE001 - one bad hand-off never stops the agent
            log.exception("hand-off")
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            conn.close()

    @staticmethod
    def _state_of(data: bytes, with_listener: bool) -> ProcessState | None:
        try:
            return parse_state(data)
        except StateError as e:
            log.warning("hand-off with a bad state (%s)%s", e,
                        "; its listener's calls go to the kernel" if with_listener else "")
            return None

    def add(self, listener: int, state: ProcessState | None) -> None:
        """Give the guard its copy and serve ``listener``; on any failure of ours it is
        still served, every call passed to the kernel."""
        name, key = "a container of unknown state", None
        try:
            os.set_inheritable(listener, False)
            if state is not None:
                name = f"container {state.container_id} (pid {state.pid})"
                key = container_key(state.pid)
            if self.guard is not None:
                # Before the view is read: the agent may die any moment from now. The
                # guard keeps what a later agent needs to serve this listener again.
                self.guard.add(listener, describe(name, key))
            self._serve_listener(listener, name, key)
        except Exception:  # noqa: BLE001 - never an unserved listener (its calls block)
            log.exception("%s: serving it", name)
            self._serve_listener(listener, name, None)

    def restore(self, listener: int, meta: bytes) -> None:
        """A listener the guard kept from an earlier agent (it holds its copy already),
        served again from the directory it was first served from."""
        os.set_inheritable(listener, False)
        if self.guard is not None:      # remembered, for a new guard should this one die
            self.guard.add(listener, meta, hand_over=False)
        name, key = described(meta)
        self._serve_listener(listener, name, key)

    def _serve_listener(self, listener: int, name: str, key: str | None) -> None:
        handlers: dict[int, Handler] = {}
        if key is not None:
            handlers = self._handlers_for(name, f"{self.source}/{key}")
        if not handlers:
            log.warning("%s: the kernel answers its calls", name)
        else:
            log.info("%s: answering from its own view", name)
        self.loop.add(Served(listener, handlers, name, on_gone=self._gone))

    def _handlers_for(self, name: str, root: str) -> dict[int, Handler]:
        read = texts_under(root)

        def read_named() -> dict[str, str]:
            try:
                return read()
            except OSError as e:   # logged once by the view, naming the container
                raise OSError(e.errno, f"{name}: {e.filename}: {e.strerror}") from e

        view = ServedView(read_named, wait=AGENT_WAIT)
        if view.current(wait=FIRST_READ_WAIT) is None:
            log.warning("%s: no view under %s yet; the kernel answers until there is", name,
                        root)
        return make_handlers(self.arch, view, self.what)

    def _gone(self, served: Served) -> None:
        """Every process of the container's filter has exited: the container is gone."""
        if self.guard is not None:
            self.guard.forget(served.listener)
        else:
            os.close(served.listener)
        log.info("%s exited; %d calls answered", served.name, served.served)


def serve_agent(socket_path: str, source: str, sysinfo: bool, affinity: str,
                external_guard: bool = False) -> int:
    arch = this_arch()
    if arch is None:
        raise AgentError("no seccomp numbers for this architecture")
    socket_path = os.path.abspath(socket_path)
    started = time.monotonic()
    d = os.path.dirname(socket_path)
    owned_private_dir(d, (os.path.basename(socket_path), GUARD_SOCKET))
    sock, first, kept = attach_waiting(d, not external_guard,        # before any thread
                                       lambda: listen_at(socket_path))
    ident = os.lstat(socket_path).st_ino     # unlinked at exit only if still ours
    agent = Agent(arch, source, sysinfo, affinity, None)
    guard = agent.guard = GuardLink(first, d, not external_guard, agent.restore)
    agent.start()
    for fd, meta in kept:
        agent.restore(fd, meta)
    if kept:
        log.info("%d listeners taken back from the guard, served again %.3f s after start",
                 len(kept), time.monotonic() - started)

    def stop(_sig: int, _frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    log.info("seccomp agent on %s, views from %s (guard pid %d)", socket_path, source,
             guard.pid)
    handoffs = Handoffs(agent.handle_connection)
    try:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError as e:          # EMFILE and the like: the next one may do
                log.warning("accept: %s", os_error_line(e))
                time.sleep(0.1)
                continue
            handoffs.start(conn)
    except (SystemExit, KeyboardInterrupt):
        return 0
    finally:
        handoffs.wait(HANDOFF_TIMEOUT + FIRST_READ_WAIT + 1.0)
        with contextlib.suppress(OSError):
            if os.lstat(socket_path).st_ino == ident:
                os.unlink(socket_path)
        sock.close()
        guard.close()      # running containers' calls go to the kernel from now on
