"""The command line's vocabulary: the parser that prints usage errors as one line, option
types, and the option groups several commands share (limits; mount options, which `run`
also passes on to the daemon it starts), with their conversion back to argv."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from guestfs.daemon.defaults import DEFAULT_CACHE_TTL, DEFAULT_VIEW, VIEWS
from guestfs.daemon.fuse_binding import BINDINGS
from guestfs.engine.explicit import (
    ENV_LIMITS_DIR,
    ExplicitLimitError,
    ExplicitLimits,
    ExplicitSettings,
    collect_explicit,
)
from guestfs.engine.quantity import ROUNDINGS
from guestfs.system.oneline import one_line

ENV_CPU_ROUNDING = "GUESTFS_CPU_ROUNDING"


class CliError(Exception):
    """A user-facing failure: printed as one line, exit status 1."""


class UsageError(CliError):
    """A command line that cannot mean anything, found after parsing: exit status 2, as
    argparse's own usage errors."""


def _columns() -> int:
    """The terminal's width as shutil.get_terminal_size() gives it ($COLUMNS, then stdout's
    terminal, then 80), without importing shutil."""
    with contextlib.suppress(KeyError, ValueError):
        if (columns := int(os.environ["COLUMNS"])) > 0:
            return columns
    with contextlib.suppress(AttributeError, ValueError, OSError):
        if (columns := os.get_terminal_size(sys.__stdout__.fileno()).columns) > 0:
            return columns
    return 80


class TerminalWidth(argparse.HelpFormatter):
    """argparse's formatter, told the width: by itself it asks shutil on every
    add_argument, and importing shutil loads zlib, bz2 and lzma, 5 ms of every command's
    start-up (`guestfs run`'s is its app's wait)."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        super().__init__(prog, indent_increment, max_help_position,
                         _columns() - 2 if width is None else width)


class RawDescription(TerminalWidth, argparse.RawDescriptionHelpFormatter):
    pass


class OneLineParser(argparse.ArgumentParser):
    """Usage errors as one line naming the bad input (argparse prints the whole usage
    first, which buries it), exit status 2 as argparse's."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", TerminalWidth)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, one_line(f"{self.prog}: {message} (see {self.prog} --help)") + "\n")

# sched_getaffinity answers under `guestfs run` (syscalls/answers.py says why).
AFFINITY_MODES = ("view", "pin", "host")


def seconds(minimum: float, strict: bool) -> Callable[[str], float]:
    """An argparse type: a finite number of seconds, at least (``strict``: above)
    ``minimum``. float() alone takes "nan", "inf" and negatives, which then meant a cache
    that never expires or a sleep that raises."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
        if not math.isfinite(value) or value < minimum or (strict and value == minimum):
            raise argparse.ArgumentTypeError(
                f"{text!r}: give a finite number of seconds {'>' if strict else '>='} "
                f"{minimum:g}")
        return value
    return parse


def process_id(text: str) -> int:
    """An argparse type: a process id, 1 to the kernel's largest (pid_max's limit, 2^22);
    pid 0 or -5 only reached /proc as "No such file or directory"."""
    if text.isascii() and text.isdigit() and 0 < int(text) < 2**22 + 1:
        return int(text)
    raise argparse.ArgumentTypeError(f"not a process id: {text!r}")


def pid_arg(text: str) -> str:
    """``self`` or a process id: the value becomes part of a /proc path, so "../x" must
    not reach it."""
    return text if text == "self" else str(process_id(text))


def add_limit_options(p: argparse.ArgumentParser, where: bool = True) -> None:
    if where:
        g = p.add_argument_group("where to look")
        g.add_argument("--root", default="/", metavar="DIR",
                       help="read host files (/proc, /sys) under DIR (default: /)")
        g.add_argument("--pid", default="self", type=pid_arg,
                       help="the process whose limits apply (default: self, the caller)")
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


def _settings(args: argparse.Namespace, env: dict[str, str]) -> ExplicitSettings:
    return ExplicitSettings(
        memory_limit=args.memory_limit, cpu_limit=args.cpu_limit, limits_dir=args.limits_dir,
        memory_divisor=args.memory_divisor, cpu_divisor=args.cpu_divisor, env=env)


def explicit_from_args(args: argparse.Namespace, env: dict[str, str]
                       ) -> tuple[ExplicitLimits, str]:
    rounding = args.cpu_rounding or env.get(ENV_CPU_ROUNDING) or "ceil"
    if rounding not in ROUNDINGS:
        raise CliError(f"{ENV_CPU_ROUNDING}={rounding!r}: use one of {', '.join(ROUNDINGS)}")
    try:
        return collect_explicit(_settings(args, env)), rounding
    except ExplicitLimitError as e:
        raise CliError(str(e)) from e


def explicit_rereader(args: argparse.Namespace, env: dict[str, str]
                      ) -> Callable[[], ExplicitLimits] | None:
    """What re-reads the explicit limits while the daemon runs: only a limits directory
    can change (kubelet rewrites a downward-API volume on an in-place resize); options and
    environment variables are fixed at start, so None without a directory."""
    settings = _settings(args, env)
    if not (settings.limits_dir or env.get(ENV_LIMITS_DIR)):
        return None
    return lambda: collect_explicit(settings)


def limit_argv(args: argparse.Namespace) -> list[str]:
    """The limit options of ``args`` as command-line words (run passes them to mount)."""
    out: list[str] = []
    for opt in ("memory_limit", "cpu_limit", "limits_dir", "memory_divisor", "cpu_divisor",
                "cpu_rounding"):
        value = getattr(args, opt)
        if value is not None:
            out += ["--" + opt.replace("_", "-"), str(value)]
    return out


def add_mount_options(p: argparse.ArgumentParser, view: str = DEFAULT_VIEW) -> None:
    """The filesystem options of `mount`, and of `run`, which passes them to its daemon;
    ``view`` is the command's default (run's is self: the app and the daemon share one
    cgroup, served from the page cache)."""
    m = p.add_argument_group("filesystem")
    m.add_argument("--view", choices=VIEWS, default=view,
                   help=f"whose cgroup a read reflects (default {view}): the reading "
                        "process (caller: per-container views even in a shared-pid pod), "
                        "its pid-namespace init (init, LXCFS's choice) or the daemon's own "
                        "(self); an exited pid falls back to the next")
    m.add_argument("--cgroup", metavar="PATH",
                   help="pin every read to this cgroup path (as /proc/<pid>/cgroup names it)")
    m.add_argument("--cache-ttl", type=seconds(0, strict=False), default=DEFAULT_CACHE_TTL,
                   metavar="SECONDS",
                   help=f"how long a computed view is reused (default {DEFAULT_CACHE_TTL})")
    m.add_argument("--fuse-binding", choices=BINDINGS, default="auto",
                   help="auto (default): guestfs's own FUSE engine (no libfuse); mfusepy3 "
                        "(mfusepy on libfuse3), mfusepy2 and fusepy by name")
    m.add_argument("--allow-other", action="store_true",
                   help="let other users (and other containers' processes) read the files")
    m.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    m.add_argument("-q", "--quiet", action="store_true",
                   help="warnings and errors only (how `run` starts its daemon unless -v)")


def mount_argv(args: argparse.Namespace) -> list[str]:
    out = ["--view", args.view, "--cache-ttl", str(args.cache_ttl),
           "--fuse-binding", args.fuse_binding, *limit_argv(args)]
    if args.cgroup:
        out += ["--cgroup", args.cgroup]
    if args.allow_other:
        out.append("--allow-other")
    # The daemon run starts writes into the app's stderr, which is the pod's log: only
    # what needs someone's attention, unless asked.
    out.append("--verbose" if args.verbose else "--quiet")
    return out


def add_run_privilege_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("privileges of CMD and readers")
    g.add_argument("--keep-caps", action="store_true",
                   help="let CMD keep CAP_SYS_ADMIN (by default it is dropped from all its "
                        "capability sets, so CMD can neither undo the binds nor mount)")
    # Most apps run as non-root: a mount only root could read would fail them (docs/mount.md
    # says why allow_other is safe here).
    g.add_argument("--no-allow-other", dest="allow_other", action="store_false",
                   help="only the mounting user may read the files (default for run: "
                        "every user may, --allow-other)")
    p.set_defaults(allow_other=True)
