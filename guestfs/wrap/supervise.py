"""`guestfs run`'s supervision: count the runs that use a mount, and restart a daemon that
died, re-binding its files inside the app's mount namespace.

A restarted daemon is a new FUSE connection, mounted in run's own mount namespace; the
app's namespace is private (nothing propagates into it) and still holds binds of the dead
connection, which answer ENOTCONN. So each served file of the new mount is cloned into a
detached mount tree here (open_tree), and a forked child joins the app's namespace,
detaches the stale binds and moves the clones over them (move_mount). The app never
restarts and needs no privilege for it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable

from guestfs.daemon import mountlock
from guestfs.daemon.mountpoint import is_guestfs_mount
from guestfs.sources.mountinfo import unescape
from guestfs.system import libc, sysmount
from guestfs.system.oneline import os_error_line

log = logging.getLogger("guestfs.run")

USERS_TIMEOUT = 15.0  # how long a new run waits for a daemon that is stopping to be gone



def _dead_connection(path: str) -> bool:
    """``path`` is served by a FUSE connection whose daemon is gone. A stat, and a read of
    a page-cached file, can still be answered from the kernel's caches for a moment after
    the daemon died; a statfs always asks the daemon. The path is the app's to change:
    opened with O_PATH|O_NOFOLLOW, so a symlink is not followed and nothing is opened."""
    try:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            sysmount.fs_type(fd)
        finally:
            os.close(fd)
    except OSError as e:
        return e.errno in (errno.ENOTCONN, errno.ECONNABORTED)
    return False


def replace_mount(tree_fd: int, target: str) -> None:
    """In the current namespace: put ``tree_fd`` at ``target`` in place of the dead mount
    there, with no moment in between where a reader would get the kernel's own file (the
    host's numbers): the new mount goes beneath the dead one, which is then detached.
    Where that cannot be done (a kernel before 6.5, or a dead mount locked into a user
    namespace, which cannot be unmounted) the new mount covers the dead one instead."""
    if _dead_connection(target):
        try:
            sysmount.move_mount_path(tree_fd, target, beneath=True)
        except OSError:
            pass
        else:
            with contextlib.suppress(OSError):
                sysmount.umount_nofollow(target)
            return
    sysmount.move_mount_path(tree_fd, target)


def rebind_in(pid: int, pairs: list[tuple[str, str]]) -> None:
    """For each (source here, target in ``pid``'s mount namespace): replace the target with
    a clone of the source. The namespace is joined by a forked child: a process with
    threads cannot setns into a mount namespace."""
    fds = [sysmount.open_tree_clone_path(src) for src, _ in pairs]
    try:
        r, w = os.pipe()
        child = os.fork()
        if child == 0:  # pragma: no cover - runs in the child; reports through the pipe
            os.close(r)
            code, msg = 0, b""
            try:
                sysmount.enter_mount_namespace(pid)
                for fd, (_, target) in zip(fds, pairs, strict=True):
                    replace_mount(fd, target)
            except BaseException as e:  # noqa: BLE001 - any failure goes to the parent
                why = os_error_line(e) if isinstance(e, OSError) else \
                    f"{type(e).__name__}: {e}"
                code, msg = 1, why.encode()
            with contextlib.suppress(OSError):
                os.write(w, msg)
            os._exit(code)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            msg = f.read().decode(errors="replace")
        _, status = os.waitpid(child, 0)
        if status != 0:
            if "setns(mnt" in msg and "Operation not permitted" in msg:
                # setns(CLONE_NEWNS) wants CAP_SYS_CHROOT beside CAP_SYS_ADMIN; Kubernetes'
                # drop ALL + add SYS_ADMIN, SETPCAP has no SYS_CHROOT.
                msg += (" (joining a mount namespace needs CAP_SYS_CHROOT too: add "
                        "SYS_CHROOT to the container so a restarted daemon's files reach "
                        "the app; until the app restarts it reads ENOTCONN)")
            raise OSError(f"re-binding in pid {pid}'s mount namespace: {msg or 'failed'}")
    finally:
        for fd in fds:
            os.close(fd)


def _signal_main_thread(pid: int, sig: int) -> None:
    """tgkill(pid, pid, sig): ``sig`` to the main thread of process ``pid`` only."""
    tgkill = libc.tgkill
    if tgkill is None:  # a libc older than 2.30
        os.kill(pid, sig)
        return
    if tgkill(ctypes.c_int(pid), ctypes.c_int(pid), ctypes.c_int(sig)) != 0:
        e = ctypes.get_errno()
        if e == errno.ESRCH:
            raise ProcessLookupError(e, f"tgkill {pid}: {os.strerror(e)}")
        raise OSError(e, f"tgkill {pid}: {os.strerror(e)}")


def join_users(mp: str, timeout: float = USERS_TIMEOUT) -> int:
    """Count this run as a user of ``mp`` (a shared lock, held until exit or death). Waits
    while a daemon that found itself unused is stopping (it holds the lock exclusively)."""
    fd = mountlock.acquire(mp, "users", fcntl.LOCK_SH, timeout)
    if fd is None:
        raise OSError(f"{mp}: its guestfs daemon has been stopping for {timeout:g}s "
                      "(stopped with SIGSTOP?)")
    return fd


def stop_daemon(proc: subprocess.Popen, timeout: float = 10.0) -> None:  # type: ignore[type-arg]
    """SIGTERM to the daemon's main thread (it unmounts on it) and SIGCONT (a stopped daemon
    would sit on it); SIGKILL after ``timeout``. libfuse's loop ends only when its main
    thread takes the signal. The daemon blocks it in its other threads, but one started by
    another guestfs version may not: sent to the process, a SIGTERM could then be taken by
    any thread once a stopped daemon continues, and the daemon would never unmount."""
    if proc.poll() is not None:
        return
    try:
        _signal_main_thread(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(proc.pid, signal.SIGCONT)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def leave_users(mp: str, users_fd: int,
                daemon: subprocess.Popen | None) -> None:  # type: ignore[type-arg]
    """Drop this run's share of ``mp``. The daemon this run started is stopped now if no
    other run uses it; otherwise it keeps serving them and exits by itself after the last
    (``--exit-when-unused``), whoever started it."""
    os.close(users_fd)
    ours = daemon is not None and daemon.poll() is None
    last = mountlock.acquire(mp, "users", fcntl.LOCK_EX)
    if last is None:
        if ours:
            log.info("%s: other guestfs runs still use it; the daemon stays until the last "
                     "one ends", mp)
        return
    try:
        if ours:
            stop_daemon(daemon)  # type: ignore[arg-type]
    finally:
        mountlock.release_removing(last, mp, "users")


def daemon_gone(mp: str) -> bool:
    """No daemon serves ``mp``: its mount lock is free (a live or stopped daemon holds it)
    and no live guestfs mount is there. Never blocks on a stopped daemon: the mount is
    only looked at once the lock says its daemon is gone."""
    return not mountlock.served_by_other(mp) and not is_guestfs_mount(mp)


def mount_identity(mp: str) -> tuple[str, str] | None:
    """(mount id, device) of the FUSE mount on top at ``mp``, from our mountinfo (never
    from the mount itself, which could block). A new daemon's mount differs from the one
    it replaced in both: the old superblock keeps its device while any bind of it is left."""
    found = None
    with contextlib.suppress(OSError), open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            with contextlib.suppress(ValueError, IndexError):
                sep = fields.index("-")
                if unescape(fields[4]) == mp and fields[sep + 1].startswith("fuse"):
                    found = (fields[0], fields[2])
    return found


StartDaemon = Callable[[], "subprocess.Popen[bytes]"]


def start_or_reuse(mp: str, start: StartDaemon) -> subprocess.Popen | None:  # type: ignore[type-arg]
    """Start a daemon for ``mp``; None if another run started one at the same moment (ours
    then lost the mount lock and exited) and that one serves."""
    try:
        return start()
    except Exception:
        if is_guestfs_mount(mp):
            log.info("%s: another guestfs run mounted it first; using that mount", mp)
            return None
        raise


class Supervisor:
    """Watches the daemon serving ``mp`` for the app ``app_pid``: once it is gone (killed,
    crashed, unmounted by hand), starts a new one and re-binds ``binds`` (source here,
    target in the app's namespace; none for copies that are refreshed from ``mp``) there.
    A new mount that another run sharing ``mp`` started first is re-bound as well: the
    mount the app's binds come from is remembered, not only whether a daemon serves.

    A stopped daemon (SIGSTOP) is not gone: it holds its lock, its readers wait and go on
    after SIGCONT. Restarts back off (1, 2, 4 ... 30 s) while the daemon keeps dying."""

    def __init__(self, mp: str, start: StartDaemon, app_pid: int,
                 binds: list[tuple[str, str]] | None,
                 daemon: subprocess.Popen | None = None,  # type: ignore[type-arg]
                 interval: float = 0.2, app_sees_mountpoint: bool = True) -> None:
        self.mp, self.start_daemon, self.app_pid = mp, start, app_pid
        # The app's namespace has ``mp`` too, unless run mounted in a private tmpfs that
        # the app's namespace detached (runspace.py).
        own = [(mp, mp)] if app_sees_mountpoint else []
        self.pairs = [*own, *binds] if binds is not None else []
        self.daemon = daemon
        self.bound = mount_identity(mp)  # the mount the app's binds were made from
        self._failed: tuple[str, str] | None = None
        self._logged: set[str] = set()
        self.interval = interval
        self.restarts: list[float] = []  # monotonic times of each recovery
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="guestfs-supervise",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _loop(self) -> None:
        backoff = 0.0
        while not self._stop.wait(self.interval):
            if self.daemon is not None:
                self.daemon.poll()  # reap it, so its lock and mount are seen as gone
            try:
                if not daemon_gone(self.mp):
                    self._follow_new_mount()
                    continue
            except OSError as e:
                log.warning("checking the daemon of %s: %s", self.mp, os_error_line(e))
                continue
            if backoff and self._stop.wait(backoff):
                return
            backoff = 0.0 if self._recover() else min(30.0, max(1.0, backoff * 2))

    def _follow_new_mount(self) -> None:
        """A daemon serves, but from a mount other than the app's binds' (another run
        sharing ``mp`` restarted it first): re-bind from it."""
        now = mount_identity(self.mp)
        if not self.pairs or now is None or now == self.bound:
            return
        try:
            rebind_in(self.app_pid, self.pairs)
        except OSError as e:
            if self._failed != now:  # retried every round, logged once per mount
                self._log_once(e)
                self._failed = now
            return
        self.bound = now
        self.restarts.append(time.monotonic())
        log.warning("%s: a new daemon serves it; files re-bound for pid %d", self.mp,
                    self.app_pid)

    def _log_once(self, e: OSError) -> None:
        """The same failure (a missing capability) is logged once, not every round."""
        if str(e) not in self._logged:
            self._logged.add(str(e))
            log.error("%s", os_error_line(e))

    def _recover(self) -> bool:
        began = time.monotonic()
        log.warning("the guestfs daemon of %s is gone; starting a new one", self.mp)
        if self.daemon is not None:
            self.daemon.poll()   # reap the dead one: no zombie left beside its successor
        try:
            self.daemon = self.start_daemon()
        except Exception as e:  # noqa: BLE001 - any failure: retry with backoff
            # Another run sharing the mount may have restarted it first: use that one.
            if not is_guestfs_mount(self.mp):
                log.error("restarting the daemon of %s failed: %s", self.mp, e)
                return False
        if self.pairs and not self._stop.is_set():
            try:
                rebind_in(self.app_pid, self.pairs)
            except OSError as e:
                self._log_once(e)
                self._failed = mount_identity(self.mp)
                return False
        self.bound = mount_identity(self.mp)
        self.restarts.append(time.monotonic())
        log.warning("%s served again, files re-bound for pid %d in %.2fs", self.mp,
                    self.app_pid, time.monotonic() - began)
        return True
