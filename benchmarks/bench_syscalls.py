#!/usr/bin/env python3
"""What an answered system call costs: sysinfo(2) and sched_getaffinity(0) under
`guestfs run` against the same calls answered by the kernel in the same run.

    .venv/bin/python benchmarks/bench_syscalls.py [--calls 20000] [--rounds 5] [--json F]

Run as root. Three rows, each the median over ``--rounds`` of a C-level loop of
``--calls`` calls (ctypes into libc, the same loop for every row):
- kernel: the plain calls, outside guestfs;
- run --no-sysinfo --cpu-affinity host: inside `guestfs run`, nothing intercepted
  (the filter is absent: what the mount namespace and binds alone cost, nothing);
- run: inside `guestfs run`, both calls answered through seccomp user notification.
Prints microseconds per call and the ratio to the kernel row. The loop runs in a
1-CPU-quota cgroup's view (--cpu-limit 1 on a machine with more CPUs) so affinity is
really answered, not passed back.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from guestfs.system.selfexec import guestfs_argv

LOOP = r"""
import ctypes, json, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
buf = ctypes.create_string_buffer(128)
mask = ctypes.create_string_buffer(1024)
n = int(sys.argv[1])
nr_getaff = 204 if os.uname().machine == "x86_64" else 123
libc.syscall.restype = ctypes.c_long
out = {}
t = time.perf_counter()
for _ in range(n):
    libc.sysinfo(buf)
out["sysinfo"] = (time.perf_counter() - t) / n * 1e6
t = time.perf_counter()
for _ in range(n):
    libc.syscall(nr_getaff, 0, 1024, mask)
out["sched_getaffinity"] = (time.perf_counter() - t) / n * 1e6
out["cpus"] = len(os.sched_getaffinity(0))
out["totalram"] = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
print(json.dumps(out))
"""


def measure(prefix: list[str], calls: int, rounds: int) -> dict[str, float]:
    runs = []
    for _ in range(rounds):
        out = subprocess.run([*prefix, sys.executable, "-c", LOOP, str(calls)],
                             capture_output=True, text=True, check=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    row = {k: statistics.median(r[k] for r in runs) for k in ("sysinfo", "sched_getaffinity")}
    row["cpus"] = runs[-1]["cpus"]
    row["totalram"] = runs[-1]["totalram"]
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench_syscalls: run as root (guestfs run mounts)", file=sys.stderr)
        return 2
    mp = tempfile.mkdtemp(prefix="guestfs-bench-sys-")
    run = guestfs_argv(["run", "--mountpoint", mp, "--memory-limit", "512Mi",
                        "--cpu-limit", "1", "--"])
    rows = {
        "kernel": measure([], args.calls, args.rounds),
        "run, not intercepted": measure(
            run[:-1] + ["--no-sysinfo", "--cpu-affinity", "host", "--"],
            args.calls, args.rounds),
        "run, answered": measure(run, args.calls, args.rounds),
    }
    os.rmdir(mp)
    base = rows["kernel"]
    print(f"{'row':24} {'sysinfo us':>11} {'x kernel':>9} {'getaffinity us':>15} "
          f"{'x kernel':>9} {'cpus':>5} {'totalram MiB':>13}")
    for name, r in rows.items():
        print(f"{name:24} {r['sysinfo']:11.2f} {r['sysinfo'] / base['sysinfo']:9.1f} "
              f"{r['sched_getaffinity']:15.2f} "
              f"{r['sched_getaffinity'] / base['sched_getaffinity']:9.1f} "
              f"{r['cpus']:5d} {r['totalram'] / (1 << 20):13.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
