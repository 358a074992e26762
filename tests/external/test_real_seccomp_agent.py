"""`guestfs seccomp-agent` with real runc containers: the profile from docs/syscalls.md
hands each container's seccomp listener to the agent, which answers sysinfo(2) and
sched_getaffinity(2) from that container's directory of a per-container guestfs mount.
Everything (containers, agent, its guard, the mount) is removed even when a test fails."""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.external.test_real_runc import MiB, bundle
from tests.support.fusemount import mounted, wait_for
from tests.support.paths import REPO
from tests.support.procs import alive

pytestmark = pytest.mark.real
SEP = "----sep----"


def docs_profile(listener: str) -> dict:
    """The profile snippet of docs/syscalls.md, so the documented one is the tested one."""
    text = (REPO / "docs/syscalls.md").read_text()
    block = next(b for b in re.findall(r"```json\n(.*?)```", text, re.S) if "listenerPath" in b)
    profile = json.loads(block)
    profile["listenerPath"] = listener
    return profile


def agent_bundle(path: Path, listener: str, script: str, mem: int, quota: int) -> str:
    b = bundle(path, None, script, mem, quota)
    cfg = json.loads((path / "config.json").read_text())
    cfg["linux"]["seccomp"] = docs_profile(listener)
    # Absolute: every controller gets the same path. A relative one is placed under each
    # hierarchy's own cgroup of runc, which differ here between memory and cpu, and the
    # per-container mount names a container by its memory path.
    cfg["linux"]["cgroupsPath"] = f"/guestfs-test-{uuid.uuid4().hex[:8]}"
    (path / "config.json").write_text(json.dumps(cfg))
    return b


@contextlib.contextmanager
def workdir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="guestfs-agent-test-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def guard_pid(log: Path) -> int | None:
    m = re.search(r"guard pid (\d+)", log.read_text(errors="replace"))
    return int(m.group(1)) if m else None


@contextlib.contextmanager
def agent_running(top: Path, source: str) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    sock = str(top / "agent" / "agent.sock")
    log = top / "agent.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "guestfs", "seccomp-agent", "--socket",
                                 sock, "--source", source, "-v"], stderr=err)
    guard = None
    try:
        # The log names the guard once the agent accepts.
        assert wait_for(lambda: guard_pid(log) is not None or proc.poll() is not None), \
            "the agent did not start"
        assert proc.poll() is None, log.read_text()
        guard = guard_pid(log)
        yield proc, sock, log
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        guard = guard or guard_pid(log)
        # The containers are gone by now, so the guard exits on its own.
        if guard is not None and not wait_for(lambda: not alive(guard), 5):
            os.kill(guard, signal.SIGKILL)


@contextlib.contextmanager
def containers(bundles: list[str], **popen: object) -> Iterator[list[subprocess.Popen[str]]]:
    ids = [f"guestfs-test-{uuid.uuid4().hex[:8]}" for _ in bundles]
    procs: list[subprocess.Popen[str]] = []
    try:
        for b, cid in zip(bundles, ids, strict=True):
            procs.append(subprocess.Popen(["runc", "run", "--bundle", b, cid], text=True,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          **popen))  # type: ignore[call-overload]
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        for cid in ids:
            subprocess.run(["runc", "delete", "--force", cid], capture_output=True)


def require_runc() -> None:
    if shutil.which("runc") is None:
        pytest.fail("runc is missing: .ci/setup installs it")
    if os.geteuid() != 0:
        pytest.skip("runc containers need root here")


def send_garbage(sock: str) -> None:
    """What a confused or hostile client could send: not JSON, nothing at all, a state
    without a listener, and a state whose "listener" is a pipe."""
    def connect() -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(sock)
        return s

    with connect() as s:
        s.sendall(b"\x00garbage{{{" * 100)
    with connect():
        pass
    state = json.dumps({"ociVersion": "1.0.2", "fds": ["seccompFd"], "pid": 1,
                        "state": {"id": "fake", "pid": 1}}).encode()
    with connect() as s:
        s.sendall(state)
    r, w = os.pipe()
    try:
        with connect() as s:
            socket.send_fds(s, [state], [r])
    finally:
        os.close(r)
        os.close(w)


# Python: pages, CPUs, the 1-minute load (glibc's getloadavg() is sysinfo's loads) and
# sysinfo's uptime, read through ctypes (bytes 0-7 of struct sysinfo).
PY = ("import ctypes, os; b = ctypes.create_string_buffer(112); "
      "ctypes.CDLL(None).sysinfo(b); "
      "print(os.sysconf(\"SC_PHYS_PAGES\"), len(os.sched_getaffinity(0)), "
      "os.getloadavg()[0], int.from_bytes(b.raw[:8], \"little\"))")
SCRIPT = ("getconf _PHYS_PAGES; echo " + SEP + "; nproc; echo " + SEP + "; python3 -c '"
          + PY + "'")


def test_each_container_gets_its_own_sysinfo_and_cpu_count():
    require_runc()
    with workdir() as top, mounted(str(top / "mnt"), "--per-container"), \
            agent_running(top, str(top / "mnt")) as (agent, sock, log):
        send_garbage(sock)
        specs = [(512 * MiB, 100000, "131072", "1"), (256 * MiB, 150000, "65536", "2")]
        bundles = [agent_bundle(top / f"b{i}", sock, "sleep 0.5; " + SCRIPT, mem, quota)
                   for i, (mem, quota, _, _) in enumerate(specs)]
        with containers(bundles) as procs:
            outs = [p.communicate(timeout=120) for p in procs]
        assert agent.poll() is None, log.read_text()
        agent.terminate()                 # SIGTERM: exits 0 and removes its socket
        assert agent.wait(10) == 0, log.read_text()
        assert not os.path.exists(sock)
        text = log.read_text()
    for (stdout, stderr), p, (_, _, pages, cpus) in zip(outs, procs, specs, strict=True):
        assert p.returncode == 0, stderr + text
        getconf, nproc, python = stdout.split(SEP + "\n")
        assert (getconf.strip(), nproc.strip()) == (pages, cpus), text
        py_pages, py_cpus, load1, uptime = python.split()
        assert [py_pages, py_cpus] == [pages, cpus]
        # A container seconds old: its own load (0 until its first 5 s sample) and age,
        # not the node's.
        assert float(load1) < 0.5 and int(uptime) < 120, python
    assert text.count("answering from its own view") == 2, text
    assert "hand-off with a bad state" in text and "without a seccomp listener" in text


def test_agent_killed_calls_get_the_kernels_answer():
    """kill -9 of the agent: the guard continues every call, so the container's next
    getconf succeeds with the node's value instead of failing with ENOSYS."""
    require_runc()
    host = subprocess.run(["getconf", "_PHYS_PAGES"], capture_output=True, text=True,
                          check=True).stdout.strip()
    with workdir() as top, mounted(str(top / "mnt"), "--per-container"), \
            agent_running(top, str(top / "mnt")) as (agent, sock, log):
        guard = guard_pid(log)
        assert guard is not None and alive(guard)
        b = agent_bundle(top / "b", sock, "getconf _PHYS_PAGES; read go; getconf _PHYS_PAGES;"
                         " nproc", 512 * MiB, 100000)
        with containers([b], stdin=subprocess.PIPE) as (proc,):
            assert proc.stdout is not None and proc.stdin is not None
            first = proc.stdout.readline().strip()
            rss = guard_rss_kib(guard)
            print(f"guard pid {guard}: {rss}")
            agent.kill()
            agent.wait()
            rest, err = proc.communicate("go\n", timeout=60)
        assert (first, proc.returncode) == ("131072", 0), err + log.read_text()
        assert rest.split() == [host, "2"], err
        assert wait_for(lambda: not alive(guard), 10), "the guard outlived its containers"


def guard_rss_kib(pid: int) -> str:
    with open(f"/proc/{pid}/status") as f:
        rss = next(ln.split()[1] for ln in f if ln.startswith("VmRSS:"))
    with open(f"/proc/{pid}/smaps_rollup") as f:
        fields = dict(ln.split()[:2] for ln in f if ln.split()[0].endswith(":"))
    private = int(fields["Private_Clean:"]) + int(fields["Private_Dirty:"])
    return f"VmRSS {rss} kB, Pss {fields['Pss:']} kB, private {private} kB"


def test_a_hand_off_with_no_per_container_directory_gets_the_kernels_answers():
    """No guestfs mount at --source: the container runs, with the node's values."""
    require_runc()
    host = subprocess.run(["getconf", "_PHYS_PAGES"], capture_output=True, text=True,
                          check=True).stdout.strip()
    with workdir() as top:
        (top / "empty").mkdir()
        with agent_running(top, str(top / "empty")) as (agent, sock, log):
            b = agent_bundle(top / "b", sock, "getconf _PHYS_PAGES; getconf _PHYS_PAGES",
                             512 * MiB, 100000)
            with containers([b]) as (proc,):
                out, err = proc.communicate(timeout=60)
            assert agent.poll() is None
            text = log.read_text()
    assert proc.returncode == 0, err + text
    assert out.split() == [host, host]
    assert text.count("reading the served view for sysinfo") == 1, text


def test_podman_passes_the_profiles_listener_path():
    """podman 4.3 (runc) with --security-opt seccomp=<the docs' profile>: the container,
    limited to 512 MiB and one CPU, reads its own values through the agent. --rootfs with
    the host's binaries keeps the test free of any image."""
    require_runc()
    if shutil.which("podman") is None:
        pytest.fail("podman is missing: .ci/setup installs it")
    from tests.external.test_image import RUN, libpod_dirs

    before = libpod_dirs()
    with workdir() as top, mounted(str(top / "mnt"), "--per-container"), \
            agent_running(top, str(top / "mnt")) as (_agent, sock, log):
        profile = top / "profile.json"
        profile.write_text(json.dumps(docs_profile(sock)))
        rootfs = top / "rootfs"
        rootfs.mkdir()
        volumes = []
        for d in ("/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc"):
            if os.path.islink(d):
                (rootfs / d[1:]).symlink_to(os.readlink(d))
            elif os.path.isdir(d):
                (rootfs / d[1:]).mkdir()
                volumes += ["-v", f"{d}:{d}:ro"]
        try:
            out = subprocess.run([*RUN, "--memory", "512m", "--cpus", "1", "--security-opt",
                                  f"seccomp={profile}", *volumes, "--rootfs", str(rootfs),
                                  "sh", "-c", "getconf _PHYS_PAGES; nproc"],
                                 capture_output=True, text=True, timeout=120)
        finally:
            for d in sorted(libpod_dirs() - before, reverse=True):  # podman's parent cgroup
                with contextlib.suppress(OSError):
                    os.rmdir(d)
        text = log.read_text()
    assert out.returncode == 0, out.stderr + text
    assert out.stdout.split() == ["131072", "1"], text


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def handed_off_child(sock: str, go: int, out: int, others: tuple[int, ...]
                     ) -> None:  # pragma: no cover - child
    """Install a notifying filter, hand its listener to the agent as runc would, wait for
    ``go``, then report what sysconf and the affinity mask say. ``others``: the parent's
    ends of the pipes, closed first: a child holding the write end of ``go`` would never
    see its end, and a failing test would hang reaping it."""
    from guestfs.syscalls.filter import Interception, install_listener

    try:
        for fd in others:
            os.close(fd)
        listener = install_listener(Interception())
        state = {"ociVersion": "1.0.2", "fds": ["seccompFd"], "pid": os.getpid(),
                 "state": {"id": f"many-{os.getpid()}", "pid": os.getpid()}}
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(sock)
            socket.send_fds(s, [json.dumps(state).encode()], [listener])
        os.close(listener)
        os.read(go, 1)
        os.write(out, f"{os.sysconf('SC_PHYS_PAGES')} {len(os.sched_getaffinity(0))}\n"
                 .encode())
    finally:
        os._exit(0)


def own_view_pages(mnt: Path) -> int:
    """_PHYS_PAGES in this test process's own directory of the per-container mount."""
    from guestfs.sources.containerdirs import key_of_cgroup_text

    with open("/proc/self/cgroup") as f:
        key = key_of_cgroup_text(f.read())
    with open(mnt / str(key) / "proc/meminfo") as f:
        return int(f.readline().split()[1]) * 1024 // os.sysconf("SC_PAGE_SIZE")


@contextlib.contextmanager
def handed_off_children(sock: str, n: int) -> Iterator[tuple[int, int]]:
    """``n`` forked children, each handing a listener of its own to the agent at ``sock``
    and waiting: yields (go, out); a byte written to ``go`` lets one report a line on
    ``out``. Closing ``go`` ends those still waiting; every child is reaped."""
    go_r, go_w = os.pipe()
    out_r, out_w = os.pipe()
    pids = []
    try:
        for _ in range(n):
            pid = os.fork()
            if pid == 0:  # pragma: no cover
                handed_off_child(sock, go_r, out_w, (go_w, out_r))
            pids.append(pid)
        os.close(out_w)
        yield go_w, out_r
    finally:
        with contextlib.suppress(OSError):
            os.close(go_w)
        for pid in pids:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        os.close(go_r)


def test_one_agent_serves_many_listeners_and_drops_each_when_its_processes_exit():
    """60 process trees with a listener each, answered by the agent's one thread; once
    they exit, neither the agent nor its guard keeps a descriptor for them."""
    require_runc()
    n = 60
    with workdir() as top, mounted(str(top / "mnt"), "--per-container"), \
            agent_running(top, str(top / "mnt")) as (agent, sock, log):
        guard = guard_pid(log)
        assert guard is not None
        base = fd_count(agent.pid), fd_count(guard)
        want_pages = own_view_pages(top / "mnt")
        with handed_off_children(sock, n) as (go, out):
            assert wait_for(lambda: log.read_text().count("answering from its own") == n,
                            30), log.read_text()[-2000:]
            os.write(go, b"x" * n)
            with os.fdopen(out) as results:
                lines = results.read().splitlines()
        assert len(lines) == n
        assert {ln.split()[0] for ln in lines} == {str(want_pages)}
        # No more than before the 60 (the guard may have closed a transient one of its
        # own since the count was taken: a full run saw 6 before and 5 after).
        assert wait_for(lambda: fd_count(agent.pid) <= base[0] and fd_count(guard) <= base[1],
                        10), (base, fd_count(agent.pid), fd_count(guard))
        assert log.read_text().count("calls answered") == n


def test_idle_connections_delay_no_hand_off():
    """20 connections that never send, then one real hand-off: its process's sysinfo(2)
    is served while all 20 are still open, i.e. before the agent has given up on any of
    them (each has its own deadline, HANDOFF_TIMEOUT). Read one at a time, the hand-off
    would wait 20 deadlines; measured against the idle ones, not against a clock."""
    if os.geteuid() != 0:
        pytest.skip("installing a filter without NoNewPrivs needs CAP_SYS_ADMIN")
    with workdir() as top, agent_running(top, str(top / "no-mount")) as (_agent, sock, log):
        idle = []
        try:
            for _ in range(20):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(sock)
                idle.append(s)
            with handed_off_children(sock, 1) as (go, out):
                os.write(go, b"x")
                # Bounded only to fail rather than hang (20 deadlines would be 40 s).
                ready = select.select([out], [], [], 60)[0]
                # Still open: the agent has neither read an end of them nor closed them.
                closed = [s for s in idle if select.select([s], [], [], 0)[0]]
                assert ready, "the hand-off's sysinfo was not served"
                line = os.read(out, 64).decode().split()
        finally:
            for s in idle:
                s.close()
        assert not closed, f"{len(closed)} idle connections closed before the hand-off " \
                           "was served"
        assert line and int(line[0]) > 0, line
        assert "container many-" in log.read_text()
