"""The `guestfs` command."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from guestfs import __version__
from guestfs.explain import to_json_text, to_text
from guestfs.explicit import ExplicitLimitError, ExplicitSettings, collect_explicit
from guestfs.host_proc import HostInfoError
from guestfs.hostroot import HostReadError, HostRoot
from guestfs.limits import ROUNDINGS, EffectiveLimits, effective_limits
from guestfs.proc_cgroup import PidGone
from guestfs.snapshot import Snapshot, read_snapshot
from guestfs.view import SERVED_FILES, render_file

ENV_CPU_ROUNDING = "GUESTFS_CPU_ROUNDING"


class CliError(Exception):
    """A user-facing failure: printed as one line, exit status 1."""


def add_limit_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("where to look")
    g.add_argument("--root", default="/", metavar="DIR",
                   help="read host files (/proc, /sys) under DIR (default: /)")
    g.add_argument("--pid", default="self",
                   help="the process whose limits apply (default: the caller)")
    e = p.add_argument_group(
        "explicit limits (the effective value is the minimum of all sources)")
    e.add_argument("--memory-limit", metavar="Q",
                   help="memory limit as a Kubernetes quantity (512Mi, 1G) or bytes "
                        "[env GUESTFS_MEMORY_LIMIT]")
    e.add_argument("--cpu-limit", metavar="Q",
                   help="CPU limit as a quantity (1500m, 2) [env GUESTFS_CPU_LIMIT]")
    e.add_argument("--limits-dir", metavar="DIR",
                   help="downward-API volume with limits.memory / limits.cpu files "
                        "[env GUESTFS_LIMITS_DIR]")
    e.add_argument("--memory-divisor", metavar="Q",
                   help="divisor of the downward API's memory values (default 1) "
                        "[env GUESTFS_MEMORY_DIVISOR]")
    e.add_argument("--cpu-divisor", metavar="Q",
                   help="divisor of the downward API's cpu values (default 1; use 1m with "
                        "'divisor: 1m') [env GUESTFS_CPU_DIVISOR]")
    e.add_argument("--cpu-rounding", choices=ROUNDINGS, default=None,
                   help="how a fractional CPU quota becomes a CPU count (default ceil, as "
                        "the JDK, Go and the downward API do) [env GUESTFS_CPU_ROUNDING]")


def compute_limits(args: argparse.Namespace, env: dict[str, str] | None = None
                   ) -> tuple[HostRoot, Snapshot, EffectiveLimits]:
    env = dict(os.environ) if env is None else env
    rounding = args.cpu_rounding or env.get(ENV_CPU_ROUNDING) or "ceil"
    if rounding not in ROUNDINGS:
        raise CliError(f"{ENV_CPU_ROUNDING}={rounding!r}: use one of {', '.join(ROUNDINGS)}")
    settings = ExplicitSettings(
        memory_limit=args.memory_limit, cpu_limit=args.cpu_limit, limits_dir=args.limits_dir,
        memory_divisor=args.memory_divisor, cpu_divisor=args.cpu_divisor, env=env)
    try:
        explicit = collect_explicit(settings)
        host = HostRoot(args.root)
        snap = read_snapshot(host, args.pid)
    except ExplicitLimitError as e:
        raise CliError(str(e)) from e
    except PidGone as e:
        raise CliError(f"{e} (has it exited?)") from e
    except (HostReadError, HostInfoError) as e:
        raise CliError(f"cannot read the host under {args.root}: {e}") from e
    return host, snap, effective_limits(snap, explicit, rounding)


def cmd_explain(args: argparse.Namespace) -> int:
    _, _, lim = compute_limits(args)
    sys.stdout.write(to_json_text(lim) if args.json else to_text(lim))
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    path = "/" + args.file.strip("/")
    if path not in SERVED_FILES:
        print(f"guestfs: {args.file}: not a served file; served files are:\n  "
              + "\n  ".join(SERVED_FILES), file=sys.stderr)
        return 2
    host, snap, lim = compute_limits(args)
    try:
        text = render_file(path, host, snap, lim)
    except HostReadError as e:
        raise CliError(f"cannot read the host's {path} under {args.root}: {e}") from e
    sys.stdout.write(text)
    return 0


SHOW_EPILOG = """\
/proc/loadavg: the daemon averages the container's runnable and uninterruptible tasks
every 5 s; show takes a single sample and prints it as all three averages.
/proc/stat: show starts from fresh counters; a mount keeps them monotonic between reads.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="guestfs",
        description="cgroup-aware /proc and /sys files for containers: see what free, top "
                    "and language runtimes should see, and why.")
    parser.add_argument("--version", action="version", version=f"guestfs {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("explain", help="effective limits of a process and where each came from",
                       description="Print the effective memory, swap and CPU limits of a "
                                   "process, and which file, cgroup level or setting set "
                                   "each one.")
    add_limit_options(p)
    p.add_argument("--json", action="store_true",
                   help="machine-readable output (keys in docs/explain-json.md)")
    p.set_defaults(func=cmd_explain)
    p = sub.add_parser("show", help="print a file exactly as guestfs serves it",
                       description="Print FILE (" + ", ".join(SERVED_FILES) + ") as the "
                                   "filesystem serves it to PID.",
                       epilog=SHOW_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", metavar="FILE", help="a guest path such as /proc/meminfo")
    add_limit_options(p)
    p.set_defaults(func=cmd_show)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except CliError as e:
        print(f"guestfs: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0
