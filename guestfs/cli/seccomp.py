"""`guestfs seccomp-agent` and `guestfs seccomp-guard`: runc's seccomp agent, and the
guard that keeps its listeners across its restarts (guestfs/inject/seccomp_agent.py,
guestfs/syscalls/keeper.py)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from guestfs import DEFAULT_HOOK_SOURCE
from guestfs.cli.messages import failure_line, setup_logging
from guestfs.cli.options import AFFINITY_MODES, CliError


def add_parser(sub: Any) -> None:
    p = sub.add_parser("seccomp-agent", help="answer sysinfo(2) and the CPU count for "
                                             "containers whose seccomp profile notifies them",
                       description="Listen on SOCKET for the seccomp listeners an OCI runtime "
                                   "hands over (the profile's listenerPath, docs/syscalls.md) "
                                   "and answer each container's sysinfo(2) and "
                                   "sched_getaffinity(2) from SOURCE/<key>/..., its directory "
                                   "of a per-container mount; where there is none, the kernel "
                                   "answers. Runs in the foreground; SIGTERM stops it.")
    p.add_argument("--socket", default="/run/guestfs-seccomp/agent.sock",
                   help="the unix socket the profile's listenerPath names (default "
                        "/run/guestfs-seccomp/agent.sock; its directory is made 0700)")
    p.add_argument("--source", default=DEFAULT_HOOK_SOURCE,
                   help=f"the per-container guestfs mount (default {DEFAULT_HOOK_SOURCE})")
    p.add_argument("--no-sysinfo", dest="sysinfo", action="store_false",
                   help="let the kernel answer sysinfo(2)")
    p.add_argument("--cpu-affinity", choices=AFFINITY_MODES, default="view",
                   help="as for run: 'view' (default), 'pin' or 'host'")
    p.add_argument("--external-guard", action="store_true",
                   help="wait for the guard `guestfs seccomp-guard` runs (in a pod of its "
                        "own) instead of starting one")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    p.set_defaults(func=agent)
    p = sub.add_parser("seccomp-guard", help="keep the seccomp agent's listeners across "
                                             "its restarts",
                       description="Hold every seccomp listener the agent of DIR hands over, "
                                   "pass their calls to the kernel while no agent runs, and "
                                   "hand them back to the next agent (docs/syscalls.md). For a "
                                   "container of its own; the agent starts one otherwise. "
                                   "Ignores SIGTERM: it must outlive agents.")
    p.add_argument("--dir", default="/run/guestfs-seccomp",
                   help="the agent socket's directory (default /run/guestfs-seccomp)")
    p.set_defaults(func=guard)


def agent(args: argparse.Namespace) -> int:
    from guestfs.inject.seccomp_agent import serve_agent

    setup_logging(args.verbose)
    try:
        return serve_agent(args.socket, args.source, args.sysinfo, args.cpu_affinity,
                           args.external_guard)
    except OSError as e:
        raise CliError(f"seccomp-agent: {failure_line(e)}") from e


def guard(args: argparse.Namespace) -> int:
    from guestfs.syscalls.keeper import exec_standalone_guard

    try:
        exec_standalone_guard(os.path.abspath(args.dir))
    except OSError as e:
        raise CliError(f"seccomp-guard: {failure_line(e)}") from e
    return 1
