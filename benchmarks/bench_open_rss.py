#!/usr/bin/env python3
"""The daemon's memory under a million opens, whatever the open pattern.

    .venv/bin/python benchmarks/bench_open_rss.py [--opens 1000000] [--readers 4] [--json F]

Run as root. It mounts guestfs on a mountpoint of its own, then ``--readers`` processes
share ``--opens`` opens of every served file in turn: every other open is read and closed
at once, the rest are read and left open, up to each reader's file-descriptor limit
(raised to ``--hold`` open files), after which the reader closes them all and goes on. The
daemon keeps no release callback, so nothing tells it an open ended: this is the pattern
that grew it without bound when its per-open store was bounded by bytes only. It samples
the daemon's RSS every second and prints RSS before, peak (VmHWM) and after, and the
renderings the daemon says it kept when it stops. Everything it starts is removed on exit.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path

# benchsupport sits next to this file (the script's directory is on sys.path); guestfs is
# the venv's installed package.
from benchsupport import guestfs_mounted

from guestfs.daemon.file_table import SERVED_FILES

MiB = 1 << 20


def _reader(mnt: str, opens: int, hold: int, only: str | None) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (hold + 64, hold + 64))
    files = [mnt + f for f in ([only] if only else SERVED_FILES) if os.path.exists(f)]
    held: list[int] = []
    for i in range(opens):
        fd = os.open(files[i % len(files)], os.O_RDONLY)
        os.read(fd, 65536)
        if i % 2:
            os.close(fd)
            continue
        held.append(fd)
        if len(held) >= hold:
            for h in held:
                os.close(h)
            held.clear()


def _status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise LookupError(field)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--opens", type=int, default=1_000_000)
    ap.add_argument("--readers", type=int, default=4)
    ap.add_argument("--hold", type=int, default=16000, help="open files each reader keeps")
    ap.add_argument("--file", help="open only this served file (e.g. the 4-byte "
                    "/sys/devices/system/cpu/online) instead of every one in turn")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench_open_rss: run as root (it mounts FUSE)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="guestfs-bench-rss-") as tmp:
        mnt, log = f"{tmp}/mnt", f"{tmp}/log"
        with guestfs_mounted(mnt, [], log) as daemon:
            time.sleep(1)  # the size probe and the first renderings
            before = _status_kib(daemon.pid, "VmRSS")
            samples: list[int] = []
            done = threading.Event()

            def sample() -> None:
                while not done.wait(1.0):
                    samples.append(_status_kib(daemon.pid, "VmRSS"))

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            t0 = time.monotonic()
            per = args.opens // args.readers
            procs = [mp.Process(target=_reader, args=(mnt, per, args.hold, args.file))
                     for _ in range(args.readers)]
            for p in procs:
                p.start()
            for p in procs:
                p.join()
            seconds = time.monotonic() - t0
            done.set()
            sampler.join()
            after = _status_kib(daemon.pid, "VmRSS")
            peak = _status_kib(daemon.pid, "VmHWM")
            daemon.send_signal(15)
            daemon.wait(30)
        kept = re.search(r"(\d+) open renderings kept", Path(log).read_text())
    failed = [p.exitcode for p in procs if p.exitcode]
    results = {"opens": per * args.readers, "readers": args.readers, "hold": args.hold,
               "file": args.file or "every served file",
               "seconds": round(seconds, 1), "rss_before_kib": before,
               "rss_after_kib": after, "rss_peak_kib": peak,
               "rss_max_sampled_kib": max(samples, default=after),
               "renderings_kept": int(kept.group(1)) if kept else None,
               "rss_every_10s_kib": samples[::10],
               "reader_failures": failed}
    print(f"{results['opens']} opens by {args.readers} readers in {seconds:.0f} s "
          f"(half left open, up to {args.hold} each): daemon RSS {before / 1024:.1f} MiB "
          f"before, {after / 1024:.1f} MiB after, peak {peak / 1024:.1f} MiB; "
          f"renderings kept at exit: {results['renderings_kept']}")
    print("RSS every 10 s (MiB):", " ".join(f"{k / 1024:.1f}" for k in samples[::10]))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
