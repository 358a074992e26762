"""The `guestfs` command: one parser, each subcommand's from the module that runs it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from guestfs import __version__
from guestfs.cli import (
    attach,
    explain,
    fuse_holder,
    mount,
    oci_hook,
    run,
    seccomp,
    show,
    webhook,
)
from guestfs.cli.messages import dispatch
from guestfs.cli.options import OneLineParser

# In the order `guestfs --help` lists them. Each module loads what its command needs only
# when it runs (`guestfs run`'s start-up is its app's wait).
COMMANDS = (explain, show, mount, run, attach, oci_hook, seccomp, fuse_holder, webhook)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="guestfs",
        description="cgroup-aware /proc and /sys files for containers: see what free, top "
                    "and language runtimes should see, and why.")
    parser.add_argument("--version", action="version", version=f"guestfs {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    given = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(given)
    args.argv = given      # `mount --hold`: its holder starts successors with it
    return dispatch(args)
