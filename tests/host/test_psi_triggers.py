"""PSI triggers on a real per-caller mount served by guestfs's engine, beside the kernel's
own /proc/pressure files as the reference: LXCFS's upstream trigger test (write "some
20000 2000000", then poll for POLLPRI) under CPU hogs, the kernel's answers to bad and
repeated triggers, a closed file's trigger gone, and the bound on open trigger files.

This host is cgroup v1, so the served pressure files (and their triggers) are the
host's /proc/pressure ones; the cgroup v2 path (a trigger on the reader's own
<resource>.pressure) is tested in the cgroup v2 VM (tests/external/vm/guest_v2.py)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.support.fusemount import mounted, private_mountpoint

pytestmark = pytest.mark.real
TRIGGER = b"some 20000 2000000\0"       # LXCFS's tests/test_psi_poll.c, NUL included
KERNEL_CPU = "/proc/pressure/cpu"


@pytest.fixture(scope="module")
def mp() -> Iterator[str]:
    if not os.path.exists(KERNEL_CPU):
        with open("/proc/cmdline") as f:
            assert "psi=0" in f.read() or not os.path.isdir("/proc/pressure"), \
                "no /proc/pressure/cpu, yet PSI is not turned off"
        pytest.skip("this kernel has PSI turned off (no /proc/pressure)")
    with private_mountpoint() as where, \
            mounted(str(where), "--fuse-binding", "guestfs", log=str(where) + ".log"):
        yield str(where)


def daemon_log(mp: str) -> str:
    with open(mp + ".log", errors="replace") as f:
        return f.read()


@contextlib.contextmanager
def cpu_hogs(n: int = 4) -> Iterator[None]:
    """More runnable tasks than CPUs: some tasks always wait, so "some" CPU pressure
    passes 20 ms in every 2 s window."""
    procs = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def status(mp: str) -> dict:
    with open(f"{mp}/.guestfs-status") as f:
        return json.load(f)


def open_trigger(path: str) -> int:
    return os.open(path, os.O_RDWR | os.O_NONBLOCK)


def test_the_upstream_trigger_test_passes_on_the_served_file_as_on_the_kernels(mp):
    """Both files polled together for 7 s of hogging: each event on the served file is a
    POLLPRI alone, as on the kernel's, and the two count the same events within one
    (PSI rate-limits a trigger to one event per window, 2 s here)."""
    served, kernel = open_trigger(f"{mp}/proc/pressure/cpu"), open_trigger(KERNEL_CPU)
    try:
        assert os.write(served, TRIGGER) == len(TRIGGER)
        assert os.write(kernel, TRIGGER) == len(TRIGGER)
        p = select.poll()
        p.register(served, select.POLLPRI)
        p.register(kernel, select.POLLPRI)
        counts = {served: 0, kernel: 0}
        with cpu_hogs():
            end = time.monotonic() + 7
            while (left := end - time.monotonic()) > 0:
                for fd, ev in p.poll(left * 1000):
                    assert ev == select.POLLPRI, hex(ev)   # no POLLERR: a live trigger
                    counts[fd] += 1
        print(f"events in 7 s: served {counts[served]}, kernel {counts[kernel]}")
        assert counts[served] >= 2 and abs(counts[served] - counts[kernel]) <= 1
        assert status(mp)["psi_triggers"]["fired"] >= counts[served]
    finally:
        os.close(served)
        os.close(kernel)


def _answers(path: str) -> list[int]:
    """errno (0: taken) of: a malformed trigger, a good one, a second one on the same file."""
    fd = open_trigger(path)
    out = []
    try:
        for data in (b"bogus 1 2\0", TRIGGER, TRIGGER):
            try:
                os.write(fd, data)
                out.append(0)
            except OSError as e:
                out.append(e.errno)
    finally:
        os.close(fd)
    return out


def test_bad_and_second_triggers_are_refused_as_the_kernel_refuses_them(mp):
    assert _answers(f"{mp}/proc/pressure/memory") == _answers("/proc/pressure/memory") \
        == [errno.EINVAL, 0, errno.EBUSY]


def test_a_polled_file_without_a_trigger_reports_what_the_kernels_does(mp):
    for path in (f"{mp}/proc/pressure/io", "/proc/pressure/io"):
        fd = os.open(path, os.O_RDONLY)
        try:
            p = select.poll()
            p.register(fd, select.POLLPRI)
            (got,) = p.poll(0)
            assert got[1] == select.POLLERR | select.POLLPRI, (path, hex(got[1]))
        finally:
            os.close(fd)


def test_closing_the_file_destroys_its_trigger_and_frees_its_slot(mp):
    before = status(mp)["psi_triggers"]
    fd = open_trigger(f"{mp}/proc/pressure/cpu")
    os.write(fd, TRIGGER)
    os.close(fd)
    deadline = time.monotonic() + 5    # RELEASE is asynchronous
    while status(mp)["psi_triggers"]["released"] == before["released"]:
        assert time.monotonic() < deadline, "no RELEASE reached the daemon"
        time.sleep(0.02)
    after = status(mp)["psi_triggers"]
    assert after["opened"] - before["opened"] == 1
    assert after["released"] - before["released"] == 1


def test_one_reader_cannot_hold_more_than_its_share_of_trigger_files(mp):
    """The daemon would hold a kernel trigger for each: bounded per view (32), EMFILE
    past it, and the share is given back as files close."""
    fds: list[int] = []
    try:
        for _ in range(32):
            fds.append(open_trigger(f"{mp}/proc/pressure/cpu"))
        with pytest.raises(OSError) as e:
            fds.append(open_trigger(f"{mp}/proc/pressure/cpu"))
        assert e.value.errno == errno.EMFILE
    finally:
        for fd in fds:
            os.close(fd)
    deadline = time.monotonic() + 5
    while True:
        try:
            os.close(open_trigger(f"{mp}/proc/pressure/cpu"))
            break
        except OSError as e:
            assert e.errno == errno.EMFILE and time.monotonic() < deadline
            time.sleep(0.05)


def test_only_the_pressure_files_take_writes(mp):
    """The mount is writable for the triggers' sake; nothing else is."""
    with open("/proc/self/mountinfo") as f:
        opts = next(ln.split()[5] for ln in f if ln.split()[4] == mp)
    assert opts.split(",")[0] == "rw"
    for path, flags in ((f"{mp}/proc/meminfo", os.O_RDWR),
                        (f"{mp}/proc/pressure/cpu", os.O_WRONLY | os.O_TRUNC),
                        (f"{mp}/proc/new", os.O_WRONLY | os.O_CREAT)):
        with pytest.raises(OSError) as e:
            os.close(os.open(path, flags, 0o644))
        assert e.value.errno == errno.EROFS, path
    with pytest.raises(OSError) as e:
        os.mkdir(f"{mp}/proc/dir")
    assert e.value.errno == errno.EROFS


def test_the_libfuse_binding_keeps_the_mount_read_only():
    """mfusepy answers no POLL: a trigger it took could never fire, so it takes none."""
    with private_mountpoint() as where, mounted(str(where), "--fuse-binding", "mfusepy3"):
        with pytest.raises(OSError) as e:
            open_trigger(f"{where}/proc/pressure/cpu")
        assert e.value.errno == errno.EROFS


@pytest.mark.parametrize("view, bound", [("caller", True), ("self", False)])
def test_attach_binds_the_pressure_files_where_they_take_triggers(tmp_path, view, bound):
    """A per-caller engine mount's pressure files are bound with the rest, and a trigger
    written in the app's namespace is taken; a page-cached (fixed) mount's are not, and
    the app keeps the kernel's (whose triggers work)."""
    import sys
    mp = str(tmp_path / "mnt")
    app = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sleep", "60"])
    try:
        with mounted(mp, "--fuse-binding", "guestfs", "--view", view):
            out = subprocess.run([sys.executable, "-m", "guestfs", "attach", "--pid",
                                  str(app.pid), "--source", mp], capture_output=True,
                                 text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            assert f"bound {13 if bound else 10}," in out.stdout + out.stderr, out
            probe = ("import os; fd = os.open('/proc/pressure/cpu', os.O_RDWR); "
                     "print(os.write(fd, b'some 20000 2000000\\n'))")
            got = subprocess.run(["nsenter", "-t", str(app.pid), "-m", sys.executable, "-c",
                                  probe], capture_output=True, text=True, timeout=30)
            assert got.stdout.strip() == "19", got.stderr
            fstype = subprocess.run(["nsenter", "-t", str(app.pid), "-m", "stat", "-f",
                                     "-c", "%T", "/proc/pressure/cpu"], capture_output=True,
                                    text=True, timeout=30).stdout.strip()
            assert (fstype == "fuseblk" or "fuse" in fstype) is bound, fstype
            if bound:
                assert status(mp)["psi_triggers"]["armed"] >= 1
    finally:
        app.kill()
        app.wait()


def test_hostile_writes_get_the_kernels_answer_and_the_daemon_serves_on(mp):
    """Garbage, a write far past max_write (the kernel cuts it into WRITEs of at most
    max_write), a lone NUL, binary junk: each is the kernel's EINVAL (or EBUSY once a
    trigger is set), never a dead or swollen daemon."""
    cases = [b"\xff" * 65536, b"\0", b"some -1 -1\n", b"full 1 99999999999999999999\n",
             os.urandom(300), b"some 20000 2000000\n" + b"x" * 10000]
    for data in cases:
        fd = open_trigger(f"{mp}/proc/pressure/memory")
        try:
            with contextlib.suppress(OSError):
                os.write(fd, data)
        finally:
            os.close(fd)
    with open(f"{mp}/proc/meminfo") as f:
        assert f.readline().startswith("MemTotal:")
    assert status(mp)["fallback_total"] == 0
    log = daemon_log(mp)
    assert "Traceback" not in log and "answering EIO" not in log, log
