"""`guestfs show FILE`: a file exactly as the filesystem serves it to a process."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from guestfs.cli.explain import compute_limits
from guestfs.cli.options import CliError, RawDescription, UsageError, add_limit_options
from guestfs.render.served import SERVED_FILES

EPILOG = """\
/proc/loadavg: the daemon averages the container's runnable and uninterruptible tasks
every 5 s; show takes a single sample and prints it as all three averages.
/proc/stat: show starts from fresh counters; a mount keeps them monotonic between reads
while the cgroup lives (one made again at the same path starts a fresh clock).
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser("show", help="print a file exactly as guestfs serves it",
                       description="Print FILE (" + ", ".join(SERVED_FILES) + ") as the "
                                   "filesystem serves it to PID.",
                       epilog=EPILOG, formatter_class=RawDescription)
    p.add_argument("file", metavar="FILE", help="a guest path such as /proc/meminfo")
    add_limit_options(p)
    p.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
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
