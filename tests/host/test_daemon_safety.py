"""The daemon's own safety on the real kernel: which process a read belongs to (pid reuse,
readers it cannot see), the privileges it keeps, bounded memory and mmap."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from guestfs.daemon.mountpoint import is_guestfs_mount
from tests.host.test_faults_daemon import watcher_of
from tests.support.fusemount import force_unmount, mounted, require_fuse, wait_for
from tests.support.realcg import v1_cgroup

pytestmark = pytest.mark.real
MiB = 1 << 20


def require_unshare() -> None:
    require_fuse()
    if shutil.which("unshare") is None:
        pytest.fail("util-linux missing: .ci/setup installs it")
    if not os.path.exists("/proc/sys/kernel/ns_last_pid"):
        pytest.skip("this kernel has no ns_last_pid (CONFIG_CHECKPOINT_RESTORE)")


def in_private_pidns(script: str, *args: str, **kw: object) -> subprocess.Popen[str]:
    """``script`` as pid 1 of a new pid namespace with its own /proc, in a private mount
    namespace: everything it mounts or starts is gone when it exits."""
    return subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", sys.executable,
                             "-c", textwrap.dedent(script), *args], text=True,
                            **kw)  # type: ignore[call-overload]


# Pid 1 of a private pid namespace: starts the daemon there, waits until it serves.
START_DAEMON = """
    import os, subprocess, sys, time
    mp, log, *daemon_args = sys.argv[1:]
    os.makedirs(mp, exist_ok=True)
    daemon = subprocess.Popen([sys.executable, "-m", "guestfs", "mount", mp, *daemon_args],
                              stderr=open(log, "wb"))
    deadline = time.monotonic() + 20
    while not os.path.ismount(mp) or not os.path.exists(mp + "/proc/meminfo"):
        if time.monotonic() > deadline or daemon.poll() is not None:
            sys.exit("the daemon did not come up")
        time.sleep(0.05)
"""

PID_REUSE = START_DAEMON + """
    TARGET = 20000

    def reader_with_target_pid(procs_files):
        # Forked with pid TARGET (forced through ns_last_pid); it joins the cgroup, then
        # reads meminfo through the mount. A daemon thread or the daemon's short-lived
        # probe child may hold TARGET for a moment: retry, over seconds rather than a burst
        # of forks that all land while it lives.
        codes = []
        for _ in range(100):
            with open("/proc/sys/kernel/ns_last_pid", "w") as f:
                f.write(str(TARGET - 1))
            pid = os.fork()
            if pid == 0:
                if os.getpid() != TARGET:
                    os._exit(3)
                try:
                    for procs in procs_files:
                        with open(procs, "w") as f:
                            f.write(str(os.getpid()))
                    with open(mp + "/proc/meminfo") as f:
                        os.write(1, f"{os.getpid()} {f.readline()}".encode())
                except OSError as e:
                    os.write(2, f"pid {TARGET}: {e}\\n".encode())
                    os._exit(4)
                os._exit(0)
            code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            if code == 0:
                return
            codes.append(code)
            time.sleep(0.05)
        # 3: another process took the pid first; 4: the reader failed (its error above).
        sys.exit("pid %d could not be had (children's exit codes: %s)"
                 % (TARGET, sorted(set(codes))))

    reader_with_target_pid(os.environ["CG_A"].split())
    time.sleep(0.05)  # start times count clock ticks: let one pass
    reader_with_target_pid(os.environ["CG_B"].split())
    daemon.terminate()
    daemon.wait()
"""


def test_a_reused_pid_in_another_cgroup_sees_that_cgroups_limits(tmp_path):
    """Within one cache TTL (30 s here) pid 20000 reads in cgroup A, exits, and a new
    process with pid 20000 reads in cgroup B: it must get B's limits, not A's cached view."""
    require_unshare()
    mp, log = str(tmp_path / "mnt"), str(tmp_path / "log")
    with v1_cgroup(512 * MiB, 100000, 100000) as a, v1_cgroup(256 * MiB, 100000, 100000) as b:
        env = {**os.environ,
               "CG_A": " ".join(f"{d}/cgroup.procs" for d in a.dirs.values()),
               "CG_B": " ".join(f"{d}/cgroup.procs" for d in b.dirs.values())}
        proc = in_private_pidns(PID_REUSE, mp, log, "--cache-ttl", "30",
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        try:
            out, err = proc.communicate(timeout=120)
        finally:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err + Path(log).read_text()
    lines = out.splitlines()
    assert [ln.split()[0] for ln in lines] == ["20000", "20000"], out
    assert lines[0].split()[2] == str(512 * 1024), out
    assert lines[1].split()[2] == str(256 * 1024), out


HOLD = START_DAEMON + """
    # A reader inside the namespace is seen and served.
    inside = subprocess.run(["head", "-1", mp + "/proc/meminfo"], capture_output=True,
                            text=True)
    print("ready", inside.returncode, inside.stdout.strip(), flush=True)
    sys.stdin.readline()
    daemon.terminate()
    daemon.wait()
"""


@pytest.mark.parametrize("view,served", [("caller", False), ("init", False), ("self", True)])
def test_a_reader_outside_the_daemons_pid_namespace(tmp_path, view, served):
    """The daemon serves from inside a private pid namespace; a reader outside it (FUSE
    reports pid 0) is refused with EACCES by a per-caller view, never given the daemon's
    own numbers, and counted in the log. A fixed view (--view self) serves it."""
    require_unshare()
    mp, log = str(tmp_path / "mnt"), str(tmp_path / "log")
    proc = in_private_pidns(HOLD, mp, log, "--view", view, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    try:
        ready = proc.stdout.readline().split()
        assert ready[:3] == ["ready", "0", "MemTotal:"], (ready, Path(log).read_text())
        # The unshare process shares the daemon's mount namespace but not its pid one.
        outside = f"/proc/{proc.pid}/root{mp}/proc/meminfo"
        if served:
            with open(outside) as f:
                assert f.readline().startswith("MemTotal:")
        else:
            with pytest.raises(PermissionError), open(outside) as f:
                f.read()
        proc.stdin.write("\n")
        proc.stdin.flush()
        assert proc.wait(timeout=30) == 0
    finally:
        proc.kill()
        proc.wait()
    text = Path(log).read_text()
    refused = "refusing reads (EACCES) from pid 0: pid 0: the reader is outside"
    assert (refused in text) is not served, text


def test_a_proc_of_another_pid_namespace_refuses_per_caller_reads(tmp_path):
    """A daemon in a new pid namespace that still reads its parent's /proc cannot map the
    pids FUSE gives it to processes: it says so and refuses rather than guess."""
    require_unshare()
    mp, log = str(tmp_path / "mnt"), str(tmp_path / "log")
    script = START_DAEMON + """
    r = subprocess.run(["cat", mp + "/proc/meminfo"], capture_output=True, text=True)
    print(r.returncode, r.stderr.strip(), flush=True)
    daemon.terminate()
    daemon.wait()
    """
    # --mount but no --mount-proc: /proc stays the parent namespace's.
    proc = subprocess.run(["unshare", "--pid", "--fork", "--mount", sys.executable, "-c",
                           textwrap.dedent(script), mp, log], capture_output=True, text=True,
                          timeout=120)
    force_unmount(mp)
    assert proc.returncode == 0, proc.stderr + Path(log).read_text()
    assert re.match(r"1 cat: .*Permission denied", proc.stdout), proc.stdout
    assert "/proc is not this daemon's pid namespace's" in Path(log).read_text()



def status_fields(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status") as f:
        return dict(ln.rstrip("\n").split(":\t", 1) for ln in f if ":\t" in ln)


def test_the_mounted_daemon_keeps_only_cap_sys_ptrace_and_no_new_privs(tmp_path):
    """Once mounted the daemon holds CAP_SYS_PTRACE alone (effective, permitted,
    bounding) and NoNewPrivs; it still serves a reader of another uid its own cgroup's
    view (and uptime, whose source needs the ptrace read check), and on SIGTERM the mount
    is gone and its unmount watcher has exited."""
    top = tempfile.mkdtemp(prefix="guestfs-caps-")  # pytest's tmp is 0700: nobody needs in
    os.chmod(top, 0o755)
    mp = f"{top}/mnt"
    try:
        caps_and_reader_of_another_uid(tmp_path, mp)
    finally:
        force_unmount(mp)
        shutil.rmtree(top)


def caps_and_reader_of_another_uid(tmp_path: Path, mp: str) -> None:
    with v1_cgroup(256 * MiB, 100000, 100000) as cg:
        with mounted(mp, "--allow-other", log=str(tmp_path / "log")) as proc:
            st = status_fields(proc.pid)
            ptrace_only = f"{1 << 19:016x}"
            assert (st["CapEff"], st["CapPrm"], st["CapBnd"]) == (ptrace_only,) * 3, st
            assert (st["CapInh"], st["CapAmb"], st["NoNewPrivs"]) == ("0" * 16,) * 2 + ("1",)
            watchers = [watcher_of(proc.pid)]
            procs = " ".join(f"{d}/cgroup.procs" for d in cg.dirs.values())
            out = subprocess.run(
                ["sh", "-c", f'for p in {procs}; do echo $$ > $p; done; exec setpriv '
                 f'--reuid 65534 --regid 65534 --clear-groups sh -c "head -1 {mp}/proc/meminfo;'
                 f' cat {mp}/proc/uptime"'], capture_output=True, text=True, timeout=60)
            assert out.returncode == 0, out.stderr
            mem, uptime = out.stdout.splitlines()
            assert mem.split()[1] == str(256 * 1024)
            assert float(uptime.split()[0]) < 60  # the container's age, not the host's
            proc.send_signal(15)
            assert proc.wait(timeout=30) == 0
        with open("/proc/self/mountinfo") as f:
            assert mp not in f.read()
        assert not any(os.path.exists(f"/proc/{w}") and status_fields(w)["State"][0] != "Z"
                       for w in watchers)
    log = (tmp_path / "log").read_text()
    assert "capabilities kept: CAP_SYS_PTRACE (" in log and "Traceback" not in log


def test_open_renderings_stay_bounded_by_entries_over_20000_opens(tmp_path):
    """20,000 opens of the 4-byte cpu/online file, half read and closed, half read and
    left open: the daemon keeps at most 8192 renderings (it reports the count when it
    stops), not one per open."""
    mp = str(tmp_path / "mnt")
    reader = textwrap.dedent("""
        import os, resource, sys
        resource.setrlimit(resource.RLIMIT_NOFILE, (20000, 20000))
        path, held = sys.argv[1], []
        for i in range(20000):
            fd = os.open(path, os.O_RDONLY)
            assert os.read(fd, 4096)
            if i % 2 or len(held) > 9000:
                os.close(fd)
            else:
                held.append(fd)
        print(len(held))
    """)
    with mounted(mp, log=str(tmp_path / "log")) as proc:
        out = subprocess.run([sys.executable, "-c", reader,
                              f"{mp}/sys/devices/system/cpu/online"],
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        assert int(out.stdout) == 9001
        proc.send_signal(15)
        assert proc.wait(timeout=30) == 0
    kept = re.search(r"(\d+) open renderings kept", (tmp_path / "log").read_text())
    assert kept is not None and 0 < int(kept.group(1)) <= 8192, kept


MMAP_EVERY_FILE = """
    import ctypes, errno, os, sys
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    PROT_READ, MAP_PRIVATE, MAP_SHARED, FAILED = 1, 2, 1, ctypes.c_void_p(-1).value
    for path in sys.argv[1:]:
        fd = os.open(path, os.O_RDONLY)
        size = os.fstat(fd).st_size
        with open(path, "rb") as f:
            content = f.read()
        # MAP_SHARED of a direct_io file: refused by the kernel, a clean error.
        assert libc.mmap(None, 4096, PROT_READ, MAP_SHARED, fd, 0) in (None, FAILED)
        if path.endswith("/proc/meminfo"):  # as reported: a page mapped, then touched
            addr = libc.mmap(None, 4096, PROT_READ, MAP_PRIVATE, fd, 0)
            assert ctypes.string_at(addr, 9) == b"MemTotal:"
        addr = libc.mmap(None, size, PROT_READ, MAP_PRIVATE, fd, 0)
        assert size > 0 and size % 4096 == 0, (path, size)  # never 0: fusefs.reported_size
        assert addr not in (None, FAILED), (path, os.strerror(ctypes.get_errno()))
        mapped = ctypes.string_at(addr, size)  # touches every page: SIGBUS would kill us
        # A whole rendering (the one this open's size was reported from), then zeros:
        # the same lines as a read of the file, the last one ending in a newline.
        text = mapped.rstrip(b"\\0")
        assert b"\\0" not in text and text.endswith(b"\\n"), (path, mapped[:200])
        assert [ln.split()[:1] for ln in text.splitlines()] == [
            ln.split()[:1] for ln in content.splitlines()] or path.endswith(
                ("/uptime", "/loadavg")), (path, mapped[:80])
        print(path, size, "ok", flush=True)
"""


def test_mmap_of_every_served_file_never_dies_of_sigbus(tmp_path):
    """A private mmap of st_size (whole pages, never 0) maps one whole rendering and zeros,
    for every served file; the MAP_SHARED one is refused. Run in a subprocess: a SIGBUS
    there cannot take pytest down."""
    from guestfs.daemon.file_table import SERVED_FILES

    mp = str(tmp_path / "mnt")
    with mounted(mp, log=str(tmp_path / "log")):
        files = [mp + f for f in SERVED_FILES if os.path.exists(f)]
        out = subprocess.run([sys.executable, "-c", textwrap.dedent(MMAP_EVERY_FILE), *files],
                             capture_output=True, text=True, timeout=120)
    assert out.returncode != -signal.SIGBUS, out.stdout
    assert out.returncode == 0, (out.returncode, out.stdout, out.stderr)
    results = [ln.split() for ln in out.stdout.splitlines()]
    assert len(results) == len(files)
    # Every file maps, those rendered afresh on every read (stat, uptime) too.
    assert all(r[2] == "ok" for r in results), results


def test_reader_ids_read_the_start_time_once_per_process_and_again_after_it_exits():
    from guestfs.daemon.readers import ReaderIds

    reads: list[int] = []
    ids = ReaderIds(lambda pid: reads.append(pid) or len(reads), use_pidfd=True)
    proc = subprocess.Popen(["sleep", "60"])
    try:
        assert ids(proc.pid) == ids(proc.pid) == (proc.pid, 1)
        assert reads == [proc.pid]          # the second request only polled its pidfd
    finally:
        proc.kill()
        proc.wait()
    # Exited (and reaped: the pid is free for reuse): the identity is looked up afresh.
    assert ids(proc.pid) == (proc.pid, 2)
    ids.close()


@pytest.mark.parametrize("view,warned", [("caller", True), ("self", False)])
def test_a_daemon_without_cap_sys_ptrace_keeps_nothing_and_says_what_degrades(
        tmp_path, view, warned):
    """Given only SYS_ADMIN and SETPCAP (Kubernetes' drop ALL + add), the daemon keeps no
    capability at all; before, capset of the missing CAP_SYS_PTRACE failed and it kept
    both. A per-caller view warns once which features degrade; a fixed view does not."""
    require_fuse()
    mp = str(tmp_path / "mnt")
    os.makedirs(mp)
    log = tmp_path / "log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            ["setpriv", "--bounding-set", "-all,+sys_admin,+setpcap", "--inh-caps", "-all",
             "--ambient-caps", "-all", "--no-new-privs", "--", sys.executable, "-m",
             "guestfs", "mount", mp, "--view", view], stderr=err)
    try:
        assert wait_for(lambda: is_guestfs_mount(mp) or proc.poll() is not None)
        assert proc.poll() is None, log.read_text()
        st = status_fields(proc.pid)
        assert (st["CapEff"], st["CapPrm"], st["CapBnd"], st["NoNewPrivs"]) == \
            ("0" * 16,) * 3 + ("1",), st
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        force_unmount(mp)
    lines = log.read_text().splitlines()
    warnings = [ln for ln in lines if " WARNING " in ln]
    assert warnings == ([w for w in warnings if "CAP_SYS_PTRACE is not in this container"]
                        if warned else []), lines
    assert len(warnings) == (1 if warned else 0), lines
    assert any("capabilities kept: none (" in ln for ln in lines), lines
