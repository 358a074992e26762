"""sysinfo(2) answered through seccomp user notification into a page the app keeps
flipping between read-only and writable (tests/support/mprotect_race.py): the supervisor's copy
must honour the page's protection at the moment of the copy, as the kernel's own
copy_to_user does, so no answer lands while the page is read-only, and where it is
read-only the caller gets EFAULT, as from the kernel."""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from guestfs.syscalls.answers import VIEW_FILES, ServedView, make_handlers, texts_under
from guestfs.syscalls.filter import Interception, install_listener, this_arch
from guestfs.syscalls.notify import ListenerLoop, Served
from tests.support.paths import SUPPORT

pytestmark = pytest.mark.real
RACE = str(SUPPORT / "mprotect_race.py")
CALLS = 100000
SYSINFO = Interception(sysinfo=True)


def fixture_view(top: Path) -> str:
    """The four files a sysinfo answer is built from (a 512 MiB, 1-CPU view)."""
    for path in VIEW_FILES:
        (top / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
    (top / "proc/meminfo").write_text(
        "MemTotal: 524288 kB\nMemFree: 262144 kB\nMemAvailable: 300000 kB\n"
        "Buffers: 0 kB\nShmem: 0 kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\n")
    (top / "proc/loadavg").write_text("0.50 0.25 0.10 1/100 4242\n")
    (top / "proc/uptime").write_text("1000.00 1500.00\n")
    (top / "sys/devices/system/cpu/online").write_text("0\n")
    return str(top)


def counted(handlers: dict, answers: dict[str, int]) -> dict:
    """``handlers``, each answer counted: "written", "efault" or "continued"."""
    def wrap(handler):
        def answer(note, mem):
            a = handler(note, mem)
            kind = "continued" if a.cont else "efault" if a.error else "written"
            answers[kind] = answers.get(kind, 0) + 1
            return a
        return answer
    return {nr: wrap(h) for nr, h in handlers.items()}


def race(view_root: str | None, answers: dict[str, int] | None = None) -> dict:
    """tests/support/mprotect_race.py's counts, its sysinfo answered by a ListenerLoop from
    ``view_root`` (None: by the kernel, no filter), each answer counted in ``answers``."""
    return app([sys.executable, RACE, "race", str(CALLS)], view_root, answers)


def app(argv: list[str], view_root: str | None, answers: dict[str, int] | None = None,
        pass_fds: tuple[int, ...] = (), handlers_of=lambda h: h) -> dict:
    """The JSON ``argv`` prints, its sysinfo calls answered as race() says (through
    ``handlers_of`` the handlers)."""
    if view_root is None:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=True)
        return json.loads(out.stdout)
    ours, theirs = socket.socketpair()

    def filtered() -> None:   # in the child, before exec: the filter, then its listener
        listener = install_listener(SYSINFO)
        socket.send_fds(theirs, [b"L"], [listener])

    loop = None
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, preexec_fn=filtered,
                            pass_fds=pass_fds)
    try:
        theirs.close()
        _msg, fds, _flags, _addr = socket.recv_fds(ours, 16, 1)
        assert len(fds) == 1, "no listener from the child"
        view = ServedView(texts_under(view_root))
        handlers = handlers_of(counted(make_handlers(this_arch(), view, SYSINFO),
                                       {} if answers is None else answers))
        listener = fds[0]
        loop = ListenerLoop().start()
        loop.add(Served(listener, handlers, on_gone=lambda _s: None))
        stdout, _ = proc.communicate(timeout=300)
    finally:
        ours.close()
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if loop is not None:
            loop.stop()
            os.close(listener)
    return json.loads(stdout)


def test_no_answer_lands_in_a_page_while_it_is_read_only(tmp_path):
    if os.geteuid() != 0 or this_arch() is None:
        pytest.skip("installing a filter without NoNewPrivs needs CAP_SYS_ADMIN")
    kernel = race(None)
    assert kernel["landed_ro"] == kernel["landed_inflight"] == kernel["other"] == 0, kernel
    answers: dict[str, int] = {}
    served = race(fixture_view(tmp_path), answers)
    assert served["other"] == 0, served
    # No call begun while the page was read-only wrote it, the kernel's count (a call
    # under way at the flip may land just after it: mprotect_race.py's docstring) ...
    assert served["landed_ro"] == 0, (served, answers)
    # ... and the race was run, every call answered by us: written while the page was
    # writable, EFAULT while it was read-only (none passed back to the kernel).
    assert answers.get("continued", 0) == 0, answers
    # (the interpreter asks sysinfo once or so at start, before the race)
    assert answers.get("written", 0) >= served["ok"] > 0, (answers, served)
    assert answers.get("efault", 0) == served["efault"] > 0, (answers, served)


COPIES = ("pwrite", "process_vm_writev")     # the primitives a supervisor writes with


def test_a_page_made_read_only_right_before_the_copy_is_not_written(tmp_path,
                                                                   monkeypatch):
    """The check-then-write window, made deterministic: the app makes its page read-only
    at the last moment before the supervisor's write primitive runs (whatever checks came
    before it). The write must fail and the caller get EFAULT, as if the kernel had
    copied at that moment."""
    if os.geteuid() != 0 or this_arch() is None:
        pytest.skip("installing a filter without NoNewPrivs needs CAP_SYS_ADMIN")
    cmd_r, cmd_w = os.pipe()
    ack_r, ack_w = os.pipe()
    from guestfs.syscalls import notify as sn

    started = []

    def flip_first(real):
        def copy(*args):
            if started:
                with contextlib.suppress(OSError):
                    os.write(cmd_w, b"R")
                    os.read(ack_r, 1)       # "A": the page is read-only now
            return real(*args)
        return copy

    monkeypatch.setattr(sn.libc, "process_vm_writev", flip_first(sn.libc.process_vm_writev))
    monkeypatch.setattr(sn.os, "pwrite", flip_first(os.pwrite))

    def closing_after(handlers):
        def wrap(h):
            def answer(note, mem):
                # Not the interpreter's own calls at start: only once the app said "S".
                if not started and select.select([ack_r], [], [], 0)[0]:
                    started.append(os.read(ack_r, 1) == b"S")
                if not started:
                    return h(note, mem)
                try:
                    return h(note, mem)
                finally:
                    with contextlib.suppress(OSError):
                        os.close(cmd_w)     # no copy made: the app stops waiting
            return answer
        return {nr: wrap(h) for nr, h in handlers.items()}

    answers: dict[str, int] = {}
    try:
        out = app([sys.executable, RACE, "once", str(cmd_r), str(ack_w)],
                  fixture_view(tmp_path), answers, (cmd_r, ack_w), closing_after)
    finally:
        for fd in (cmd_r, ack_r, ack_w):
            os.close(fd)
        with contextlib.suppress(OSError):
            os.close(cmd_w)
    assert out == {"errno": 14, "flipped": True, "landed_ro": False}, (out, answers)
    assert answers.get("efault") == 1 and "continued" not in answers, answers


# sysinfo(2) into a NULL pointer, an unmapped address, a read-only page, a page that
# is writable only from its second half, and a kernel address: the errno of each.
BAD_POINTERS = r"""
import ctypes, json, mmap
libc = ctypes.CDLL(None, use_errno=True)
libc.sysinfo.argtypes = [ctypes.c_void_p]
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long]
ro = libc.mmap(None, 8192, 1, 0x22, -1, 0)          # PROT_READ, MAP_PRIVATE|ANONYMOUS
def call(addr):
    return 0 if libc.sysinfo(addr) == 0 else ctypes.get_errno()
print(json.dumps({"null": call(None), "unmapped": call(8), "read-only": call(ro),
                  "kernel": call(0xFFFF800000000000),
                  "straddling": call(ro + 4096 - 56)}))
"""


def test_a_pointer_the_caller_may_not_write_gets_efault_as_from_the_kernel(tmp_path):
    if os.geteuid() != 0 or this_arch() is None:
        pytest.skip("installing a filter without NoNewPrivs needs CAP_SYS_ADMIN")
    argv = [sys.executable, "-c", BAD_POINTERS]
    kernel = app(argv, None)
    assert set(kernel.values()) == {14}, kernel          # EFAULT everywhere
    answers: dict[str, int] = {}
    assert app(argv, fixture_view(tmp_path), answers) == kernel
    assert answers.get("efault", 0) == len(kernel) and "continued" not in answers, answers
