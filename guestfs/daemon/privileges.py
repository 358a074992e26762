"""Least privilege for the daemon: mount first, then keep only what serving needs.

The daemon parses files other processes control (cgroupfs, /proc/<pid>/*) as root, so
once its FUSE mount exists it gives up every capability but CAP_SYS_PTRACE (if it holds
it: a Kubernetes container given only SYS_ADMIN and SETPCAP keeps none) and sets
NoNewPrivs. It mounts /dev/fuse itself and hands libfuse3 the descriptor as
``/dev/fd/N``, so the drop happens while the process is still single-threaded
(capabilities are per thread: a drop made after libfuse starts its workers would leave
them privileged). Unmounting needs CAP_SYS_ADMIN, which the server no longer has: a small
watcher process forked before the drop keeps it, does nothing but wait on a pipe, and
detaches the mount when the server says it stopped cleanly.

Why CAP_SYS_PTRACE stays: reading /proc/<pid>/ns/pid of a reader of another uid, or of
a root process holding capabilities the daemon dropped, is a ptrace "read" check. Without
it the container's age (uptime), `--view init` and loadavg's last-pid field lose their
source for such readers. Every other capability was measured as unused once mounted:
/proc/<pid>/{cgroup,stat,status} and cgroupfs are world-readable, the host's files are
already open.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import logging
import os
import signal
import threading
from dataclasses import dataclass

from guestfs.system import sysmount
from guestfs.system.caps import (
    CAP_SETPCAP,
    CAP_SYS_PTRACE,
    PR_CAP_AMBIENT,
    PR_CAP_AMBIENT_CLEAR_ALL,
    PR_SET_NO_NEW_PRIVS,
    PR_SET_SECUREBITS,
    cap_names,
    effective_caps,
    limit_bounding_to,
    permitted_caps,
    prctl,
    set_caps,
)
from guestfs.system.oneline import os_error_line

log = logging.getLogger("guestfs.privileges")

KEPT_CAPS = frozenset({CAP_SYS_PTRACE})
# NOROOT: a program the daemon executes (its size probe) gets no capabilities for being
# uid 0; NO_SETUID_FIXUP and KEEP_CAPS locked so nothing can change that later.
SECUREBITS = (1 << 0) | (1 << 1) | (1 << 2) | (1 << 3) | (1 << 5)
MS_NOSUID, MS_NODEV = 2, 4



def drop_privileges(keep: frozenset[int] = KEPT_CAPS) -> frozenset[int]:
    """Keep only what of ``keep`` this process holds (effective and permitted; bounding
    set too, given CAP_SETPCAP), clear the ambient and inheritable sets, and set
    NoNewPrivs. Returns the capabilities of ``keep`` that were not held. Call it while
    single-threaded."""
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        # Only the calling thread would lose its capabilities.
        raise OSError(f"drop_privileges: {threads} threads, not 1")
    held = permitted_caps()
    kept = keep & held
    # capset(2) cannot raise what is not permitted: asking for it fails the whole call
    # and would leave every capability in place (a container given SYS_ADMIN and SETPCAP
    # only, as Kubernetes' drop ALL + add does, has no CAP_SYS_PTRACE).
    if CAP_SETPCAP in effective_caps():
        with contextlib.suppress(OSError):  # bits locked otherwise by whoever started us
            prctl("PR_SET_SECUREBITS", PR_SET_SECUREBITS, SECUREBITS)
        limit_bounding_to(kept)
    # Without CAP_SETPCAP the bounding set stays as the container gave it: NoNewPrivs
    # below still keeps every exec from gaining anything beyond ``kept``.
    with contextlib.suppress(OSError):  # kernels before 4.3 have no ambient set
        prctl("PR_CAP_AMBIENT", PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    set_caps(kept)
    prctl("PR_SET_NO_NEW_PRIVS", PR_SET_NO_NEW_PRIVS, 1)
    return keep - held


@dataclass(frozen=True)
class FuseMount:
    fd: int              # the /dev/fuse connection, for libfuse3 as /dev/fd/N
    mountpoint: str


def mount_fuse(mp: str, fsname: str, allow_other: bool, readonly: bool = True) -> FuseMount:
    """mount(2) a FUSE filesystem at ``mp`` as libfuse does for root, read-only unless
    ``readonly`` is False (the files are read-only all the same: a writable mount only lets
    PSI triggers reach the daemon), and return the open /dev/fuse descriptor that serves
    it."""
    fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    opts = (f"fd={fd},rootmode=40000,user_id={os.getuid()},group_id={os.getgid()},"
            "default_permissions" + (",allow_other" if allow_other else ""))
    flags = (sysmount.MS_RDONLY if readonly else 0) | MS_NOSUID | MS_NODEV
    try:
        try:
            sysmount.mount(fsname, mp, f"fuse.{fsname}", flags, opts)
        except OSError as e:
            if e.errno != errno.ENODEV:
                raise
            # No subtype support (gVisor): plain "fuse", as libfuse falls back to.
            sysmount.mount(fsname, mp, "fuse", flags, opts)
    except OSError:
        os.close(fd)
        raise
    # Nothing may look at the new mount until libfuse serves it: gVisor's sentry even
    # asks the server while generating /proc/self/mountinfo, so reading it would hang.
    return FuseMount(fd, mp)


def detach(mountpoint: str) -> None:
    """What libfuse does on a clean stop (sysmount.detach_quietly)."""
    sysmount.detach_quietly(mountpoint)


def start_unmount_watcher(m: FuseMount) -> tuple[int, int]:
    """Start the process that will unmount ``m`` (it keeps the privileges the server is
    about to drop). Returns (its pid, the pipe end to signal it through).

    The child execs a fresh interpreter at once (``_boot.py --unmount-watcher``, nothing
    but os and sys imported until it has to unmount) rather than wait in a fork of the
    server: a fork shares the server's pages copy-on-write, and every page the server
    wrote afterwards became the watcher's own copy, 4.7 MiB of the container's memory
    after a few thousand reads and growing (docs/performance.md, "Daemon memory"). The
    signals it must outlive are ignored before the exec (ignored dispositions survive
    it). Where there is no interpreter to exec, the child waits as a plain fork. Call it
    while single-threaded: the child runs Python after fork."""
    from guestfs.system.selfexec import UNMOUNT_WATCHER, SelfExecError, helper_argv

    r, w = os.pipe()
    try:
        argv: list[str] | None = helper_argv(UNMOUNT_WATCHER, str(r), m.mountpoint)
    except SelfExecError:
        argv = None
    pid = os.fork()
    if pid == 0:  # the watcher
        try:
            os.close(w)
            os.close(m.fd)  # the server's connection must close when the server's does
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
                signal.signal(sig, signal.SIG_IGN)  # a terminal's ^C must not skip cleanup
            if argv is not None:
                with contextlib.suppress(OSError):
                    os.set_inheritable(r, True)
                    os.execv(argv[0], argv)
            # b"u": the server stopped cleanly. EOF without it: the server was killed;
            # the stale mount is then left for the next start to detach, as before.
            if os.read(r, 1) == b"u":
                detach(m.mountpoint)
        except BaseException:  # noqa: BLE001 - never return into the server's code
            os._exit(1)
        os._exit(0)
    os.close(r)
    return pid, w


def stop_unmount_watcher(pid: int, w: int, clean: bool) -> None:
    """Ask the watcher to detach the mount (``clean``) or just to exit; wait for it."""
    with contextlib.suppress(OSError):
        if clean:
            os.write(w, b"u")
        os.close(w)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)


class Dropped:
    """A mount made by the daemon itself, whose privileges are now dropped."""

    def __init__(self, mount: FuseMount, watcher: int, pipe: int) -> None:
        self.target = f"/dev/fd/{mount.fd}"  # what libfuse gets instead of the mount point
        self.mount = mount
        self.watcher = watcher
        self.pipe = pipe
        self._finished = threading.Lock()
        # However the server ends short of SIGKILL — an exception before libfuse even
        # starts included — the mount it made is detached.
        atexit.register(self.finish)

    def finish(self) -> None:
        """The server stopped: close the connection if libfuse has not, so nothing can
        block on the mount any more, then have the watcher detach it and wait for it.
        Only the first call acts."""
        if not self._finished.acquire(blocking=False):
            return
        with contextlib.suppress(OSError):
            if os.fstat(self.mount.fd).st_rdev == os.stat("/dev/fuse").st_rdev:
                os.close(self.mount.fd)
        stop_unmount_watcher(self.watcher, self.pipe, clean=True)


def _status_line(name: str) -> str:
    with open("/proc/self/status") as f:
        return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith(name + ":")),
                    "?")


# What a missing CAP_SYS_PTRACE costs (privileges.py's docstring says why it is kept).
# A fixed view (run, --view self, --cgroup) reads no reader's namespace: only the
# container's pid-namespace init, for its age, and the oldest process of the cgroup that
# it falls back to is that same process in a container.
_NO_PTRACE_READERS = (
    "CAP_SYS_PTRACE is not in this container's capabilities: for readers of another uid "
    "or holding capabilities the daemon lacks, --view init serves the reader's own "
    "cgroup, uptime is the age of the cgroup's oldest process and loadavg's last-pid "
    "field is the host's (add SYS_PTRACE to the container for them)")
_NO_PTRACE_FIXED = (
    "CAP_SYS_PTRACE is not held: the container's age is its cgroup's oldest process "
    "rather than its pid-namespace init (in a container, the same process)")


def _report_missing(missing: frozenset[int], reader_views: bool) -> None:
    if CAP_SYS_PTRACE in missing:
        if reader_views:
            log.warning("%s", _NO_PTRACE_READERS)
        else:
            log.debug("%s", _NO_PTRACE_FIXED)


def mount_then_drop(mp: str, fsname: str, allow_other: bool, takes_fd: bool,
                    reader_views: bool = True, readonly: bool = True) -> Dropped | None:
    """Mount ``mp``, fork its unmount watcher and drop privileges; None (privileges kept,
    libfuse mounts as before) where that cannot be done: a binding whose libfuse cannot
    take a mounted descriptor (libfuse2), or no right to mount(2) (fusermount's job).
    ``reader_views``: views depend on who reads (a missing CAP_SYS_PTRACE degrades them:
    a warning; for a fixed view only a line at -v)."""
    if not takes_fd:
        log.warning("this FUSE binding mounts by itself (libfuse2): the daemon keeps its "
                    "capabilities; mfusepy on libfuse3 lets it drop them")
        return None
    try:
        m = mount_fuse(mp, fsname, allow_other, readonly)
    except OSError as e:
        log.warning("mount(2) of %s failed (%s): libfuse mounts it and the daemon keeps "
                    "its capabilities", mp, os_error_line(e))
        return None
    pid, w = start_unmount_watcher(m)
    drop_and_report(reader_views, f"unmount watcher pid {pid}")
    return Dropped(m, pid, w)


def drop_and_report(reader_views: bool, helper: str) -> None:
    """drop_privileges, and one line saying what is kept (``helper``: the process that
    kept the right to unmount). A failure keeps them, with a warning."""
    try:
        missing = drop_privileges()
    except OSError as e:
        log.warning("capabilities kept: %s", os_error_line(e))
        return
    _report_missing(missing, reader_views)
    log.info("mounted; capabilities kept: %s (CapEff %s, CapBnd %s), NoNewPrivs %s; %s",
             cap_names(KEPT_CAPS - missing), _status_line("CapEff"),
             _status_line("CapBnd"), _status_line("NoNewPrivs"), helper)
