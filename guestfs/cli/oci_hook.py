"""`guestfs oci-hook`: the OCI createContainer hook (guestfs/inject/ocihook.py)."""

from __future__ import annotations

import argparse
from typing import Any

from guestfs import DEFAULT_HOOK_SOURCE
from guestfs.cli.options import seconds


def add_parser(sub: Any) -> None:
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
    p.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    from guestfs.inject.ocihook import main as hook_main

    return hook_main(args.source, args.strict, args.per_container, args.timeout,
                     verbose=args.verbose, log_file=args.log_file)
