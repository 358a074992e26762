"""struct sysinfo and affinity masks from served text, the BPF program, the writability
check: pure pieces, expected values worked out by hand."""

from __future__ import annotations

import struct

import pytest

from guestfs.render.sysinfo import (
    SYSINFO,
    ViewTextError,
    cpu_count_of,
    first_cpus,
    pack_sysinfo,
    parse_view,
    same_cpus,
)
from guestfs.syscalls.filter import (
    ARCHES,
    SECCOMP_RET_ALLOW,
    SECCOMP_RET_USER_NOTIF,
    Interception,
    build_program,
)

MEMINFO = """MemTotal:         524288 kB
MemFree:          400000 kB
MemAvailable:     450000 kB
Buffers:            1000 kB
Cached:            20000 kB
SwapCached:            0 kB
Shmem:               512 kB
SwapTotal:        262144 kB
SwapFree:         262000 kB
"""
LOADAVG = "0.52 1.25 2.00 3/147 9999\n"
UPTIME = "1234.56 2000.00\n"


def test_struct_is_the_kernels_112_bytes():
    # 8 (uptime) + 24 (loads) + 48 (six sizes) + 2 procs + 6 pad + 16 (high) + 4 + 4 pad.
    assert SYSINFO.size == 112


def test_pack_sysinfo_fields_by_hand():
    view = parse_view(MEMINFO, LOADAVG, UPTIME)
    raw = pack_sysinfo(view, elapsed=0.3)
    (uptime, l1, l5, l15, total, free, shared, buffers, tswap, fswap, procs,
     thigh, fhigh, unit) = SYSINFO.unpack(raw)
    assert uptime == 1235                           # ceil(1234.86): the kernel rounds up
    assert (l1, l5, l15) == (34079, 81920, 131072)  # 0.52*65536 = 34078.72 -> 34079
    assert total == 524288 * 1024 == 512 * 1024 * 1024
    assert free == 400000 * 1024
    assert shared == 512 * 1024 and buffers == 1000 * 1024
    assert (tswap, fswap) == (256 * 1024 * 1024, 262000 * 1024)
    assert procs == 147                             # all threads, loadavg's "3/147"
    assert (thigh, fhigh, unit) == (0, 0, 1)
    # procs sits at offset 80 and is followed by 6 zero bytes of padding.
    assert raw[80:82] == struct.pack("=H", 147) and raw[82:88] == b"\0" * 6


def test_procs_is_capped_not_wrapped():
    view = parse_view(MEMINFO, "0 0 0 1/70000 1\n", UPTIME)
    assert SYSINFO.unpack(pack_sysinfo(view))[10] == 65535


@pytest.mark.parametrize("meminfo,loadavg,uptime", [
    ("", LOADAVG, UPTIME),                               # no MemTotal
    (MEMINFO.replace("524288", "0"), LOADAVG, UPTIME),   # MemTotal 0: never served
    (MEMINFO, "0.1 0.2\n", UPTIME),                      # short loadavg
    (MEMINFO, LOADAVG, "x y\n"),
])
def test_bad_text_is_refused(meminfo, loadavg, uptime):
    with pytest.raises(ViewTextError):
        parse_view(meminfo, loadavg, uptime)


def test_cpu_lists():
    assert cpu_count_of("0\n") == 1
    assert cpu_count_of("0-3,6,8-9\n") == 7
    with pytest.raises(ViewTextError):
        cpu_count_of("\n")


def test_first_cpus_keeps_real_numbers():
    # CPUs 2, 3, 5, 9 allowed (bytes 0b00101100, 0b00000010); the first two are 2 and 3.
    mask = bytes([0b00101100, 0b00000010]) + b"\0" * 6
    assert first_cpus(mask, 2) == bytes([0b00001100]) + b"\0" * 7
    assert first_cpus(mask, 4) == mask
    assert first_cpus(mask, 9) == mask


def test_same_cpus_ignores_trailing_zero_bytes():
    assert same_cpus(b"\x03", b"\x03\0\0\0\0\0\0\0")
    assert not same_cpus(b"\x03", b"\x01\0\0\0")


def _run_bpf(prog, nr, arch, arg0=0):
    """A classic-BPF interpreter for the three instruction kinds the filter uses."""
    data = struct.pack("=iIQ6Q", nr, arch, 0, arg0, 0, 0, 0, 0, 0)
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = prog[pc]
        if code == 0x20:
            acc = struct.unpack_from("=I", data, k)[0]
            pc += 1
        elif code == 0x15:
            pc += 1 + (jt if acc == k else jf)
        elif code == 0x06:
            return k
        else:
            raise AssertionError(f"unexpected BPF code {code:#x}")


@pytest.mark.parametrize("arch", sorted(ARCHES))
def test_filter_notifies_only_what_it_should(arch):
    a = ARCHES[arch]
    prog = build_program(a, Interception())
    notify, allow = SECCOMP_RET_USER_NOTIF, SECCOMP_RET_ALLOW
    assert _run_bpf(prog, a.sysinfo, a.audit_arch) == notify
    assert _run_bpf(prog, a.sched_getaffinity, a.audit_arch, arg0=0) == notify
    assert _run_bpf(prog, a.sched_setaffinity, a.audit_arch, arg0=0) == notify
    # Another pid's mask, another syscall, another ABI: the kernel answers.
    assert _run_bpf(prog, a.sched_getaffinity, a.audit_arch, arg0=1234) == allow
    assert _run_bpf(prog, a.sysinfo + 1, a.audit_arch) == allow
    assert _run_bpf(prog, a.sysinfo, 0x40000003) == allow            # AUDIT_ARCH_I386
    # pid_t is 32 bits: garbage in the upper half of the register is still pid 0.
    assert _run_bpf(prog, a.sched_getaffinity, a.audit_arch, arg0=0xFFFF_FFFF_0000_0000) \
        == notify


def test_filter_without_affinity_lets_affinity_through():
    a = ARCHES["x86_64"]
    prog = build_program(a, Interception(getaffinity=False, setaffinity=False))
    assert _run_bpf(prog, a.sched_getaffinity, a.audit_arch) == SECCOMP_RET_ALLOW
    assert _run_bpf(prog, a.sysinfo, a.audit_arch) == SECCOMP_RET_USER_NOTIF


@pytest.fixture
def two_pages():
    """Two adjacent pages of this process: the first writable, the second read-only."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    addr = libc.mmap(None, 8192, 3, 0x22, -1, 0)      # RW, MAP_PRIVATE|MAP_ANONYMOUS
    assert libc.mprotect(addr + 4096, 4096, 1) == 0   # the second: PROT_READ
    yield addr
    libc.munmap(addr, 8192)


@pytest.mark.parametrize("offset,size,ok,landed", [
    (0, 112, True, 112),           # inside the writable page
    (4096 - 56, 112, False, 56),   # into the read-only page: the part before it, EFAULT
    (4096, 112, False, 0),         # the read-only page
])
def test_caller_memory_writes_only_where_the_caller_may(monkeypatch, two_pages, offset,
                                                        size, ok, landed):
    """process_vm_writev on this very process: what copy_to_user would do, no maps read."""
    import ctypes
    import os

    from guestfs.syscalls import notify as sn

    monkeypatch.setattr(sn, "still_valid", lambda listener, nid: True)
    note = sn.Notification(1, os.getpid(), 99, 0, (0,) * 6)
    assert sn.CallerMemory(-1, note).write(two_pages + offset, b"\xab" * size) is ok
    seen = ctypes.string_at(two_pages + offset, size)
    assert seen == b"\xab" * landed + bytes(size - landed)
    assert sn.CallerMemory(-1, note).write(8, b"x") is False        # never mapped
    if ok:
        assert sn.CallerMemory(-1, note).read(two_pages + offset, 4) == b"\xab" * 4
