#!/usr/bin/env python3
"""Read latency and throughput of the served files: kernel /proc vs LXCFS vs guestfs.

    .venv/bin/python benchmarks/bench_read.py [--ops 5000] [--json FILE]

Run as root on a cgroup v1 (or hybrid) host with lxcfs installed (.ci/setup). It creates a
v1 cgroup (512 MiB, quota 150000/100000), starts LXCFS and guestfs on mountpoints of their
own (both daemons outside the cgroup, as when LXCFS runs on the host), and from inside the
cgroup times open+read+close of /proc/{meminfo,cpuinfo,stat} through each, with 1 and 4
concurrent readers (`--files` picks others, e.g. uptime,loadavg; `--idle-procs N` first starts
N sleeping processes outside the cgroup, to show a file's cost does not grow with the number
of processes on the host); then `free -m` invocations per second with each one's meminfo bound
over /proc/meminfo; then each daemon's RSS. Ratios are within one run, never across runs:
the machine is shared and noisy. Everything it starts is removed on exit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.fusemount import mounted  # noqa: E402
from tests.lxcfsd import lxcfs_mounted  # noqa: E402
from tests.realcg import v1_cgroup  # noqa: E402

FILES = ("meminfo", "cpuinfo", "stat")


def _reader(path: str, ops: int, q: mp.Queue) -> None:  # type: ignore[type-arg]
    lat = []
    for _ in range(ops):
        t0 = time.perf_counter_ns()
        with open(path, "rb", buffering=0) as f:
            while f.read(65536):
                pass
        lat.append(time.perf_counter_ns() - t0)
    q.put(lat)


def measure(path: str, ops: int, readers: int) -> dict[str, float]:
    q: mp.Queue = mp.Queue()  # type: ignore[type-arg]
    procs = [mp.Process(target=_reader, args=(path, ops, q)) for _ in range(readers)]
    t0 = time.perf_counter()
    for p in procs:
        p.start()
    lats = [x for _ in procs for x in q.get()]
    for p in procs:
        p.join()
    wall = time.perf_counter() - t0
    lats.sort()
    return {"p50_us": lats[len(lats) // 2] / 1000, "p99_us": lats[int(len(lats) * 0.99)] / 1000,
            "mean_us": statistics.fmean(lats) / 1000, "ops_per_s": len(lats) / wall}


FREE_LOOP = ("import subprocess, sys, time; n = int(sys.argv[1]); t = time.perf_counter()\n"
             "for _ in range(n): subprocess.run(['free', '-m'], stdout=subprocess.DEVNULL)\n"
             "print(n / (time.perf_counter() - t))")


def free_rate(meminfo: str | None, n: int) -> float:
    loop = [sys.executable, "-c", FREE_LOOP, str(n)]
    if meminfo is None:
        out = subprocess.run(loop, check=True, capture_output=True, text=True)
    else:
        out = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                              'mount --bind "$0" /proc/meminfo && exec "$@"', meminfo,
                              *loop], check=True, capture_output=True, text=True)
    return float(out.stdout)


@contextlib.contextmanager
def sleeping(n: int) -> Iterator[None]:
    procs = [subprocess.Popen(["sleep", "3600"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def enter(dirs: dict[str, str]) -> None:
    for d in dirs.values():
        with open(f"{d}/cgroup.procs", "w") as f:
            f.write(str(os.getpid()))


def leave(dirs: dict[str, str]) -> None:
    for d in dirs.values():
        with open(f"{os.path.dirname(d)}/cgroup.procs", "w") as f:
            f.write(str(os.getpid()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", type=int, default=5000, help="reads per reader (default 5000)")
    ap.add_argument("--free", type=int, default=300, help="free -m runs per target")
    ap.add_argument("--binding", default="auto", help="guestfs --fuse-binding")
    ap.add_argument("--json", metavar="FILE", help="also write the results here")
    ap.add_argument("--files", default=",".join(FILES),
                    help=f"files under /proc to time (default {','.join(FILES)})")
    ap.add_argument("--idle-procs", type=int, default=0, metavar="N",
                    help="sleeping processes to start on the host first (default 0)")
    a = ap.parse_args()
    files = tuple(a.files.split(","))
    results: dict[str, object] = {"binding": a.binding, "ops": a.ops,
                                  "idle_procs": a.idle_procs}
    with tempfile.TemporaryDirectory(prefix="guestfs-bench-") as tmp, \
            lxcfs_mounted(f"{tmp}/lxcfs", f"{tmp}/lxcfs.pid") as lx, \
            mounted(f"{tmp}/guestfs", "--fuse-binding", a.binding,
                    log=f"{tmp}/guestfs.log") as gf, \
            v1_cgroup(512 << 20, 150000, 100000) as cg, \
            sleeping(a.idle_procs):
        targets = {"kernel": "/proc", "lxcfs": f"{tmp}/lxcfs/proc",
                   "guestfs": f"{tmp}/guestfs/proc"}
        enter(cg.dirs)
        try:
            reads: dict[str, dict[str, object]] = {}
            for f in files:
                for readers in (1, 4):
                    for name, base in targets.items():
                        measure(f"{base}/{f}", min(200, a.ops), readers)  # warm up
                        r = measure(f"{base}/{f}", a.ops, readers)
                        reads[f"{f} x{readers} {name}"] = r
                        print(f"{f:8} readers={readers} {name:8} p50 {r['p50_us']:8.1f} us  "
                              f"p99 {r['p99_us']:8.1f} us  {r['ops_per_s']:9.0f} reads/s",
                              flush=True)
            results["reads"] = reads
            free = {name: free_rate(None if name == "kernel" else f"{base}/meminfo", a.free)
                    for name, base in targets.items()}
            results["free_per_s"] = free
            print("free -m per second: " + ", ".join(f"{k} {v:.0f}" for k, v in free.items()))
        finally:
            leave(cg.dirs)
        rss = {"guestfs": psutil.Process(gf.pid).memory_info().rss,
               "lxcfs": psutil.Process(lx.pid).memory_info().rss}
        results["rss_bytes"] = rss
        results["guestfs_log"] = Path(f"{tmp}/guestfs.log").read_text().splitlines()[:1]
    ratios = {}
    for f in files:
        for readers in (1, 4):
            g, x = reads[f"{f} x{readers} guestfs"], reads[f"{f} x{readers} lxcfs"]
            ratios[f"{f} x{readers}"] = {k: g[k] / x[k] for k in ("p50_us", "p99_us",
                                                                 "ops_per_s")}
    results["guestfs_over_lxcfs"] = ratios
    results["free_guestfs_over_kernel"] = free["guestfs"] / free["kernel"]
    print("\nguestfs / LXCFS (lower latency ratio is better):")
    for k, v in ratios.items():
        print(f"  {k:12} p50 {v['p50_us']:.2f}  p99 {v['p99_us']:.2f}  "
              f"reads/s {v['ops_per_s']:.2f}")
    print(f"free -m rate guestfs/kernel: {results['free_guestfs_over_kernel']:.2f}")
    print(f"RSS: guestfs {rss['guestfs'] / 2**20:.1f} MiB, lxcfs {rss['lxcfs'] / 2**20:.1f} MiB")
    print(results["guestfs_log"][0] if results["guestfs_log"] else "")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
