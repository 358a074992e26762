"""Real cgroups on this machine for integration tests: created, filled, always removed, and
commands run inside them."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from guestfs.sources.mountinfo import parse_mountinfo
from guestfs.sources.proc_cgroup import parse_proc_cgroup
from tests.support.cgroupfs import empty_and_remove, write


@dataclass
class RealCgroup:
    dirs: dict[str, str]          # controller -> directory
    paths: dict[str, str]         # controller -> cgroup path (as /proc/<pid>/cgroup prints)

    def add(self, pid: int) -> None:
        for d in self.dirs.values():
            with open(os.path.join(d, "cgroup.procs"), "w") as f:
                f.write(str(pid))


def _v1_dir(controller: str) -> tuple[str, str] | None:
    with open("/proc/self/mountinfo") as f:
        mounts = [m for m in parse_mountinfo(f.read())
                  if m.version == 1 and controller in m.controllers]
    with open("/proc/self/cgroup") as f:
        member = next((m for m in parse_proc_cgroup(f.read()) if controller in m.controllers),
                      None)
    if not mounts or member is None:
        return None
    m = mounts[0]
    rel = member.path[len(m.root.rstrip("/")):] if m.root != "/" else member.path
    return os.path.join(m.mount_point, rel.lstrip("/")), member.path


def require_v1_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to create cgroups")
    for c in ("memory", "cpu", "cpuset"):
        if _v1_dir(c) is None:
            pytest.skip(f"no cgroup v1 {c} hierarchy on this kernel "
                        "(pure v2: see tests/external/vm)")


@contextlib.contextmanager
def v1_cgroup(memory: int, quota: int, period: int, cpus: str | None = None
              ) -> Iterator[RealCgroup]:
    """A child of this process's own v1 cgroups with the given limits; removed on exit
    (every process left in it is killed first)."""
    require_v1_root()
    name = f"guestfs-test-{uuid.uuid4().hex[:8]}"
    dirs: dict[str, str] = {}
    paths: dict[str, str] = {}
    controllers = ["memory", "cpu", "cpuset"]
    acct = _v1_dir("cpuacct")
    if acct is not None and acct[0] != _v1_dir("cpu")[0]:  # type: ignore[index]
        controllers.append("cpuacct")  # a hierarchy of its own (this machine)
    try:
        for c in controllers:
            base, path = _v1_dir(c)  # type: ignore[misc]
            d = os.path.join(base, name)
            os.mkdir(d)
            dirs[c], paths[c] = d, f"{path.rstrip('/')}/{name}"
        write(os.path.join(dirs["memory"], "memory.limit_in_bytes"), str(memory))
        write(os.path.join(dirs["cpu"], "cpu.cfs_period_us"), str(period))
        write(os.path.join(dirs["cpu"], "cpu.cfs_quota_us"), str(quota))
        parent = os.path.dirname(dirs["cpuset"])
        with open(os.path.join(parent, "cpuset.mems")) as f:
            write(os.path.join(dirs["cpuset"], "cpuset.mems"), f.read().strip())
        if cpus is None:
            with open(os.path.join(parent, "cpuset.cpus")) as f:
                cpus = f.read().strip()
        write(os.path.join(dirs["cpuset"], "cpuset.cpus"), cpus)
        yield RealCgroup(dirs, paths)
    finally:
        for d in reversed(list(dirs.values())):
            empty_and_remove(d)


@contextlib.contextmanager
def process_in(cg: RealCgroup) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "600"])
    try:
        cg.add(proc.pid)
        yield proc
    finally:
        proc.kill()
        proc.wait()


# What tests print between the outputs of commands run one after another in one shell.
SEP = "----sep----"


def in_cgroup(cg: RealCgroup, argv: list[str], timeout: float = 120,
              **kw: object) -> subprocess.CompletedProcess[str]:
    """argv run from inside ``cg`` (it and everything it starts, the daemon included)."""
    dirs = " ".join(cg.dirs.values())
    shell = f'for d in {dirs}; do echo $$ > $d/cgroup.procs; done; exec "$@"'
    return subprocess.run(["sh", "-c", shell, "_", *argv], capture_output=True, text=True,
                          timeout=timeout, **kw)  # type: ignore[call-overload]


BUSY = f"{sys.executable} -c 'import time; t=time.time()\nwhile time.time()-t<{{s}}: pass'"


def burn(cg: RealCgroup, seconds: float, procs: int) -> None:
    """``procs`` busy loops for ``seconds`` inside ``cg``; they exit before we go on."""
    script = " & ".join([BUSY.format(s=seconds)] * procs) + "; wait"
    out = in_cgroup(cg, ["sh", "-c", script], timeout=60)
    assert out.returncode == 0, out.stderr
