"""`guestfs fuse-holder`: the standalone holder of FUSE connections that `guestfs mount
--external-holder` hands over (guestfs/fuse/holder.py), for a pod of its own."""

from __future__ import annotations

import argparse
import os
from typing import Any

from guestfs.cli.options import CliError


def add_parser(sub: Any) -> None:
    p = sub.add_parser("fuse-holder", help="keep FUSE connections open across the deaths "
                                           "and restarts of their daemons",
                       description="Listen in DIR for the FUSE connections `guestfs mount "
                                   "--hold --external-holder` hands over, keep each open, and "
                                   "give it to the next `guestfs mount --hold` of its "
                                   "mountpoint once its daemon is gone (docs/mount.md, "
                                   "\"Takeover\"). For a pod of its own (the DaemonSet's "
                                   "guestfs-fuse-holder). SIGTERM ends it and every "
                                   "connection it holds.")
    p.add_argument("--lock-dir", metavar="DIR", required=True,
                   help="the daemons' lock directory (their --lock-dir; it must be ours and "
                        "writable by no one else)")
    p.add_argument("--orphan-grace", type=float, default=60.0, metavar="S",
                   help="end a connection no daemon asked for within S seconds of its "
                        "daemon's end (default 60)")
    p.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    from guestfs.system.selfexec import FUSE_HOLDER_STANDALONE, helper_argv

    lock_dir = os.path.abspath(args.lock_dir)
    if not os.path.isdir(lock_dir):
        raise CliError(f"fuse-holder: --lock-dir {lock_dir} is not a directory")
    if not args.orphan_grace > 0:
        raise CliError("fuse-holder: --orphan-grace must be more than 0")
    # A fresh interpreter without site or the command line's modules: it lives for as
    # long as the node's mounts, in a pod whose memory is its own.
    argv = helper_argv(FUSE_HOLDER_STANDALONE, lock_dir, repr(args.orphan_grace))
    os.execv(argv[0], argv)
    return 1    # not reached
