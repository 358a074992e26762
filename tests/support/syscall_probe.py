"""Run inside `guestfs run`: what a program learns from sysinfo(2), sched_getaffinity(2)
and the served files, as one JSON object on stdout. Standalone (no guestfs import), so it
runs the same under any Python the tests start it with."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
import threading

libc = ctypes.CDLL(None, use_errno=True)


class Sysinfo(ctypes.Structure):
    _fields_ = [("uptime", ctypes.c_long), ("loads", ctypes.c_ulong * 3),
                ("totalram", ctypes.c_ulong), ("freeram", ctypes.c_ulong),
                ("sharedram", ctypes.c_ulong), ("bufferram", ctypes.c_ulong),
                ("totalswap", ctypes.c_ulong), ("freeswap", ctypes.c_ulong),
                ("procs", ctypes.c_ushort), ("totalhigh", ctypes.c_ulong),
                ("freehigh", ctypes.c_ulong), ("mem_unit", ctypes.c_uint),
                ("_f", ctypes.c_char * 0)]


def sysinfo() -> dict[str, object]:
    si = Sysinfo()
    if libc.sysinfo(ctypes.byref(si)) != 0:
        return {"errno": ctypes.get_errno()}
    return {k: (list(getattr(si, k)) if k == "loads" else getattr(si, k))
            for k, _t in Sysinfo._fields_ if k != "_f"}


def sysinfo_errno(addr: int) -> int:
    libc.syscall.restype = ctypes.c_long
    rc = libc.syscall(ctypes.c_long(99 if os.uname().machine == "x86_64" else 179),
                      ctypes.c_void_p(addr))
    return 0 if rc == 0 else ctypes.get_errno()


def readonly_page_errno() -> tuple[int, bool]:
    """sysinfo into a read-only page: the kernel's EFAULT, and the page left untouched
    (/proc/<pid>/mem would have written through the protection)."""
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    addr = libc.mmap(None, 4096, 1, 0x22, -1, 0)        # PROT_READ, MAP_PRIVATE|ANONYMOUS
    err = sysinfo_errno(addr)
    return err, ctypes.string_at(addr, 4096) == b"\0" * 4096


def status_field(name: str) -> str:
    with open("/proc/self/status") as f:
        return next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith(name + ":"))


def threaded(n_threads: int, calls: int) -> list[int]:
    totals: set[int] = set()
    lock = threading.Lock()

    def work() -> None:
        seen = set()
        for _ in range(calls):
            si = Sysinfo()
            seen.add(si.totalram * si.mem_unit if libc.sysinfo(ctypes.byref(si)) == 0 else -1)
        with lock:
            totals.update(seen)

    ts = [threading.Thread(target=work) for _ in range(n_threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sorted(totals)


def main() -> None:
    what = sys.argv[1] if len(sys.argv) > 1 else "all"
    out: dict[str, object] = {}
    if what == "setaffinity":
        told = os.sched_getaffinity(0)
        os.sched_setaffinity(0, told)
        out["told"] = sorted(told)
        out["allowed_after"] = status_field("Cpus_allowed_list")
        out["told_after"] = sorted(os.sched_getaffinity(0))
    elif what == "threads":
        out["totals"] = threaded(16, 200)
    else:
        out["sysinfo"] = sysinfo()
        out["phys_pages"] = os.sysconf("SC_PHYS_PAGES")
        out["avphys_pages"] = os.sysconf("SC_AVPHYS_PAGES")
        out["page_size"] = os.sysconf("SC_PAGE_SIZE")
        out["getloadavg"] = list(os.getloadavg())
        out["cpu_count"] = os.cpu_count()
        out["affinity"] = sorted(os.sched_getaffinity(0))
        out["allowed"] = status_field("Cpus_allowed_list")
        for name in ("meminfo", "loadavg", "uptime"):
            with open(f"/proc/{name}") as f:
                out[name] = f.read()
        run = {"capture_output": True, "text": True, "check": True}
        out["getconf"] = subprocess.run(["getconf", "_PHYS_PAGES"], **run).stdout.strip()
        out["nproc"] = subprocess.run(["nproc"], **run).stdout.strip()
        # A grandchild through two shells: the filter is inherited by the whole tree.
        out["grandchild"] = subprocess.run(["sh", "-c", "sh -c 'getconf _PHYS_PAGES'"],
                                           **run).stdout.strip()
        out["efault_null"] = sysinfo_errno(0)
        out["efault_readonly"] = readonly_page_errno()
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
