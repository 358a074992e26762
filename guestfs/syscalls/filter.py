"""A seccomp filter that hands sysinfo(2) and sched_{get,set}affinity(2) to a supervisor
(SECCOMP_RET_USER_NOTIF), and the listener fd that receives them.

Raw classic BPF through the seccomp(2) syscall, as libseccomp would emit it: Python has
no seccomp binding in its standard library, and the filter is a dozen instructions.

Installed without NoNewPrivs: seccomp(2) allows that to a caller holding CAP_SYS_ADMIN in
its user namespace, which `guestfs run`'s child still has before it drops it. Forcing
NoNewPrivs on the app would break its setuid helpers (su, sudo, ping).
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass

from guestfs.system import libc

# linux/seccomp.h
SECCOMP_SET_MODE_FILTER = 1
SECCOMP_FILTER_FLAG_NEW_LISTENER = 1 << 3
SECCOMP_RET_USER_NOTIF = 0x7FC00000
SECCOMP_RET_ALLOW = 0x7FFF0000

# linux/bpf_common.h
_BPF_LD_W_ABS = 0x00 | 0x00 | 0x20       # BPF_LD | BPF_W | BPF_ABS
_BPF_JEQ_K = 0x05 | 0x10 | 0x00          # BPF_JMP | BPF_JEQ | BPF_K
_BPF_RET_K = 0x06 | 0x00                 # BPF_RET | BPF_K

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6].
# pid_t is an int: the kernel reads only the low word of args[0] (little-endian here).
_OFF_NR, _OFF_ARCH, _OFF_ARG0_LOW = 0, 4, 16


@dataclass(frozen=True)
class Arch:
    """One architecture's numbers. Only little-endian 64-bit ones are listed: struct
    sysinfo's layout and the argument offset above assume them."""
    audit_arch: int
    seccomp: int
    sysinfo: int
    sched_setaffinity: int
    sched_getaffinity: int


# asm/unistd_64.h (x86-64) and asm-generic/unistd.h (arm64); AUDIT_ARCH_* from audit.h.
ARCHES = {
    "x86_64": Arch(0xC000003E, seccomp=317, sysinfo=99, sched_setaffinity=203,
                   sched_getaffinity=204),
    "aarch64": Arch(0xC00000B7, seccomp=277, sysinfo=179, sched_setaffinity=122,
                    sched_getaffinity=123),
}


class SeccompUnavailable(OSError):
    """Why no filter was installed; the app then runs with the kernel's answers."""


def this_arch() -> Arch | None:
    return ARCHES.get(os.uname().machine)   # platform.machine(), without platform


@dataclass(frozen=True)
class Interception:
    """Which calls the supervisor answers. Affinity calls are notified only for pid 0 (the
    caller itself: what nproc, os.sched_getaffinity(0), the JVM, Go and libuv ask);
    another pid's mask passes to the kernel without a round trip."""
    sysinfo: bool = True
    getaffinity: bool = True
    setaffinity: bool = True

    @property
    def any(self) -> bool:
        return self.sysinfo or self.getaffinity or self.setaffinity

    def spelled(self) -> str:
        """As one command-line word ("sysinfo,getaffinity"; "-" for none): parse() reads it."""
        return ",".join(n for n in _CALLS if getattr(self, n)) or "-"

    @classmethod
    def parse(cls, word: str) -> Interception:
        names = set(word.split(",")) - {"-"}
        if not names <= set(_CALLS):
            raise ValueError(f"not calls guestfs answers: {word!r}")
        return cls(**{n: n in names for n in _CALLS})


_CALLS = ("sysinfo", "getaffinity", "setaffinity")


def build_program(arch: Arch, what: Interception) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k) instructions. A call from another architecture on
    the same kernel (an i386 binary on x86-64) and every other syscall are allowed; x32
    calls carry bit 30 in their number and so never match."""
    notify_any: list[int] = []     # numbers notified whatever their arguments
    notify_self: list[int] = []    # numbers notified when (pid_t)args[0] == 0
    if what.sysinfo:
        notify_any.append(arch.sysinfo)
    if what.getaffinity:
        notify_self.append(arch.sched_getaffinity)
    if what.setaffinity:
        notify_self.append(arch.sched_setaffinity)
    # Symbolic jump targets, resolved below to the kernel's relative offsets.
    prog: list[tuple[int, object, object, int]] = [
        (_BPF_LD_W_ABS, 0, 0, _OFF_ARCH),
        (_BPF_JEQ_K, "next", "allow", arch.audit_arch),
        (_BPF_LD_W_ABS, 0, 0, _OFF_NR),
    ]
    prog += [(_BPF_JEQ_K, "notify", "next", nr) for nr in notify_any]
    prog += [(_BPF_JEQ_K, "self", "next", nr) for nr in notify_self]
    prog.append((_BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW))
    labels = {"self": len(prog)}
    prog += [(_BPF_LD_W_ABS, 0, 0, _OFF_ARG0_LOW), (_BPF_JEQ_K, "notify", "allow", 0)]
    labels["notify"] = len(prog)
    prog.append((_BPF_RET_K, 0, 0, SECCOMP_RET_USER_NOTIF))
    labels["allow"] = len(prog)
    prog.append((_BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW))

    def offset(i: int, target: object) -> int:
        if target == "next":
            return 0
        if isinstance(target, str):
            return labels[target] - (i + 1)
        return int(target)   # type: ignore[call-overload]

    return [(code, offset(i, jt), offset(i, jf), k) for i, (code, jt, jf, k) in enumerate(prog)]


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_SockFilter))]


# The C library this interpreter is linked with (dlopen(NULL)), not find_library("c"):
# that runs `ldconfig -p` in a child process on every call, at every start.


def install_listener(what: Interception) -> int:
    """Install the filter on the calling thread (inherited across fork and exec) and return
    the listener fd (close-on-exec). Call it in a single-threaded process right before
    exec: the filter binds only this thread."""
    arch = this_arch()
    if arch is None:
        raise SeccompUnavailable(0, f"no seccomp numbers for {os.uname().machine}")
    if not what.any:
        raise SeccompUnavailable(0, "nothing to intercept")
    insns = build_program(arch, what)
    array = (_SockFilter * len(insns))(*[_SockFilter(*i) for i in insns])
    prog = _SockFprog(len(insns), array)
    fd = libc.syscall(ctypes.c_long(arch.seccomp), ctypes.c_long(SECCOMP_SET_MODE_FILTER),
                       ctypes.c_long(SECCOMP_FILTER_FLAG_NEW_LISTENER), ctypes.byref(prog))
    if fd < 0:
        e = ctypes.get_errno()
        why = os.strerror(e)
        if e == 13:   # EACCES: neither CAP_SYS_ADMIN nor NoNewPrivs
            why += " (installing a filter without NoNewPrivs needs CAP_SYS_ADMIN)"
        raise SeccompUnavailable(e, f"seccomp(SECCOMP_SET_MODE_FILTER): {why}")
    os.set_inheritable(fd, False)
    return int(fd)
