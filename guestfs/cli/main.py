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


# The module that registers each command, in the order `guestfs --help` lists them (a
# unit test holds it to the parsers). Each module loads what its command needs only
# when it runs (`guestfs run`'s start-up is its app's wait).
MODULE_OF = {"explain": "explain", "show": "show", "mount": "mount", "run": "run",
             "attach": "attach", "oci-hook": "oci_hook", "seccomp-agent": "seccomp",
             "seccomp-guard": "seccomp", "fuse-holder": "fuse_holder", "webhook": "webhook"}


def commands(only: str | None = None) -> tuple[ModuleType, ...]:
    """The command modules: every one, or the one registering the command ``only``."""
    import importlib

    names = [MODULE_OF[only]] if only in MODULE_OF else dict.fromkeys(MODULE_OF.values())
    return tuple(importlib.import_module(f"guestfs.cli.{name}") for name in names)


def build_parser(given: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The parser of every command; where ``given`` starts with a command's name, of that
    one alone (the others' options cost `guestfs run` about 5 ms of its start)."""
    from guestfs import __version__
    from guestfs.cli.options import OneLineParser

    parser = OneLineParser(
        prog="guestfs",
        description="cgroup-aware /proc and /sys files for containers: see what free, top "
                    "and language runtimes should see, and why.")
    parser.add_argument("--version", action="version", version=f"guestfs {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in commands(given[0] if given else None):
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
        args = build_parser(given).parse_args(given)
        args.argv = given      # `mount --hold`: its holder starts successors with it
        if collecting and args.command not in SELF_COLLECTING:
            gc.enable()
        return dispatch(args)
    finally:
        if collecting:
            gc.enable()
