"""sysinfo(2) answered through seccomp user notification into a page the app keeps
flipping between read-only and writable (tests/mprotect_race.py): the supervisor's copy
must honour the page's protection at the moment of the copy, as the kernel's own
copy_to_user does, so no answer lands while the page is read-only, and where it is
read-only the caller gets EFAULT, as from the kernel."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from guestfs.commands.syscall_view import VIEW_FILES, ServedView, make_handlers, texts_under
from guestfs.system.seccomp_filter import Interception, install_listener, this_arch
from guestfs.system.seccomp_notify import NotificationLoop

pytestmark = pytest.mark.real
RACE = str(Path(__file__).with_name("mprotect_race.py"))
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
    """tests/mprotect_race.py's counts, its sysinfo answered by NotificationLoop from
    ``view_root`` (None: by the kernel, no filter), each answer counted in ``answers``."""
    if view_root is None:
        out = subprocess.run([sys.executable, RACE, str(CALLS)], capture_output=True,
                             text=True, timeout=300, check=True)
        return json.loads(out.stdout)
    ours, theirs = socket.socketpair()

    def filtered() -> None:   # in the child, before exec: the filter, then its listener
        listener = install_listener(SYSINFO)
        socket.send_fds(theirs, [b"L"], [listener])

    loop = None
    proc = subprocess.Popen([sys.executable, RACE, str(CALLS)], stdout=subprocess.PIPE,
                            text=True, preexec_fn=filtered)
    try:
        theirs.close()
        _msg, fds, _flags, _addr = socket.recv_fds(ours, 16, 1)
        assert len(fds) == 1, "no listener from the child"
        view = ServedView(texts_under(view_root))
        handlers = counted(make_handlers(this_arch(), view, SYSINFO), answers)
        loop = NotificationLoop(fds[0], handlers).start()
        stdout, _ = proc.communicate(timeout=300)
    finally:
        ours.close()
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if loop is not None:
            loop.stop()
            os.close(loop.listener)
    return json.loads(stdout)


def test_no_answer_lands_in_a_page_while_it_is_read_only(tmp_path):
    if os.geteuid() != 0 or this_arch() is None:
        pytest.skip("installing a filter without NoNewPrivs needs CAP_SYS_ADMIN")
    kernel = race(None)
    assert kernel["landed_ro"] == 0 and kernel["other"] == 0, kernel
    answers: dict[str, int] = {}
    served = race(fixture_view(tmp_path), answers)
    assert served["other"] == 0, served
    # None written while the page was read-only, the kernel's own count ...
    assert served["landed_ro"] == 0, (served, answers)
    # ... and the race was run, every call answered by us: written while the page was writable,
    # EFAULT while it was read-only (none passed back to the kernel).
    assert answers.get("continued", 0) == 0, answers
    # (the interpreter asks sysinfo once or so at start, before the race)
    assert answers.get("written", 0) >= served["ok"] > 0, (answers, served)
    assert answers.get("efault", 0) == served["efault"] > 0, (answers, served)
