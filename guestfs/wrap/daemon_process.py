"""The daemon `guestfs run` starts: the first one forked from run itself, a restarted one
executed as `guestfs mount` (docs/run.md, "How `run` starts its daemon").

The app waits for the first one, and a fresh interpreter would make it wait for Python's
start and for every module run has already loaded (about 60 ms of the 0.15 s the app
may wait, `benchmarks/bench_startup.py`). A fork has them all, and what the daemon loads
beyond them then loads while run goes on with its own preparations on the other CPU. Only
a single-threaded run forks: the supervisor's restarts happen beside its threads, where a
child of a fork could inherit a lock another thread held, so they execute `guestfs mount`.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from guestfs.system import forked
from guestfs.system.selfexec import guestfs_argv

# What the forked daemon calls itself (/proc/PID/comm, `ps -o comm`, `pgrep -x`).
DAEMON_NAME = b"guestfs-mount"


class RunError(RuntimeError):
    pass


class ForkedDaemon:
    """The first daemon, a child of this process, with what run and its supervisor ask of
    a subprocess.Popen: pid, returncode, poll, wait, send_signal, terminate, kill. Its pid
    is ours until we reap it, so signals by pid cannot reach another process (no pidfd:
    gVisor has none)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(ChildProcessError):
                done, status = os.waitpid(self.pid, os.WNOHANG)
                if done:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if timeout is None:
            if self.returncode is None:
                _, status = os.waitpid(self.pid, 0)
                self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(["guestfs mount"], timeout)
            time.sleep(0.01)
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


Daemon = subprocess.Popen | ForkedDaemon  # type: ignore[type-arg]
Entry = Callable[[list[str]], int]


def start_daemon(mp: str, mount_args: list[str],
                 env: dict[str, str] | None = None,
                 timeout: float = 20.0) -> subprocess.Popen[bytes]:
    """``guestfs mount MP`` executed as a child that serves while any run uses it.

    Its own session: the terminal's SIGINT/SIGQUIT (Ctrl-C, sent to the whole foreground
    process group) and SIGHUP reach the app and us, never the daemon, which we stop once
    the app has exited. With --exit-when-unused it stops itself once no run holds the
    mount's users lock, so a run killed with -9 leaves nothing behind, while a daemon
    another run still uses outlives the run that started it (docs/run.md).

    Waited for on a pipe the daemon writes to once FUSE's INIT is done (--ready-fd), not
    by polling the mount: each look at it is a child process of its own (probe_mount),
    and their start-ups took the CPU from the daemon's."""
    r, w = os.pipe()
    try:
        proc = subprocess.Popen(guestfs_argv(["mount", mp, *mount_args, "--ready-fd", str(w)]),
                                start_new_session=True, env=env, pass_fds=(w,))
    except BaseException:
        os.close(r)
        raise
    finally:
        os.close(w)
    return wait_ready(mp, proc, r, timeout)


def fork_daemon(mp: str, mount_args: list[str], entry: Entry,
                env: dict[str, str] | None = None) -> tuple[ForkedDaemon, int]:
    """``guestfs mount MP`` in a forked child, as start_daemon's but not waited for: the
    child and the pipe end wait_ready takes. ``entry`` runs an argv as the guestfs
    command does (cli.mount.alone). Only from a single-threaded process."""
    if not forked.single_threaded():
        raise RunError("the daemon is forked only from a single-threaded run")
    r, w = os.pipe()
    pid = forked.fork()
    if pid == 0:  # pragma: no cover - the child never returns: it serves, then exits
        os.close(r)
        _serve_in_child(entry, ["mount", mp, *mount_args, "--ready-fd", str(w)], w, env)
    os.close(w)
    return ForkedDaemon(pid), r


def _serve_in_child(entry: Entry, argv: list[str], keep_fd: int,
                    env: dict[str, str] | None) -> None:
    """The forked child: nothing of run's but stdio and ``keep_fd`` (run's users lock
    above all: held here, the daemon would never find itself unused), default signal
    dispositions, then `guestfs mount` until it ends."""
    rc = 1
    try:
        forked.cut_off((keep_fd,), devnull_stdio=False)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT
                          else signal.SIG_DFL)
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
            if "tempfile" in sys.modules:
                sys.modules["tempfile"].tempdir = None   # TMPDIR is read again
        forked.name_process(DAEMON_NAME)
        rc = entry(argv)
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    except BaseException:  # never back into run's code: that is the parent's
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(rc)


def wait_ready(mp: str, proc: Daemon, r: int, timeout: float = 20.0) -> Daemon:
    """``proc`` once it tells on ``r`` (closed here) that it serves. Given up as soon as
    the daemon exits (killed while starting, a refused mount): the supervisor then
    retries with backoff instead of waiting out the timeout."""
    try:
        told = _wait_ready(r, proc, timeout)
    finally:
        os.close(r)
    if not told or proc.poll() is not None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        proc.wait()
        raise RunError(f"guestfs mount {mp} did not come up")
    return proc


def _wait_ready(r: int, proc: Daemon, timeout: float) -> bool:
    """Until the daemon's byte arrives (True), or end of file (it exited, or closed the
    pipe unasked), or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        if select.select([r], [], [], min(left, 0.5))[0]:
            return os.read(r, 1) == b"r"
        if proc.poll() is not None:
            return False
    return False
