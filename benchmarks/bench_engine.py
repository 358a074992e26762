#!/usr/bin/env python3
"""The Python cost of guestfs's FUSE engine on the per-caller path, without the kernel's
FUSE client: what one reader's open + read to EOF + close costs the daemon's interpreter.

    .venv/bin/python benchmarks/bench_engine.py [--ops 5000] [--file meminfo]
                                                [--profile tottime|cumtime]

Run as root on a cgroup v1 (or hybrid) host (it makes a 512 MiB / 1.5 CPU cgroup, as
bench_read.py does). A sleeping process in that cgroup is the reader; the requests the
kernel sends for `open(); fstat(); read() until EOF; close()` of MP/proc/<file> with
default_permissions (GETATTR, OPEN, the fstat's GETATTR, READ, READ at the end,
RELEASE) are built by hand with that reader's pid and handed to a Session whose replies
go into a pipe; the daemon's operations, view server and caches are the real ones, over
the real host files. It prints the µs per sequence and, as the reference of the same
run, the µs of the same open + fstat + read + read + close of the kernel's
/proc/<file>: the ratio is what the engine's Python costs in kernel reads. The kernel
round trips a real read adds are bench_read.py's to measure. ``--profile`` prints a
cProfile of a second pass, sorted so.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import subprocess
import sys
import time

from benchsupport import BenchError, bench_cgroup

from guestfs.daemon.file_table import SERVED_FILES
from guestfs.daemon.fusefs import make_operations
from guestfs.daemon.server import ServerConfig, ViewServer
from guestfs.fuse import abi, adapter
from guestfs.fuse.inodes import path_id
from guestfs.sources.host_pin import pin_host_files
from tests.support.fuseframes import PipeSession, frame, init_frame, replies


class Reader:
    """The engine of a per-caller mount, and the requests of one reader's reads."""

    def __init__(self, pid: int, path: str) -> None:
        self.pid, self.nodeid = pid, path_id(path)
        server = ViewServer(pin_host_files(SERVED_FILES), ServerConfig())
        ops = make_operations(adapter, server, "per-caller", 0.0)
        fs = adapter.OperationsFilesystem(ops, attr_timeout=0.0, entry_timeout=1.0)
        self.pipe = PipeSession(fs, init=False)
        fs.session = self.pipe.session
        self.pipe.ask(init_frame())
        walked, parent = "", abi.ROOT_ID
        for part in path.strip("/").split("/"):
            self.pipe.ask(frame(abi.LOOKUP, part.encode() + b"\0", nodeid=parent, pid=pid))
            walked += "/" + part
            parent = path_id(walked)

    def _ask(self, opcode: int, body: bytes) -> list[object]:
        self.pipe.session.handle(frame(opcode, body, nodeid=self.nodeid, pid=self.pid))
        return list(replies(self.pipe.r))

    def read_once(self) -> int:
        """One open + fstat + read to EOF + close: the bytes read."""
        self._ask(abi.GETATTR, abi.GETATTR_IN.pack(0, 0, 0))      # the open's permission
        (opened,) = self._ask(abi.OPEN, abi.OPEN_IN.pack(os.O_RDONLY, 0))
        fh = abi.OPEN_OUT.unpack_from(opened.body)[0]              # type: ignore[attr-defined]
        # An fstat: the kernel sends it without the handle (vfs_getattr passes no file).
        self._ask(abi.GETATTR, abi.GETATTR_IN.pack(0, 0, 0))
        (data,) = self._ask(abi.READ, abi.READ_IN.pack(fh, 0, 65536, abi.READ_LOCKOWNER,
                                                        1, 0, 0))
        n = len(data.body)                                         # type: ignore[attr-defined]
        self._ask(abi.READ, abi.READ_IN.pack(fh, n, 65536, abi.READ_LOCKOWNER, 1, 0, 0))
        self._ask(abi.RELEASE, abi.RELEASE_IN.pack(fh, 0, 0, 0))
        return n


def kernel_read(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fstat(fd)
        while os.read(fd, 65536):
            pass
    finally:
        os.close(fd)


def per_op_us(fn: object, ops: int) -> float:
    start = time.perf_counter()
    for _ in range(ops):
        fn()  # type: ignore[operator]
    return (time.perf_counter() - start) / ops * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", type=int, default=5000)
    ap.add_argument("--file", default="meminfo", help="a file under /proc (default meminfo)")
    ap.add_argument("--profile", choices=("tottime", "cumtime"))
    args = ap.parse_args()
    path = f"/proc/{args.file}"
    try:
        with bench_cgroup(512 << 20, 150000, 100000) as cg:
            cg.enter()
            sleeper = subprocess.Popen(["sleep", "600"], cwd="/")
            cg.leave()
            try:
                reader = Reader(sleeper.pid, path)
                if reader.read_once() < 100:
                    raise BenchError(f"{path}: the engine served less than a rendering")
                engine = per_op_us(reader.read_once, args.ops)
                kernel = per_op_us(lambda: kernel_read(path), args.ops)
                print(f"{path}, {args.ops} reads: engine {engine:.1f} µs per open + fstat + "
                      f"read + read + close (6 requests), kernel {kernel:.1f} µs: "
                      f"engine/kernel {engine / kernel:.2f}")
                if args.profile:
                    prof = cProfile.Profile()
                    prof.enable()
                    for _ in range(args.ops):
                        reader.read_once()
                    prof.disable()
                    pstats.Stats(prof).sort_stats(args.profile).print_stats(30)
            finally:
                sleeper.kill()
                sleeper.wait()
    except BenchError as e:
        print(f"bench_engine: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
