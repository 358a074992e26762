"""struct sysinfo and the affinity mask, built from the served files' text, so a program
calling sysinfo(2) or sched_getaffinity(2) sees the numbers `free`, `uptime` and
/proc/cpuinfo show.

sysinfo(2) (kernel/sys.c do_sysinfo) is what glibc's sysconf(_SC_PHYS_PAGES /
_SC_AVPHYS_PAGES), get_phys_pages(), getloadavg() and Python's os.getloadavg() read; GNU
sort sizes its default buffer from it. sched_getaffinity(2) is what nproc, Python's
os.sched_getaffinity / os.process_cpu_count, the JVM, Go and libuv count.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

from guestfs.sources.cgroup_files import parse_cpu_list
from guestfs.sources.host_proc import parse_meminfo, parse_uptime

# LP64 layout (x86-64, arm64): long uptime; unsigned long loads[3]; unsigned long totalram,
# freeram, sharedram, bufferram, totalswap, freeswap; unsigned short procs (+6 padding);
# unsigned long totalhigh, freehigh; unsigned int mem_unit; char _f[0] (+4 padding).
SYSINFO = struct.Struct("=q3Q6QH6x2QI4x")
SI_LOAD_SHIFT = 16


class ViewTextError(ValueError):
    """A served file did not parse; the caller lets the kernel answer instead."""


@dataclass(frozen=True)
class SysinfoView:
    uptime: float                   # seconds, /proc/uptime's first field
    loads: tuple[float, float, float]
    total_ram: int                  # bytes
    free_ram: int
    shared_ram: int
    buffer_ram: int
    total_swap: int
    free_swap: int
    procs: int                      # threads, /proc/loadavg's "running/TOTAL"


def parse_view(meminfo: str, loadavg: str, uptime: str) -> SysinfoView:
    try:
        kb = parse_meminfo(meminfo)           # the lines sysinfo uses are all in kB
        la = loadavg.split()
        total_threads = int(la[3].split("/")[1])
        view = SysinfoView(
            uptime=parse_uptime(uptime),
            loads=(float(la[0]), float(la[1]), float(la[2])),
            total_ram=kb["MemTotal"] * 1024, free_ram=kb["MemFree"] * 1024,
            shared_ram=kb.get("Shmem", 0) * 1024, buffer_ram=kb.get("Buffers", 0) * 1024,
            total_swap=kb.get("SwapTotal", 0) * 1024, free_swap=kb.get("SwapFree", 0) * 1024,
            procs=total_threads)
    except (KeyError, IndexError, ValueError) as e:
        raise ViewTextError(f"served files do not parse: {e!r}") from e
    if view.total_ram <= 0:
        raise ViewTextError("served MemTotal is 0")
    return view


def pack_sysinfo(view: SysinfoView, elapsed: float = 0.0) -> bytes:
    """The 112 bytes the kernel would copy out. ``elapsed``: seconds since ``view`` was
    read, so uptime keeps ticking between refreshes. The kernel rounds uptime up
    (tv_sec + !!tv_nsec), fixes loads at 16 fractional bits, reports bytes with
    mem_unit 1 on 64-bit when they fit (they always do here), and keeps procs in 16 bits;
    procs is capped instead of wrapped, so 70,000 threads never read as 4,464."""
    loads = [min(round(x * (1 << SI_LOAD_SHIFT)), (1 << 64) - 1) for x in view.loads]
    return SYSINFO.pack(
        math.ceil(view.uptime + elapsed), *loads,
        view.total_ram, min(view.free_ram, view.total_ram),
        view.shared_ram, view.buffer_ram,
        view.total_swap, min(view.free_swap, view.total_swap),
        min(view.procs, 0xFFFF), 0, 0, 1)


def cpu_count_of(online: str) -> int:
    """CPUs in a cpu list such as /sys/devices/system/cpu/online ("0-3,6")."""
    try:
        n = len(parse_cpu_list(online))
    except ValueError as e:
        raise ViewTextError(f"bad cpu list {online!r}: {e}") from e
    if n <= 0:
        raise ViewTextError(f"empty cpu list {online!r}")
    return n


def first_cpus(mask: bytes, n: int) -> bytes:
    """``mask`` (a kernel cpumask, bit i of byte i//8 = CPU i) keeping only its first
    ``n`` set bits: the CPUs /proc/cpuinfo shows, as real CPU numbers."""
    out = bytearray(len(mask))
    left = n
    for i, byte in enumerate(mask):
        if left <= 0:
            break
        for bit in range(8):
            if byte >> bit & 1 and left > 0:
                out[i] |= 1 << bit
                left -= 1
    return bytes(out)


def same_cpus(a: bytes, b: bytes) -> bool:
    """Two masks of any lengths naming the same CPUs (missing bytes are zero)."""
    size = max(len(a), len(b))
    return a.ljust(size, b"\0") == b.ljust(size, b"\0")
