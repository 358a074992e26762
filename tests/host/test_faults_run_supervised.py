"""Faults of the daemon under `guestfs run`, each asserting what the app's readers see:
kill -9 (on Linux 6.9+ the mount's holder starts a successor on the same connection and
nothing fails; with a libfuse binding, which cannot be held, run restarts the daemon and
re-binds in the app's namespace), SIGSTOP/SIGCONT (readers wait, then go on; no restart),
and two runs sharing one mount (the first leaving, or being killed with -9, does not take
the second's files away; the daemon goes after the last).

The app is a reader of /proc/meminfo logging one line per read (monotonic time, then the
MemTotal it saw or err<errno>), until a stop file appears."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from guestfs.daemon.mountpoint import is_guestfs_mount
from guestfs.syscalls.guard import GUARD_NAME
from guestfs.system import kernel, sysmount
from tests.support.fusemount import force_unmount, is_guestfs_daemon, require_fuse, wait_for

pytestmark = pytest.mark.real
LIMIT_KB = 524288  # --memory-limit 512Mi
RECOVERY_S = 15.0  # polled deadline; measured recoveries are printed (and in the docs)
# What a daemon run cannot hold gets: a dead one's files re-bound (the path of kernels
# before 6.9 too, where run holds nothing).
REBIND = ("--fuse-binding", "mfusepy3")

READER = """
import sys, time, os
log = open(sys.argv[1], "a", buffering=1)
while not os.path.exists(sys.argv[2]):
    try:
        with open("/proc/meminfo") as f:
            seen = f.readline().split()[1]
    except OSError as e:
        seen = f"err{e.errno}"
    log.write(f"{time.monotonic():.3f} {seen}\\n")
    time.sleep(0.05)
"""


class App:
    """`guestfs run` around a reader; its output goes to files, since a daemon it started
    may outlive it (and would hold a pipe open)."""

    def __init__(self, tmp: Path, name: str, mp: str, args: tuple[str, ...] = ()) -> None:
        self.log, self.stopfile = tmp / f"{name}.log", tmp / f"{name}.stop"
        script = tmp / "reader.py"
        script.write_text(READER)
        self.out = open(tmp / f"{name}.out", "wb")  # noqa: SIM115 - closed in finish()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "guestfs", "run", "--mountpoint", mp, "--memory-limit",
             "512Mi", *args, "--", sys.executable, "-I", str(script), str(self.log),
             str(self.stopfile)], stdout=self.out, stderr=subprocess.STDOUT)

    def reads(self) -> list[tuple[float, str]]:
        with contextlib.suppress(FileNotFoundError):
            rows = [ln.split() for ln in self.log.read_text().splitlines()]
            return [(float(r[0]), r[1]) for r in rows if len(r) == 2]
        return []

    def served_after(self, t: float) -> float | None:
        """The time of the first read after ``t`` that saw the served limit."""
        return next((at for at, seen in self.reads() if at > t and seen == str(LIMIT_KB)),
                    None)

    def daemons(self) -> list[psutil.Process]:
        """The live daemons run started (a killed one not yet reaped is a zombie)."""
        out = []
        with contextlib.suppress(psutil.NoSuchProcess):
            for c in psutil.Process(self.proc.pid).children():
                with contextlib.suppress(psutil.NoSuchProcess):   # ZombieProcess too
                    if c.status() != psutil.STATUS_ZOMBIE and \
                            is_guestfs_daemon(c.cmdline(), c.name()):
                        out.append(c)
        return out

    def reader_pid(self) -> int:
        # Not the daemon or the guard run forked, whose command lines are run's.
        (reader,) = [c for c in psutil.Process(self.proc.pid).children()
                     if "reader.py" in " ".join(c.cmdline())
                     and not is_guestfs_daemon(c.cmdline(), c.name())
                     and c.name() != GUARD_NAME.decode()]
        return reader.pid

    def fuse_mounts_at(self, path: str) -> int:
        """How many FUSE mounts are stacked at ``path`` in the reader's namespace."""
        with open(f"/proc/{self.reader_pid()}/mountinfo") as f:
            rows = [ln.split() for ln in f]
        return sum(1 for r in rows if r[4] == path and r[r.index("-") + 1].startswith("fuse"))

    def output(self) -> str:
        return Path(self.out.name).read_text(errors="replace")

    def finish(self, timeout: float = 60) -> int:
        self.stopfile.touch()
        try:
            return self.proc.wait(timeout)
        finally:
            self.out.close()

    def kill(self) -> None:
        self.stopfile.touch()
        for d in self.daemons():
            with contextlib.suppress(psutil.NoSuchProcess):
                d.send_signal(signal.SIGCONT)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.out.close()


@pytest.fixture
def apps(tmp_path: Path) -> Iterator[tuple[str, list[App]]]:
    """A mountpoint and the list of apps a test starts there; every app, daemon and mount
    is gone afterwards, pass or fail."""
    require_fuse()
    mp = str(tmp_path / "mnt")
    started: list[App] = []
    before = {p.pid for p in psutil.process_iter()}
    try:
        yield mp, started
    finally:
        daemons = [d for a in started for d in a.daemons()]
        for a in started:
            a.kill()
        # Daemons whose run has exited (shared ones) were reparented: find them by mountpoint.
        for p in psutil.process_iter(["pid", "cmdline"]):
            if p.pid not in before and mp in " ".join(p.info["cmdline"] or []):
                daemons.append(p)
        for d in daemons:
            with contextlib.suppress(psutil.NoSuchProcess):
                d.send_signal(signal.SIGCONT)
                d.kill()
        force_unmount(mp)


def start_app(tmp_path: Path, mp: str, started: list[App], name: str = "app",
              args: tuple[str, ...] = ()) -> App:
    app = App(tmp_path, name, mp, args)
    started.append(app)
    assert wait_for(lambda: app.served_after(0) is not None, 60), app.output()
    return app


def host_memtotal_kb() -> int:
    with open("/proc/meminfo") as f:
        return int(f.readline().split()[1])


def test_kill_9_of_an_unheld_daemon_under_run_is_healed_by_re_binding(tmp_path, apps):
    mp, started = apps
    assert host_memtotal_kb() != LIMIT_KB
    app = start_app(tmp_path, mp, started, args=REBIND)
    recoveries = []
    for n in (1, 2):
        (daemon,) = app.daemons()
        killed_at = time.monotonic()
        daemon.kill()
        # Reads may go on from the kernel's page cache for up to --cache-ttl after the
        # kill (docs/run.md), so a served read alone does not say the new daemon is up:
        # wait for run to have re-bound, then for a read served after that.
        assert wait_for(lambda n=n: app.output().count("served again, files re-bound") >= n,
                        RECOVERY_S), app.output()
        rebound_at = time.monotonic()
        assert wait_for(lambda t=rebound_at: app.served_after(t) is not None, RECOVERY_S), \
            (app.output(), app.reads()[-5:])
        recoveries.append(app.served_after(rebound_at) - killed_at)
        assert len(app.daemons()) == 1 and app.daemons()[0].pid != daemon.pid
        # The dead bind was replaced, not covered: none piles up in the app's namespace.
        assert app.fuse_mounts_at("/proc/meminfo") == 1
    # What the reader saw in between: its limit, or ENOTCONN while no daemon served
    # (ECONNABORTED for a read in flight when the daemon died); never the host's numbers,
    # which a gap between detaching the dead bind and attaching the new one would show.
    assert {seen for _, seen in app.reads()} <= {str(LIMIT_KB), "err107", "err103"}
    assert app.finish() == 0, app.output()
    assert "served again, files re-bound" in app.output()
    assert not is_guestfs_mount(mp)
    print(f"kill -9 of the daemon under run: reads served again after "
          f"{', '.join(f'{r:.2f}' for r in recoveries)} s")


def test_a_stopped_daemon_holds_readers_until_sigcont(tmp_path, apps):
    """A SIGSTOPped daemon is not treated as dead: readers wait in the kernel (FUSE) and
    go on after SIGCONT, with no error and no second daemon."""
    mp, started = apps
    app = start_app(tmp_path, mp, started)
    (daemon,) = app.daemons()
    daemon.suspend()
    stopped_at = time.monotonic()
    try:
        # The reader blocks: no read completes after the first one in flight.
        assert wait_for(lambda: time.monotonic() - max(t for t, _ in app.reads()) > 2, 10)
        assert [d.pid for d in app.daemons()] == [daemon.pid]  # not restarted meanwhile
    finally:
        daemon.resume()
    resumed_at = time.monotonic()
    assert wait_for(lambda: app.served_after(resumed_at) is not None, RECOVERY_S)
    assert [d.pid for d in app.daemons()] == [daemon.pid]
    assert {seen for _, seen in app.reads()} == {str(LIMIT_KB)}  # never an error
    assert app.finish() == 0, app.output()
    print(f"SIGSTOP for {resumed_at - stopped_at:.2f} s: reads resumed "
          f"{app.served_after(resumed_at) - resumed_at:.2f} s after SIGCONT")


def test_a_stopped_daemon_does_not_keep_run_from_exiting(tmp_path, apps):
    mp, started = apps
    app = start_app(tmp_path, mp, started)
    (daemon,) = app.daemons()
    daemon.suspend()
    app.stopfile.touch()  # the reader is blocked; it exits after its read completes
    os.kill(app.proc.pid, signal.SIGTERM)  # forwarded to the app, which ends
    assert app.proc.wait(60) in (0, 128 + signal.SIGTERM), app.output()
    assert wait_for(lambda: not daemon.is_running() or daemon.status() == "zombie", 30)
    # It was woken to unmount (SIGCONT with the SIGTERM), not killed with its mount left
    # stale for the next user.
    assert not is_guestfs_mount(mp) and not sysmount.is_stale_mount(mp)


def test_two_runs_share_a_mount_and_the_first_may_leave_first(tmp_path, apps):
    mp, started = apps
    first = start_app(tmp_path, mp, started, "first")
    second = start_app(tmp_path, mp, started, "second")
    assert len(first.daemons()) == 1 and second.daemons() == []  # the second reused it
    (daemon,) = first.daemons()
    assert first.finish() == 0, first.output()
    left_at = time.monotonic()
    # The second keeps being served, by the same daemon, with not one failed read.
    assert wait_for(lambda: len([t for t, _ in second.reads() if t > left_at + 2]) >= 10, 30)
    assert {seen for _, seen in second.reads()} == {str(LIMIT_KB)}, second.reads()[-5:]
    assert daemon.is_running() and is_guestfs_mount(mp)
    # The last user gone, the daemon unmounts and exits by itself.
    assert second.finish() == 0, second.output()
    assert wait_for(lambda: not daemon.is_running(), RECOVERY_S)
    assert not is_guestfs_mount(mp)


def test_a_third_run_after_both_left_starts_a_new_daemon(tmp_path, apps):
    """The mount is not kept by anyone once unused; the next run mounts again."""
    mp, started = apps
    first = start_app(tmp_path, mp, started, "first")
    (daemon,) = first.daemons()
    assert first.finish() == 0, first.output()
    assert wait_for(lambda: not daemon.is_running(), RECOVERY_S)
    again = start_app(tmp_path, mp, started, "again")
    assert len(again.daemons()) == 1
    assert again.finish() == 0, again.output()


def all_daemons(mp: str) -> list[psutil.Process]:
    """Serving daemons at ``mp``; not their unmount watchers (children of a daemon that
    keep the right to unmount: docs/mount.md)."""
    procs = [p for p in psutil.process_iter(["cmdline", "ppid", "name"])
             if (c := p.info["cmdline"] or []) and mp in c
             and is_guestfs_daemon(c, p.info["name"])]
    pids = {p.pid for p in procs}
    return [p for p in procs if p.info["ppid"] not in pids]


def test_two_runs_started_together_share_one_daemon(tmp_path, apps):
    mp, started = apps
    together = [App(tmp_path, name, mp) for name in ("left", "right")]
    started.extend(together)
    for app in together:
        assert wait_for(lambda a=app: a.served_after(0) is not None, 60), app.output()
    assert wait_for(lambda: len(all_daemons(mp)) == 1, 10), all_daemons(mp)
    for app in together:
        assert app.finish() == 0, app.output()
        assert {seen for _, seen in app.reads()} == {str(LIMIT_KB)}
    assert wait_for(lambda: not all_daemons(mp), RECOVERY_S)
    assert not is_guestfs_mount(mp)


def test_kill_9_of_a_shared_daemon_heals_every_run(tmp_path, apps):
    mp, started = apps
    first = start_app(tmp_path, mp, started, "first")
    second = start_app(tmp_path, mp, started, "second")
    (daemon,) = first.daemons()
    killed_at = time.monotonic()
    daemon.kill()
    for app in (first, second):
        assert wait_for(lambda a=app: a.served_after(killed_at + 0.05) is not None,
                        RECOVERY_S), (app.output(), app.reads()[-5:])
    assert wait_for(lambda: len(all_daemons(mp)) == 1, 10), all_daemons(mp)  # one winner
    print("kill -9 of a daemon shared by two runs: served again after "
          + ", ".join(f"{a.served_after(killed_at + 0.05) - killed_at:.2f}"
                      for a in (first, second)) + " s")
    for app in (first, second):
        assert app.finish() == 0, app.output()
    assert wait_for(lambda: not all_daemons(mp), RECOVERY_S)
    assert not is_guestfs_mount(mp)


def test_kill_9_of_the_run_that_started_a_shared_daemon(tmp_path, apps):
    """The daemon lives while any run or any of its apps uses it, not while its parent
    does: the second run keeps being served, with no failed read; and once both runs are
    gone (killed with -9, so nothing of run's own cleanup runs) and their apps too, the
    daemon unmounts and exits, since the kernel released every users lock."""
    mp, started = apps
    first = start_app(tmp_path, mp, started, "first")
    second = start_app(tmp_path, mp, started, "second")
    (daemon,) = first.daemons()
    readers = [psutil.Process(first.reader_pid()), psutil.Process(second.reader_pid())]
    first.proc.kill()
    first.proc.wait()
    killed_at = time.monotonic()
    assert wait_for(lambda: len([t for t, _ in second.reads() if t > killed_at + 2]) >= 10, 30)
    assert {seen for _, seen in second.reads()} == {str(LIMIT_KB)}, second.reads()[-5:]
    assert {seen for _, seen in first.reads()} == {str(LIMIT_KB)}, first.reads()[-5:]
    assert daemon.is_running() and all_daemons(mp) == [daemon]
    second.proc.kill()
    second.proc.wait()
    time.sleep(1)   # the apps, run's no more, still hold the mount: it stays
    assert daemon.is_running()
    for r in readers:
        r.kill()
    assert wait_for(lambda: not daemon.is_running(), RECOVERY_S)
    assert not is_guestfs_mount(mp) and not sysmount.is_stale_mount(mp)


def test_a_daemon_replaced_behind_runs_back_is_re_bound(tmp_path, apps):
    """Another run sharing the mount (or an operator) may put a new daemon there before this
    run notices the old one died: run then sees a daemon serving, and must still move its
    app's binds to the new mount. Made deterministic by stopping run meanwhile."""
    mp, started = apps
    app = start_app(tmp_path, mp, started, args=REBIND)
    (daemon,) = app.daemons()
    pidfile = tmp_path / "other.pid"
    os.kill(app.proc.pid, signal.SIGSTOP)
    try:
        daemon.kill()
        killed_at = time.monotonic()
        subprocess.run([sys.executable, "-m", "guestfs", "mount", mp, "--daemon",
                        "--pid-file", str(pidfile), "--memory-limit", "512Mi"],
                       check=True, timeout=60)
    finally:
        os.kill(app.proc.pid, signal.SIGCONT)
    try:
        # The page cache may serve the dead mount's last rendering for --cache-ttl: what
        # counts is that run re-binds to the other daemon, then reads are served.
        assert wait_for(lambda: "a new daemon serves it; files re-bound" in app.output(),
                        RECOVERY_S), app.output()
        rebound_at = time.monotonic()
        assert wait_for(lambda: app.served_after(rebound_at) is not None, RECOVERY_S), \
            (app.output(), app.reads()[-5:], killed_at)
        assert app.daemons() == []  # re-bound to the other daemon, not a third one
        assert app.finish() == 0, app.output()
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pidfile.read_text()), signal.SIGTERM)


TIGHT_READER = """
import json, os, sys
host, counts = sys.argv[1].encode(), {"served": 0, "host": 0, "error": 0}
while not os.path.exists(sys.argv[3]):
    try:
        fd = os.open("/proc/meminfo", os.O_RDONLY)
        try:
            head = os.read(fd, 40)
        finally:
            os.close(fd)
        counts["host" if host in head else "served"] += 1
    except OSError:
        counts["error"] += 1
open(sys.argv[2], "w").write(json.dumps(counts))
"""


def test_a_reader_in_a_tight_loop_never_sees_the_hosts_numbers_across_restarts(tmp_path,
                                                                              apps):
    """The dead bind is replaced with no gap in between: the new mount goes beneath it
    before it is detached. (Detaching first, then attaching, let a tight reader see the
    kernel's own /proc/meminfo about 35 times per restart.)"""
    require_fuse()
    mp, _ = apps
    host = str(host_memtotal_kb())
    script, counts, stop = tmp_path / "tight.py", tmp_path / "counts.json", tmp_path / "stop"
    script.write_text(TIGHT_READER)
    with open(tmp_path / "run.out", "wb") as out:
        run = subprocess.Popen([sys.executable, "-m", "guestfs", "run", "--mountpoint", mp,
                                "--memory-limit", "512Mi", *REBIND, "--", sys.executable, "-I",
                                str(script), host, str(counts), str(stop)],
                               stdout=out, stderr=subprocess.STDOUT)
    try:
        def daemons() -> list[int]:
            found = []
            for c in psutil.Process(run.pid).children():
                with contextlib.suppress(psutil.Error):
                    if c.status() != psutil.STATUS_ZOMBIE and \
                            is_guestfs_daemon(c.cmdline(), c.name()):
                        found.append(c.pid)
            return found

        def reading() -> bool:
            """The app has exec'd (its binds are made): before that, run's forked child
            still shows run's own command line, which names the script too."""
            for c in psutil.Process(run.pid).children():
                with contextlib.suppress(psutil.Error):
                    if c.cmdline()[1:3] == ["-I", str(script)]:
                        return True
            return False

        def output() -> str:
            return (tmp_path / "run.out").read_text(errors="replace")

        assert wait_for(lambda: reading() and len(daemons()) == 1, 60)
        for restarts in range(1, 4):
            (old,) = daemons()
            os.kill(old, signal.SIGKILL)
            assert wait_for(lambda n=restarts: output().count("re-bound") == n, RECOVERY_S), \
                output()
        stop.touch()
        assert run.wait(60) == 0, output()
        got = json.loads(counts.read_text())
        assert got["host"] == 0 and got["served"] > 0, got
    finally:
        stop.touch()
        if run.poll() is None:
            run.kill()
            run.wait()
        force_unmount(mp)


def meminfo_bind(pid: int) -> list[str]:
    """The mount ids and devices of what is mounted at /proc/meminfo in ``pid``'s namespace."""
    with open(f"/proc/{pid}/mountinfo") as f:
        return [" ".join(r[:3]) for r in (ln.split() for ln in f) if r[4] == "/proc/meminfo"]


def test_kill_9_of_a_held_daemon_under_run_fails_no_read(tmp_path, apps):
    """Where the kernel resends (6.9+), run's daemons hold their connection: each kill -9 of
    whichever daemon serves is succeeded by the holder's successor on the same connection.
    Not one read fails, the app's binds are never replaced, nothing is re-bound."""
    if not kernel.kernel_resends():
        pytest.skip(f"Linux {os.uname().release} has no FUSE_NOTIFY_RESEND (6.9+): run "
                    "re-binds instead (test_kill_9_of_an_unheld_daemon_...)")
    mp, started = apps
    app = start_app(tmp_path, mp, started)
    assert "--hold" in " ".join(app.daemons()[0].cmdline()) or \
        app.daemons()[0].name() == "guestfs-mount"
    bind = meminfo_bind(app.reader_pid())
    gaps = []
    for _ in range(5):
        (daemon,) = all_daemons(mp)
        killed_at = time.monotonic()
        daemon.kill()
        assert wait_for(lambda d=daemon: [p.pid for p in all_daemons(mp)] not in ([], [d.pid]),
                        RECOVERY_S), all_daemons(mp)
        assert wait_for(lambda t=killed_at: len([r for r in app.reads() if r[0] > t]) >= 3,
                        RECOVERY_S), app.reads()[-5:]
        before = [at for at, _ in app.reads() if at <= killed_at]
        after = [at for at, _ in app.reads() if at > killed_at]
        gaps.append(after[0] - before[-1])
    assert {seen for _, seen in app.reads()} == {str(LIMIT_KB)}, \
        [r for r in app.reads() if r[1] != str(LIMIT_KB)][:5]
    assert meminfo_bind(app.reader_pid()) == bind
    assert app.finish() == 0, app.output()
    assert "re-bound" not in app.output()
    assert wait_for(lambda: not all_daemons(mp), RECOVERY_S)
    assert not is_guestfs_mount(mp) and not sysmount.is_stale_mount(mp)
    print(f"kill -9 of a held daemon under run, 5 times: {len(app.reads())} reads, 0 failed; "
          f"longest gap between reads {max(gaps):.3f} s (a read every 0.05 s)")
