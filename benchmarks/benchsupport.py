"""What the benchmarks start and always remove: a v1 cgroup, LXCFS and guestfs mounts.

No pytest: the standard library, psutil, guestfs's own mountinfo, cgroup and process
helpers, and the tests' helpers that need no pytest (tests/support/cgroupfs.py, mounts.py,
lxcfs.py), so a benchmark runs as ``.venv/bin/python benchmarks/bench_read.py`` from any
directory: this file is found next to the script, tests/ in the checkout around it (never
the working directory), and guestfs is the venv's installed package. The daemons are
started with cwd ``/`` so that ``python -m guestfs`` never imports from the caller's
current directory.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from guestfs.daemon.mountpoint import wait_until
from guestfs.sources.mountinfo import MountEntry, parse_mount_entries
from guestfs.sources.proc_cgroup import parse_proc_cgroup
from guestfs.wrap.run import stop_process

# The checkout this file is in, after everything else: tests/ is found there, and nothing
# installed is shadowed by it.
sys.path.append(str(Path(__file__).resolve().parent.parent))

from tests.support.cgroupfs import empty_and_remove, write  # noqa: E402
from tests.support.lxcfs import LxcfsError, lxcfs_process  # noqa: E402
from tests.support.mounts import force_unmount  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")


class BenchError(RuntimeError):
    """The benchmark cannot run here (no root, no v1 cgroup, no lxcfs, a daemon failed)."""


def _mounts() -> list[MountEntry]:
    """Every mount in our mount table (guestfs's own mountinfo parser)."""
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        return parse_mount_entries(f.read())


def fuse_mounted(mp: str) -> bool:
    """A FUSE mount at ``mp``, from the mount table only (never touches the mount, which
    would hang on a stopped daemon)."""
    mp = os.path.realpath(mp)
    return any(m.mount_point == mp and m.fstype.startswith("fuse") for m in _mounts())


def require_fuse() -> None:
    if os.geteuid() != 0:
        raise BenchError("run as root: it mounts FUSE filesystems and creates cgroups")
    if not os.path.exists("/dev/fuse"):
        raise BenchError("this kernel has no /dev/fuse")


def _tail(path: str, n: int = 3) -> str:
    try:
        with open(path, errors="replace") as f:
            return " | ".join(line.strip() for line in f.read().splitlines()[-n:])
    except OSError:
        return ""


@contextlib.contextmanager
def guestfs_mounted(mp: str, args: list[str], log: str, optional: bool = False,
                    command: list[str] | None = None
                    ) -> Iterator[subprocess.Popen[bytes] | str]:
    """``guestfs mount mp args`` until the block ends. With ``optional``, a mount that
    exits before mounting (an option this guestfs does not have) yields the reason as a
    string instead of raising. ``command``: what runs as ``guestfs`` (default ``python -m
    guestfs``)."""
    require_fuse()
    os.makedirs(mp, exist_ok=True)
    command = command or [sys.executable, "-m", "guestfs"]
    with open(log, "wb") as err:
        proc = subprocess.Popen([*command, "mount", mp, *args],
                                stdout=subprocess.DEVNULL, stderr=err, cwd="/")
    try:
        up = wait_until(lambda: fuse_mounted(mp) or proc.poll() is not None, 30.0)
        if proc.poll() is not None or not up:
            why = (f"`guestfs mount {' '.join(args)}` "
                   + (f"exited with {proc.returncode}" if proc.poll() is not None
                      else "did not mount in 30 s") + f": {_tail(log)}")
            if not optional:
                raise BenchError(why)
            yield why
        else:
            yield proc
    finally:
        stop_process(proc)
        force_unmount(mp)


@contextlib.contextmanager
def lxcfs_mounted(mp: str, pidfile: str) -> Iterator[subprocess.Popen[bytes]]:
    """LXCFS at ``mp`` until the block ends; BenchError where it is missing or fails."""
    require_fuse()
    with contextlib.ExitStack() as stack:
        try:
            proc = stack.enter_context(lxcfs_process(mp, pidfile))
        except LxcfsError as e:
            raise BenchError(str(e)) from e
        yield proc


@contextlib.contextmanager
def sleeping(n: int) -> Iterator[None]:
    procs = [subprocess.Popen(["sleep", "3600"]) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


# --- the bench cgroup ----------------------------------------------------------------


@dataclass
class BenchCgroup:
    path: str                   # the same cgroup path in every hierarchy
    dirs: dict[str, str]        # controller -> directory
    home: dict[str, str] = field(default_factory=dict)  # controller -> where we were

    def enter(self) -> None:
        for d in self.dirs.values():
            write(f"{d}/cgroup.procs", str(os.getpid()))

    def leave(self) -> None:
        for d in self.home.values():
            write(f"{d}/cgroup.procs", str(os.getpid()))


def _v1_mount(controller: str) -> tuple[str, str] | None:
    """(mount root, mount point) of the v1 hierarchy holding ``controller``."""
    for m in _mounts():
        if m.fstype == "cgroup" and controller in m.superopts.split(","):
            return m.root, m.mount_point
    return None


def _own_path(controller: str) -> str | None:
    with open("/proc/self/cgroup") as f:
        member = next((m for m in parse_proc_cgroup(f.read()) if controller in m.controllers),
                      None)
    return member.path if member is not None else None


def _dir_of(controller: str, path: str) -> str:
    root, mp = _v1_mount(controller)  # type: ignore[misc]
    rel = path[len(root.rstrip("/")):] if root != "/" else path
    return os.path.join(mp, rel.lstrip("/"))


@contextlib.contextmanager
def bench_cgroup(memory: int, quota: int, period: int) -> Iterator[BenchCgroup]:
    """A v1 cgroup with these limits at ONE path in the memory, cpu, cpuset (and a
    separate cpuacct) hierarchies: under our own memory cgroup, its parents created in the
    other hierarchies as needed, so that ``guestfs mount --cgroup PATH`` (one path for
    every hierarchy) names exactly the cgroup the readers sit in. Everything created is
    removed at the end, any process left in it killed first."""
    if os.geteuid() != 0:
        raise BenchError("run as root: it creates cgroups")
    controllers = ["memory", "cpu", "cpuset"]
    for c in controllers:
        if _v1_mount(c) is None or _own_path(c) is None:
            raise BenchError(f"no cgroup v1 {c} hierarchy on this kernel (v1 or hybrid needed)")
    acct = _v1_mount("cpuacct")
    if acct is not None and acct != _v1_mount("cpu"):
        controllers.append("cpuacct")  # a hierarchy of its own
    path = f"{_own_path('memory').rstrip('/')}/guestfs-bench-{uuid.uuid4().hex[:8]}"  # type: ignore[union-attr]
    created: list[str] = []
    dirs: dict[str, str] = {}
    home = {c: _dir_of(c, _own_path(c)) for c in controllers}  # type: ignore[arg-type]
    try:
        for c in controllers:
            d = _dir_of(c, path)
            todo = []
            p = d
            while not os.path.isdir(p):
                todo.append(p)
                p = os.path.dirname(p)
            for p in reversed(todo):
                os.mkdir(p)
                created.append(p)
                if c == "cpuset":  # a new cpuset is empty: copy its parent's cpus and mems
                    for k in ("cpuset.cpus", "cpuset.mems"):
                        with open(os.path.join(os.path.dirname(p), k)) as f:
                            write(os.path.join(p, k), f.read().strip())
            dirs[c] = d
        write(os.path.join(dirs["memory"], "memory.limit_in_bytes"), str(memory))
        write(os.path.join(dirs["cpu"], "cpu.cfs_period_us"), str(period))
        write(os.path.join(dirs["cpu"], "cpu.cfs_quota_us"), str(quota))
        yield BenchCgroup(path, dirs, home)
    finally:
        leaf = set(dirs.values())
        for d in reversed(created):
            if d in leaf:
                empty_and_remove(d)
            else:  # a parent we made: someone else may have a child there by now
                with contextlib.suppress(OSError):
                    os.rmdir(d)


# --- a daemon's cost -----------------------------------------------------------------


def cpu_sample(pid: int) -> dict[tuple[int, int], int]:
    """utime + stime ticks of ``pid`` and each of its descendants (every thread), from
    /proc/<pid>/stat, by (pid, start time)."""
    import psutil

    pids = [pid]
    with contextlib.suppress(psutil.Error):
        pids += [c.pid for c in psutil.Process(pid).children(recursive=True)]
    out: dict[tuple[int, int], int] = {}
    for p in pids:
        try:
            with open(f"/proc/{p}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
            # fields 14 and 15: utime, stime; 22: start time
            out[(p, int(rest[19]))] = int(rest[11]) + int(rest[12])
        except (OSError, IndexError, ValueError):
            continue
    return out


def cpu_seconds_between(before: dict[tuple[int, int], int],
                        after: dict[tuple[int, int], int]) -> float:
    """CPU seconds spent between two cpu_samples by the processes alive at the second (a
    helper that exited in between took its ticks with it: summing totals then went
    negative)."""
    return sum(t - before.get(k, 0) for k, t in after.items()) / CLK_TCK


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0
