#!/usr/bin/env python3
"""Reads/s of the per-caller mount on guestfs's engine by its number of worker threads
(session.Options.threads), LXCFS beside it as the reference of the same run.

    .venv/bin/python benchmarks/bench_workers.py [--workers 1,2,4] [--files meminfo,stat]
                                                 [--readers 1,4] [--ops 1000] [--rounds 3]

Run as root on a cgroup v1 (or hybrid) host with lxcfs installed (.ci/setup). It makes the
bench cgroup of bench_read.py (512 MiB, quota 150000/100000), starts LXCFS and one
`guestfs mount MP` per worker count (this script re-executed as the daemon, the count set
before guestfs's own entry point runs; cwd /, the venv's guestfs), then from inside the
cgroup runs bench_read.py's measurement (N readers let go together, each open + read to
EOF + close ``--ops`` times) against every mount in each of ``--rounds`` rounds, the order
reversed every other round so a burst of load lands on every mount alike. It prints, per
file and number of readers, each mount's reads/s (lowest-highest over the rounds) and the
median of its per-round ratios to LXCFS. Everything it starts is removed on exit.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
from pathlib import Path

SERVE = "--serve-with-workers"


def serve(argv: list[str]) -> int:
    """The daemon: ``N mount MP ...`` with N workers."""
    from guestfs.cli.main import main as guestfs_main
    from guestfs.fuse.session import Options

    defaults = list(Options.__init__.__defaults__ or ())
    defaults[0] = int(argv[0])                      # threads, Options' first field
    Options.__init__.__defaults__ = tuple(defaults)  # type: ignore[attr-defined]
    return guestfs_main(argv[1:])


def run(a: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    from bench_read import measure
    from benchsupport import bench_cgroup, guestfs_mounted, lxcfs_mounted

    workers = [int(n) for n in a.workers.split(",")]
    seen: dict[str, dict[str, list[float]]] = {}
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="guestfs-workers-"))
        cg = stack.enter_context(bench_cgroup(512 << 20, 150000, 100000))
        stack.enter_context(lxcfs_mounted(f"{tmp}/lxcfs", f"{tmp}/lxcfs.pid"))
        bases = {"LXCFS": f"{tmp}/lxcfs/proc"}
        for w in workers:
            # This script as the daemon, its worker count set (serve).
            daemon = [sys.executable, str(Path(__file__).resolve()), SERVE, str(w)]
            stack.enter_context(guestfs_mounted(f"{tmp}/w{w}", ["--fuse-binding", "guestfs"],
                                                f"{tmp}/w{w}.log", command=daemon))
            bases[f"{w} workers"] = f"{tmp}/w{w}/proc"
        cg.enter()
        try:
            for r in range(a.rounds):
                for f in a.files.split(","):
                    for n in (int(x) for x in a.readers.split(",")):
                        order = list(bases) if r % 2 == 0 else list(reversed(bases))
                        for name in order:
                            path = f"{bases[name]}/{f}"
                            measure(path, min(100, a.ops), n)   # warm up
                            got = measure(path, a.ops, n)["ops_per_s"]
                            seen.setdefault(f"{f} x{n}", {}).setdefault(name, []).append(got)
                            print(f"round {r + 1} {f} x{n} {name}: {got:.0f} reads/s",
                                  flush=True)
        finally:
            cg.leave()
    return seen


def table(seen: dict[str, dict[str, list[float]]]) -> str:
    names = list(next(iter(seen.values())))
    head = "| file, readers | " + " | ".join(f"{n} reads/s" for n in names) + " |"
    rows = [head, "|" + "---|" * (len(names) + 1)]
    for key, by in seen.items():
        cells = []
        for n in names:
            lo, hi = min(by[n]), max(by[n])
            cell = f"{lo:,.0f}–{hi:,.0f}"
            if n != "LXCFS":
                ratio = statistics.median(x / y for x, y in zip(by[n], by["LXCFS"],
                                                                 strict=True))
                cell += f" ({ratio:.2f}×)"
            cells.append(cell)
        rows.append(f"| {key} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == SERVE:
        return serve(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--files", default="meminfo,stat")
    ap.add_argument("--readers", default="1,4")
    ap.add_argument("--ops", type=int, default=1000, help="reads per reader per round")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    from benchsupport import BenchError
    try:
        seen = run(a)
    except BenchError as e:
        print(f"bench_workers: {e}", file=sys.stderr)
        return 2
    print()
    print(table(seen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
