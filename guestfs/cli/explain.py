"""`guestfs explain`: the effective limits of a process and where each came from; and the
limits of --pid under --root that show computes too."""

from __future__ import annotations

import argparse
import os
import stat
import sys
from typing import TYPE_CHECKING, Any

from guestfs.cli.options import CliError, add_limit_options, explicit_from_args
from guestfs.system.oneline import os_error_line

# Loaded when the command runs: the whole read path (`guestfs run` must not pay for it).
if TYPE_CHECKING:
    from guestfs.engine.limits import EffectiveLimits
    from guestfs.sources.host_root import HostRoot
    from guestfs.sources.snapshot import Snapshot


def add_parser(sub: Any) -> None:
    p = sub.add_parser("explain", help="effective limits of a process and where each came from",
                       description="Print the effective memory, swap and CPU limits of a "
                                   "process, and which file, cgroup level or setting set "
                                   "each one.")
    add_limit_options(p)
    p.add_argument("--json", action="store_true",
                   help="machine-readable output (keys in docs/explain-json.md)")
    p.add_argument("--mount", metavar="MOUNTPOINT",
                   help="also show the fallbacks taken by the daemon serving MOUNTPOINT "
                        "(bad or vanished cgroup files, failed renders), by cause")
    p.set_defaults(func=command)


def command(args: argparse.Namespace) -> int:
    from guestfs.cli.explain_output import json_text, to_json, to_text
    from guestfs.daemon.daemon_status import format_status, read_status

    _, _, lim = compute_limits(args)
    status = None
    if args.mount is not None:
        try:
            status = read_status(args.mount)
        except OSError as e:
            raise CliError(f"--mount {args.mount}: {os_error_line(e)}") from e
    if args.json:
        doc = to_json(lim)
        if status is not None:
            doc["daemon"] = status
        sys.stdout.write(json_text(doc))
    else:
        sys.stdout.write(to_text(lim))
        if status is not None:
            sys.stdout.write(format_status(args.mount, status))
    return 0


def compute_limits(args: argparse.Namespace, env: dict[str, str] | None = None
                   ) -> tuple[HostRoot, Snapshot, EffectiveLimits]:
    from guestfs.engine.limits import effective_limits
    from guestfs.sources.host_proc import HostInfoError
    from guestfs.sources.host_root import HostReadError, HostRoot
    from guestfs.sources.proc_cgroup import PidGone
    from guestfs.sources.snapshot import read_snapshot

    env = dict(os.environ) if env is None else env
    explicit, rounding = explicit_from_args(args, env)
    try:
        # Checked first: every pid would otherwise look gone.
        is_dir = stat.S_ISDIR(os.stat(os.path.join(args.root, "proc")).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        is_dir = False
    except OSError as e:
        raise CliError(f"--root {args.root}: cannot look into it ({e.strerror}); give a "
                       "directory this user may read, or run as root") from None
    if not is_dir:
        raise CliError(f"--root {args.root}: no proc directory there (give the directory "
                       "that holds the host's proc and sys)")
    try:
        host = HostRoot(args.root)
        snap = read_snapshot(host, args.pid)
    except PidGone as e:
        raise CliError(str(e)) from e
    except (HostReadError, HostInfoError) as e:
        raise CliError(f"cannot read the host under {args.root}: {e}") from e
    return host, snap, effective_limits(snap, explicit, rounding)
