"""`guestfs run -- CMD`: CMD with the served files over its /proc and /sys (guestfs/wrap/)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from guestfs import DEFAULT_MOUNTPOINT
from guestfs.cli import mount
from guestfs.cli.messages import failure_line, setup_logging
from guestfs.cli.options import (
    AFFINITY_MODES,
    CliError,
    UsageError,
    add_limit_options,
    add_mount_options,
    add_run_privilege_options,
    explicit_from_args,
    mount_argv,
)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("run", help="run a command that sees guestfs's files over /proc, /sys",
                       description="Mount (or reuse) the filesystem at --mountpoint, run CMD "
                                   "in a private mount namespace where every served file is "
                                   "bind-mounted over its /proc or /sys counterpart, and exit "
                                   "with CMD's status (signals are forwarded).")
    p.add_argument("--mountpoint",
                   help="where the filesystem is or will be mounted (default /run/guestfs; "
                        "where that cannot be made, a private tmpfs only run and its "
                        "daemon see: docs/run.md)")
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
    p.set_defaults(func=command)


def daemon_argv(args: argparse.Namespace) -> list[str]:
    """The options run's daemons are started with: its own, and --hold wherever a holder
    can keep the connection (guestfs's FUSE engine, Linux 6.9+), so that a daemon killed
    under the app is succeeded on the same connection and the app's binds stay valid.
    Elsewhere a dead daemon's files are re-bound (wrap/supervise.py, docs/run.md)."""
    from guestfs.system.kernel import kernel_resends

    out = mount_argv(args)
    if args.fuse_binding in ("auto", "guestfs") and kernel_resends():
        out.append("--hold")
    return out


def command(args: argparse.Namespace) -> int:
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
    mount.check_cgroup("run", args.cgroup)
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
        start = begin(mp, daemon_argv(args), args.mountpoint is not None, entry=mount.alone)
        # Loaded while the daemon starts (wrap/start.py): the app side, from here on.
        from guestfs.wrap.run import run

        return run(start, cmd, args.bind_pressure, keep_caps=args.keep_caps,
                   host_clock=args.host_clock, sysinfo=args.sysinfo,
                   affinity=args.cpu_affinity)
    except (RunError, OSError) as e:
        raise CliError(failure_line(e)) from e
