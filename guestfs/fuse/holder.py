"""The FUSE holder: a small process that keeps a mount's /dev/fuse descriptor (and its
mount lock) open, so that the connection outlives the daemon serving it.

A FUSE connection lives while any descriptor of its /dev/fuse stays open; requests wait
in the kernel's queue until some process reads them, and since Linux 6.9 a new server
can have the kernel queue again what a dead one had read and not answered
(FUSE_NOTIFY_RESEND). So when the serving daemon dies (kill -9, OOM, a crash) nothing
the readers see fails: their requests wait until a successor serves, on the same
connection, under the same binds.

The holder never reads the connection. It holds one *lease* at a time: its connection
to the daemon that serves. The lease's end without ``stop`` is the daemon's death; then
a ``guestfs mount MOUNTPOINT`` that asks within ``GRACE`` (what a restarted DaemonSet
container runs) gets the descriptor, else the holder starts a successor itself (the
first daemon's command line). A daemon that asks while a successor of the holder's own
serves is given way to (``yield``); one that asks while any other daemon serves is
refused. After ``MAX_YOUNG`` deaths in a row of daemons that took the lease and never
said they serve (a crash loop), or a death before INIT was answered, the holder exits:
the connection then ends as it did before holders (the readers see "Transport endpoint
is not connected", and the next mount detaches the stale one).

Started as ``python -I -S _boot.py --fuse-holder CTL FUSE LOCK MOUNTPOINT SOCKET --
ARGV...``: no site, nothing of the serving code (it imports only ``holdwire``), so that
its memory stays small in the container it lives in. It ignores the stop signals a
terminal or a process-group kill sends; the serving daemon's clean stop (``stop``) ends
it, or the mount's end (seen by the daemon, or while none serves by the descriptor's
POLLERR).
"""

from __future__ import annotations

# Built-in modules rather than their Python wrappers (contextlib, socket, signal and the
# enum, selectors and collections they bring): the holder lives as long as its mount, in
# the container's cgroup; these halve its start-up (22 to 10 ms of CPU) and take 0.8 MiB
# off its own memory.
import _signal as signal
import _socket as socket
import os
import select
import time

from guestfs.fuse import holdwire

TYPE_CHECKING = False   # typing.TYPE_CHECKING, without typing
if TYPE_CHECKING:
    from collections.abc import Callable

GRACE = 0.1       # a daemon asking this soon after a death wins over a successor of ours
MAX_YOUNG = 5     # deaths in a row before serving (a crash loop): the connection ends
ORPHAN_GRACE = 60.0   # the standalone holder waits this long for a daemon to ask
ASK_TIMEOUT = 2.0
# The PSI triggers kept for successors (holdwire's ``keep``): the daemon opens at most 256
# (psi_triggers.LIMIT); bounded here too, whatever a daemon sends.
MAX_KEPT = 512
MAX_RECORD = 4096
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


class suppress:
    """contextlib.suppress, without contextlib."""

    def __init__(self, *kinds: type[BaseException]) -> None:
        self.kinds = kinds

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> bool:
        return kind is not None and issubclass(kind, self.kinds)


def say(msg: str) -> None:
    with suppress(OSError):
        os.write(2, f"guestfs-holder[{os.getpid()}]: {msg}\n".encode(errors="replace"))


NAME = holdwire.HOLDER_NAME   # /proc/PID/comm: what ps, pgrep -x and top show


def name_self() -> None:
    """Our comm, written to procfs rather than by prctl: ctypes alone would double this
    process's memory."""
    with suppress(OSError), open("/proc/self/comm", "wb") as f:
        f.write(NAME)


def detach(mountpoint: str) -> None:
    """sysmount.detach_quietly, loaded only now: ctypes would double this process's
    memory for the whole of its life."""
    from guestfs.system.sysmount import detach_quietly

    detach_quietly(mountpoint)


def listen_at(path: str, backlog: int) -> socket.socket:
    """A SEQPACKET socket listening at ``path`` (mode 0600), in place of a dead holder's
    (a live one holds the lock or the hand-over socket, so none is there)."""
    with suppress(FileNotFoundError):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    sock.bind(path)
    os.chmod(path, 0o600)
    sock.listen(backlog)
    return sock


def first_message(listener: socket.socket) -> tuple[socket.socket, int, bytes, bytes,
                                                      list[int]] | None:
    """A connection accepted, its peer (uid 0 or ours only) and its first message:
    (conn, pid, verb, payload, descriptors). None, logged, for anything else."""
    try:
        conn = socket.socket(fileno=listener._accept()[0])
    except OSError:
        return None
    try:
        pid, uid = holdwire.peer_ids(conn)
        if uid not in (0, os.getuid()):
            raise PermissionError(f"uid {uid} may not talk to this holder")
        conn.settimeout(ASK_TIMEOUT)
        msg = holdwire.recv(conn)
        conn.settimeout(None)
        if msg is None:
            raise holdwire.BadMessage("no message")
    except (OSError, holdwire.BadMessage) as e:
        say(f"refused a connection: {e}")
        conn.close()
        return None
    return conn, pid, *msg


class Holder:
    """One held connection. ``respawn``: the command line to start a successor with (a
    holder of the daemon's own); None for the standalone holder, which only waits for
    one to ask, ``ORPHAN_GRACE`` seconds at most."""

    def __init__(self, ctl: socket.socket, fuse_fd: int, lock_fd: int, mountpoint: str,
                 listen_path: str, respawn: list[str] | None) -> None:
        self.fuse_fd, self.lock_fd, self.mountpoint = fuse_fd, lock_fd, mountpoint
        self.listen_path, self.respawn = listen_path, respawn
        self.lease: socket.socket | None = ctl
        self.lease_pid = holdwire.peer_ids(ctl)[0]
        self.lease_ours = False           # the lease holder is a successor we started
        self.lease_serving = False        # it said it serves (``negotiated``)
        self.negotiated: bytes | None = None
        self.pending: socket.socket | None = None   # an asker waiting for a yield
        self.child: int | None = None     # our successor, started and not yet leased
        self.lost_at: float | None = None
        self.young = 0
        # Trigger files by FUSE handle: (the daemon's record, the descriptor kept).
        self.kept: dict[int, tuple[bytes, int]] = {}
        self.listener = listen_at(listen_path, 4)
        self._listen_ino = os.stat(listen_path).st_ino
        # A daemon that died already (it does not wait for this word) has its lease end
        # at the loop's first look, as any death.
        with suppress(OSError):
            holdwire.send(ctl, b"ready")

    # ------------------------------------------------------------ what to wait for

    def poll_fds(self) -> list[tuple[int, int]]:
        fds = [(self.listener.fileno(), select.POLLIN)]
        if self.lease is not None:
            # The lease's word first: an asker arriving with it must see what it said.
            fds.insert(0, (self.lease.fileno(), select.POLLIN))
        else:
            # POLLERR only: the connection ended. Never while a daemon serves: each
            # request queued would wake this process too (a read took twice as long on
            # 2 CPUs); then the daemon sees the end itself and says ``stop``.
            fds.append((self.fuse_fd, 0))
        return fds

    def due(self) -> float | None:
        """Seconds until ``on_time`` has something to do, if anything is waited for."""
        if self.lease is not None or self.child is not None or self.pending is not None:
            return None
        wait = GRACE if self.respawn is not None else ORPHAN_GRACE
        return max(0.0, (self.lost_at or 0.0) + wait - time.monotonic())

    def on_time(self) -> int | None:
        if self.due() != 0.0:
            return None
        if self.respawn is None:
            say(f"no daemon asked for {self.mountpoint} within {ORPHAN_GRACE:g}s; ending "
                "its connection")
            return 1
        self._spawn()
        return None

    def on_event(self, fd: int, events: int) -> int | None:
        """An exit status once this connection is done with."""
        if fd == self.fuse_fd and events & (select.POLLERR | select.POLLHUP |
                                             select.POLLNVAL):
            return 0                            # unmounted: nothing to hold
        if fd == self.listener.fileno():
            self._accept()
        elif self.lease is not None and fd == self.lease.fileno():
            return self._from_lease()
        return None

    def reaped(self, pid: int, status: int) -> int | None:
        if pid != self.child:
            return None
        # It exited without taking the lease (refused, or failed to start).
        self.child = None
        if self.lease is not None:
            return None
        return self._died(f"successor pid {pid} exited ({os.waitstatus_to_exitcode(status)})"
                          " before serving", young=True)

    # ------------------------------------------------------------ the lease

    def _from_lease(self) -> int | None:
        assert self.lease is not None
        try:
            msg = holdwire.recv(self.lease)
        except holdwire.BadMessage as e:
            say(f"ignored: {e}")
            return None
        except OSError:
            msg = None
        if msg is None:
            return self._lease_lost()
        verb, payload, fds = msg
        if verb == b"keep":
            self._keep(payload, fds)
            return None
        for fd in fds:
            os.close(fd)
        if verb == b"drop":
            with suppress(ValueError):
                old = self.kept.pop(int(payload), None)
                if old is not None:
                    os.close(old[1])
        elif verb == b"negotiated":
            self.negotiated = payload
            self.lease_serving = True
        elif verb == b"stop":
            detach(self.mountpoint)
            return 0
        return None

    def _keep(self, payload: bytes, fds: list[int]) -> None:
        """A trigger kept (with its descriptor: a new one, which replaces any kept under
        its handle) or its record updated (without)."""
        got = holdwire.split_trigger(payload, fds)
        if got is None:
            return
        fh, record, fd = got
        old = self.kept.get(fh)
        if len(record) > MAX_RECORD or fd is None and old is None \
                or old is None and len(self.kept) >= MAX_KEPT:
            if fd is not None:
                os.close(fd)
            return
        if fd is None:
            assert old is not None
            fd = old[1]
        elif old is not None:
            os.close(old[1])
        self.kept[fh] = (record, fd)

    def _lease_lost(self) -> int | None:
        assert self.lease is not None
        self.lease.close()
        self.lease = None
        if self.pending is not None:          # a yield: the asker takes over
            asker, self.pending = self.pending, None
            self._grant(asker, yielded=True)
            return None
        if self.negotiated is None:
            say(f"the daemon (pid {self.lease_pid}) died before the connection was "
                "initialised; ending it")
            return 1
        return self._died(f"the daemon (pid {self.lease_pid}) died",
                          young=not self.lease_serving)

    def _died(self, what: str, young: bool) -> int | None:
        self.young = self.young + 1 if young else 0
        if self.young >= MAX_YOUNG:
            say(f"{what}: {self.young} young deaths in a row; ending the connection")
            return 1
        self.lost_at = time.monotonic()
        return None

    def _accept(self) -> None:
        got = first_message(self.listener)
        if got is None:
            return
        conn, pid, verb, _, fds = got
        for fd in fds:
            os.close(fd)
        if verb != b"serve":
            say(f"refused a connection: {verb!r} is not serve")
            conn.close()
            return
        self._ask(conn, pid)

    def _ask(self, conn: socket.socket, pid: int) -> None:
        if self.negotiated is None:
            self._refuse(conn, "the connection is not initialised yet")
        elif self.lease is None:
            self._grant(conn)
        elif self.lease_ours and self.pending is None:
            self.pending = conn
            with suppress(OSError):
                holdwire.send(self.lease, b"yield")
        else:
            self._refuse(conn, f"pid {self.lease_pid} serves it")

    def _refuse(self, conn: socket.socket, why: str) -> None:
        with suppress(OSError, holdwire.BadMessage):
            holdwire.send(conn, b"refused", why.encode())
        conn.close()

    def _grant(self, conn: socket.socket, yielded: bool = False) -> None:
        assert self.negotiated is not None
        pid, _ = holdwire.peer_ids(conn)
        try:
            # The triggers first: the successor has them before it serves a request.
            for fh, (record, fd) in self.kept.items():
                holdwire.send(conn, b"kept", holdwire.trigger_payload(fh, record), (fd,))
            holdwire.send(conn, b"granted", self.negotiated, (self.fuse_fd, self.lock_fd))
        except OSError as e:
            say(f"pid {pid} asked and went away ({e.strerror})")
            conn.close()
            self.lost_at = time.monotonic() - GRACE
            return
        ours = pid == self.child
        if ours:
            self.child = None
        self.lease, self.lease_pid, self.lease_ours = conn, pid, ours
        self.lease_serving = False
        self.lost_at = None
        if not ours:
            say(f"pid {pid} serves the connection" + (" (ours yielded)" if yielded else ""))

    def _spawn(self) -> None:
        assert self.respawn is not None
        pid = os.fork()
        if pid == 0:
            try:
                for sig in (*STOP_SIGNALS, signal.SIGCHLD):
                    signal.signal(sig, signal.SIG_DFL)   # ignored ones survive exec
                signal.set_wakeup_fd(-1)
                signal.pthread_sigmask(signal.SIG_SETMASK, [])
                os.execv(self.respawn[0], self.respawn)
            finally:
                os._exit(127)
        self.child = pid
        say(f"the daemon (pid {self.lease_pid}) is gone: started pid {pid} to serve on")

    def close(self) -> None:
        with suppress(OSError):
            if os.stat(self.listen_path).st_ino == self._listen_ino:
                os.unlink(self.listen_path)
        self.listener.close()
        for sock in (self.lease, self.pending):
            if sock is not None:
                sock.close()
        for fd in (self.fuse_fd, self.lock_fd, *(fd for _, fd in self.kept.values())):
            with suppress(OSError):
                os.close(fd)
        self.kept.clear()


class Loop:
    """Wait for every held connection's sockets and timers, and for ``extra`` (the
    standalone holder's hand-off socket); reap the successors started."""

    def __init__(self) -> None:
        self.holders: list[Holder] = []
        self._wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)

    def once(self, extra: dict[int, Callable[[], None]] | None = None) -> list[int]:
        """One poll; the exit statuses of the holders done (they are dropped)."""
        extra = extra or {}
        poller = select.poll()
        owner: dict[int, Holder] = {}
        order: list[int] = []
        for h in self.holders:
            for fd, events in h.poll_fds():
                poller.register(fd, events)
                owner[fd] = h
                order.append(fd)
        for fd in (self._wake_r, *extra):
            poller.register(fd, select.POLLIN)
        dues = [d for h in self.holders if (d := h.due()) is not None]
        ready = dict(poller.poll(min(dues, default=1.0) * 1000))
        done: list[tuple[Holder, int]] = []
        for fd in [*order, *(f for f in ready if f not in owner)]:
            if fd not in ready:
                continue
            if fd in owner:
                status = owner[fd].on_event(fd, ready[fd])
                if status is not None:
                    done.append((owner[fd], status))
            elif fd == self._wake_r:
                with suppress(BlockingIOError):
                    os.read(self._wake_r, 256)
            else:
                extra[fd]()
        done += self._timers_and_children({h for h, _ in done})
        return self._drop(done)

    def _timers_and_children(self, finished: set[Holder]) -> list[tuple[Holder, int]]:
        """A holder done already is left alone (its timer would start a successor)."""
        done = []
        for h in self.holders:
            if h in finished:
                continue
            status = h.on_time()
            if status is not None:
                done.append((h, status))
        while True:
            try:
                pid, wstatus = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            for h in self.holders:
                if h in finished:
                    continue
                status = h.reaped(pid, wstatus)
                if status is not None:
                    done.append((h, status))
        return done

    def _drop(self, done: list[tuple[Holder, int]]) -> list[int]:
        out = []
        for h, status in done:
            if h in self.holders:
                self.holders.remove(h)
                h.close()
                out.append(status)
        return out


def holder_main(argv: list[str]) -> int:
    """CTL FUSE LOCK MOUNTPOINT SOCKET -- RESPAWN..."""
    if len(argv) < 7 or argv[5] != "--":
        say("usage: --fuse-holder CTL FUSE LOCK MOUNTPOINT SOCKET -- ARGV...")
        return 2
    name_self()
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    # The serving daemon blocks the stop signals in its threads; an exec keeps that mask,
    # and a successor started with it would never take its SIGTERM.
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    ctl = socket.socket(fileno=int(argv[0]))
    fuse_fd, lock_fd = int(argv[1]), int(argv[2])
    for fd in (ctl.fileno(), fuse_fd, lock_fd):
        os.set_inheritable(fd, False)
    try:
        holder = Holder(ctl, fuse_fd, lock_fd, argv[3], argv[4], argv[6:])
    except OSError as e:
        say(f"cannot listen on {argv[4]}: {e.strerror}")
        return 1
    loop = Loop()
    loop.holders.append(holder)
    while True:
        statuses = loop.once()
        if statuses:
            return statuses[0]


def _safe_dir(path: str) -> None:
    """The lock directory: ours, writable by no one else, not a symlink."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise PermissionError(f"{path} must be ours and writable by no one else")


def _socket_name(name: str) -> bool:
    """<32 hex digits>.holder: a name in the lock directory, never a path."""
    key, dot, rest = name.partition(".")
    return (dot == "." and "." + rest == holdwire.SUFFIX and len(key) == 32
            and all(c in "0123456789abcdef" for c in key))


class Standalone:
    """`guestfs fuse-holder`: holds the connections daemons in other pods hand it."""

    def __init__(self, lock_dir: str) -> None:
        _safe_dir(lock_dir)
        self.lock_dir = lock_dir
        self.path = os.path.join(lock_dir, holdwire.HANDOFF)
        self.listener = listen_at(self.path, 16)
        self.loop = Loop()

    def serve(self) -> int:
        say(f"holding FUSE connections handed over at {self.path}")
        while True:
            self.loop.once({self.listener.fileno(): self._accept})

    def _accept(self) -> None:
        got = first_message(self.listener)
        if got is None:
            return
        conn, _, verb, payload, fds = got
        try:
            name, _, mountpoint = payload.decode(errors="replace").partition("\n")
            if verb != b"hold" or len(fds) != 2 or not _socket_name(name) or not mountpoint:
                raise holdwire.BadMessage("not a hold of a mount")
            listen_path = os.path.join(self.lock_dir, name)
            if any(h.listen_path == listen_path for h in self.loop.holders):
                raise holdwire.BadMessage(f"{mountpoint} is held already")
            holder = Holder(conn, fds[0], fds[1], mountpoint, listen_path, None)
        except (OSError, holdwire.BadMessage) as e:
            say(f"refused a hand-over: {e}")
            for fd in fds:
                os.close(fd)
            with suppress(OSError, holdwire.BadMessage):
                holdwire.send(conn, b"refused", str(e).encode()[:1000])
            conn.close()
            return
        self.loop.holders.append(holder)
        say(f"holding {mountpoint} for pid {holder.lease_pid}")


def standalone_main(argv: list[str]) -> int:
    """LOCK_DIR [ORPHAN_GRACE]: SIGTERM ends it (and every connection it holds)."""
    global ORPHAN_GRACE
    if len(argv) not in (1, 2):
        say("usage: --fuse-holder-standalone LOCK_DIR [SECONDS]")
        return 2
    if len(argv) == 2:
        ORPHAN_GRACE = float(argv[1])
    name_self()
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    try:
        holder = Standalone(argv[0])
    except OSError as e:
        say(f"cannot listen in {argv[0]}: {e}")
        return 1
    return holder.serve()
