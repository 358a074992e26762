#!/usr/bin/env python3
"""What each import costs the daemon in resident memory, and the daemon's RSS serving.

    .venv/bin/python benchmarks/bench_rss_imports.py [--top 40] [--reads 1000] [--no-daemon]
        [--hold]

Part 1 (any user): a fresh ``python -I -S`` (the daemon's interpreter and flags, site
imported under the hook so its cost shows) imports what the daemon imports, in its order:
``site``, ``guestfs.cli.main`` (the package loaded as ``_boot.py`` does), the FUSE binding and
the modules ``guestfs mount`` imports on its way to serving. A meta-path hook reads VmRSS
from /proc/self/status around every module's execution: "cum" is a module's RSS delta
including the modules it imports (as ``-X importtime``'s cumulative column), "self"
without them. Rows are in first-import order, nested by depth, those under ``--min`` KiB
cumulative left out.

Part 2 (root, FUSE): ``guestfs mount MP --cgroup /`` and ``guestfs mount MP`` (per-caller
view), each started as ``guestfs run`` starts its daemon (``python -I .../_boot.py``); the
daemon's VmRSS (and RssAnon, RssFile, threads) once it serves, and after one reader process
has made ``--reads`` open+read+close of every served file, and after as many more from 20
short-lived reader processes (per-caller views are cached per reader).

``--hold``: the daemon of ``guestfs mount --hold`` instead: part 1 imports what it adds
(``guestfs.daemon.held`` and what it brings), part 2 mounts with ``--hold`` (its holder
is a process of its own, not measured).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BOOT = REPO / "guestfs" / "_boot.py"

# Runs in the measured interpreter (python -I -S): no guestfs import before the hook.
CHILD = r"""
import sys, json
def rss():
    with open('/proc/self/status', 'rb') as f:
        for line in f:
            if line.startswith(b'VmRSS:'):
                return int(line.split()[1])
rows = []      # [name, depth, cum, self]
stack = []     # per open import: [children's cum]
class Hook:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        for finder in sys.meta_path:
            if finder is cls or not hasattr(finder, 'find_spec'):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, 'exec_module'):
            return spec
        real = loader.exec_module
        class Wrapped:
            def __getattr__(self, a):
                return getattr(loader, a)
            def create_module(self, s):
                return loader.create_module(s)
            def exec_module(self, module):
                row = [name, len(stack), 0, 0]
                rows.append(row)
                stack.append([0])
                before = rss()
                try:
                    real(module)
                finally:
                    cum = rss() - before
                    children = stack.pop()[0]
                    row[2], row[3] = cum, cum - children
                    if stack:
                        stack[-1][0] += cum
        spec.loader = Wrapped()
        return spec
start = rss()
sys.meta_path.insert(0, Hook)
import site
site.main()
import importlib.util, os
here = sys.argv[1]
spec = importlib.util.spec_from_file_location(
    'guestfs', os.path.join(here, '__init__.py'), submodule_search_locations=[here])
mod = importlib.util.module_from_spec(spec)
sys.modules['guestfs'] = mod
spec.loader.exec_module(mod)
import guestfs.cli.main
from guestfs.daemon.fuse_binding import load_binding
load_binding('auto')
import guestfs.daemon.mount
if sys.argv[2] == 'hold':
    import guestfs.daemon.held
print(json.dumps({'start': start, 'end': rss(), 'rows': rows}))
"""

MOUNT_ORDER = ("/proc/meminfo", "/proc/cpuinfo", "/proc/stat", "/proc/uptime",
               "/proc/loadavg", "/proc/swaps", "/proc/diskstats", "/proc/pressure/cpu",
               "/proc/pressure/memory", "/proc/pressure/io",
               "/sys/devices/system/cpu/online", "/sys/devices/system/cpu/possible",
               "/sys/devices/system/cpu/present")

READER = r"""
import os, sys
mp, n, order = sys.argv[1], int(sys.argv[2]), sys.argv[3]
files = [mp + f for f in sys.argv[4:] if os.path.exists(mp + f)]
seq = [f for f in files for _ in range(n)] if order == "file-by-file" else files * n
for f in seq:
    fd = os.open(f, os.O_RDONLY)
    try:
        while os.read(fd, 65536):
            pass
    finally:
        os.close(fd)
"""


def import_table(min_kib: int, hold: bool) -> str:
    out = subprocess.run([sys.executable, "-I", "-S", "-c", CHILD, str(REPO / "guestfs"),
                          "hold" if hold else "-"],
                         check=True, capture_output=True, text=True, cwd="/").stdout
    data = json.loads(out)
    lines = [f"interpreter before site: {data['start']} KiB; after every daemon import: "
             f"{data['end']} KiB (+{data['end'] - data['start']} KiB)", "",
             f"{'module':<50} {'cum KiB':>8} {'self KiB':>9}"]
    for name, depth, cum, own in data["rows"]:
        if cum >= min_kib:
            lines.append(f"{'  ' * depth + name:<50} {cum:>8} {own:>9}")
    return "\n".join(lines)


def status(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile", "Threads", "VmHWM"):
                out[key] = int(value.split()[0])
    return out


def fmt(s: dict[str, int]) -> str:
    return (f"VmRSS {s['VmRSS'] / 1024:5.1f} MiB (anon {s['RssAnon'] / 1024:4.1f}, "
            f"file {s['RssFile'] / 1024:4.1f}) threads {s['Threads']}")


def read_all(mp: str, n: int, order: str) -> None:
    subprocess.run([sys.executable, "-I", "-S", "-c", READER, mp, str(n), order,
                    *MOUNT_ORDER], check=True)


def daemon_rss(args: list[str], reads: int, order: str, env: dict[str, str]) -> list[str]:
    from benchsupport import force_unmount

    from guestfs.daemon.mountpoint import is_guestfs_mount, wait_until

    base = tempfile.mkdtemp(prefix="guestfs-rss-")
    mp = os.path.join(base, "mnt")
    os.mkdir(mp)
    proc = subprocess.Popen([sys.executable, "-I", str(BOOT), "mount", mp, *args],
                            stderr=subprocess.DEVNULL, cwd="/", env={**os.environ, **env})
    try:
        if not wait_until(lambda: is_guestfs_mount(mp) or proc.poll() is not None, 30):
            raise SystemExit(f"guestfs mount {mp} did not come up")
        time.sleep(1.0)  # the probe thread and the sampler's first round
        rows = [f"  serving:                {fmt(status(proc.pid))}"]
        read_all(mp, reads, order)
        rows.append(f"  {reads} reads of each:   {fmt(status(proc.pid))}")
        for _ in range(20):
            read_all(mp, max(1, reads // 20), order)
        s = status(proc.pid)
        rows.append(f"  + 20 readers:          {fmt(s)}; peak {s['VmHWM'] / 1024:.1f} MiB")
        return rows
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        force_unmount(mp)
        for d in (mp, base):
            with contextlib.suppress(OSError):
                os.rmdir(d)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--min", type=int, default=64, help="hide imports under this many KiB")
    ap.add_argument("--reads", type=int, default=1000)
    ap.add_argument("--order", choices=("round-robin", "file-by-file"), default="round-robin",
                    help="every file in turn, or all reads of one file before the next")
    ap.add_argument("--no-daemon", action="store_true", help="only the import table")
    ap.add_argument("--hold", action="store_true",
                    help="the daemon of guestfs mount --hold (imports and RSS)")
    ap.add_argument("--no-imports", action="store_true", help="only the daemon's RSS")
    ap.add_argument("--env", action="append", default=[], metavar="K=V",
                    help="extra environment for the daemon (to try e.g. MALLOC_ARENA_MAX)")
    a = ap.parse_args()
    if not a.no_imports:
        print(import_table(a.min, a.hold))
    if a.no_daemon:
        return 0
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        print("\n(daemon RSS skipped: needs root and /dev/fuse)")
        return 0
    env = dict(kv.split("=", 1) for kv in a.env)
    for args in (["--cgroup", "/"], []):
        args += ["--hold"] if a.hold else []
        print(f"\nguestfs mount MP {' '.join(args)}".rstrip() + f" ({a.order})")
        print("\n".join(daemon_rss(args, a.reads, a.order, env)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
