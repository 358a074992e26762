"""The `guestfs` command."""

from __future__ import annotations

import argparse
import logging
import os
import stat
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from guestfs import DEFAULT_HOOK_SOURCE, DEFAULT_MOUNTPOINT, __version__
from guestfs.cli.options import (
    AFFINITY_MODES,
    CliError,
    OneLineParser,
    RawDescription,
    UsageError,
    add_limit_options,
    add_mount_options,
    add_run_privilege_options,
    explicit_from_args,
    explicit_rereader,
    mount_argv,
    process_id,
    seconds,
)
from guestfs.render.served import SERVED_FILES
from guestfs.system import ratelog
from guestfs.system.oneline import one_line, os_error_line

# Each command loads what it needs when it runs (`guestfs run`'s start-up is the app's
# wait); explain and show need the whole read path.
if TYPE_CHECKING:
    from guestfs.engine.limits import EffectiveLimits
    from guestfs.sources.host_root import HostRoot
    from guestfs.sources.snapshot import Snapshot


def compute_limits(args: argparse.Namespace, env: dict[str, str] | None = None
                   ) -> tuple[HostRoot, Snapshot, EffectiveLimits]:
    from guestfs.engine.limits import effective_limits
    from guestfs.sources.host_proc import HostInfoError
    from guestfs.sources.host_root import HostReadError, HostRoot
    from guestfs.sources.proc_cgroup import PidGone
    from guestfs.sources.snapshot import read_snapshot

    env = dict(os.environ) if env is None else env
    explicit, rounding = explicit_from_args(args, env)
    try:
        # Checked first: every pid would otherwise look gone.
        is_dir = stat.S_ISDIR(os.stat(os.path.join(args.root, "proc")).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        is_dir = False
    except OSError as e:
        raise CliError(f"--root {args.root}: cannot look into it ({e.strerror}); give a "
                       "directory this user may read, or run as root") from None
    if not is_dir:
        raise CliError(f"--root {args.root}: no proc directory there (give the directory "
                       "that holds the host's proc and sys)")
    try:
        host = HostRoot(args.root)
        snap = read_snapshot(host, args.pid)
    except PidGone as e:
        raise CliError(str(e)) from e
    except (HostReadError, HostInfoError) as e:
        raise CliError(f"cannot read the host under {args.root}: {e}") from e
    return host, snap, effective_limits(snap, explicit, rounding)


def cmd_explain(args: argparse.Namespace) -> int:
    from guestfs.cli.explain import json_text, to_json, to_text
    from guestfs.daemon.daemon_status import format_status, read_status

    _, _, lim = compute_limits(args)
    status = None
    if args.mount is not None:
        try:
            status = read_status(args.mount)
        except OSError as e:
            raise CliError(f"--mount {args.mount}: {os_error_line(e)}") from e
    if args.json:
        doc = to_json(lim)
        if status is not None:
            doc["daemon"] = status
        sys.stdout.write(json_text(doc))
    else:
        sys.stdout.write(to_text(lim))
        if status is not None:
            sys.stdout.write(format_status(args.mount, status))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    path = "/" + args.file.strip("/")
    if path not in SERVED_FILES:
        raise UsageError(f"show: {args.file}: not a served file; give one of "
                         + ", ".join(SERVED_FILES))
    from guestfs.daemon.file_table import render_file
    from guestfs.sources.host_root import HostReadError

    host, snap, lim = compute_limits(args)
    try:
        text = render_file(path, host, snap, lim)
    except HostReadError as e:
        raise CliError(f"cannot read the host's {path} under {args.root}: {e}") from e
    except (ValueError, LookupError) as e:
        raise CliError(f"the host's {path} under {args.root} is malformed: "
                       f"{type(e).__name__}: {e}") from e
    sys.stdout.write(text)
    return 0


SHOW_EPILOG = """\
/proc/loadavg: the daemon averages the container's runnable and uninterruptible tasks
every 5 s; show takes a single sample and prints it as all three averages.
/proc/stat: show starts from fresh counters; a mount keeps them monotonic between reads
while the cgroup lives (one made again at the same path starts a fresh clock).
"""


def cmd_mount(args: argparse.Namespace) -> int:
    from guestfs.daemon.fuse_binding import BindingError
    from guestfs.daemon.lowmem import one_malloc_arena
    from guestfs.daemon.mount import MountOptions, serve
    from guestfs.daemon.mountpoint import MountError, check_fuse_device

    one_malloc_arena()  # before any thread starts
    setup_logging(args.verbose, args.quiet)
    if args.lock_dir:
        from guestfs.daemon import mountlock

        mountlock.use_lock_dir(os.path.abspath(args.lock_dir))
    if args.per_container and args.cgroup:
        raise UsageError("mount: --per-container serves every container's cgroup; it takes "
                         "no --cgroup")
    check_cgroup("mount", args.cgroup)
    env = dict(os.environ)
    explicit, rounding = explicit_from_args(args, env)
    opts = MountOptions(args.mountpoint, args.view, args.cgroup, args.cache_ttl, explicit,
                        rounding, args.fuse_binding, args.allow_other, args.daemon,
                        args.pid_file, args.log_file,
                        exit_when_unused=args.exit_when_unused, ready_fd=args.ready_fd,
                        per_container=args.per_container,
                        reread_explicit=explicit_rereader(args, env))
    try:
        check_fuse_device()
        return serve(opts)
    except (MountError, BindingError, OSError) as e:
        raise CliError(failure_line(e)) from e


def check_cgroup(command: str, cgroup: str | None) -> None:
    if cgroup is None:
        return
    from guestfs.sources.host_root import HostRoot
    from guestfs.sources.snapshot import pinned_cgroup_dirs

    if not pinned_cgroup_dirs(HostRoot(), cgroup):
        # Served anyway, its view would be the node's numbers with nothing counted.
        raise CliError(f"{command}: --cgroup {cgroup}: no such cgroup in any cgroup "
                       "mount; give the path as /proc/<pid>/cgroup shows it")


def failure_line(e: Exception) -> str:
    """The one line a caught failure prints: an OSError without Python's "[Errno N]"."""
    return os_error_line(e) if isinstance(e, OSError) else str(e)


def cmd_run(args: argparse.Namespace) -> int:
    from guestfs.daemon.mountpoint import (
        MountError,
        check_fuse_device,
        refuse_foreign_mount,
        refuse_non_directory,
        refuse_symlink,
    )
    from guestfs.system.caps import CAP_SYS_ADMIN, effective_caps
    from guestfs.wrap.daemon_process import RunError
    from guestfs.wrap.start import begin

    setup_logging(args.verbose, quiet=not args.verbose)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        raise UsageError("run: no command given (guestfs run [options] -- CMD [ARGS...])")
    # Whatever the daemon would refuse is refused here, before it is started: its line
    # and run's own "did not come up" would be two.
    explicit_from_args(args, dict(os.environ))
    check_cgroup("run", args.cgroup)
    mp = args.mountpoint or DEFAULT_MOUNTPOINT
    if CAP_SYS_ADMIN not in effective_caps():
        # Checked first: everything after (the private namespace, FUSE, the binds) fails
        # without it, with messages about what it fails at rather than why.
        raise CliError("run: CAP_SYS_ADMIN is missing: run needs it for the app's private "
                       "mount namespace, the FUSE mount and the binds (Kubernetes: "
                       "securityContext.capabilities.add [SYS_ADMIN]; docker/podman: "
                       "--cap-add SYS_ADMIN)")
    try:
        refuse_symlink(mp)   # before a daemon is started for it
        refuse_non_directory(mp)
        refuse_foreign_mount(mp)
        check_fuse_device()
    except MountError as e:
        raise CliError(f"run: {e}") from e
    try:
        start = begin(mp, mount_argv(args), args.mountpoint is not None, entry=main)
        # Loaded while the daemon starts (wrap/start.py): the app side, from here on.
        from guestfs.wrap.run import run

        return run(start, cmd, args.bind_pressure, keep_caps=args.keep_caps,
                   host_clock=args.host_clock, sysinfo=args.sysinfo,
                   affinity=args.cpu_affinity)
    except (RunError, OSError) as e:
        raise CliError(failure_line(e)) from e


def cmd_attach(args: argparse.Namespace) -> int:
    from guestfs.inject.attach import attach, watch

    setup_logging(args.verbose)
    try:
        if args.watch:
            watch(args.pid or None, args.source, args.interval, args.per_container)
            return 0
        if not args.pid:
            raise CliError("attach: give --pid PID (or --watch to follow every other mount "
                           "namespace)")
        for pid in args.pid:
            res = attach(pid, args.source, per_container=args.per_container)
            print(f"pid {pid}: bound {len(res.bound)}, already live {len(res.healthy)} "
                  f"({res.method}) from {res.source}")
    except OSError as e:  # AttachError: already one line naming the pid and the file
        raise CliError(failure_line(e)) from e
    return 0


def cmd_oci_hook(args: argparse.Namespace) -> int:
    from guestfs.inject.ocihook import main as hook_main

    return hook_main(args.source, args.strict, args.per_container, args.timeout,
                     verbose=args.verbose, log_file=args.log_file)


def cmd_seccomp_agent(args: argparse.Namespace) -> int:
    from guestfs.inject.seccomp_agent import serve_agent

    setup_logging(args.verbose)
    try:
        return serve_agent(args.socket, args.source, args.sysinfo, args.cpu_affinity,
                           args.external_guard)
    except OSError as e:
        raise CliError(f"seccomp-agent: {failure_line(e)}") from e


def cmd_seccomp_guard(args: argparse.Namespace) -> int:
    from guestfs.syscalls.keeper import exec_standalone_guard

    try:
        exec_standalone_guard(os.path.abspath(args.dir))
    except OSError as e:
        raise CliError(f"seccomp-guard: {failure_line(e)}") from e
    return 1


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="guestfs",
        description="cgroup-aware /proc and /sys files for containers: see what free, top "
                    "and language runtimes should see, and why.")
    parser.add_argument("--version", action="version", version=f"guestfs {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("explain", help="effective limits of a process and where each came from",
                       description="Print the effective memory, swap and CPU limits of a "
                                   "process, and which file, cgroup level or setting set "
                                   "each one.")
    add_limit_options(p)
    p.add_argument("--json", action="store_true",
                   help="machine-readable output (keys in docs/explain-json.md)")
    p.add_argument("--mount", metavar="MOUNTPOINT",
                   help="also show the fallbacks taken by the daemon serving MOUNTPOINT "
                        "(bad or vanished cgroup files, failed renders), by cause")
    p.set_defaults(func=cmd_explain)
    p = sub.add_parser("show", help="print a file exactly as guestfs serves it",
                       description="Print FILE (" + ", ".join(SERVED_FILES) + ") as the "
                                   "filesystem serves it to PID.",
                       epilog=SHOW_EPILOG, formatter_class=RawDescription)
    p.add_argument("file", metavar="FILE", help="a guest path such as /proc/meminfo")
    add_limit_options(p)
    p.set_defaults(func=cmd_show)

    p = sub.add_parser("mount", help="serve the files over FUSE at MOUNTPOINT",
                       description="Mount the guestfs filesystem: MOUNTPOINT/proc/{meminfo,"
                                   "cpuinfo,stat,uptime,loadavg,swaps,diskstats}, "
                                   "MOUNTPOINT/proc/pressure/*, MOUNTPOINT/sys/devices/system/"
                                   "cpu/{online,possible,present} (LXCFS's layout). Runs in "
                                   "the foreground, logging to stderr; SIGTERM/SIGINT unmount.")
    p.add_argument("mountpoint", metavar="MOUNTPOINT")
    p.add_argument("--daemon", action="store_true",
                   help="detach once mounted (logs go to --log-file, else nowhere)")
    p.add_argument("--pid-file", metavar="FILE", help="write the serving process's pid here")
    p.add_argument("--log-file", metavar="FILE", help="with --daemon: append logs here")
    p.add_argument("--ready-fd", type=int, metavar="FD",
                   help="write one byte to descriptor FD once the FUSE connection is "
                        "initialised, then close it (run waits on it for its daemon)")
    p.add_argument("--exit-when-unused", action="store_true",
                   help="unmount and exit once no `guestfs run` uses this mount (run starts "
                        "its daemon so; docs/mount.md)")
    p.add_argument("--per-container", action="store_true",
                   help="serve one directory per container cgroup, MOUNTPOINT/<key>/proc/"
                        "meminfo and so on (key: the cgroup path percent-encoded, "
                        "docs/mount.md), each from the kernel's page cache, instead of "
                        "LXCFS's per-caller layout")
    p.add_argument("--lock-dir", metavar="DIR",
                   help="keep the mount's locks in DIR (default /run/guestfs-locks as root, "
                        "else $XDG_RUNTIME_DIR/guestfs-locks or /tmp/guestfs-locks-UID; a "
                        "mount sharing a MOUNTPOINT must use the same one)")
    add_mount_options(p)
    add_limit_options(p, where=False)
    p.set_defaults(func=cmd_mount)

    p = sub.add_parser("run", help="run a command that sees guestfs's files over /proc, /sys",
                       description="Mount (or reuse) the filesystem at --mountpoint, run CMD "
                                   "in a private mount namespace where every served file is "
                                   "bind-mounted over its /proc or /sys counterpart, and exit "
                                   "with CMD's status (signals are forwarded).")
    p.add_argument("--mountpoint",
                   help="where the filesystem is or will be mounted (default /run/guestfs; "
                        "where that cannot be made, a private tmpfs only run and its "
                        "daemon see: docs/mount.md)")
    add_mount_options(p, view="self")
    add_limit_options(p, where=False)
    p.add_argument("--bind-pressure", action="store_true",
                   help="also bind /proc/pressure/{cpu,memory,io} (the cgroup's pressure; "
                        "PSI triggers written to them then fail with EROFS)")
    p.add_argument("--host-clock", action="store_true",
                   help="keep the host's boot clock for CMD (by default CMD gets a time "
                        "namespace whose CLOCK_BOOTTIME is the container's age, so ps's "
                        "ELAPSED agrees with the served uptime)")
    p.add_argument("--no-sysinfo", dest="sysinfo", action="store_false",
                   help="let the kernel answer CMD's sysinfo(2) (by default it is answered "
                        "from the served files through seccomp user notification, so getconf "
                        "_PHYS_PAGES and getloadavg() agree with free and uptime)")
    p.add_argument("--cpu-affinity", choices=AFFINITY_MODES, default="view",
                   help="sched_getaffinity(0) under a CPU quota: 'view' (default) answers the "
                        "visible CPUs, and setting that mask back changes nothing; 'pin' "
                        "answers the same, but setting it pins CMD to those CPUs; 'host' "
                        "leaves affinity to the kernel (nproc counts every allowed CPU)")
    add_run_privilege_options(p)
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("attach", help="bind the served files inside another process's mount "
                                      "namespace, and heal stale binds",
                       description="Enter PID's mount namespace and bind SOURCE/proc/... and "
                                   "SOURCE/sys/... over /proc and /sys there, replacing binds "
                                   "left stale by a daemon that died. With --watch, repeat "
                                   "every --interval seconds for the given pids or for every "
                                   "other mount namespace (the sidecar pattern). On a "
                                   "per-container mount (no SOURCE/proc, a SOURCE/<key> for "
                                   "PID's cgroup) the files are SOURCE/<key>/proc/...")
    p.add_argument("--pid", type=process_id, action="append", default=[],
                   help="a process whose mount namespace gets the binds (repeatable)")
    p.add_argument("--source", default=DEFAULT_MOUNTPOINT,
                   help="the guestfs mount: in attach's own mount namespace (its files are "
                        "moved into the target's), else as seen inside the target's "
                        "(default /run/guestfs)")
    layout = p.add_mutually_exclusive_group()
    layout.add_argument("--per-container", dest="per_container", action="store_true",
                        default=None,
                        help="SOURCE is a `guestfs mount --per-container` mount: bind "
                             "SOURCE/<key of PID's cgroup>/... (default: detected)")
    layout.add_argument("--shared", dest="per_container", action="store_false",
                        help="SOURCE has the shared layout, SOURCE/proc/... (default: "
                             "detected)")
    p.add_argument("--watch", action="store_true", help="keep attaching, forever")
    p.add_argument("--interval", type=seconds(0, strict=True), default=2.0,
                   help="seconds between rounds of --watch (> 0; default 2)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.set_defaults(func=cmd_attach)

    p = sub.add_parser("oci-hook", help="OCI createContainer hook: bind the files over a new "
                                        "container's /proc and /sys (podman, CRI-O hooks.d)",
                       description="Read the OCI state on stdin, find the container's root "
                                   "in BUNDLE/config.json and bind SOURCE/<key>/proc/... (a "
                                   "per-container mount) or SOURCE/proc/... over "
                                   "ROOT/proc/... and ROOT/sys/... inside the container's "
                                   "mount namespace. Fail-open: when it cannot (no guestfs "
                                   "mount, no directory for the container), it logs one line "
                                   "and exits 0 so the container starts with the kernel's "
                                   "files. Example hooks.d file: "
                                   "container/oci-hooks.d/guestfs.json.")
    p.add_argument("--source", default=DEFAULT_HOOK_SOURCE,
                   help="the guestfs mount, in the runtime's mount namespace (default "
                        f"{DEFAULT_HOOK_SOURCE}, the DaemonSet's per-container mount)")
    p.add_argument("--strict", action="store_true",
                   help="fail the container's start when the files cannot be bound")
    layout = p.add_mutually_exclusive_group()
    layout.add_argument("--per-container", dest="per_container", action="store_true",
                        default=None, help="SOURCE is a per-container mount (default: "
                                           "detected)")
    layout.add_argument("--shared", dest="per_container", action="store_false",
                        help="SOURCE has the shared layout (default: detected)")
    p.add_argument("--timeout", type=seconds(0, strict=True), default=5.0,
                   help="give up after this many seconds (a stopped daemon; default 5)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="also log one line when the files were bound")
    p.add_argument("--log-file", metavar="FILE",
                   help="also append the log line here (runtimes drop the output of a hook "
                        "that exits 0)")
    p.set_defaults(func=cmd_oci_hook)

    p = sub.add_parser("seccomp-agent", help="answer sysinfo(2) and the CPU count for "
                                             "containers whose seccomp profile notifies them",
                       description="Listen on SOCKET for the seccomp listeners an OCI runtime "
                                   "hands over (the profile's listenerPath, docs/deploy.md) "
                                   "and answer each container's sysinfo(2) and "
                                   "sched_getaffinity(2) from SOURCE/<key>/..., its directory "
                                   "of a per-container mount; where there is none, the kernel "
                                   "answers. Runs in the foreground; SIGTERM stops it.")
    p.add_argument("--socket", default="/run/guestfs-seccomp/agent.sock",
                   help="the unix socket the profile's listenerPath names (default "
                        "/run/guestfs-seccomp/agent.sock; its directory is made 0700)")
    p.add_argument("--source", default=DEFAULT_HOOK_SOURCE,
                   help=f"the per-container guestfs mount (default {DEFAULT_HOOK_SOURCE})")
    p.add_argument("--no-sysinfo", dest="sysinfo", action="store_false",
                   help="let the kernel answer sysinfo(2)")
    p.add_argument("--cpu-affinity", choices=AFFINITY_MODES, default="view",
                   help="as for run: 'view' (default), 'pin' or 'host'")
    p.add_argument("--external-guard", action="store_true",
                   help="wait for the guard `guestfs seccomp-guard` runs (in a pod of its "
                        "own) instead of starting one")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.set_defaults(func=cmd_seccomp_agent)

    p = sub.add_parser("seccomp-guard", help="keep the seccomp agent's listeners across "
                                             "its restarts",
                       description="Hold every seccomp listener the agent of DIR hands over, "
                                   "pass their calls to the kernel while no agent runs, and "
                                   "hand them back to the next agent (docs/deploy.md). For a "
                                   "container of its own; the agent starts one otherwise. "
                                   "Ignores SIGTERM: it must outlive agents.")
    p.add_argument("--dir", default="/run/guestfs-seccomp",
                   help="the agent socket's directory (default /run/guestfs-seccomp)")
    p.set_defaults(func=cmd_seccomp_guard)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except CliError as e:
        print(f"guestfs: {one_line(str(e))}", file=sys.stderr)
        return 2 if isinstance(e, UsageError) else 1
    except BrokenPipeError:
        return 0
    except OSError as e:
        # Each command turns the failures a user can cause into a CliError naming the
        # fix; one that escapes is still one line, not a traceback.
        print(f"guestfs: {args.command}: {os_error_line(e)}", file=sys.stderr)
        return 1


def setup_logging(verbose: bool, quiet: bool = False) -> None:
    level = logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO
    logging.basicConfig(stream=sys.stderr, level=level,
                        format="guestfs[%(process)d] %(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        ratelog.install(handler)
    # mfusepy logs every errno an operation returns at DEBUG, with a traceback: the
    # designed ones too (ENOSYS from open selects the page cache, ENOENT from lookup).
    # -v is for guestfs's own steps; the binding's errors above DEBUG still show.
    logging.getLogger("fuse").setLevel(logging.INFO)
