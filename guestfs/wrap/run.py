"""`guestfs run -- CMD`: CMD in a private mount namespace with the served files bound
over their /proc and /sys counterparts; the filesystem is mounted first, or reused."""

from __future__ import annotations

import contextlib
import fcntl
import gc
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import dataclass

from guestfs.daemon.mountpoint import wait_until
from guestfs.render.served import BOUND_BY_DEFAULT, SERVED_FILES
from guestfs.sources.host_root import pread_path
from guestfs.syscalls.answers import (
    ServedView,
    SyscallSupervisor,
    hand_over_listener,
    interception_for,
    supervise_listener,
    take_listener,
    texts_under,
)
from guestfs.syscalls.filter import Interception
from guestfs.syscalls.guard import ListenerGuard
from guestfs.system import sysmount
from guestfs.system.oneline import one_line, os_error_line
from guestfs.wrap import runspace, supervise
from guestfs.wrap.apppriv import AppSetup, container_clock_source, prepare_app
from guestfs.wrap.daemon_process import Daemon, RunError, start_daemon, wait_ready
from guestfs.wrap.runspace import RunSpace
from guestfs.wrap.start import RunStart

log = logging.getLogger("guestfs.run")
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2, signal.SIGWINCH)


def stop_process(proc: subprocess.Popen, timeout: float = 10.0) -> None:  # type: ignore[type-arg]
    """SIGTERM (a guestfs daemon unmounts on it), then SIGKILL after ``timeout``."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def check_reused_view(mp: str) -> None:
    """A live mount at ``mp`` serving a fixed view of the daemon's own cgroup (what run
    starts) is reused only by a run in that same cgroup: another cgroup's limits must not
    be served to this CMD."""
    from guestfs.daemon.daemon_status import read_status

    try:
        status = read_status(mp)
    except OSError as e:
        raise RunError(f"{mp}: cannot read the serving daemon's status: {e}") from e
    if status.get("layout") == "per-container":
        # Its files are under MP/<key>/: nothing at MP/proc to bind (run waited 30 s for
        # one, then blamed an empty file).
        raise RunError(f"{mp} is a per-container mount (MP/<key>/proc/...): give this run a "
                       "--mountpoint of its own, or bind a container's directory with "
                       "guestfs attach")
    theirs = status.get("self_cgroup")
    if theirs is None:
        return   # a per-caller or pinned view: every reader gets what it should
    with open("/proc/self/cgroup", encoding="utf-8", errors="replace") as f:
        ours = f.read()
    if theirs != ours:
        raise RunError(f"{mp} is served for another cgroup's processes; give this run a "
                       "--mountpoint of its own")


def binds_for(mp: str, pressure: bool = False) -> list[tuple[str, str]]:
    # A kernel without PSI has no /proc/pressure: nothing to cover there.
    files = SERVED_FILES if pressure else BOUND_BY_DEFAULT
    return [(mp + f, f) for f in files if os.path.exists(f)]


def wait_serving(path: str, timeout: float = 30.0) -> None:
    """Until a read of ``path`` returns data: a daemon that found a FUSE client which stops
    at st_size (gVisor) reports sizes only once its probe has run."""
    def reads_data() -> bool:
        with contextlib.suppress(OSError), open(path, "rb") as f:
            return bool(f.read())
        return False

    if not wait_until(reads_data, timeout, 0.05):
        raise RunError(f"{path} reads empty after {timeout:g}s")


def rereads_after_lseek(path: str) -> bool:
    """Whether an open FUSE file can be read again after lseek(0), as procps does on every
    sample. gVisor's FUSE client (runsc 20221219) answers EOF without asking the server."""
    with open(path, "rb", buffering=0) as f:
        first = f.read()
        f.seek(0)
        again = f.read()
    return bool(first) and bool(again)


class Materialized:
    """The served files as regular files in a private directory, refreshed in place every
    ``interval`` seconds from the mount (with pread, which such clients do forward). For
    FUSE clients whose open files cannot be re-read; in place, because a bind mount pins
    the inode. Readers see the view of the `guestfs run` process itself."""

    def __init__(self, binds: list[tuple[str, str]], interval: float = 1.0,
                 parent: str | None = None) -> None:
        import tempfile  # only for such clients: with shutil, ~5 ms of every run's start

        self.dir = tempfile.mkdtemp(prefix="guestfs-run-", dir=parent)
        self.sources = {guest: src for src, guest in binds}
        self.binds = [(os.path.join(self.dir, guest.strip("/").replace("/", "_")), guest)
                      for _src, guest in binds]
        self.interval = interval
        self._stop = threading.Event()
        self.refresh()
        self._thread = threading.Thread(target=self._loop, name="guestfs-refresh",
                                        daemon=True)
        self._thread.start()

    def refresh(self) -> None:
        for dst, guest in self.binds:
            try:
                data = pread_path(self.sources[guest])
            except OSError as e:
                log.warning("refreshing %s: %s", guest, os_error_line(e))
                continue
            fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o444)
            try:
                os.pwrite(fd, data, 0)
                os.ftruncate(fd, len(data))
            finally:
                os.close(fd)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.refresh()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        import shutil

        shutil.rmtree(self.dir, ignore_errors=True)


def share_users_lock(users_fd: int) -> None:
    """Give the app a shared hold of the mount's users lock of its own, inherited across
    exec by everything it starts: the daemon (--exit-when-unused) serves while any holder
    lives, so the app's files keep serving if run itself is killed (-9, an OOM kill), until
    the app's last process is gone. A fresh read-only open (not run's descriptor): the app
    gets nothing it could write to."""
    fd = os.open(f"/proc/self/fd/{users_fd}", os.O_RDONLY | os.O_CLOEXEC)
    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)   # run holds it shared: never blocks
    os.set_inheritable(fd, True)


def _child(binds: list[tuple[str, str]], cmd: list[str], app: AppSetup,
           seccomp: tuple[socket.socket, Interception, ListenerGuard] | None,
           space: RunSpace, users_fd: int) -> None:
    try:
        sysmount.unshare_mount_namespace()
        for src, dst in binds:
            sysmount.bind(src, dst)
        share_users_lock(users_fd)   # before the private space (its lock dir) is hidden
        runspace.hide_from_app(space)
        if seccomp is not None:
            hand_over_listener(*seccomp)   # before prepare_app drops CAP_SYS_ADMIN
        prepare_app(app)
    except OSError as e:
        print(f"guestfs run: {os_error_line(e)}", file=sys.stderr)
        os._exit(127)
    try:
        os.execvp(cmd[0], cmd)
    except OSError as e:
        print(one_line(f"guestfs run: {cmd[0]}: {e.strerror}; CMD must be a program this "
                       "user may execute (a path, or a name on PATH)"), file=sys.stderr)
        os._exit(127)


def _start_guard(what: Interception, mp: str) -> ListenerGuard | None:
    """The guard, started before the app so that the app's child can hand it the
    listener before anything else (syscall_view.hand_over_listener). Should run be killed,
    it starts a successor that answers from ``mp`` (syscall_successor.py)."""
    if not what.any:
        return None
    try:
        return ListenerGuard.forked(successor=(mp, what.spelled()))
    except OSError as e:
        # Without a guard a killed run would leave the app's calls failing: no filter.
        log.warning("no seccomp guard (%s): sysinfo and the CPU count are left to the "
                    "kernel", e)
        return None


def _start_syscall_view(sock: socket.socket, mp: str, what: Interception,
                        guard: ListenerGuard) -> SyscallSupervisor | None:
    listener = take_listener(sock)
    if listener is None:
        return None
    # Read at the app's first call, not now: the four reads (and their renderings in the
    # daemon) would take CPU from the app's start, which a pod with a CPU limit waits for.
    return supervise_listener(listener, ServedView(texts_under(mp)), what, guard)


@dataclass
class _DaemonRef:
    """The daemon serving the app's mount: the one run started, or the last one its
    supervisor started in its place (the one run stops when the app is done)."""
    proc: Daemon | None


def run(start: RunStart, cmd: list[str], bind_pressure: bool = False,
        keep_caps: bool = False, host_clock: bool = False, sysinfo: bool = True,
        affinity: str = "view") -> int:
    """CMD with the served files of ``start``'s mount, from a daemon that started with
    it (or one already serving there); the exit code of CMD. Each step registers what
    undoes it on one ExitStack: the teardown is the setup in reverse."""
    mp = start.mountpoint
    with contextlib.ExitStack() as stack:
        daemon = _DaemonRef(start.pending[0] if start.pending else None)
        stack.callback(lambda: supervise.leave_users(mp, start.users_fd, daemon.proc))
        app = AppSetup(keep_caps, start.oom,
                       container_clock_source(mp + "/proc/uptime", host_clock))
        what = interception_for(sysinfo, affinity)
        if start.pending is not None:
            daemon.proc = supervise.start_or_reuse(mp, lambda: wait_ready(mp, *start.pending))
        else:
            check_reused_view(mp)
        binds, copies = _binds(start, bind_pressure, stack)
        # Forked while run still has one thread (an exec'd guard's start-up took 40-50 ms
        # of CPU from the daemon's and the app's), before the app's child, which hands
        # it the listener first.
        guard = _start_guard(what, mp)
        if guard is not None:
            stack.callback(guard.close)
        pid, sock = _fork_app(start, binds, cmd, app, what, guard)
        if sock is not None and guard is not None:
            syscalls = _start_syscall_view(sock, mp, what, guard)
            if syscalls is not None:
                stack.callback(syscalls.stop)
        # Copies are refreshed from mp: only binds of mp need re-binding.
        supervisor = supervise.Supervisor(mp, lambda: start_daemon(
            mp, start.mount_args, start.space.daemon_env()), pid, None if copies else binds,
            daemon.proc, app_sees_mountpoint=start.space.private_dir is None)
        supervisor.start()
        stack.callback(_stop_supervisor, supervisor, daemon)
        gc.enable()   # off while run started (cli/main.py)
        return _wait_app(pid)


def _binds(start: RunStart, pressure: bool, stack: contextlib.ExitStack
           ) -> tuple[list[tuple[str, str]], bool]:
    """(source, target) of each bind once the mount serves, and whether the sources are
    refreshed copies (a FUSE client whose open files cannot be re-read)."""
    mp = start.mountpoint
    binds = binds_for(mp, pressure)
    wait_serving(mp + "/proc/meminfo")
    if rereads_after_lseek(mp + "/proc/meminfo"):
        return binds, False
    log.warning("open files on %s cannot be re-read after lseek (gVisor's FUSE client): "
                "binding regular copies refreshed every second", mp)
    materialized = Materialized(binds, parent=start.space.private_dir)
    stack.callback(materialized.close)
    return materialized.binds, True


def _fork_app(start: RunStart, binds: list[tuple[str, str]], cmd: list[str],
              app: AppSetup, what: Interception, guard: ListenerGuard | None
              ) -> tuple[int, socket.socket | None]:
    """The app's child, and our end of the socket it sends its seccomp listener on. From
    here on a Ctrl-C (and the other forwarded signals) is the app's, not ours."""
    pair = socket.socketpair() if guard is not None else None
    pid = os.fork()
    if pid == 0:
        if pair is not None:
            pair[0].close()
        _child(binds, cmd, app, (pair[1], what, guard) if pair and guard else None,
               start.space, start.users_fd)
    for sig in FORWARDED:
        signal.signal(sig, lambda s, _f: os.kill(pid, s))
    if pair is None:
        return pid, None
    pair[1].close()
    return pid, pair[0]


def _wait_app(pid: int) -> int:
    """The app's exit code as a shell gives it (128 + the signal that killed it)."""
    _, status = os.waitpid(pid, 0)
    for sig in FORWARDED:
        signal.signal(sig, signal.SIG_DFL)
    rc = os.waitstatus_to_exitcode(status)
    return 128 - rc if rc < 0 else rc


def _stop_supervisor(supervisor: supervise.Supervisor, daemon: _DaemonRef) -> None:
    supervisor.stop()
    daemon.proc = supervisor.daemon  # the one it restarted, if it did
