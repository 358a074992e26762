"""The `guestfs` command: one parser, each subcommand's from the module that runs it."""

from __future__ import annotations

import gc
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse

# Commands that turn the garbage collector back on themselves, once started (main()):
# run once its app is started (wrap/run.py), mount once it serves (daemon/mount.py).
SELF_COLLECTING = ("run", "mount")


def commands() -> tuple[ModuleType, ...]:
    """In the order `guestfs --help` lists them. Each module loads what its command needs
    only when it runs (`guestfs run`'s start-up is its app's wait)."""
    from guestfs.cli import attach, explain, fuse_holder, mount, oci_hook, run, seccomp, show

    return (explain, show, mount, run, attach, oci_hook, seccomp, fuse_holder)


def build_parser() -> argparse.ArgumentParser:
    from guestfs import __version__
    from guestfs.cli.options import OneLineParser

    parser = OneLineParser(
        prog="guestfs",
        description="cgroup-aware /proc and /sys files for containers: see what free, top "
                    "and language runtimes should see, and why.")
    parser.add_argument("--version", action="version", version=f"guestfs {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in commands():
        command.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # Loading and parsing make tens of thousands of objects that live as long as the
    # process; the collector's passes over them were about a tenth of `guestfs run`'s
    # start-up CPU (and, after its fork, copied the pages the daemon shares with run).
    # Off until the command starts; whoever called us gets it back as it was.
    collecting = gc.isenabled()
    gc.disable()
    try:
        from guestfs.cli.messages import dispatch

        given = list(sys.argv[1:] if argv is None else argv)
        args = build_parser().parse_args(given)
        args.argv = given      # `mount --hold`: its holder starts successors with it
        if collecting and args.command not in SELF_COLLECTING:
            gc.enable()
        return dispatch(args)
    finally:
        if collecting:
            gc.enable()
