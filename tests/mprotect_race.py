"""The app side of the mprotect race: one thread calls sysinfo(2) into a page while the
main thread flips that page between read-only and writable. Prints, as one JSON object,
how many struct sysinfo writes landed while the page was read-only (the kernel's own
copy_to_user: never) and while it was writable, and what the calls returned. Standalone
(no guestfs import): a test installs the seccomp filter before exec'ing it.

    python mprotect_race.py CALLS
"""

from __future__ import annotations

import ctypes
import json
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
ZERO = bytes(SIZE)


def main() -> int:
    calls = int(sys.argv[1])
    addr = libc.mmap(None, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
    out = {"ok": 0, "efault": 0, "other": 0, "landed_ro": 0, "landed_rw": 0, "cycles": 0}
    done = threading.Event()

    def caller() -> None:
        for _ in range(calls):
            if libc.sysinfo(addr) == 0:
                out["ok"] += 1
            elif ctypes.get_errno() == 14:
                out["efault"] += 1
            else:
                out["other"] += 1
        done.set()

    t = threading.Thread(target=caller)
    t.start()
    while not done.is_set():
        out["cycles"] += 1
        libc.mprotect(addr, PAGE, PROT_READ | PROT_WRITE)
        ctypes.memset(addr, 0, SIZE)
        libc.mprotect(addr, PAGE, PROT_READ)
        # Zero when it became read-only: anything else there now was written since,
        # while it was read-only.
        at_ro = ctypes.string_at(addr, SIZE)
        for _ in range(20):
            pass
        at_end = ctypes.string_at(addr, SIZE)
        if at_ro != ZERO:
            out["landed_rw"] += 1
        elif at_end != ZERO:
            out["landed_ro"] += 1
    t.join()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
