"""`guestfs run` attacked: code planted in the working directory, an app that tries to undo
or replace the binds, and readers that are not root (the self-exec command alone:
tests/cli/test_self_exec.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fusemount import force_unmount, private_mountpoint, require_fuse
from tests.support.planted import plant_package, pwn

GUESTFS = str(Path(sys.executable).parent / "guestfs")  # the installed console script


@pytest.fixture
def mp() -> Iterator[Path]:
    with private_mountpoint() as path:
        yield path


CAP_SYS_ADMIN = 21
LIMIT = ["--memory-limit", "256Mi"]  # a MemTotal the host does not have: 262144 kB
SERVED_MEMTOTAL = "MemTotal:         262144 kB"


def guestfs_run(mp: Path, cmd: list[str], *opts: str, cwd: Path | None = None
                ) -> subprocess.CompletedProcess[str]:
    require_fuse()
    try:
        return subprocess.run([GUESTFS, "run", "--mountpoint", str(mp), *opts, "--", *cmd],
                              capture_output=True, text=True, timeout=120, cwd=cwd)
    finally:
        force_unmount(str(mp))


def status_caps(text: str, name: str) -> int:
    line = next(ln for ln in text.splitlines() if ln.startswith(name + ":"))
    return int(line.split()[1], 16)


@pytest.mark.real
def test_run_never_imports_a_guestfs_package_from_the_cwd(tmp_path, mp):
    """The issue's reproduction: a planted guestfs/__main__.py in the working directory."""
    work = tmp_path / "work"
    work.mkdir()
    marker = tmp_path / "pwned"
    plant_package(work, pwn(marker))
    out = guestfs_run(mp, ["head", "-1", "/proc/meminfo"], *LIMIT, cwd=work)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == SERVED_MEMTOTAL
    assert not marker.exists()


@pytest.mark.real
def test_an_empty_guestfs_dir_in_the_cwd_does_not_break_run(tmp_path, mp):
    work = tmp_path / "work"
    (work / "guestfs").mkdir(parents=True)
    out = guestfs_run(mp, ["head", "-1", "/proc/meminfo"], *LIMIT, cwd=work)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == SERVED_MEMTOTAL


ATTACKS = """
grep ^Cap /proc/self/status
echo ----
umount /proc/meminfo; echo umount=$?
umount -l /proc/meminfo; echo umount-lazy=$?
mount -t tmpfs guestfs-attack /mnt; echo mount=$?
mount --bind /dev/null /proc/meminfo; echo bind=$?
unshare --user --map-root-user --mount sh -c 'umount /proc/meminfo' 2>/dev/null; echo userns=$?
head -1 /proc/meminfo
"""


@pytest.mark.real
def test_the_app_cannot_undo_the_binds_nor_mount(mp):
    out = guestfs_run(mp, ["sh", "-c", ATTACKS], *LIMIT)
    assert out.returncode == 0, out.stderr
    status, results = out.stdout.split("----\n")
    for name in ("CapEff", "CapPrm", "CapBnd", "CapInh", "CapAmb"):
        assert not status_caps(status, name) & (1 << CAP_SYS_ADMIN), (name, status)
    lines = results.splitlines()
    for attack in ("umount", "umount-lazy", "mount", "bind", "userns"):
        rc = next(ln for ln in lines if ln.startswith(attack + "=")).split("=")[1]
        assert rc != "0", (attack, results, out.stderr)
    assert lines[-1] == SERVED_MEMTOTAL
    assert not os.path.ismount("/mnt") or "guestfs-attack" not in Path(
        "/proc/self/mountinfo").read_text()


@pytest.mark.real
def test_keep_caps_leaves_cap_sys_admin_to_the_app(mp):
    out = guestfs_run(mp, ["grep", "^Cap", "/proc/self/status"],
                      "--keep-caps")
    assert out.returncode == 0, out.stderr
    with open("/proc/self/status") as f:
        ours = f.read()
    assert status_caps(out.stdout, "CapBnd") == status_caps(ours, "CapBnd")
    assert status_caps(out.stdout, "CapEff") & (1 << CAP_SYS_ADMIN)


NOBODY = ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups"]


@pytest.mark.real
def test_a_non_root_app_reads_the_files(mp):
    out = guestfs_run(mp, [*NOBODY, "free", "-b"], *LIMIT)
    assert out.returncode == 0, out.stderr
    total = next(ln.split()[1] for ln in out.stdout.splitlines() if ln.startswith("Mem:"))
    assert total == str(256 << 20)


@pytest.mark.real
def test_no_allow_other_keeps_non_root_readers_out(mp):
    out = guestfs_run(mp, [*NOBODY, "head", "-1", "/proc/meminfo"],
                      *LIMIT, "--no-allow-other")
    assert out.returncode != 0
    assert "Permission denied" in out.stderr


@pytest.mark.real
def test_without_cap_setpcap_run_refuses_to_start_the_app_with_cap_sys_admin(mp, tmp_path):
    """A root app would get CAP_SYS_ADMIN back from the bounding set at exec: no app then,
    one line saying what to do."""
    require_fuse()
    marker = tmp_path / "app-ran"
    no_setpcap = ["setpriv", "--bounding-set", "-setpcap"]
    try:
        out = subprocess.run([*no_setpcap, GUESTFS, "run", "--mountpoint", str(mp), "--",
                              "touch", str(marker)], capture_output=True, text=True, timeout=120)
    finally:
        force_unmount(str(mp))
    assert out.returncode == 127
    errors = [ln for ln in out.stderr.splitlines() if ln.startswith("guestfs run:")]
    assert len(errors) == 1 and "CAP_SETPCAP" in errors[0] and "--keep-caps" in errors[0]
    assert "Traceback" not in out.stderr
    assert not marker.exists()
