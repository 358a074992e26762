"""Hypothesis fuzzing of `guestfs show` over random fake roots: a fixture root whose cgroup
files, /proc/<pid>/{cgroup,stat}, mountinfo and cpu lists are replaced by junk, and whose
host /proc files get kernel-shaped damage (other numbers). No exception
escapes the CLI, and every file served is well formed: junk in the container's files
degrades the view (with a warning), it never breaks a file."""

from __future__ import annotations

import contextlib
import io
import re
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from guestfs.cli.main import main
from guestfs.daemon.file_table import SERVED_FILES
from guestfs.daemon.server import ServerConfig, UnseenReader, ViewServer
from guestfs.sources.host_root import HostRoot
from tests.conftest import FIXTURE_NAMES, FIXTURES
from tests.fuzz.test_fuzz_parsers import texts
from tests.support.fuzzing import examples

# Host files the kernel writes: damaged only the way a kernel could differ (other numbers,
# missing lines), since guestfs serves their other lines as they are.
HOST_FILES = frozenset({"proc/meminfo", "proc/stat", "proc/uptime", "proc/loadavg",
                        "proc/swaps", "proc/diskstats", "proc/cpuinfo", "proc/pressure/cpu",
                        "proc/pressure/memory", "proc/pressure/io",
                        "sys/devices/system/cpu/online", "sys/devices/system/cpu/possible",
                        "sys/devices/system/cpu/present"})
# Whole numbers and decimals standing alone ("cpu0" and "avg10" are names, not numbers).
NUMBER = re.compile(r"\b\d+(\.\d+)?\b")


def files_of(name: str) -> list[str]:
    root = FIXTURES / name
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.is_file() and not p.is_symlink())


FILES = {name: files_of(name) for name in FIXTURE_NAMES}
NUMBERS = st.sampled_from(["0", "1", "4096", "9223372036854771712", "18446744073709551615",
                           "99999999999999999999999", "7", "100000"])


@st.composite
def damage(draw: st.DrawFn, rel: str, original: str) -> str | None:
    """New content for ``rel`` (None: delete it)."""
    if rel == "proc/meminfo" or rel.startswith("sys/"):
        return original   # other values would be a host with inconsistent totals or CPUs
    if rel in HOST_FILES:
        return NUMBER.sub(lambda m: draw(NUMBERS) + (m.group(1) or ""), original)
    kind = draw(st.sampled_from(["junk", "empty", "delete", "numbers", "truncate"]))
    if kind == "junk":
        return draw(texts)
    if kind == "empty":
        return ""
    if kind == "delete":
        return None
    if kind == "numbers":
        return re.sub(r"\d+", lambda _m: draw(st.one_of(NUMBERS, st.sampled_from(
            ["-1", "-18446744073709551615", "²", "nan", "", "0-99999999999"]))), original)
    return original[: draw(st.integers(0, len(original)))]


@st.composite
def fake_root(draw: st.DrawFn) -> tuple[str, str, dict[str, str | None]]:
    name = draw(st.sampled_from(FIXTURE_NAMES))
    pid = draw(st.sampled_from(["self", "7", "1"]))
    chosen = draw(st.lists(st.sampled_from(FILES[name]), min_size=1, max_size=25, unique=True))
    changes = {rel: draw(damage(rel, (FIXTURES / name / rel).read_text())) for rel in chosen}
    return name, pid, changes


def show(root: str, pid: str, path: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["show", path, "--root", root, "--pid", pid])
    return rc, out.getvalue(), err.getvalue()


MEMINFO_LINE = re.compile(r"[A-Za-z0-9_()]+:\s+\d+( kB)?")
CPU_LIST = re.compile(r"\d+(-\d+)?(,\d+(-\d+)?)*\n")
UPTIME = re.compile(r"\d+\.\d\d \d+\.\d\d\n")
LOADAVG = re.compile(r"\d+\.\d\d \d+\.\d\d \d+\.\d\d \d+/\d+ \d+\n")
PRESSURE = re.compile(r"(some|full) avg10=\d+\.\d\d avg60=\d+\.\d\d avg300=\d+\.\d\d "
                      r"total=\d+")


def check_shape(path: str, text: str) -> None:
    lines = text.splitlines()
    if path == "/proc/meminfo":
        assert all(MEMINFO_LINE.fullmatch(ln) for ln in lines), text
        values = {ln.split(":")[0]: int(ln.split()[1]) for ln in lines}
        assert values.get("MemTotal", 0) > 0, text
        assert values.get("MemAvailable", 0) <= values["MemTotal"], text
    elif path == "/proc/stat":
        cpu = [ln.split() for ln in lines if ln.startswith("cpu")]
        assert cpu and cpu[0][0] == "cpu" and len(cpu) >= 2, text
        assert [c[0] for c in cpu[1:]] == [f"cpu{i}" for i in range(len(cpu) - 1)], text
        assert all(f.isdigit() for c in cpu for f in c[1:]), text
    elif path.startswith("/sys/devices/system/cpu/"):
        assert CPU_LIST.fullmatch(text), text
    elif path == "/proc/uptime":
        assert UPTIME.fullmatch(text), text
    elif path == "/proc/loadavg":
        assert LOADAVG.fullmatch(text), text
    elif path.startswith("/proc/pressure/"):
        assert lines and all(PRESSURE.fullmatch(ln) for ln in lines), text
    elif path == "/proc/swaps":
        assert lines and lines[0].startswith("Filename"), text


def every(name: str, suffix: str, text: str | None) -> tuple[str, str, dict[str, str | None]]:
    """An explicit case: every file of fixture ``name`` ending in ``suffix`` replaced."""
    return name, "7", {rel: text for rel in FILES[name] if rel.endswith(suffix)}


@settings(max_examples=examples(80), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(fake_root())
# A cgroup's pressure file was served as it was: "0" reached readers of /proc/pressure/*.
@example(every("k8s-systemd-v2-guaranteed-crio", ".pressure", "0"))
@example(every("k8s-systemd-v2-burstable", "/io.stat", "8:0 rbytes=\u00b2 wbytes=1\n"))
@example(every("docker-v1", "blkio.throttle.io_serviced_recursive", "8:0 Read \u00b2\n"))
@example(every("docker-v1", "cpuset.cpus", "0-99999999999\n"))
@example(every("docker-v1", "/mountinfo", "26 23 0:23 / /x rw - cgroup x\n"))
@example(("docker-v1", "1", {"proc/1/cgroup": None}))   # a reader the daemon cannot place
def test_show_over_damaged_roots(case):
    name, pid, changes = case
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / name
        shutil.copytree(FIXTURES / name, root, symlinks=True)
        for rel, text in changes.items():
            if text is None:
                (root / rel).unlink()
            else:
                (root / rel).write_text(text)
        host_damaged = any(rel in HOST_FILES or rel.startswith("proc/self/mountinfo")
                           for rel in changes)
        for path in SERVED_FILES:
            rc, out, err = show(str(root), pid, path)
            if rc == 0:
                check_shape(path, out)
                continue
            # A pid whose /proc/<pid>/cgroup was deleted is gone; a host file the kernel
            # always has may be missing: both are one-line errors, nothing else is.
            assert rc == 1 and len(err.splitlines()) == 1, err
            assert host_damaged or "pid" in err or "cannot read the host" in err, (changes, err)
        if pid != "self":
            serve_every_file(str(root), int(pid))


def serve_every_file(root: str, pid: int) -> None:
    """The daemon's path over the same root: render never raises but to refuse a reader
    it cannot place (EACCES, counted: docs/mount.md); what it renders without a counted
    fallback is well formed."""
    srv = ViewServer(HostRoot(root), ServerConfig(cache_ttl=0))
    try:
        for path in SERVED_FILES:
            before, refused = srv.errors, sum(srv.refusals.values())
            try:
                data = srv.render(path, pid).decode()
            except UnseenReader:
                assert sum(srv.refusals.values()) == refused + 1
                continue
            if srv.errors == before:
                check_shape(path, data)
    finally:
        srv.stop()
