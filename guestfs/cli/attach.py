"""`guestfs attach`: bind the served files inside another process's mount namespace
(guestfs/inject/attach.py)."""

from __future__ import annotations

import argparse
from typing import Any

from guestfs import DEFAULT_MOUNTPOINT
from guestfs.cli.messages import failure_line, setup_logging
from guestfs.cli.options import CliError, process_id, seconds


def add_parser(sub: Any) -> None:
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
    p.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
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
