"""Faults of the daemon under the sidecar (`attach --watch`) and the DaemonSet (binds made
once from a shared mount): kill -9 and SIGSTOP/SIGCONT, asserting what the app's readers
see and that they recover. Recovery times are measured by polling and printed (run with
-s to see them); they are not asserted, since the machine is shared."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from guestfs.wrap.run import stop_process
from tests.host.test_attach_safety import app_namespace, run_attach
from tests.support.fusemount import mounted, wait_for

pytestmark = pytest.mark.real
KB_512M, KB_256M = 512 * 1024, 256 * 1024
ENOTCONN_TEXT = "Transport endpoint is not connected"


def first_line(app: int, timeout: float = 30) -> str:
    """What a reader in the app's namespace gets from /proc/meminfo: 'kB N' or the
    error text."""
    out = subprocess.run(["nsenter", "-t", str(app), "-m", "head", "-1", "/proc/meminfo"],
                         capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        return "error: " + out.stderr.strip()
    return "kB " + out.stdout.split()[1]


def time_until(pred, limit: float = 30.0) -> float | None:
    start = time.monotonic()
    return time.monotonic() - start if wait_for(pred, limit) else None


@contextlib.contextmanager
def watcher(app: int, mp: str, log: str, interval: str = "2"
            ) -> Iterator[subprocess.Popen[bytes]]:
    """The sidecar's `attach --watch` (the default interval unless told), logging to
    ``log``."""
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "guestfs", "attach", "--watch",
                                 "--pid", str(app), "--source", mp, "--interval", interval],
                                stderr=err)
    try:
        yield proc
    finally:
        stop_process(proc)


def report(what: str, **numbers: float | str | None) -> None:
    print(f"\n[fault] {what}: " + ", ".join(f"{k}={v}" for k, v in numbers.items()))


def test_sidecar_kill_9_readers_see_enotconn_then_heal_after_restart(tmp_path):
    mp = str(tmp_path / "mnt")
    log = str(tmp_path / "watch.log")
    with app_namespace() as app, watcher(app, mp, log) as watch:
        with mounted(mp, "--memory-limit", "512Mi") as daemon:
            assert wait_for(lambda: first_line(app) == f"kB {KB_512M}", 30)
            daemon.kill()
            daemon.wait()
            seen = time_until(lambda: ENOTCONN_TEXT in first_line(app), 10)
            assert seen is not None, first_line(app)
            # Without a new daemon nothing can heal: the binds stay ENOTCONN, and the
            # watcher says so rather than binding the kernel's files back silently.
            time.sleep(2.5)
            assert ENOTCONN_TEXT in first_line(app)
            assert "is the daemon running?" in Path(log).read_text()
        with mounted(mp, "--memory-limit", "256Mi"):   # the kubelet restarts the sidecar
            healed = time_until(lambda: first_line(app) == f"kB {KB_256M}", 30)
        assert watch.poll() is None                       # the watcher lived through it
    assert healed is not None
    report("sidecar kill -9", stale_after_s=round(seen, 2),
           healed_after_restart_s=round(healed, 2), watch_interval_s=2)


def test_sidecar_sigstop_readers_block_then_resume_on_sigcont(tmp_path):
    mp = str(tmp_path / "mnt")
    log = str(tmp_path / "watch.log")
    with app_namespace() as app, watcher(app, mp, log, interval="0.5") as watch, \
            mounted(mp, "--memory-limit", "512Mi") as daemon:
        assert wait_for(lambda: first_line(app) == f"kB {KB_512M}", 30)
        os.kill(daemon.pid, signal.SIGSTOP)
        try:
            time.sleep(1.0)  # past the kernel's attribute cache: every read asks the daemon
            reader = subprocess.Popen(["nsenter", "-t", str(app), "-m", "head", "-1",
                                       "/proc/meminfo"], stdout=subprocess.PIPE, text=True)
            # A reader blocks (no error, no host value) while the daemon is stopped...
            assert not wait_for(lambda: reader.poll() is not None, 3), reader.stdout
            # ...and a one-shot attach gives up with a one-line error instead of hanging.
            once = run_attach(app, mp)
            assert once.returncode != 0 and "timed out" in once.stderr, once.stderr
            assert "\n" not in once.stderr.strip()
        finally:
            os.kill(daemon.pid, signal.SIGCONT)
        stopped_for = 1.0 + 3 + 10
        start = time.monotonic()
        out, _ = reader.communicate(timeout=30)
        resumed = time.monotonic() - start
        assert out.split()[1] == str(KB_512M)
        assert watch.poll() is None
        assert "timed out" in Path(log).read_text()   # its round gave up, the next went on
        # The binds were live all along: the watcher kept them (no rebind, no stacking).
        assert first_line(app) == f"kB {KB_512M}"
        depth = subprocess.run(["nsenter", "-t", str(app), "-m", "findmnt", "-n", "-o",
                                "TARGET", "/proc/meminfo"], capture_output=True, text=True)
        assert len(depth.stdout.split()) == 1, depth.stdout
    report("sidecar SIGSTOP", stopped_for_s=stopped_for, reader="blocked, no error",
           reader_done_after_sigcont_s=round(resumed, 2))


def test_daemonset_kill_9_binds_stay_stale_until_attach_runs_again(tmp_path):
    """The DaemonSet pattern: a node-wide mount whose files were bound into the pod once
    (as the runtime does from a hostPath). A restarted daemon cannot reach those binds: the
    pod's readers keep ENOTCONN until something rebinds them (here `attach`, once)."""
    mp = str(tmp_path / "mnt")
    with app_namespace() as app:
        with mounted(mp, "--memory-limit", "512Mi", "--allow-other") as daemon:
            assert run_attach(app, mp).returncode == 0
            assert first_line(app) == f"kB {KB_512M}"
            daemon.kill()
            daemon.wait()
            assert wait_for(lambda: ENOTCONN_TEXT in first_line(app), 10)
        with mounted(mp, "--memory-limit", "256Mi", "--allow-other"):
            time.sleep(2.5)
            still = first_line(app)
            assert ENOTCONN_TEXT in still      # no self-healing in this pattern
            start = time.monotonic()
            assert run_attach(app, mp).returncode == 0
            assert first_line(app) == f"kB {KB_256M}"
            healed = time.monotonic() - start
    report("daemonset kill -9", stale_after_restart="ENOTCONN until rebound",
           rebound_by_attach_s=round(healed, 2))


def test_daemonset_sigstop_readers_block_then_resume_on_sigcont(tmp_path):
    """A node-wide daemon stopped: the pod's readers block on its binds, and all complete
    with the right value on SIGCONT; nothing needs rebinding."""
    mp = str(tmp_path / "mnt")
    with app_namespace() as app, \
            mounted(mp, "--memory-limit", "512Mi", "--allow-other") as daemon:
        assert run_attach(app, mp).returncode == 0   # the runtime's binds, made once
        assert first_line(app) == f"kB {KB_512M}"
        os.kill(daemon.pid, signal.SIGSTOP)
        try:
            time.sleep(1.0)  # past the kernel's attribute cache
            readers = [subprocess.Popen(["nsenter", "-t", str(app), "-m", "head", "-1",
                                         "/proc/meminfo"], stdout=subprocess.PIPE, text=True)
                       for _ in range(4)]
            assert not wait_for(lambda: any(r.poll() is not None for r in readers), 3)
        finally:
            os.kill(daemon.pid, signal.SIGCONT)
        start = time.monotonic()
        outs = [r.communicate(timeout=30)[0] for r in readers]
        resumed = time.monotonic() - start
        assert [o.split()[1] for o in outs] == [str(KB_512M)] * 4
        assert first_line(app) == f"kB {KB_512M}"
    report("daemonset SIGSTOP", readers="4 blocked, no error",
           all_done_after_sigcont_s=round(resumed, 2))
