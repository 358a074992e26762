"""The daemon's own safety on the real kernel: which process a read belongs to (pid reuse,
readers it cannot see), the privileges it keeps, bounded memory and mmap."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from tests.fusemount import force_unmount, mounted, require_fuse
from tests.realcg import v1_cgroup

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
        # reads meminfo through the mount. A daemon thread may take TARGET first: retry.
        for _ in range(50):
            with open("/proc/sys/kernel/ns_last_pid", "w") as f:
                f.write(str(TARGET - 1))
            pid = os.fork()
            if pid == 0:
                if os.getpid() != TARGET:
                    os._exit(3)
                for procs in procs_files:
                    with open(procs, "w") as f:
                        f.write(str(os.getpid()))
                with open(mp + "/proc/meminfo") as f:
                    os.write(1, f"{os.getpid()} {f.readline()}".encode())
                os._exit(0)
            if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0:
                return
        sys.exit("pid %d could not be had" % TARGET)

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
    assert proc.returncode == 0, err + open(log).read()
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
        assert ready[:3] == ["ready", "0", "MemTotal:"], (ready, open(log).read())
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
    text = open(log).read()
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
    assert proc.returncode == 0, proc.stderr + open(log).read()
    assert re.match(r"1 cat: .*Permission denied", proc.stdout), proc.stdout
    assert "/proc is not this daemon's pid namespace's" in open(log).read()

