"""Bad configuration through the real CLI: every case exits non-zero with one line on
stderr that names the bad input; never a traceback, a hang or an unbounded read."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from guestfs.sources.limits_dir import MAX_LIMIT_FILE
from tests.conftest import FIXTURES
from tests.support.fusemount import force_unmount


@dataclass(frozen=True)
class Case:
    name: str
    argv: list[str]               # after `guestfs`; {d} is the limits directory
    names: str                    # what the error line must contain ({d} expanded)
    setup: str = ""               # how to fill the limits directory (see make_dir)
    env: dict[str, str] = field(default_factory=dict)


SHOW = ["show", "/proc/meminfo"]
CASES = [
    Case("memory limit 1e999999999 (hung at 100% CPU)", [*SHOW, "--memory-limit", "1e999999999"],
         "--memory-limit"),
    Case("memory limit 1e400 (meant no limit)", [*SHOW, "--memory-limit", "1e400"],
         "--memory-limit"),
    Case("memory limit 2^63 bytes", [*SHOW, "--memory-limit", str(2**63)], "--memory-limit"),
    Case("tiny exponent", [*SHOW, "--cpu-limit", "1e-999999999"], "--cpu-limit"),
    Case("env memory limit 1e400", SHOW, "GUESTFS_MEMORY_LIMIT",
         env={"GUESTFS_MEMORY_LIMIT": "1e400"}),
    Case("memory divisor nan", [*SHOW, "--memory-divisor", "nan"], "memory divisor"),
    Case("limits.memory 'lots'", [*SHOW, "--limits-dir", "{d}"], "{d}/limits.memory",
         setup="lots"),
    Case("limits.memory empty", [*SHOW, "--limits-dir", "{d}"], "{d}/limits.memory",
         setup="empty"),
    Case("limits.memory not UTF-8", [*SHOW, "--limits-dir", "{d}"], "{d}/limits.memory",
         setup="latin1"),
    Case("limits.cpu a link to /dev/zero", [*SHOW, "--limits-dir", "{d}"], "{d}/limits.cpu",
         setup="devzero"),
    Case("limits.memory a FIFO", [*SHOW, "--limits-dir", "{d}"], "{d}/limits.memory",
         setup="fifo"),
    Case("limits.memory a link to a FIFO in the dir", [*SHOW, "--limits-dir", "{d}"],
         "{d}/limits.memory", setup="fifolink"),
    Case("limits.memory huge", [*SHOW, "--limits-dir", "{d}"], "{d}/limits.memory",
         setup="huge"),
    Case("limits.memory a directory", [*SHOW, "--limits-dir", "{d}"], "{d}/limits.memory",
         setup="dir"),
    Case("limits dir from env, 'lots'", SHOW, "{d}/limits.memory", setup="lots",
         env={"GUESTFS_LIMITS_DIR": "{d}"}),
    Case("mount --limits-dir 'lots'", ["mount", "{d}/mnt", "--limits-dir", "{d}"],
         "{d}/limits.memory", setup="lots"),
    Case("run --limits-dir /dev/zero", ["run", "--mountpoint", "{d}/mnt", "--limits-dir", "{d}",
                                        "--", "true"], "{d}/limits.cpu", setup="devzero"),
    Case("cache ttl nan", ["mount", "{d}/mnt", "--cache-ttl", "nan"], "--cache-ttl"),
    Case("cache ttl -1", ["mount", "{d}/mnt", "--cache-ttl", "-1"], "--cache-ttl"),
    Case("cache ttl inf", ["run", "--cache-ttl", "inf", "--", "true"], "--cache-ttl"),
    Case("cache ttl word", ["mount", "{d}/mnt", "--cache-ttl", "soon"], "--cache-ttl"),
    Case("attach interval -1 (traceback)", ["attach", "--watch", "--interval", "-1"],
         "--interval"),
    Case("attach interval nan", ["attach", "--watch", "--interval", "nan"], "--interval"),
    Case("attach interval 0", ["attach", "--watch", "--interval", "0"], "--interval"),
    Case("cpu rounding env", SHOW, "GUESTFS_CPU_ROUNDING", env={"GUESTFS_CPU_ROUNDING": "up"}),
    Case("unknown option", [*SHOW, "--memroy-limit", "1G"], "--memroy-limit"),
    Case("pid as a path", [*SHOW, "--pid", "../../etc"], "--pid"),
    Case("pid zero", ["explain", "--pid", "0"], "--pid"),
    Case("pid not a number", ["explain", "--pid", "1e3"], "--pid"),
]


def make_dir(d: Path, setup: str) -> None:
    mem, cpu = d / "limits.memory", d / "limits.cpu"
    if setup == "lots":
        mem.write_text("lots\n")
    elif setup == "empty":
        mem.write_text("")
    elif setup == "latin1":
        mem.write_bytes("512Mi\xe9\n".encode("latin-1"))
    elif setup == "devzero":
        cpu.symlink_to("/dev/zero")
    elif setup == "fifo":
        os.mkfifo(mem)
    elif setup == "fifolink":
        os.mkfifo(d / "..fifo")
        mem.symlink_to("..fifo")
    elif setup == "huge":
        mem.write_text("1" * (MAX_LIMIT_FILE * 256))
    elif setup == "dir":
        mem.mkdir()


def cli(argv: list[str], env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess[str]:
    # The timeout turns a hang (a FIFO opened for reading, 1e999999999 as a fraction) into
    # a failure rather than a stuck suite.
    return subprocess.run([sys.executable, "-m", "guestfs", *argv], capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL,
                          env={**os.environ, **(env or {})})


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input_is_one_line_naming_it(tmp_path, case):
    d = tmp_path / "podinfo"
    d.mkdir()
    make_dir(d, case.setup)
    argv = [w.format(d=d) for w in case.argv]
    env = {k: v.format(d=d) for k, v in case.env.items()}
    try:
        out = cli(argv, env)
    finally:
        force_unmount(str(d / "mnt"))   # should a regression mount there after all
    assert out.returncode != 0, out.stdout
    assert "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert case.names.format(d=d) in lines[0], lines[0]
    # Nothing was mounted on the way to the error.
    assert not os.path.ismount(d / "mnt")


def test_the_kubelets_atomic_writer_layout_is_read(tmp_path):
    """limits.memory -> ..data/limits.memory, ..data -> ..<timestamp>: links that stay
    inside the directory are followed."""
    d = tmp_path / "podinfo"
    (d / "..2026_12_01_00_00_00.1").mkdir(parents=True)
    (d / "..2026_12_01_00_00_00.1" / "limits.memory").write_text("134217728")
    (d / "..data").symlink_to("..2026_12_01_00_00_00.1")
    (d / "limits.memory").symlink_to("..data/limits.memory")
    (d / "limits.cpu").symlink_to("..data/limits.cpu")   # dangling: not written, no limit
    out = cli(["show", "/proc/meminfo", "--limits-dir", str(d)])
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0].split() == ["MemTotal:", "131072", "kB"]


def test_a_link_out_of_the_limits_directory_is_refused(tmp_path):
    (tmp_path / "elsewhere").write_text("1Gi")
    d = tmp_path / "podinfo"
    d.mkdir()
    (d / "limits.memory").symlink_to(tmp_path / "elsewhere")
    out = cli(["show", "/proc/meminfo", "--limits-dir", str(d)])
    assert out.returncode == 1 and "links out of the limits directory" in out.stderr


@pytest.mark.parametrize("what", ["fifo", "devzero", "directory"])
@pytest.mark.parametrize("rel", ["proc/meminfo", "proc/self/cgroup", "proc/self/mountinfo"])
def test_a_root_whose_files_are_not_regular_is_an_error_not_a_hang(tmp_path, what, rel):
    """--root DIR: a FIFO blocked the open for ever, /dev/zero was read without end."""
    root = tmp_path / "root"
    shutil.copytree(FIXTURES / "docker-v1", root, symlinks=True)
    target = root / rel
    target.unlink()
    if what == "fifo":
        os.mkfifo(target)
    elif what == "devzero":
        target.symlink_to("/dev/zero")
    else:
        target.mkdir()
    out = cli(["show", "/proc/meminfo", "--root", str(root)])
    assert "Traceback" not in out.stderr, out.stderr
    if rel == "proc/self/mountinfo":
        # No cgroup mount found is a degraded view (the host's numbers), not an error.
        assert out.returncode == 0 and out.stdout.startswith("MemTotal:"), out.stderr
        return
    lines = out.stderr.splitlines()
    assert out.returncode == 1 and len(lines) == 1, out.stderr
    assert rel.split("/")[-1] in lines[0], lines[0]
