"""`guestfs mount`: set up and run the FUSE daemon."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from guestfs import mountlock, sysmount
from guestfs.explicit import ExplicitLimits
from guestfs.fuse_binding import load_binding
from guestfs.fusefs import make_operations
from guestfs.hostpin import pin_host_files
from guestfs.server import ServerConfig, ViewServer
from guestfs.view import SERVED_FILES

log = logging.getLogger("guestfs.mount")
FSNAME = "guestfs"
ATTR_TIMEOUT = 0.5  # kernel attr/entry cache; the files never change shape
PROBE_FILE = "/sys/devices/system/cpu/online"  # served with a sysfs-style size of 4096
LIBFUSE3_STOPPED_BY_SIGNAL = 8
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT}


class MountError(RuntimeError):
    pass


@dataclass(frozen=True)
class MountOptions:
    mountpoint: str
    view: str
    cgroup: str | None
    cache_ttl: float
    explicit: ExplicitLimits
    cpu_rounding: str
    binding: str = "auto"
    allow_other: bool = False
    daemon: bool = False
    pid_file: str | None = None
    log_file: str | None = None
    exit_when_unused: bool = False


def is_guestfs_mount(path: str) -> bool:
    """A live guestfs mount at ``path`` (read from our mount table)."""
    path = os.path.abspath(path)
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                sep = fields.index("-")
                if fields[4] != path:
                    continue
                if fields[sep + 1] == f"fuse.{FSNAME}":
                    return not sysmount.is_stale_mount(path)
                if fields[sep + 1] == "fuse":
                    # gVisor shows neither the subtype nor the fsname: look at the layout.
                    return _serves(path)
    except (OSError, ValueError):
        return False
    return False


def _serves(mp: str) -> bool:
    """``mp`` answers with guestfs's layout (its sysfs-style file has a non-zero size)."""
    try:
        with open(f"{mp}{PROBE_FILE}", "rb") as f:
            return bool(f.read())
    except OSError:
        return False


def _read_from_child(path: str, timeout: float = 10.0) -> bytes | None:
    """``path`` read by a child process. The daemon reads its own mount only this way: a
    thread of the serving process blocked in a FUSE request to that same process makes it
    unkillable (kill -9 then leaves a process that never exits and a wedged mount)."""
    # Our own interpreter by absolute path, isolated (-I: no cwd or user site on sys.path),
    # never a `cat` looked up in a PATH that may hold the working directory.
    reader = "import sys; sys.stdout.buffer.write(open(sys.argv[1], 'rb').read())"
    try:
        out = subprocess.run([sys.executable, "-I", "-S", "-c", reader, path],
                             capture_output=True, timeout=timeout, close_fds=True, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def probe_fuse_client(mp: str, ops: object, timeout: float = 30.0) -> None:
    """Some FUSE clients (gVisor's) stop reading at st_size even with direct_io, so a
    procfs-style size of 0 reads empty. Read our own mount once it serves and, if so,
    switch the operations to reporting real sizes."""
    if not wait_until(lambda: bool(_read_from_child(f"{mp}{PROBE_FILE}")), timeout, 0.05):
        log.warning("%s did not start serving within %gs; size probe skipped", mp, timeout)
        return
    data = _read_from_child(f"{mp}/proc/uptime")
    if data is None:
        log.warning("size probe failed: %s/proc/uptime could not be read", mp)
        return
    empty = not data
    if empty:
        ops.sized = True  # type: ignore[attr-defined]
        log.warning("this FUSE client stops reading at the file size even with direct_io "
                    "(gVisor does): reporting each file's rendered size from now on")


def prepare_mountpoint(mp: str) -> None:
    if sysmount.is_stale_mount(mp):
        # A daemon was killed and left "Transport endpoint is not connected" behind.
        log.warning("%s: stale FUSE mount from a dead daemon; detaching it", mp)
        sysmount.umount(mp, detach=True)
    if os.path.ismount(mp):
        raise MountError(f"{mp} is already a mount point"
                         + (" (a running guestfs)" if is_guestfs_mount(mp) else ""))
    os.makedirs(mp, exist_ok=True)


def hold_mount_lock(mp: str, timeout: float = 1.0) -> int:
    """Take ``mp``'s mount lock for the life of this process (the descriptor is returned and
    must stay open): one guestfs mount per mountpoint. Taken before the mountpoint is even
    looked at, so a second mount neither stacks on a live one nor probes (and blocks on)
    one whose daemon is stopped. Waits ``timeout`` for a holder that only probes it."""
    fd = mountlock.acquire(mp, "mount", fcntl.LOCK_EX, timeout)
    if fd is None:
        owner = mountlock.read_owner(mp)
        raise MountError(f"{mp} is already served by another guestfs mount"
                         + (f" (pid {owner.split()[0]})" if owner else "")
                         + "; one mount per mountpoint")
    return fd


def exit_when_unused(mp: str, interval: float = 0.25, grace: float = 2.0) -> list[int]:
    """Stop serving once no `guestfs run` holds ``mp``'s users lock. The exclusive lock is
    kept until exit (the returned list receives its descriptor), so a run arriving
    meanwhile waits for this daemon to be gone and then starts its own, instead of reusing
    a mount that is going away. The first check waits ``grace`` seconds, for libfuse to
    have installed the SIGTERM handler that unmounts."""
    held: list[int] = []
    main = threading.main_thread().ident

    def loop() -> None:
        time.sleep(grace)
        while (fd := mountlock.acquire(mp, "users", fcntl.LOCK_EX)) is None:
            time.sleep(interval)
        held.append(fd)
        log.info("%s: no guestfs run uses this mount any more; stopping", mp)
        # To the main thread: libfuse's handler ends the loop, serve() unmounts.
        signal.pthread_kill(main, signal.SIGTERM)  # type: ignore[arg-type]

    threading.Thread(target=loop, name="guestfs-users", daemon=True).start()
    return held


def wait_until(ready: Callable[[], bool], timeout: float, interval: float = 0.02) -> bool:
    """Poll ``ready`` until it holds (True) or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
    return True


def wait_mounted(mp: str, child_pid: int | None = None, timeout: float = 20.0) -> bool:
    """Until guestfs serves at ``mp``; False after ``timeout`` or once ``child_pid`` (the
    daemon being waited for) has exited."""
    def exited() -> bool:
        return child_pid is not None and os.waitpid(child_pid, os.WNOHANG)[0] != 0

    return wait_until(lambda: is_guestfs_mount(mp) or exited(), timeout) \
        and is_guestfs_mount(mp)


def _daemonize(opts: MountOptions) -> None:
    """Fork; the parent returns to exit once the mount is up, the child serves."""
    pid = os.fork()
    if pid > 0:
        ok = wait_mounted(opts.mountpoint, pid)
        os._exit(0 if ok else 1)
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    out = os.open(opts.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) \
        if opts.log_file else devnull
    os.dup2(out, 1)
    os.dup2(out, 2)


def serve(opts: MountOptions) -> int:
    mp = os.path.abspath(opts.mountpoint)
    binding = load_binding(opts.binding)
    lock_fd = hold_mount_lock(mp)
    prepare_mountpoint(mp)
    if opts.daemon:
        _daemonize(opts)
    mountlock.write_owner(lock_fd, f"{os.getpid()} {mp}\n")
    # libfuse's loop ends only when its own (the main) thread takes SIGTERM/SIGINT; it
    # blocks them in its workers, and every thread started here inherits this mask, so a
    # signal sent to the process cannot land on one of ours (after a SIGSTOP/SIGCONT it
    # did, and the daemon then never stopped). Unblocked in this thread just before FUSE.
    unblocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    users_held = exit_when_unused(mp) if opts.exit_when_unused else []
    host = pin_host_files(SERVED_FILES)
    server = ViewServer(host, ServerConfig(opts.view, opts.cgroup, opts.cache_ttl,
                                           opts.explicit, opts.cpu_rounding))
    server.start_sampler()
    if opts.pid_file:
        with open(opts.pid_file, "w") as f:
            f.write(f"{os.getpid()}\n")
    log.info("serving %s with %s (%s); view=%s%s cache_ttl=%gs host files from %s", mp,
             binding.name, binding.libfuse, opts.view,
             f" cgroup={opts.cgroup}" if opts.cgroup else "", opts.cache_ttl, host.origin)
    # libfuse only installs its SIGINT/SIGTERM handlers (which unmount cleanly) over the
    # default disposition, and Python has its own SIGINT handler.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    kwargs = {"foreground": True, "ro": True, "nothreads": False, "fsname": FSNAME,
              "subtype": FSNAME, "attr_timeout": ATTR_TIMEOUT, "entry_timeout": ATTR_TIMEOUT,
              "default_permissions": True}
    if opts.allow_other:
        kwargs["allow_other"] = True
    ops = make_operations(binding.module, server)
    threading.Thread(target=probe_fuse_client, args=(mp, ops), name="guestfs-probe",
                     daemon=True).start()
    signal.pthread_sigmask(signal.SIG_SETMASK, unblocked)
    try:
        binding.module.FUSE(ops, mp, raw_fi=True, **kwargs)
    except RuntimeError as e:
        # libfuse3's fuse_main returns 8 when a signal ended the loop: a clean stop.
        if e.args != (LIBFUSE3_STOPPED_BY_SIGNAL,):
            log.error("FUSE failed on %s: %s", mp, e)
            return 1
    finally:
        server.stop()
        host.close()
        if opts.pid_file:
            with contextlib.suppress(OSError):
                os.unlink(opts.pid_file)
        if sysmount.is_stale_mount(mp) or is_guestfs_mount(mp):
            with contextlib.suppress(OSError):
                sysmount.umount(mp, detach=True)
        # Unmounted: the locks' files can go (kept if a run still holds the users lock).
        for fd in users_held:
            mountlock.release_removing(fd, mp, "users")
        mountlock.release_removing(lock_fd, mp, "mount")
    log.info("unmounted %s (%d reads fell back to host files)", mp, server.errors)
    return 0


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(stream=sys.stderr, level=logging.DEBUG if verbose else logging.INFO,
                        format="guestfs[%(process)d] %(levelname)s %(name)s: %(message)s")
