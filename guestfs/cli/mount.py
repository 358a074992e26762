"""`guestfs mount MOUNTPOINT`: serve the files over FUSE (guestfs/daemon/)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from guestfs.cli.messages import dispatch, failure_line, setup_logging
from guestfs.cli.options import (
    CliError,
    OneLineParser,
    UsageError,
    add_limit_options,
    add_mount_options,
    explicit_from_args,
    explicit_rereader,
)


def add_parser(sub: Any) -> None:
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
    p.add_argument("--hold", action="store_true",
                   help="keep the FUSE connection in a holder process, so that a killed or "
                        "crashed daemon is succeeded on the same connection and no reader "
                        "sees an error (Linux 6.9 and later; guestfs's own FUSE engine; "
                        "docs/mount.md, \"Takeover\")")
    p.add_argument("--external-holder", action="store_true",
                   help="with --hold: hand the connection to the `guestfs fuse-holder` "
                        "listening in the lock directory (a pod of its own, so that a "
                        "restart of this container never ends the mount), waiting up to "
                        "60 s for it; a clean stop leaves it the connection for the next "
                        "daemon")
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
    p.set_defaults(func=command)


def alone(argv: list[str]) -> int:
    """`guestfs mount ARGV...` with this command's parser only: what `guestfs run`'s forked
    daemon runs (wrap/daemon_process.py), without the other commands' parsers."""
    parser = OneLineParser(prog="guestfs")
    add_parser(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    args = parser.parse_args(argv)
    args.argv = list(argv)
    return dispatch(args)


# Options of the first daemon's start that a successor must not repeat: it is started
# by the holder, already detached, and nobody waits on a descriptor of its.
_FIRST_ONLY = {"--daemon": 0, "--ready-fd": 1}


def respawn_argv(argv: list[str]) -> list[str]:
    """The command line a holder starts a successor with: this mount's own, by this very
    package (selfexec), less what only the first start means."""
    from guestfs.system.selfexec import guestfs_argv

    out: list[str] = []
    skip = 0
    for i, arg in enumerate(argv):
        if skip:
            skip -= 1
            continue
        name = arg.split("=", 1)[0]
        if arg == "--":
            out.extend(argv[i:])
            break
        if name in _FIRST_ONLY:
            skip = 0 if "=" in arg else _FIRST_ONLY[name]
            continue
        out.append(arg)
    return guestfs_argv(out)


def command(args: argparse.Namespace) -> int:
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
    hold = args.hold or args.external_holder
    explicit, rounding = explicit_from_args(args, env)
    opts = MountOptions(args.mountpoint, args.view, args.cgroup, args.cache_ttl, explicit,
                        rounding, args.fuse_binding, args.allow_other, args.daemon,
                        args.pid_file, args.log_file,
                        exit_when_unused=args.exit_when_unused, ready_fd=args.ready_fd,
                        per_container=args.per_container,
                        reread_explicit=explicit_rereader(args, env),
                        hold=hold, external_holder=args.external_holder,
                        respawn=tuple(respawn_argv(args.argv)) if hold else ())
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
