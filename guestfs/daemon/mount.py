"""`guestfs mount`: set up and run the FUSE daemon."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import gc
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from guestfs.daemon import mountlock, privileges
from guestfs.daemon.fuse_binding import Binding, load_binding
from guestfs.daemon.fusefs import REVALIDATE, make_operations
from guestfs.daemon.mountpoint import (
    FSNAME,
    MountError,
    MountUnresponsive,
    is_guestfs_mount,
    is_stale_mount,
    mount_entry,
    probe_mount,
    refuse_non_directory,
    refuse_symlink,
    wait_until,
)
from guestfs.daemon.psi_triggers import open_source
from guestfs.daemon.server import ServerConfig, ViewServer
from guestfs.engine.explicit import ExplicitLimits
from guestfs.render.served import SERVED_FILES
from guestfs.sources.host_pin import PinnedHost, pin_host_files
from guestfs.system import sysmount
from guestfs.system.oneline import one_line
from guestfs.system.safefile import OpenedFile, open_private, remove_if_same, write_pid

if TYPE_CHECKING:
    # Loaded only for --hold (held.py brings socket and the holder's messages).
    from guestfs.daemon import held

log = logging.getLogger("guestfs.mount")
ATTR_TIMEOUT = 0.5  # kernel entry cache (and attributes of page-cached files' directories)
DIRECT_ATTR_TIMEOUT = 0.0  # attributes of files served through the daemon: see serve()
LIBFUSE3_STOPPED_BY_SIGNAL = 8
PROBE_NICE = 10  # weight 110 against a reader's 1024: it still runs beside a busy app
PROBE_DELAY = 1.0  # from INIT to the client probe (probe_fuse_client)
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT}


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
    per_container: bool = False
    reread_explicit: Callable[[], ExplicitLimits] | None = None
    ready_fd: int | None = None       # --ready-fd: told once the mount serves
    hold: bool = False                # --hold: a holder keeps the connection (held.py)
    external_holder: bool = False     # --external-holder: `guestfs fuse-holder`'s
    respawn: tuple[str, ...] = ()     # the command line the holder starts successors with


def _read_own(mp: str, name: str) -> bytes | None:
    """``mp + name`` read by a child process (probe_mount). The daemon reads its own mount
    only this way: a thread of the serving process blocked in a FUSE request to that same
    process makes it unkillable (kill -9 then leaves a process that never exits and a
    wedged mount)."""
    try:
        # Niced: started as the mount comes up, it would take the CPU from the first
        # reads and binds of `guestfs run` and its app, which wait for them.
        err, data = probe_mount(mp, name, timeout=10.0, nice=PROBE_NICE)
    except MountUnresponsive:
        return None
    return data if err == 0 else None


def _stopped_meanwhile(mp: str) -> bool:
    """A probe failed because this daemon is stopping (its mount gone or going), not
    because of the client: `guestfs run -- cat FILE` stops it within milliseconds."""
    try:
        gone = not is_guestfs_mount(mp)
    except OSError:
        gone = True
    if gone:
        log.debug("%s stopped while its FUSE client was probed", mp)
    return gone


def probe_fuse_client(mp: str, ops: Any, timeout: float = 30.0) -> None:
    """Read a page-cached file of our own mount once it serves: a FUSE client that does not
    honour no_open (page-cached files unreadable) turns the page cache off.

    The page cache is taken only where the client's INIT offers no_open
    (fusefs._configure), so this is the check that it keeps its word, and it waits
    PROBE_DELAY after INIT: its child's CPU (an interpreter, where this process has
    threads) then no longer competes with `guestfs run`'s first reads and its app's."""
    if not ops.initialised.wait(timeout):
        if not _stopped_meanwhile(mp):
            log.warning("%s did not start serving within %gs; client probe skipped", mp,
                        timeout)
        return
    # No size probe: every file reports a size that holds its reader's rendering
    # (fusefs.reported_size), so a client that stops reading at st_size even with
    # direct_io (gVisor's) still reads it whole.
    log.info("every served file reports a size that holds its reader's whole rendering")
    time.sleep(PROBE_DELAY)
    if ops.page_cache and not _read_own(mp, ops.probe_path) and not _stopped_meanwhile(mp):
        # Served from the page cache, a read goes through no open of ours: a client that
        # does not honour ENOSYS from open (no_open) fails it instead.
        ops.disable_page_cache("this FUSE client does not read page-cached files")


def prepare_mountpoint(mp: str) -> None:
    # From the mount table and a child's probe, never a stat here: a mount point served by
    # a stopped daemon would block this process for good.
    if is_stale_mount(mp):
        # A daemon was killed and left "Transport endpoint is not connected" behind.
        log.warning("%s: stale FUSE mount from a dead daemon; detaching it", mp)
        sysmount.umount(mp, detach=True)
    entry = mount_entry(mp)
    # As os.path.ismount saw it, without its stat: a filesystem's root mounted here (a FUSE
    # mount, a tmpfs) is refused; a bind of a directory onto itself or of a subdirectory
    # (the sidecar's shared emptyDir) is not a mount point to stack on, so it is fine.
    if entry is not None and (entry.root == "/" or entry.fstype.startswith("fuse")):
        raise MountError(f"{mp} is already a mount point ("
                         + ("a running guestfs" if is_guestfs_mount(mp) else entry.fstype)
                         + "); give a directory nothing is mounted on")
    if not os.path.lexists(mp):
        parent = os.path.dirname(mp)
        if not os.path.isdir(parent):
            # Only the last component is made: a typo must not make a tree as root.
            raise MountError(f"{mp}: {parent} does not exist (make it, or give another "
                             "mountpoint)")
        with contextlib.suppress(FileExistsError):
            os.mkdir(mp, 0o755)
        log.debug("%s did not exist: made it", mp)
    refuse_symlink(mp)
    refuse_non_directory(mp)


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


def exit_when_unused(mp: str, held: list[int], interval: float = 0.25,
                     grace: float = 2.0) -> None:
    """Stop serving once no `guestfs run` holds ``mp``'s users lock. The exclusive lock is
    kept until exit (``held`` receives its descriptor), so a run arriving meanwhile waits
    for this daemon to be gone and then starts its own, instead of reusing a mount that is
    going away. The first check waits ``grace`` seconds, for libfuse to have installed the
    SIGTERM handler that unmounts."""
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


def wait_mounted(mp: str, child_pid: int | None = None, timeout: float = 20.0) -> bool:
    """Until guestfs serves at ``mp``; False after ``timeout`` or once ``child_pid`` (the
    daemon being waited for) has exited."""
    def exited() -> bool:
        return child_pid is not None and os.waitpid(child_pid, os.WNOHANG)[0] != 0

    return wait_until(lambda: is_guestfs_mount(mp) or exited(), timeout) \
        and is_guestfs_mount(mp)


def _daemonize(opts: MountOptions, log_file: OpenedFile | None) -> None:
    """Fork; the parent returns to exit once the mount is up, the child serves."""
    pid = os.fork()
    if pid > 0:
        try:
            ok = wait_mounted(opts.mountpoint, pid)
        except MountUnresponsive as e:
            print(f"guestfs: {one_line(str(e))}", file=sys.stderr)
            os._exit(1)
        if not ok:
            print(one_line(f"guestfs: the daemon did not come up on {opts.mountpoint}"
                           + (f"; see {opts.log_file}" if opts.log_file else "")),
                  file=sys.stderr)
        os._exit(0 if ok else 1)
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    out = log_file.fd if log_file else devnull
    os.dup2(out, 1)
    os.dup2(out, 2)


def open_output_files(opts: MountOptions) -> tuple[OpenedFile | None, OpenedFile | None]:
    """The pid file and the log file, opened before anything else (and before detaching,
    so a bad path is reported on the terminal): never through a symlink, never a file
    that is not ours (guestfs.system.safefile)."""
    pid_file = open_private(opts.pid_file, "--pid-file", append=False) \
        if opts.pid_file else None
    try:
        log_file = open_private(opts.log_file, "--log-file", append=True) \
            if opts.log_file and opts.daemon else None
    except BaseException:
        if pid_file is not None:
            os.close(pid_file.fd)
            remove_if_same(pid_file)
        raise
    return pid_file, log_file


def ready_notifier(fd: int | None) -> Callable[[], None] | None:
    """What tells the process waiting on ``fd`` (`guestfs run`) that the mount serves: one
    byte, then the descriptor closed, once. Close-on-exec from the start, so that the
    helpers this daemon runs (unmount watcher, probes) never hold it open: the waiter
    takes end-of-file without that byte for this daemon's exit."""
    if fd is None:
        return None
    try:
        os.set_inheritable(fd, False)
    except OSError as e:
        raise MountError(f"--ready-fd {fd}: {e.strerror}; give a descriptor this process "
                         "has open for writing (a pipe's, as guestfs run does)") from None
    done = threading.Lock()

    def notify() -> None:
        if done.acquire(blocking=False):
            with contextlib.suppress(OSError):   # the waiter is gone: nothing to tell
                os.write(fd, b"r")
            with contextlib.suppress(OSError):
                os.close(fd)
    return notify


@dataclass
class _Serving:
    """What serve() set up: each piece is undone by its ExitStack, in reverse order."""
    server: ViewServer
    host: PinnedHost
    target: str            # where libfuse mounts (privileges.mount_then_drop)
    layout: str
    cached: bool           # page-cached files (fusefs.init_with_config may still refuse)
    triggers: bool         # PSI triggers taken (takes_triggers): a writable mount
    unblocked: set[signal.Signals] = field(default_factory=set)
    lease: held.Lease | None = None   # --hold: this daemon's lease of the holder


def serve(opts: MountOptions) -> int:
    """`guestfs mount`: set up, serve until a signal ends libfuse's loop, tear down."""
    mp = os.path.abspath(opts.mountpoint)
    ready = ready_notifier(opts.ready_fd)
    opts = _check_hold(opts)
    binding = load_binding("guestfs" if opts.hold else opts.binding)
    with contextlib.ExitStack() as stack:
        serving = _set_up(opts, mp, binding, stack)
        ops = make_operations(binding.module, serving.server, serving.layout,
                              DIRECT_ATTR_TIMEOUT, ready)
        if serving.triggers:
            ops.trigger_source = functools.partial(open_source, serving.host,
                                                   serving.host.pins)
        _describe(opts, mp, binding, serving)
        threading.Thread(target=probe_fuse_client, args=(mp, ops), name="guestfs-probe",
                         daemon=True).start()
        kwargs = _fuse_options(opts, binding, serving)
        if serving.lease is not None:
            kwargs.update(_held_options(serving.lease, ops))
            # The PSI triggers outlive this daemon with the holder (psi_triggers.py).
            ops.trigger_keeper, ops.adopted_triggers = serving.lease, serving.lease.kept
            serving.lease.kept = []
            serving.lease.watch()
        signal.pthread_sigmask(signal.SIG_SETMASK, serving.unblocked)
        gc.enable()   # off while starting (cli/main.py), and in run's fork of us
        try:
            binding.module.FUSE(ops, serving.target, raw_fi=True, **kwargs)
            if serving.lease is not None:
                serving.lease.stop()     # a clean stop: the holder unmounts
        except RuntimeError as e:
            # libfuse3's fuse_main returns 8 when a signal ended the loop: a clean stop.
            if e.args != (LIBFUSE3_STOPPED_BY_SIGNAL,):
                log.error("FUSE failed on %s: %s", mp, e)
                return 1
        finally:
            ops.stop()   # before the teardown closes the host files
    server = serving.server
    log.info("unmounted %s (%d reads fell back to host files, %d refused; %d open renderings "
             "kept)", mp, server.errors, sum(server.refusals.values()), len(ops.kept_renderings))
    return 0


def _check_hold(opts: MountOptions) -> MountOptions:
    """--hold where it can work: guestfs's engine (libfuse cannot serve a connection it did
    not initialise) on a kernel that resends (held.py); else served as without it."""
    if not opts.hold:
        return opts
    from guestfs.system import kernel

    if opts.binding not in ("auto", "guestfs"):
        raise MountError(f"--hold needs guestfs's own FUSE engine; --fuse-binding "
                         f"{opts.binding} cannot serve a connection another process "
                         "initialised (use --fuse-binding auto or guestfs)")
    if not kernel.kernel_resends():
        log.warning("--hold needs Linux %d.%d or later (FUSE_NOTIFY_RESEND); this kernel "
                    "is %s: served without a holder (a dead daemon's mount is re-bound as "
                    "before)", *kernel.RESEND_KERNEL, os.uname().release)
        return dataclasses.replace(opts, hold=False)
    return opts


def _held_options(lease: held.Lease, ops: Any) -> dict[str, Any]:
    """The engine's FUSE options for a held connection: a successor's parameters, and
    the word to the holder once this daemon serves (the first: once INIT is answered)."""
    out: dict[str, Any] = {"resolver": ops.known_paths,
                           "on_negotiated": lease.send_negotiated}
    if lease.negotiated:
        out["negotiated"] = lease.negotiated
    return out


def _take_lock(opts: MountOptions, mp: str) -> tuple[int, held.Lease | None]:
    """The mount lock, or for --hold where a holder keeps it, the holder's connection."""
    if opts.hold:
        from guestfs.daemon import held

        fd = mountlock.acquire(mp, "mount", fcntl.LOCK_EX)
        if fd is not None:
            return fd, None
        lease = held.ask(mp)
        if lease is not None:
            assert lease.lock_fd is not None
            return lease.lock_fd, lease
    return hold_mount_lock(mp), None


def _set_up(opts: MountOptions, mp: str, binding: Binding,
            stack: contextlib.ExitStack) -> _Serving:
    """Every step before libfuse's loop, in order, each registered on ``stack`` with what
    undoes it: the stack's reverse order is the teardown's (the mount lock last, so no
    other daemon starts before ours is gone). A successor on a held connection skips
    what the mount's first daemon did (the mount point, the mount)."""
    lock_fd, lease = _take_lock(opts, mp)
    if not opts.hold:
        stack.callback(mountlock.release_removing, lock_fd, mp, "mount")
    else:
        # The holder holds the lock too: its file stays (a later daemon must find the
        # lock held, not a new file), and unmounting is the holder's.
        stack.callback(os.close, lock_fd)
    users_held: list[int] = []
    # Unmounted, the locks' files can go (kept if a run still holds the users lock).
    stack.callback(_release_users, users_held, mp)
    if lease is None:
        prepare_mountpoint(mp)
    if not opts.hold:
        stack.callback(_detach_if_ours, mp)
    pid_file, log_file = open_output_files(opts)
    if pid_file is not None:
        stack.callback(remove_if_same, pid_file)
    if opts.daemon:
        _daemonize(opts, log_file)
    mountlock.write_owner(lock_fd, f"{os.getpid()} {mp}\n")
    # libfuse's loop ends only when its own (the main) thread takes SIGTERM/SIGINT; it
    # blocks them in its workers, and every thread started here inherits this mask, so a
    # signal sent to the process cannot land on one of ours (after a SIGSTOP/SIGCONT it
    # did, and the daemon then never stopped). Unblocked in this thread just before FUSE.
    unblocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    host = pin_host_files(SERVED_FILES)
    stack.callback(host.close)
    server = ViewServer(host, ServerConfig(opts.view, opts.cgroup, opts.cache_ttl,
                                           opts.explicit, opts.cpu_rounding,
                                           opts.reread_explicit))
    stack.callback(server.stop)
    if pid_file is not None:
        write_pid(pid_file, os.getpid())
    # Before any thread starts: capabilities are dropped per thread, and a thread started
    # earlier would keep every one of them.
    triggers = takes_triggers(opts, binding, server)
    dropped = _mount_and_drop(opts, mp, binding, lock_fd, lease, not server.fixed_view,
                              not triggers)
    if dropped:
        stack.callback(dropped.finish)
    lease = getattr(dropped, "lease", None)    # held.Held's
    if opts.exit_when_unused:
        exit_when_unused(mp, users_held)
    server.start_sampler()
    # libfuse only installs its SIGINT/SIGTERM handlers (which unmount cleanly) over the
    # default disposition, and Python has its own SIGINT handler.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    layout = _layout(opts, server)
    # Page-cached files are revalidated by one GETATTR per REVALIDATE at most; libfuse3 tells
    # in its init whether the kernel's client can do it at all (fusefs.init_with_config).
    cached = layout != "per-caller" and binding.sees_capabilities
    return _Serving(server, host, dropped.target if dropped else mp, layout, cached,
                    triggers, unblocked, lease)


def _layout(opts: MountOptions, server: ViewServer) -> str:
    return "per-container" if opts.per_container else \
        "fixed" if server.fixed_view else "per-caller"


def takes_triggers(opts: MountOptions, binding: Binding, server: ViewServer) -> bool:
    """PSI triggers are taken on the per-caller layout through guestfs's engine (which
    answers WRITE and POLL): every open reaches the daemon there. A page-cached layout
    opens without asking (no_open), so no write can be tied to an open file."""
    return binding.engine and not opts.per_container and not server.fixed_view


def _mount_and_drop(opts: MountOptions, mp: str, binding: Binding, lock_fd: int,
                    lease: held.Lease | None, reader_views: bool,
                    readonly: bool) -> privileges.Dropped | held.Held | None:
    if not opts.hold:
        return privileges.mount_then_drop(mp, FSNAME, opts.allow_other, binding.takes_fd,
                                          reader_views=reader_views, readonly=readonly)
    from guestfs.daemon import held

    if lease is not None:
        return held.take_over(lease, mp, reader_views)
    return held.mount_held(mp, FSNAME, opts.allow_other, lock_fd, list(opts.respawn),
                           reader_views, opts.external_holder, readonly)


def _release_users(held: list[int], mp: str) -> None:
    for fd in held:
        mountlock.release_removing(fd, mp, "users")


def _detach_if_ours(mp: str) -> None:
    """After the loop: our mount, or a stale one (libfuse already unmounted a clean stop)."""
    stale_or_ours = False
    with contextlib.suppress(OSError):  # MountUnresponsive included
        stale_or_ours = is_stale_mount(mp) or is_guestfs_mount(mp)
    if stale_or_ours:
        with contextlib.suppress(OSError):
            sysmount.umount(mp, detach=True)


def _fuse_options(opts: MountOptions, binding: Binding, serving: _Serving) -> dict[str, Any]:
    # Served through the daemon, attributes are never cached: with default_permissions
    # (privileges.py) every open then asks for its file's, and that GETATTR renders the
    # file for the opener and sets the shared inode's size from it (fusefs.reported_size),
    # which sendfile, splice and mmap stop at; an fstat asks for the open handle's own.
    attr_timeout = min(opts.cache_ttl, REVALIDATE) if serving.cached else DIRECT_ATTR_TIMEOUT
    kwargs: dict[str, Any] = {
        "foreground": True, "ro": not serving.triggers,
        "nothreads": False, "fsname": FSNAME,
        "subtype": FSNAME, "attr_timeout": attr_timeout, "entry_timeout": ATTR_TIMEOUT,
        "default_permissions": True}
    if "fuse3" in binding.libfuse:
        # libfuse 3.14.0 passes its "unlimited" default (-1) through a check that then
        # prints "Ignoring invalid max threads value 4294967295" on every start; 10 is
        # what libfuse3 defaulted to before.
        kwargs["max_idle_threads"] = 10
    if opts.allow_other:
        kwargs["allow_other"] = True
    return kwargs


def _describe(opts: MountOptions, mp: str, binding: Binding, serving: _Serving) -> None:
    """The status file's layout fields, and the start-up's log lines."""
    server, layout, cached = serving.server, serving.layout, serving.cached
    server.serving.update(layout=layout, page_cache=cached)
    if server.fixed_view and opts.cgroup is None:
        # Whose view --view self serves: a run reusing this mount checks it is its own.
        server.serving["self_cgroup"] = serving.host.try_read_small("/proc/self/cgroup")
    if layout != "per-caller" and not cached:
        log.warning("%s layout without libfuse3 (%s): every read goes through the daemon; "
                    "install libfuse3 and mfusepy for reads from the kernel's page cache",
                    layout, binding.libfuse)
    log.info("serving %s with %s (%s); %s layout%s; view=%s%s cache_ttl=%gs host files "
             "from %s", mp, binding.name, binding.libfuse, layout,
             ", page cache" if cached else ", direct_io", opts.view,
             f" cgroup={opts.cgroup}" if opts.cgroup else "", opts.cache_ttl,
             serving.host.origin)
