"""`guestfs mount --hold`: the daemon's side of the FUSE holder (guestfs.fuse.holder).

The first daemon of a mount mounts it, starts its holder (handing it the /dev/fuse
descriptor and the mount lock, before it drops its own privileges: the holder keeps the
right to unmount) and sends it the INIT parameters once they are agreed. A daemon that
finds the mount lock held asks the holder instead (``ask``): granted, it serves the same
connection as a successor (``take_over``); refused, it stops with one line, as a second
mount always has. While serving, each keeps its *lease*, the connection to the holder,
whose end the holder takes for the daemon's death.

Why only on Linux 6.9 and later: a successor must have the kernel send again what its
predecessor read and never answered (FUSE_NOTIFY_RESEND); without it those readers
would wait for ever. Older kernels are served as without --hold (docs/mount.md).
"""

from __future__ import annotations

# _socket, not socket.py: socket.py and the array module it brings cost the serving daemon
# 380 KiB of RSS for what _socket.socket does itself (holdwire uses it the same way).
import _socket as socket
import contextlib
import logging
import os
import threading
import time
from dataclasses import dataclass

from guestfs.daemon import mountlock, privileges
from guestfs.daemon.mountpoint import MountError
from guestfs.fuse import holdwire
from guestfs.fuse.holdwire import HOLDER_NAME
from guestfs.system import forked
from guestfs.system.oneline import one_line
from guestfs.system.selfexec import FUSE_HOLDER, helper_argv

log = logging.getLogger("guestfs.held")

ANSWER_TIMEOUT = 10.0        # a holder's answer to "serve" or "hold"
EXTERNAL_WAIT = 60.0         # --external-holder: for the holder's pod to be up
HOLDER_DELAY = 0.3           # from the mount to the holder's interpreter (start_holder)


def socket_path(mountpoint: str, lock_dir: str | None = None) -> str:
    """Where the holder of ``mountpoint`` listens: beside its mount lock, in a directory
    only root (or the mount's owner) may write to (mountlock.open_lock_dir)."""
    return os.path.join(lock_dir or mountlock.LOCK_DIR,
                        mountlock.mount_key(mountpoint) + holdwire.SUFFIX)


class Lease:
    """This daemon's connection to the holder, and what came with it."""

    def __init__(self, sock: socket.socket, fuse_fd: int, negotiated: str | None = None,
                 lock_fd: int | None = None, keeps: bool = False) -> None:
        self.sock, self.fuse_fd, self.lock_fd = sock, fuse_fd, lock_fd
        self.negotiated = negotiated      # JSON of session.Negotiated: a successor's
        # The standalone holder: a clean stop leaves it the connection for the next
        # daemon (a rolling update) rather than unmounting.
        self.keeps = keeps
        self._stopped = threading.Lock()
        self.holder_gone = threading.Event()    # the holder ended the lease (killed)
        self.stopped_cleanly = False
        # A successor's: the PSI triggers its predecessors left, (handle, record, fd).
        self.kept: list[tuple[int, bytes, int]] = []
        self._untold = False    # a trigger's state the holder was not told: logged once

    def keep(self, fh: int, record: bytes, fd: int | None = None) -> bool:
        """The holder keeps the trigger of handle ``fh`` (its descriptor, given the first
        time) for this daemon's successor (psi_triggers.Triggers' keeper). Never blocks:
        a holder that does not read (stopped, gone) is not told (False; the status file
        counts it)."""
        return self._tell(b"keep", holdwire.trigger_payload(fh, record),
                          () if fd is None else (fd,))

    def drop(self, fh: int) -> bool:
        return self._tell(b"drop", b"%d" % fh, ())

    def _tell(self, verb: bytes, payload: bytes, fds: tuple[int, ...]) -> bool:
        try:
            holdwire.send(self.sock, verb, payload, fds, socket.MSG_DONTWAIT)
            return True
        except (OSError, holdwire.BadMessage) as e:
            if not self._untold:
                self._untold = True
                log.warning("the FUSE holder was not told of a PSI trigger (%s): a "
                            "successor of this daemon may not keep it", e)
            return False

    def send_negotiated(self, negotiated_json: str) -> None:
        try:
            holdwire.send(self.sock, b"negotiated", negotiated_json.encode())
        except OSError as e:
            log.warning("the FUSE holder did not take the connection's parameters (%s): a "
                        "death of this daemon will end the mount", e.strerror or e)

    def watch(self) -> None:
        """Until the lease ends: a ``yield`` asked of a successor started by the holder
        ends this process at once (its unanswered requests go to the asker by RESEND),
        the holder's own end is logged."""
        threading.Thread(target=self._watch, name="guestfs-lease", daemon=True).start()

    def _watch(self) -> None:
        while True:
            try:
                msg = holdwire.recv(self.sock)
            except holdwire.BadMessage:
                continue
            except OSError:
                msg = None
            if msg is None:
                if not self._stopped.locked():
                    self.holder_gone.set()
                    log.warning("the FUSE holder is gone: this daemon's death will now end "
                                "the mount")
                return
            for fd in msg[2]:
                os.close(fd)
            if msg[0] == b"yield":
                log.info("another guestfs mount takes over this connection; exiting")
                os._exit(0)

    def stop(self) -> None:
        """A clean stop. A holder of this daemon's own detaches the mount and exits; the
        standalone one (``keeps``) is told nothing: the lease ends with this process,
        after its last thread (a worker still reading once a successor had the kernel
        resend would take a request away from it for good). Only the first call."""
        if not self._stopped.acquire(blocking=False):
            return
        self.stopped_cleanly = True
        if self.keeps:
            return
        with contextlib.suppress(OSError):
            holdwire.send(self.sock, b"stop")
        self.sock.close()


@dataclass
class Held:
    """What serve() gets in place of privileges.Dropped: where the binding serves, and
    the unmount watcher (pid, pipe) started before privileges were dropped, if any."""
    lease: Lease
    watcher: tuple[int, int] | None = None

    @property
    def target(self) -> str:
        return f"/dev/fd/{self.lease.fuse_fd}"

    def finish(self) -> None:
        """After serving. A clean stop whose holder is gone (killed while this daemon
        served) has the watcher detach the mount, since no holder will: without it the
        mount would be left to end with this process, stale ("Transport endpoint is not
        connected") until the next mount replaced it. Otherwise the watcher only exits:
        the holder unmounts (or keeps the connection for the next daemon), and any other
        end is this daemon's failure, which the holder sees when this process is gone."""
        if self.watcher is None:
            return
        detach = self.lease.stopped_cleanly and self.lease.holder_gone.is_set()
        if detach:
            log.info("the FUSE holder is gone: this daemon detaches the mount itself")
        privileges.stop_unmount_watcher(*self.watcher, clean=detach)
        self.watcher = None


def start_holder(fuse_fd: int, lock_fd: int, mountpoint: str,
                 respawn: list[str]) -> Lease:
    """Start the holder of a mount just made, and return its lease at once. Call it while
    single-threaded, before privileges are dropped.

    The holder's interpreter starts HOLDER_DELAY later, in a child forked now: that child
    keeps the connection from this moment (a death of this daemon meanwhile is succeeded
    once the holder is up), and the holder's start-up (about 20 ms of CPU) no longer
    competes with `guestfs run`'s first reads and its app's start
    (benchmarks/bench_startup.py). Nothing waits for it: what the lease sends meanwhile
    waits in the socket, its "ready" is read by Lease.watch, and a holder that fails to
    start ends the lease there, with one warning (this daemon's death then ends the
    mount, as without --hold). This daemon holds the mount lock on its own as well, so a
    failed holder never leaves the mount unlocked."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    argv = helper_argv(FUSE_HOLDER, str(theirs.fileno()), str(fuse_fd), str(lock_fd),
                       mountpoint, socket_path(mountpoint), "--", *respawn)
    try:   # not `with`: _socket.socket is no context manager
        pid = _exec_later(argv, (theirs.fileno(), fuse_fd, lock_fd), HOLDER_DELAY)
    except OSError as e:
        ours.close()
        raise MountError(f"the FUSE holder of {mountpoint} did not start ({e}); "
                         "mount without --hold") from None
    finally:
        theirs.close()
    log.info("FUSE holder pid %d keeps the connection of %s", pid, mountpoint)
    return Lease(ours, fuse_fd)


def _exec_later(argv: list[str], keep: tuple[int, ...], delay: float) -> int:
    """A child that keeps ``keep`` (and nothing else of ours) from now and executes
    ``argv`` after ``delay`` seconds: its pid. Forked from a single-threaded process."""
    pid = forked.fork()
    if pid != 0:
        return pid
    try:  # pragma: no cover - the child
        # A session of its own: a Ctrl-C to run's process group must not reach it
        # before the holder ignores the stop signals. stdin and stdout on /dev/null,
        # stderr kept for the holder's lines, as its Popen had them.
        forked.cut_off(keep, devnull_stdio=False)
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.close(null)
        for fd in keep:
            os.set_inheritable(fd, True)
        # Named as what it will be: tests and ps must not take it for a serving daemon.
        forked.name_process(HOLDER_NAME)
        time.sleep(delay)
        os.execv(argv[0], argv)
    finally:
        os._exit(127)


def _exchange(sock: socket.socket, what: str, verb: bytes, payload: bytes,
              fds: tuple[int, ...] = ()) -> tuple[bytes, bytes, list[int]] | None:
    """One message to a holder and its answer, within ANSWER_TIMEOUT; the socket closed
    and a one-line MountError if it does not answer."""
    try:
        sock.settimeout(ANSWER_TIMEOUT)
        holdwire.send(sock, verb, payload, fds)
    except (OSError, holdwire.BadMessage) as e:
        sock.close()
        raise MountError(f"{what} did not answer ({e})") from None
    return _receive(sock, what)


def ask(mountpoint: str) -> Lease | None:
    """The connection of ``mountpoint`` from its holder, for a successor; None where no
    holder listens. Refused (another daemon serves): MountError, one line."""
    path = socket_path(mountpoint)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return None
    what = f"{mountpoint}: its FUSE holder"
    msg = _exchange(sock, what, b"serve", str(os.getpid()).encode())
    kept: list[tuple[int, bytes, int]] = []
    while msg is not None and msg[0] == b"kept":    # the triggers, then the grant
        got = holdwire.split_trigger(msg[1], msg[2])
        if got is not None and got[2] is not None:
            kept.append((got[0], got[1], got[2]))
        msg = _receive(sock, what)
    if msg is None or msg[0] != b"granted" or len(msg[2]) != 2:
        for _, _, fd in kept:
            os.close(fd)
        for fd in (msg[2] if msg else []):
            os.close(fd)
        sock.close()
        why = msg[1].decode(errors="replace") if msg else "no answer"
        raise MountError(one_line(f"{mountpoint} is already served by another guestfs "
                                  f"mount ({why}); one mount per mountpoint"))
    fuse_fd, lock_fd = msg[2]
    lease = Lease(sock, fuse_fd, msg[1].decode(), lock_fd, keeps=external_holder_listens())
    lease.kept = kept
    return lease


def _receive(sock: socket.socket, what: str) -> tuple[bytes, bytes, list[int]] | None:
    """The holder's next message, within ANSWER_TIMEOUT (a one-line MountError if not)."""
    try:
        sock.settimeout(ANSWER_TIMEOUT)
        msg = holdwire.recv(sock)
        sock.settimeout(None)
    except (OSError, holdwire.BadMessage) as e:
        sock.close()
        raise MountError(f"{what} did not answer ({e})") from None
    return msg


def handoff_path(lock_dir: str | None = None) -> str:
    return os.path.join(lock_dir or mountlock.LOCK_DIR, holdwire.HANDOFF)


def external_holder_listens() -> bool:
    """A standalone holder (`guestfs fuse-holder`) listens in this lock directory."""
    import stat
    try:
        return stat.S_ISSOCK(os.stat(handoff_path(), follow_symlinks=False).st_mode)
    except OSError:
        return False


def hand_over(fuse_fd: int, lock_fd: int, mountpoint: str,
              wait: float = EXTERNAL_WAIT) -> Lease:
    """A mount just made, handed to the standalone holder (`mount --external-holder`,
    the DaemonSet's: the holder lives in a pod of its own), waiting ``wait`` seconds for
    it to listen."""
    import time
    path = handoff_path()
    deadline = time.monotonic() + wait
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            sock.connect(path)
            break
        except OSError as e:
            sock.close()
            if time.monotonic() >= deadline:
                raise MountError(f"no FUSE holder listens at {path} ({e.strerror}) after "
                                 f"{wait:g}s: start `guestfs fuse-holder --lock-dir "
                                 f"{os.path.dirname(path)}`, or mount without "
                                 "--external-holder") from None
            time.sleep(0.2)
    name = os.path.basename(socket_path(mountpoint))
    msg = _exchange(sock, f"the FUSE holder at {path}", b"hold",
                    f"{name}\n{mountpoint}".encode(), (fuse_fd, lock_fd))
    if msg is None or msg[0] != b"ready":
        sock.close()
        why = msg[1].decode(errors="replace") if msg else "no answer"
        raise MountError(one_line(f"the FUSE holder at {path} refused {mountpoint}: {why}"))
    log.info("the FUSE holder at %s keeps the connection of %s", path, mountpoint)
    return Lease(sock, fuse_fd, keeps=True)


def mount_held(mountpoint: str, fsname: str, allow_other: bool, lock_fd: int,
               respawn: list[str], reader_views: bool, external: bool = False,
               readonly: bool = True) -> Held:
    """The first daemon's mount, its holder (started here, or the standalone one it is
    handed to), then privileges dropped."""
    m = privileges.mount_fuse(mountpoint, fsname, allow_other, readonly)
    try:
        lease = hand_over(m.fd, lock_fd, mountpoint) if external else \
            start_holder(m.fd, lock_fd, mountpoint, respawn)
    except MountError:
        privileges.detach(mountpoint)
        os.close(m.fd)
        raise
    watcher = _watcher(m.fd, mountpoint)
    privileges.drop_and_report(reader_views, "the FUSE holder unmounts")
    return Held(lease, watcher)


def _watcher(fuse_fd: int, mountpoint: str) -> tuple[int, int] | None:
    """The unmount watcher of a held mount: what detaches it at a clean stop once its
    holder has died (Held.finish). Started while single-threaded, before the drop."""
    try:
        return privileges.start_unmount_watcher(privileges.FuseMount(fuse_fd, mountpoint))
    except OSError as e:
        log.warning("no unmount watcher (%s): should the FUSE holder die, a clean stop "
                    "leaves the mount stale", e.strerror or e)
        return None


def take_over(lease: Lease, mountpoint: str, reader_views: bool) -> Held:
    """A successor's start: privileges dropped as the first daemon's were (a successor the
    holder started has the holder's)."""
    watcher = _watcher(lease.fuse_fd, mountpoint)
    privileges.drop_and_report(reader_views, "the FUSE holder unmounts")
    log.info("took over the FUSE connection from its holder")
    return Held(lease, watcher)
