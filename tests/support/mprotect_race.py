"""The app side of the mprotect race: one thread calls sysinfo(2) into a page while the
main thread flips that page between read-only and writable. Standalone (no guestfs
import): a test installs the seccomp filter before exec'ing it. Prints one JSON object.

    python mprotect_race.py race CALLS
        Call k writes slot k % 36 of the page (struct sysinfo is 112 bytes), so a write
        seen while the page is read-only tells which call made it. "landed_ro": writes by
        calls begun after the page became read-only (the kernel: never). "landed_inflight":
        writes seen after the flip by the one call that was under way when it happened,
        whose permission was checked before it (process_vm_writev pins the pages under
        the mmap lock and copies right after dropping it). "landed_rw": cycles skipped
        because a write came while still writable.
    python mprotect_race.py once CMD_FD ACK_FD
        One call, announced by "S" on ACK_FD; the page is made read-only when a byte
        arrives on CMD_FD (sent by the supervisor right before its copy), acknowledged
        by "A" on ACK_FD.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import threading

libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long]
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.sysinfo.argtypes = [ctypes.c_void_p]
PAGE = 4096
PROT_READ, PROT_WRITE = 1, 2
MAP_PRIVATE, MAP_ANONYMOUS = 0x02, 0x20
SIZE = 112                       # struct sysinfo on 64-bit Linux
SLOTS = PAGE // SIZE
ZERO = bytes(PAGE)


def page() -> int:
    return libc.mmap(None, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)


def call(addr: int) -> int:
    return 0 if libc.sysinfo(addr) == 0 else ctypes.get_errno()


def race(calls: int) -> dict[str, int]:
    addr = page()
    out = {"ok": 0, "efault": 0, "other": 0, "landed_ro": 0, "landed_inflight": 0,
           "landed_rw": 0, "cycles": 0}
    nxt = [0]                       # the number the next call takes, set before it starts
    done = threading.Event()

    def caller() -> None:
        for n in range(calls):
            nxt[0] = n + 1
            e = call(addr + n % SLOTS * SIZE)
            out["ok" if e == 0 else "efault" if e == 14 else "other"] += 1
        done.set()

    t = threading.Thread(target=caller)
    t.start()
    while not done.is_set():
        out["cycles"] += 1
        libc.mprotect(addr, PAGE, PROT_READ | PROT_WRITE)
        ctypes.memset(addr, 0, PAGE)
        libc.mprotect(addr, PAGE, PROT_READ)
        begun = nxt[0]              # calls numbered >= begun start after the flip
        at_ro = ctypes.string_at(addr, PAGE)
        for _ in range(20):
            pass
        at_end = ctypes.string_at(addr, PAGE)
        if at_ro != ZERO or nxt[0] - begun >= SLOTS - 1:
            out["landed_rw"] += at_ro != ZERO
            continue
        for s in range(SLOTS):
            if at_end[s * SIZE:(s + 1) * SIZE] != ZERO[:SIZE]:
                inflight = begun > 0 and s == (begun - 1) % SLOTS
                out["landed_inflight" if inflight else "landed_ro"] += 1
    t.join()
    return out


def once(cmd: int, ack: int) -> dict[str, object]:
    addr = page()
    ctypes.memset(addr, 0, PAGE)
    result: list[int] = []
    os.write(ack, b"S")             # the calls of the interpreter's start are over
    t = threading.Thread(target=lambda: result.append(call(addr)))
    t.start()
    flipped = os.read(cmd, 1) == b"R"
    if flipped:
        libc.mprotect(addr, PAGE, PROT_READ)
        os.write(ack, b"A")
    t.join()
    return {"errno": result[0], "flipped": flipped,
            "landed_ro": flipped and ctypes.string_at(addr, PAGE) != ZERO}


if __name__ == "__main__":
    if sys.argv[1] == "race":
        print(json.dumps(race(int(sys.argv[2]))))
    else:
        print(json.dumps(once(int(sys.argv[2]), int(sys.argv[3]))))
