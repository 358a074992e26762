#!/usr/bin/env python3
"""How long an app waits for its files: from the start of `guestfs run -- APP` to APP's
first read of its /proc/meminfo, against LXCFS's equivalent in the same run.

    .venv/bin/python benchmarks/bench_startup.py [--rounds 10] [--json F]

Run as root, on a machine with lxcfs and a cgroup v1 memory hierarchy. APP is a small C
program (built with gcc; a `python -I -S` one where there is none, said in the output)
that reads MemTotal from /proc/meminfo, then prints CLOCK_MONOTONIC as that read is done
and the value it read: whatever run leaves to be done after the app's exec (a daemon
still starting, an answer rendered at first use) counts until the app has its number.
Every command is started from this process, in a 512 MiB cgroup, and timed from just
before its fork to APP's read done (CLOCK_MONOTONIC: `run`'s time namespace moves only
CLOCK_BOOTTIME). Rows, interleaved round by round:
- lxcfs: an already running lxcfs's file bound by `unshare -m` + `mount --bind` + exec;
- guestfs run: `guestfs run -- APP` with no mount there yet (it starts its daemon);
- guestfs run, mount reused: the same with another run's mount already serving.
Prints each row's median, min and max in seconds and the median's ratio to LXCFS's. Every
row's APP must have read MemTotal = 524288 kB (the cgroup's limit), or the run fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

# benchsupport sits next to this file (the script's directory is on sys.path).
from benchsupport import BenchError, bench_cgroup, lxcfs_mounted, require_fuse

from guestfs.daemon.mountpoint import is_guestfs_mount, wait_until
from guestfs.system.selfexec import guestfs_argv
from guestfs.wrap.run import stop_process

LIMIT_KB = 524288
TARGET_S = 0.15

APP_C = r"""
#include <stdio.h>
#include <string.h>
#include <time.h>
int main(void) {
    struct timespec ts;
    char line[256];
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) { perror("/proc/meminfo"); return 1; }
    long long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemTotal: %lld kB", &kb) == 1) break;
    fclose(f);
    clock_gettime(CLOCK_MONOTONIC, &ts);
    printf("%lld %lld\n", (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec, kb);
    return 0;
}
"""

APP_PY = ("import time\nwith open('/proc/meminfo') as f:\n"
          "    kb = next(int(x.split()[1]) for x in f if x.startswith('MemTotal:'))\n"
          "print(time.monotonic_ns(), kb)\n")


def build_app(tmp: str) -> tuple[list[str], str]:
    """(APP's argv, what it is)."""
    gcc = shutil.which("gcc")
    if gcc is not None:
        src, exe = os.path.join(tmp, "first_read.c"), os.path.join(tmp, "first_read")
        with open(src, "w") as f:
            f.write(APP_C)
        subprocess.run([gcc, "-O2", "-o", exe, src], check=True)
        return [exe], "C (gcc)"
    return [sys.executable, "-I", "-S", "-c", APP_PY], "python -I -S (no gcc)"


def timed(argv: list[str]) -> tuple[float, int]:
    """(seconds from just before the fork to APP's read done, APP's MemTotal in kB)."""
    t0 = time.monotonic_ns()
    out = subprocess.run(argv, capture_output=True, text=True, cwd="/", timeout=60)
    if out.returncode != 0:
        raise BenchError(f"{' '.join(argv[:4])}...: exit {out.returncode}: "
                         f"{out.stderr.strip()[-500:]}")
    stamp, kb = out.stdout.split()[-2:]
    return (int(stamp) - t0) / 1e9, int(kb)


@contextlib.contextmanager
def serving_run(mp: str, app: list[str]) -> Iterator[None]:
    """A `guestfs run` holding a mount at ``mp`` for the block (APP: sleep)."""
    proc = subprocess.Popen(guestfs_argv(["run", "--mountpoint", mp, "--", "sleep", "600"]),
                            cwd="/", stdout=subprocess.DEVNULL)
    try:
        if not wait_until(lambda: is_guestfs_mount(mp) or proc.poll() is not None, 30):
            raise BenchError("the sharing run's mount did not come up")
        yield
    finally:
        stop_process(proc)


Rows = dict[str, list[tuple[float, int]]]    # row -> (seconds, MemTotal kB read) per round


def measure(rounds: int, tmp: str, app: list[str], lxcfs: str) -> Rows:
    fresh, shared = os.path.join(tmp, "fresh"), os.path.join(tmp, "shared")
    os.makedirs(fresh)
    os.makedirs(shared)
    bind = ["unshare", "-m", "--propagation", "private", "sh", "-c",
            'mount --bind "$1" /proc/meminfo && shift && exec "$@"', "sh",
            f"{lxcfs}/proc/meminfo", *app]
    rows: Rows = {"lxcfs": [], "guestfs run": [], "guestfs run, mount reused": []}
    cmds = {"lxcfs": bind,
            "guestfs run": guestfs_argv(["run", "--mountpoint", fresh, "--", *app]),
            "guestfs run, mount reused": guestfs_argv(["run", "--mountpoint", shared, "--",
                                                       *app])}
    with serving_run(shared, app):
        for _ in range(rounds):
            for name, argv in cmds.items():
                if name == "guestfs run":
                    # The last round's daemon stops once its run has: wait until it is.
                    wait_until(lambda: not is_guestfs_mount(fresh), 10)
                secs, kb = timed(argv)
                if kb != LIMIT_KB:
                    raise BenchError(f"{name}: the app read MemTotal {kb} kB, not the "
                                     f"cgroup's {LIMIT_KB} kB")
                rows[name].append((secs, kb))
    return rows


def report(rows: Rows, app_kind: str) -> dict[str, object]:
    secs = {name: [t for t, _kb in vals] for name, vals in rows.items()}
    base = statistics.median(secs["lxcfs"])
    table: dict[str, object] = {}
    print(f"startup to the app's first read of /proc/meminfo (app: {app_kind})")
    print(f"{'row':28} {'median s':>9} {'min s':>7} {'max s':>7} {'x lxcfs':>8}")
    for name, vals in secs.items():
        med = statistics.median(vals)
        table[name] = {"median_s": med, "min_s": min(vals), "max_s": max(vals),
                       "over_lxcfs": med / base, "rounds": len(vals),
                       "memtotal_kb": [kb for _t, kb in rows[name]]}
        print(f"{name:28} {med:9.3f} {min(vals):7.3f} {max(vals):7.3f} {med / base:8.1f}")
    med = statistics.median(secs["guestfs run"])
    print(f"target: guestfs run <= {TARGET_S} s: {'met' if med <= TARGET_S else 'missed'} "
          f"({med:.3f} s)")
    return {"app": app_kind, "target_s": TARGET_S, "target_met": med <= TARGET_S,
            "limit_kb": LIMIT_KB, "rows": table}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    try:
        require_fuse()
        with contextlib.ExitStack() as stack:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="guestfs-bench-start-"))
            app, kind = build_app(tmp)
            cg = stack.enter_context(bench_cgroup(LIMIT_KB << 10, 100000, 100000))
            stack.enter_context(lxcfs_mounted(f"{tmp}/lxcfs", f"{tmp}/lxcfs.pid"))
            cg.enter()
            try:
                rows = measure(args.rounds, tmp, app, f"{tmp}/lxcfs")
            finally:
                cg.leave()
    except BenchError as e:
        print(f"bench_startup: {e}", file=sys.stderr)
        return 2
    out = report(rows, kind)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
