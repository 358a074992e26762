"""How the command talks: its logging, set up per command, and a caught failure as the
one line it prints."""

from __future__ import annotations

import argparse
import logging
import sys

from guestfs.cli.options import CliError, UsageError
from guestfs.system import ratelog
from guestfs.system.oneline import one_line, os_error_line


def dispatch(args: argparse.Namespace) -> int:
    """Run the parsed command; its exit status. A CliError is one line (2 for usage, as
    argparse's own, 1 for a failure found while running)."""
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


def failure_line(e: Exception) -> str:
    """The one line a caught failure prints: an OSError without Python's "[Errno N]"."""
    return os_error_line(e) if isinstance(e, OSError) else str(e)
