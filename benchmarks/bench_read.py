#!/usr/bin/env python3
"""Read latency and throughput of the served files: kernel /proc vs LXCFS vs guestfs.

    .venv/bin/python benchmarks/bench_read.py [--ops 5000] [--json FILE] [--plot FILE.svg]

Run as root on a cgroup v1 (or hybrid) host with lxcfs installed (.ci/setup). It creates a
v1 cgroup (512 MiB, quota 150000/100000) at one path in every hierarchy, starts LXCFS and
three guestfs mounts on mountpoints of their own (all daemons outside the cgroup, as when
LXCFS runs on the host):

- ``guestfs``: the default mount, a per-caller view (``guestfs mount MP``);
- ``fixed``: a fixed view of the bench cgroup (``guestfs mount MP --cgroup PATH``);
- ``percontainer``: ``guestfs mount MP --per-container``, read at
  ``MP/<dir_key(PATH)>/proc/...`` (left out, with the reason, if this guestfs refuses the
  option);

and from inside the cgroup times open+read-to-EOF+close of /proc/{meminfo,cpuinfo,stat}
through the kernel and each daemon, with 1, 2 and 4 concurrent reader processes (``--files``
picks others, e.g. uptime,loadavg; ``--idle-procs N`` first starts N sleeping processes
outside the cgroup, to show a file's cost does not grow with the number of processes on the
host), and each daemon's CPU time per 10^5 reads (utime+stime of /proc/<pid>/stat around
each measurement); then `free -m` invocations per second with each one's meminfo bound over
/proc/meminfo in a private mount namespace (the kernel's own file for the kernel), in
interleaved rounds; then each daemon's RSS. It prints a markdown
table for docs/performance.md with the ratios against the targets, and ``--plot`` writes an
SVG of reads/s by number of readers. Ratios are within one run, never across runs: the
machine is shared and noisy. Everything it starts is removed on exit, failure included.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import queue
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# benchsupport and svgplot sit next to this file (the script's directory is on sys.path);
# guestfs is the venv's installed package.
from benchsupport import (
    CLK_TCK,
    BenchError,
    bench_cgroup,
    cpu_sample,
    cpu_seconds_between,
    guestfs_mounted,
    lxcfs_mounted,
    rss_bytes,
    sleeping,
)
from svgplot import grouped_bars

FILES = ("meminfo", "cpuinfo", "stat")
READERS = (1, 2, 4)
MODES = ("kernel", "lxcfs", "guestfs", "fixed", "percontainer")
LABELS = {"kernel": "kernel", "lxcfs": "LXCFS", "guestfs": "guestfs per-caller",
          "fixed": "guestfs fixed view", "percontainer": "guestfs per-container"}
DAEMONS = MODES[1:]


def _reader(path: str, ops: int, ready: Any, go: Any, q: Any) -> None:
    lat = []
    ready.release()
    go.wait()
    start = time.perf_counter()  # CLOCK_MONOTONIC: comparable across processes
    try:
        for _ in range(ops):
            t0 = time.perf_counter_ns()
            with open(path, "rb", buffering=0) as f:
                while f.read(65536):
                    pass
            lat.append(time.perf_counter_ns() - t0)
    except OSError as e:
        q.put(f"{path}: {e}")
        return
    q.put((start, time.perf_counter(), lat))


def measure(path: str, ops: int, readers: int, daemon: int | None = None
            ) -> dict[str, float]:
    """``readers`` processes each open+read+close ``path`` ``ops`` times, all let go at
    once; reads/s is every read over the span from the first reader's start to the last
    one's end (process start-up and the transfer of results left out). With ``daemon``,
    also that daemon's CPU seconds over the run, and per 10^5 reads."""
    ctx = mp.get_context("fork")
    q, ready, go = ctx.Queue(), ctx.Semaphore(0), ctx.Event()
    procs = [ctx.Process(target=_reader, args=(path, ops, ready, go, q))
             for _ in range(readers)]
    try:
        for p in procs:
            p.start()
        for _ in procs:
            if not ready.acquire(timeout=30):
                raise BenchError(f"the readers of {path} did not start")
        cpu0 = cpu_sample(daemon) if daemon else {}
        go.set()
        got = []
        for _ in procs:
            while True:
                with contextlib.suppress(queue.Empty):
                    got.append(q.get(timeout=1))
                    break
                if not any(p.is_alive() for p in procs) and q.empty():
                    raise BenchError(f"the readers of {path} died")
        cpu = cpu_seconds_between(cpu0, cpu_sample(daemon)) if daemon else 0.0
        for p in procs:
            p.join()
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    errors = [g for g in got if isinstance(g, str)]
    if errors:
        raise BenchError(errors[0])
    wall = max(g[1] for g in got) - min(g[0] for g in got)
    lats = sorted(x for g in got for x in g[2])
    r = {"p50_us": lats[len(lats) // 2] / 1000, "p99_us": lats[int(len(lats) * 0.99)] / 1000,
         "mean_us": statistics.fmean(lats) / 1000, "ops_per_s": len(lats) / wall,
         "reads": len(lats)}
    if daemon:
        r["daemon_cpu_s"] = cpu
        r["cpu_s_per_1e5_reads"] = cpu * 1e5 / len(lats)
    return r


FREE_LOOP = ("import subprocess, sys, time; n = int(sys.argv[1]); t = time.perf_counter()\n"
             "for _ in range(n): subprocess.run(['free', '-m'], stdout=subprocess.DEVNULL)\n"
             "print(n / (time.perf_counter() - t))")


def free_rate(meminfo: str, n: int) -> float:
    """``free -m`` runs per second in a private mount namespace with ``meminfo`` bound over
    /proc/meminfo (the kernel's own file for the kernel: the same namespace and mount)."""
    loop = [sys.executable, "-c", FREE_LOOP, str(n)]
    out = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                          'mount --bind "$0" /proc/meminfo && exec "$@"', meminfo, *loop],
                         check=True, capture_output=True, text=True, cwd="/")
    return float(out.stdout)


def free_rates(meminfos: dict[str, str], n: int, rounds: int
               ) -> tuple[dict[str, float], dict[str, list[float]]]:
    """``n`` runs per target in ``rounds`` interleaved rounds (the order reversed every
    other round), so a burst of load on the shared machine lands on every target alike:
    each target's runs over its total time, and every round's rate."""
    per = max(1, n // rounds)
    seen: dict[str, list[float]] = {m: [] for m in meminfos}
    for r in range(rounds):
        for m in (list(meminfos) if r % 2 == 0 else list(reversed(meminfos))):
            seen[m].append(free_rate(meminfos[m], per))
    return {m: len(v) * per / sum(per / x for x in v) for m, v in seen.items()}, seen


def daemon_cpu(reads: dict[str, dict[str, float]], mode: str) -> dict[str, float]:
    """A daemon's CPU seconds per 10^5 reads over every measurement of it: /proc/<pid>/stat
    counts in clock ticks (10 ms), too coarse for one short measurement of a fast path, so
    the sum is the figure to quote; ``resolution`` is one tick over the same reads."""
    rows = [r for k, r in reads.items() if k.endswith(f" {mode}")]
    n, cpu = sum(r["reads"] for r in rows), sum(r["daemon_cpu_s"] for r in rows)
    return {"value": cpu * 1e5 / n, "cpu_s": cpu, "reads": n,
            "resolution": 1e5 / CLK_TCK / n}


def _memtotal(path: str) -> str:
    with open(path) as f:
        return next((line.split(None, 1)[1].strip() for line in f
                     if line.startswith("MemTotal:")), "?")


# --- the report ----------------------------------------------------------------------


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def targets(results: dict) -> list[dict]:  # type: ignore[type-arg]
    """The fixed view against the targets of issue 11, as ratios within this run."""
    reads, free = results["reads"], results["free_per_s"]

    def get(key: str, field: str) -> float | None:
        return reads[key][field] if key in reads else None

    top = max(results["readers"])
    rows = [
        ("fixed-view meminfo p50 / kernel p50 (1 reader)", "≤ 1.0",
         _ratio(get("meminfo x1 fixed", "p50_us"), get("meminfo x1 kernel", "p50_us")),
         lambda v: v <= 1.0),
        ("fixed-view meminfo p50 / LXCFS p50 (1 reader)", "≤ 0.05",
         _ratio(get("meminfo x1 fixed", "p50_us"), get("meminfo x1 lxcfs", "p50_us")),
         lambda v: v <= 0.05),
        (f"fixed-view / LXCFS meminfo reads/s ({top} readers)", "≥ 10",
         _ratio(get(f"meminfo x{top} fixed", "ops_per_s"),
                get(f"meminfo x{top} lxcfs", "ops_per_s")),
         lambda v: v >= 10),
        ("`free -m` rate fixed view / kernel", "≥ 0.95",
         _ratio(free.get("fixed"), free.get("kernel")), lambda v: v >= 0.95),
    ]
    return [{"target": name, "goal": goal, "measured": v,
             "met": None if v is None else bool(ok(v))} for name, goal, v, ok in rows]


def _cell(r: dict | None) -> str:  # type: ignore[type-arg]
    return "–" if r is None else f"{r['p50_us']:.0f} / {r['p99_us']:.0f}"


def _sig(v: float) -> str:
    return f"{v:.0f}" if v >= 10 else f"{v:.1f}" if v >= 1 else f"{v:.2g}"


def _num(v: float | None, fmt: str = ".2f") -> str:
    return "–" if v is None else format(v, fmt)


def markdown(results: dict) -> str:  # type: ignore[type-arg]
    reads, modes, files = results["reads"], results["modes"], results["files"]
    readers = results["readers"]
    out = ["| file | readers | " + " | ".join(f"{LABELS[m]} p50 / p99 µs" for m in modes)
           + " | fixed/kernel p50 | fixed/LXCFS p50 |",
           "|---|---|" + "---|" * (len(modes) + 2)]
    for f in files:
        for n in readers:
            if n not in (1, 4) and {1, 4} & set(readers):
                continue  # 2 readers: in the second table and the plot only
            row = [_cell(reads.get(f"{f} x{n} {m}")) for m in modes]
            fx = reads.get(f"{f} x{n} fixed")
            ratios = [_num(_ratio(fx and fx["p50_us"], reads[f"{f} x{n} {b}"]["p50_us"]))
                      for b in ("kernel", "lxcfs")]
            out.append(f"| {f} | {n} | " + " | ".join(row + ratios) + " |")
    out += ["", "| | " + " | ".join(f"meminfo reads/s ×{n}" for n in readers)
            + " | `free -m` /s | RSS MiB | daemon CPU s / 10^5 reads |",
            "|---|" + "---|" * (len(readers) + 3)]
    for m in modes:
        rs = [reads.get(f"meminfo x{n} {m}") for n in readers]
        cpu = results["cpu_s_per_1e5_reads"].get(m)
        if cpu is None:
            cpu_cell = "–"
        elif cpu["cpu_s"] == 0:
            cpu_cell = f"< {_sig(cpu['resolution'])}"
        else:
            cpu_cell = _sig(cpu["value"])
        rss = results["rss_bytes"].get(m)
        out.append(f"| {LABELS[m]} | "
                   + " | ".join("–" if r is None else f"{r['ops_per_s']:.0f}" for r in rs)
                   + f" | {_num(results['free_per_s'].get(m), '.0f')}"
                   + f" | {_num(rss and rss / 2**20, '.1f')}"
                   + f" | {cpu_cell} |")
    timed = sum(readers) * len(files) * results["ops"]
    out.append(f"\n`free -m` /s: with that meminfo bound over /proc/meminfo in a private mount "
               f"namespace (the kernel's over itself), {results['free_rounds']} interleaved "
               "rounds. Daemon CPU: "
               f"utime+stime of /proc/<pid>/stat over all {timed} timed reads of it "
               f"({', '.join(files)}; 1 tick = 1/{CLK_TCK} s).")
    for m, why in results["skipped"].items():
        out.append(f"\n{LABELS[m]}: not measured: {why}")
    out += ["", "| target (issue 11) | goal | measured | |", "|---|---|---|---|"]
    for t in results["targets"]:
        met = {True: "met", False: "**not met**", None: "not measured"}[t["met"]]
        out.append(f"| {t['target']} | {t['goal']} | {_num(t['measured'])} | {met} |")
    return "\n".join(out) + "\n"


def plot(results: dict) -> str:  # type: ignore[type-arg]
    panels = {f: {n: {m: results["reads"][f"{f} x{n} {m}"]["ops_per_s"]
                      for m in results["modes"] if f"{f} x{n} {m}" in results["reads"]}
                  for n in results["readers"]}
              for f in results["files"]}
    return grouped_bars("open + read + close per second, by concurrent readers",
                        {f"/proc/{f}": g for f, g in panels.items()}, LABELS,
                        subtitle=f"benchmarks/bench_read.py --ops {results['ops']}, "
                                 f"{results['date']}, {os.cpu_count()} CPUs; "
                                 "one run, compare within it only")


# --- the run -------------------------------------------------------------------------


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through every cleanup below


def run(a: argparse.Namespace) -> dict:  # type: ignore[type-arg]
    from guestfs.sources.containerdirs import dir_key

    files = tuple(a.files.split(","))
    readers = tuple(int(n) for n in a.readers.split(","))
    results: dict = {"binding": a.binding, "ops": a.ops,  # type: ignore[type-arg]
                     "idle_procs": a.idle_procs, "files": list(files),
                     "readers": list(readers), "skipped": {}, "free_rounds": a.free_rounds,
                     "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    gargs = ["--fuse-binding", a.binding, *(["--hold"] if a.hold else [])]
    results["hold"] = a.hold
    if a.cache_ttl is not None:
        gargs += ["--cache-ttl", a.cache_ttl]
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="guestfs-bench-"))
        cg = stack.enter_context(bench_cgroup(512 << 20, 150000, 100000))
        key = dir_key(cg.path)
        results["cgroup"], results["key"] = cg.path, key
        lx = stack.enter_context(lxcfs_mounted(f"{tmp}/lxcfs", f"{tmp}/lxcfs.pid"))
        gf = stack.enter_context(guestfs_mounted(f"{tmp}/guestfs", gargs,
                                                 f"{tmp}/guestfs.log"))
        fx = stack.enter_context(guestfs_mounted(f"{tmp}/fixed", [*gargs, "--cgroup", cg.path],
                                                 f"{tmp}/fixed.log"))
        pc = stack.enter_context(guestfs_mounted(f"{tmp}/percontainer",
                                                 [*gargs, "--per-container"],
                                                 f"{tmp}/percontainer.log", optional=True))
        stack.enter_context(sleeping(a.idle_procs))
        bases = {"kernel": "/proc", "lxcfs": f"{tmp}/lxcfs/proc",
                 "guestfs": f"{tmp}/guestfs/proc", "fixed": f"{tmp}/fixed/proc",
                 "percontainer": f"{tmp}/percontainer/{key}/proc"}
        pids = {"lxcfs": lx.pid, "guestfs": gf.pid, "fixed": fx.pid}  # type: ignore[union-attr]
        if isinstance(pc, str):
            results["skipped"]["percontainer"] = pc
        else:
            pids["percontainer"] = pc.pid
        modes = [m for m in MODES if m not in results["skipped"]]
        results["modes"] = modes
        results["pids"] = pids
        cg.enter()
        try:
            if "percontainer" in modes and not os.path.exists(f"{bases['percontainer']}/meminfo"):
                # The mount took the option but has no directory for this cgroup: report it
                # (the other rows still run), it is not a missing mode.
                results["skipped"]["percontainer"] = (
                    f"mounted, but {bases['percontainer']}/meminfo does not exist")
                modes.remove("percontainer")
            results["memtotal"] = {m: _memtotal(f"{bases[m]}/meminfo") for m in modes}
            print("MemTotal: " + ", ".join(f"{m} {v}" for m, v in results["memtotal"].items()),
                  flush=True)
            reads: dict[str, dict[str, float]] = {}
            results["reads"] = reads
            for f in files:
                for n in readers:
                    for m in modes:
                        path = f"{bases[m]}/{f}"
                        measure(path, min(200, a.ops), n)  # warm up
                        r = measure(path, a.ops, n, pids.get(m))
                        reads[f"{f} x{n} {m}"] = r
                        cpu = (f"  {r['cpu_s_per_1e5_reads']:6.2f} cpu s/1e5"
                               if "cpu_s_per_1e5_reads" in r else "")
                        print(f"{f:8} readers={n} {m:12} p50 {r['p50_us']:8.1f} us  "
                              f"p99 {r['p99_us']:8.1f} us  {r['ops_per_s']:9.0f} reads/s{cpu}",
                              flush=True)
            free, rounds = free_rates({m: f"{bases[m]}/meminfo" for m in modes}, a.free,
                                      a.free_rounds)
            results["free_rounds_per_s"] = rounds
            results["cpu_s_per_1e5_reads"] = {m: daemon_cpu(reads, m) for m in modes
                                              if m in pids}
            results["free_per_s"] = free
            print("free -m per second: " + ", ".join(f"{k} {v:.0f}" for k, v in free.items()))
        finally:
            cg.leave()
        results["rss_bytes"] = {m: rss_bytes(pid) for m, pid in pids.items()}
        results["guestfs_log"] = Path(f"{tmp}/guestfs.log").read_text().splitlines()[:1]
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", type=int, default=5000, help="reads per reader (default 5000)")
    ap.add_argument("--free", type=int, default=300, help="free -m runs per target")
    ap.add_argument("--free-rounds", type=int, default=5, metavar="N",
                    help="interleaved rounds the free -m runs are split into (default 5)")
    ap.add_argument("--binding", default="auto", help="guestfs --fuse-binding")
    ap.add_argument("--hold", action="store_true",
                    help="guestfs mount --hold (a holder keeps each connection)")
    ap.add_argument("--cache-ttl", metavar="S", help="guestfs --cache-ttl (default: its own)")
    ap.add_argument("--json", metavar="FILE", help="also write the results here")
    ap.add_argument("--plot", metavar="FILE.svg", help="also draw reads/s by readers here")
    ap.add_argument("--files", default=",".join(FILES),
                    help=f"files under /proc to time (default {','.join(FILES)})")
    ap.add_argument("--readers", default=",".join(map(str, READERS)),
                    help="numbers of concurrent readers (default 1,2,4)")
    ap.add_argument("--idle-procs", type=int, default=0, metavar="N",
                    help="sleeping processes to start on the host first (default 0)")
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, _terminate)
    try:
        results = run(a)
    except BenchError as e:
        print(f"bench_read: {e}", file=sys.stderr)
        return 1
    reads, free = results["reads"], results["free_per_s"]
    ratios = {}
    for f in results["files"]:
        for n in results["readers"]:
            g, x = reads[f"{f} x{n} guestfs"], reads[f"{f} x{n} lxcfs"]
            ratios[f"{f} x{n}"] = {k: g[k] / x[k] for k in ("p50_us", "p99_us", "ops_per_s")}
    results["guestfs_over_lxcfs"] = ratios
    results["free_guestfs_over_kernel"] = free["guestfs"] / free["kernel"]
    results["targets"] = targets(results)
    print("\nguestfs per-caller / LXCFS (lower latency ratio is better):")
    for k, v in ratios.items():
        print(f"  {k:12} p50 {v['p50_us']:.2f}  p99 {v['p99_us']:.2f}  "
              f"reads/s {v['ops_per_s']:.2f}")
    print(f"free -m rate guestfs/kernel: {results['free_guestfs_over_kernel']:.2f}")
    print("RSS: " + ", ".join(f"{m} {v / 2**20:.1f} MiB"
                              for m, v in results["rss_bytes"].items()))
    print(results["guestfs_log"][0] if results["guestfs_log"] else "")
    results["table_md"] = markdown(results)
    print("\n" + results["table_md"])
    if a.plot:
        Path(a.plot).write_text(plot(results))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
