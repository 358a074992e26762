"""`guestfs mount`: a real FUSE mount on this kernel."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from guestfs.daemon.file_table import SERVED_FILES
from guestfs.daemon.mountpoint import is_guestfs_mount
from guestfs.render.served import PRESSURE_FILES
from guestfs.system import sysmount
from tests.support.fusemount import force_unmount, mounted, require_fuse, wait_for

pytestmark = pytest.mark.real


@pytest.fixture
def mp(tmp_path):
    path = str(tmp_path / "mnt")
    yield path
    force_unmount(path)


def show(path: str) -> str:
    return subprocess.run([sys.executable, "-m", "guestfs", "show", path], check=True,
                          capture_output=True, text=True).stdout


def test_layout_types_and_content(mp, tmp_path):
    with mounted(mp, log=str(tmp_path / "log")):
        # LXCFS's layout, plus the daemon's status for `explain --mount`.
        assert sorted(os.listdir(mp)) == [".guestfs-status", "proc", "sys"]
        status = json.loads(Path(mp, ".guestfs-status").read_text())
        assert status["fallback_total"] == 0 and status["fallbacks"] == {}
        entries = {e.name: e for e in os.scandir(f"{mp}/proc")}
        assert entries["pressure"].is_dir() and entries["meminfo"].is_file()
        assert {e.name for e in os.scandir(f"{mp}/sys/devices/system/cpu")} == {
            "online", "possible", "present"}
        for f in SERVED_FILES:
            st = os.stat(mp + f)
            # The engine's pressure files take PSI triggers (test_psi_triggers.py).
            modes = (0o444, 0o666) if f in PRESSURE_FILES else (0o444,)
            assert stat.S_IMODE(st.st_mode) in modes and stat.S_ISREG(st.st_mode), f
        # Each file's size is its rendering's length in whole pages (sendfile and mmap
        # stop at it); a read returns everything (direct_io).
        for f in ("/proc/cpuinfo", "/proc/meminfo", "/proc/stat", "/proc/uptime"):
            size = os.stat(mp + f).st_size
            assert size % 4096 == 0 and 0 <= size - len(show(f).encode()) < 4096, (f, size)
        for f in ("/proc/cpuinfo", "/sys/devices/system/cpu/online", "/proc/swaps"):
            with open(mp + f) as fh:
                assert fh.read() == show(f)
        with open(f"{mp}/proc/meminfo") as fh:
            assert fh.readline() == show("/proc/meminfo").splitlines(True)[0]
        with open(tmp_path / "log") as fh:
            log = fh.read()
        # auto: guestfs's own engine, named as such in the startup line.
        assert re.search(r"serving .* with guestfs's FUSE engine \(no libfuse", log), log
        # The kernel's FUSE honours direct_io: no sized mode here.
        assert "stops reading at the file size" not in log


def touch(path: str, mode: str) -> None:
    with open(path, mode):
        pass


def test_read_only(mp):
    with mounted(mp):
        f = f"{mp}/proc/meminfo"
        for attempt in (lambda: touch(f, "w"), lambda: touch(f, "r+"),
                        lambda: touch(f"{mp}/proc/new", "w"), lambda: os.chmod(f, 0o666),
                        lambda: os.truncate(f, 0), lambda: os.mkdir(f"{mp}/proc/x"),
                        lambda: os.unlink(f), lambda: os.rename(f, f"{mp}/proc/y"),
                        lambda: os.utime(f, (0, 0))):
            with pytest.raises(OSError) as e:
                attempt()
            assert e.value.errno in (errno.EROFS, errno.EACCES, errno.EPERM)
        assert not os.path.exists(f"{mp}/proc/new")
        with pytest.raises(FileNotFoundError):
            touch(f"{mp}/proc/nosuchfile", "r")


def test_an_open_file_is_one_rendering(mp):
    """Later offsets of one open come from the rendering made at offset 0."""
    with mounted(mp, "--cache-ttl", "0"):
        fd = os.open(f"{mp}/proc/uptime", os.O_RDONLY)
        try:
            head = os.read(fd, 3)
            opened_at = float(Path("/proc/uptime").read_text().split()[0])
            time.sleep(1.2)
            rest = b""
            while chunk := os.read(fd, 4):
                rest += chunk
        finally:
            os.close(fd)
        text = (head + rest).decode()
        assert re.fullmatch(r"\d+\.\d\d \d+\.\d\d\n", text), text
        assert float(text.split()[0]) <= opened_at + 0.1  # not re-rendered 1.2 s later


def test_sigterm_and_sigint_unmount_cleanly(mp):
    for sig in (signal.SIGTERM, signal.SIGINT):
        with mounted(mp) as proc:
            proc.send_signal(sig)
            assert proc.wait(10) == 0
            assert not os.path.ismount(mp) and not sysmount.is_stale_mount(mp)


def test_stale_mount_from_a_killed_daemon_is_replaced(mp, tmp_path):
    with mounted(mp) as proc:
        proc.kill()
        proc.wait()
        assert wait_for(lambda: sysmount.is_stale_mount(mp), 5)
        # "Transport endpoint is not connected": the next daemon detaches and replaces it.
        with mounted(mp, log=str(tmp_path / "log2")):
            assert is_guestfs_mount(mp)
            with open(f"{mp}/proc/meminfo") as f:
                assert f.readline().startswith("MemTotal:")
        assert "stale FUSE mount" in (tmp_path / "log2").read_text()


def test_daemon_mode_and_pid_file(mp, tmp_path):
    require_fuse()
    pidfile = tmp_path / "pid"
    out = subprocess.run([sys.executable, "-m", "guestfs", "mount", mp, "--daemon",
                          "--pid-file", str(pidfile), "--log-file", str(tmp_path / "log")],
                         timeout=30)
    try:
        assert out.returncode == 0 and is_guestfs_mount(mp)
        assert wait_for(pidfile.exists, 5)
        pid = int(pidfile.read_text())
        os.kill(pid, signal.SIGTERM)
        assert wait_for(lambda: not os.path.ismount(mp), 10)
        assert wait_for(lambda: not pidfile.exists(), 5)
    finally:
        force_unmount(mp)


def test_never_reads_through_its_own_mount(tmp_path):
    """The daemon's own mount namespace has its files bound over /proc (the deployment
    where guestfs runs inside the container it serves); then it is killed and restarted
    under those binds. No read may hang or fail."""
    require_fuse()
    mp = tmp_path / "mnt"
    script = textwrap.dedent(f"""\
        set -e
        mp={mp}
        start() {{ {sys.executable} -m guestfs mount $mp 2>>{tmp_path}/log & pid=$!
                   for i in $(seq 200); do [ -r $mp/proc/meminfo ] && return; sleep 0.05; done
                   echo "no mount"; exit 1; }}
        start
        for f in {' '.join(f for f in SERVED_FILES if os.path.exists(f))}; do
          mount --bind $mp$f $f
        done
        free -m | grep -q '^Mem:'
        cat /proc/stat /proc/cpuinfo /proc/uptime /proc/loadavg > /dev/null
        {sys.executable} -c 'import psutil; psutil.virtual_memory(); psutil.cpu_times()'
        kill -9 $pid; wait $pid || true
        umount -l $mp
        start
        head -1 $mp/proc/meminfo | grep -q MemTotal
        cat $mp/proc/stat $mp/proc/uptime > /dev/null
        kill $pid; wait $pid
        echo done
        """)
    out = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                         capture_output=True, text=True, timeout=90)
    assert out.returncode == 0 and out.stdout.strip().endswith("done"), \
        out.stdout + out.stderr + (tmp_path / "log").read_text()
