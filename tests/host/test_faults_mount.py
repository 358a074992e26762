"""Hostile surroundings of `guestfs mount` on the real kernel: a daemon stopped with
SIGSTOP, mount points with characters the mount table escapes, and pid/log files planted
as symlinks by another user."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from guestfs.daemon.mountpoint import MountUnresponsive, is_guestfs_mount, mount_entry, probe_mount
from tests.support.fusemount import force_unmount, mounted, require_fuse, wait_for
from tests.support.paths import REPO

pytestmark = pytest.mark.real
NOBODY = 65534
GUESTFS = [sys.executable, "-m", "guestfs"]


def guestfs(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    # A hang shows up as TimeoutExpired: the test fails instead of blocking the suite.
    return subprocess.run([*GUESTFS, *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def one_line_error(out: subprocess.CompletedProcess[str], *words: str) -> str:
    assert out.returncode != 0, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def stop_daemon_at(mp: str, pid_file: Path) -> None:
    """SIGTERM the daemon whose pid is in ``pid_file``; always unmount."""
    with contextlib.suppress(OSError, ValueError):
        pid = int(pid_file.read_text())
        os.kill(pid, signal.SIGCONT)
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: mount_entry(mp) is None, 10)
    force_unmount(mp)


@pytest.fixture
def stopped_daemon(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """(mount point, daemon pid): a live guestfs mount whose daemon is stopped with
    SIGSTOP (resumed at the end, whatever happens)."""
    mp = str(tmp_path / "mnt")
    with mounted(mp) as proc:
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            yield mp, proc.pid
        finally:
            os.kill(proc.pid, signal.SIGCONT)


def test_probes_of_a_stopped_daemon_end_with_a_clear_error(stopped_daemon):
    mp, _ = stopped_daemon
    with pytest.raises(MountUnresponsive, match="does not answer"):
        is_guestfs_mount(mp)
    with pytest.raises(MountUnresponsive):
        probe_mount(mp, "/proc/meminfo", timeout=1.0)
    # The mount table alone still names it: no FUSE request is needed for that.
    entry = mount_entry(mp)
    assert entry is not None and entry.fstype == "fuse.guestfs"


# A second mount is refused by the mount lock before the mount point is even looked at;
# run, which may reuse a mount, probes it and gives up after 5 s.
@pytest.mark.parametrize("command,words", [
    (["mount", "{mp}", "--daemon"], ["already served by another guestfs mount"]),
    (["mount", "{mp}"], ["already served by another guestfs mount"]),
    (["run", "--mountpoint", "{mp}", "--", "true"], ["does not answer"]),
])
def test_commands_on_a_stopped_daemon_fail_instead_of_hanging(stopped_daemon, command, words):
    mp, _ = stopped_daemon
    out = guestfs(*[w.format(mp=mp) for w in command])
    one_line_error(out, mp, *words)


def test_a_resumed_daemon_serves_again(stopped_daemon):
    mp, pid = stopped_daemon
    with pytest.raises(MountUnresponsive):
        is_guestfs_mount(mp)
    os.kill(pid, signal.SIGCONT)
    assert is_guestfs_mount(mp)
    with open(f"{mp}/proc/meminfo") as f:
        assert f.readline().startswith("MemTotal:")


# Each is escaped in /proc/self/mountinfo: \040 \011 \012 \134.
ODD_NAMES = ["m 1", "m\t2", "m\n3", "m\\4", " lead and trail "]


@pytest.mark.parametrize("name", ODD_NAMES)
def test_daemon_mode_on_a_mountpoint_the_mount_table_escapes(tmp_path, name):
    require_fuse()
    mp = str(tmp_path / name)
    pid_file = tmp_path / "pid"
    try:
        out = guestfs("mount", mp, "--daemon", "--pid-file", str(pid_file))
        assert out.returncode == 0, out.stderr
        assert is_guestfs_mount(mp)
        with open(f"{mp}/proc/meminfo") as f:
            assert f.readline().startswith("MemTotal:")
        # A second mount there is refused, naming the running guestfs.
        again = guestfs("mount", mp)
        one_line_error(again, "already served by another guestfs mount")
    finally:
        stop_daemon_at(mp, pid_file)
    assert mount_entry(mp) is None


# --- pid and log files -------------------------------------------------------------------

@pytest.fixture
def planted(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(a root-only 0600 file, a sticky world-writable directory holding nothing yet)."""
    secret = tmp_path / "secret"
    secret.write_text("root only\n")
    secret.chmod(0o600)
    shared = Path(tempfile.mkdtemp(prefix="guestfs-sticky-", dir="/tmp"))
    shared.chmod(0o1777)
    try:
        yield secret, shared
    finally:
        shutil.rmtree(shared)


def as_nobody(*argv: str) -> None:
    subprocess.run(["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY),
                    "--clear-groups", *argv], check=True, timeout=30)


@pytest.mark.parametrize("option", ["--pid-file", "--log-file"])
@pytest.mark.parametrize("where", ["sticky", "nobody's own directory"])
def test_a_symlink_planted_by_nobody_is_not_followed(tmp_path, planted, option, where):
    require_fuse()
    secret, shared = planted
    directory = shared
    if where != "sticky":
        # A directory the app's user owns: fs.protected_symlinks does not cover it.
        directory = shared / "app"
        directory.mkdir()
        os.chown(directory, NOBODY, NOBODY)
    link = directory / "guestfs.file"
    as_nobody("ln", "-s", str(secret), str(link))
    mp = str(tmp_path / "mnt")
    try:
        out = guestfs("mount", mp, "--daemon", option, str(link))
        one_line_error(out, option, str(link), "symbolic link")
        assert mount_entry(mp) is None
    finally:
        force_unmount(mp)
    assert secret.read_text() == "root only\n"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600


@pytest.mark.parametrize("option", ["--pid-file", "--log-file"])
def test_a_file_of_another_user_or_a_hard_link_is_refused(tmp_path, planted, option):
    require_fuse()
    secret, shared = planted
    theirs = shared / "theirs"
    as_nobody("sh", "-c", f"echo nobody > {theirs}")
    hard = tmp_path / "hard"
    os.link(secret, hard)
    mp = str(tmp_path / "mnt")
    try:
        one_line_error(guestfs("mount", mp, "--daemon", option, str(theirs)),
                       option, "owned by uid 65534")
        one_line_error(guestfs("mount", mp, "--daemon", option, str(hard)),
                       option, "hard links")
        fifo = tmp_path / "fifo"
        os.mkfifo(fifo)
        one_line_error(guestfs("mount", mp, "--daemon", option, str(fifo)), option)
        assert mount_entry(mp) is None
    finally:
        force_unmount(mp)
    assert theirs.read_text() == "nobody\n" and secret.read_text() == "root only\n"


def test_pid_file_in_a_missing_directory_is_a_one_line_error(tmp_path):
    require_fuse()
    mp = str(tmp_path / "mnt")
    try:
        out = guestfs("mount", mp, "--daemon", "--pid-file", str(tmp_path / "no/such/pid"))
        one_line_error(out, "--pid-file", "does not exist")
        assert mount_entry(mp) is None
    finally:
        force_unmount(mp)


def test_pid_and_log_files_are_created_and_an_old_pid_file_of_ours_reused(tmp_path):
    require_fuse()
    mp = str(tmp_path / "mnt")
    pid_file, log_file = tmp_path / "pid", tmp_path / "log"
    pid_file.write_text("99999999\nleftover of an earlier daemon\n")
    try:
        out = guestfs("mount", mp, "--daemon", "--pid-file", str(pid_file),
                      "--log-file", str(log_file))
        assert out.returncode == 0, out.stderr
        pid = int(pid_file.read_text())
        assert pid_file.read_text() == f"{pid}\n"
        assert "serving" in log_file.read_text()
    finally:
        stop_daemon_at(mp, pid_file)
    assert wait_for(lambda: not pid_file.exists(), 10)


def test_run_on_a_mountpoint_with_a_space(tmp_path):
    require_fuse()
    mp = str(tmp_path / "run mnt")
    try:
        out = guestfs("run", "--mountpoint", mp, "--memory-limit", "256Mi", "--",
                      "head", "-1", "/proc/meminfo")
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["MemTotal:", str(256 * 1024), "kB"]
    finally:
        force_unmount(mp)
    assert mount_entry(mp) is None   # the daemon run started is gone with it


def test_a_mountpoint_planted_as_a_symlink_is_refused(tmp_path, planted):
    require_fuse()
    _, shared = planted
    target = tmp_path / "victim"
    target.mkdir()
    (target / "keep").write_text("x")
    link = shared / "mnt"
    as_nobody("ln", "-s", str(target), str(link))
    try:
        for command in (["mount", str(link), "--daemon"],
                        ["run", "--mountpoint", str(link), "--", "true"]):
            one_line_error(guestfs(*command), str(link), "symbolic link")
        assert mount_entry(str(target)) is None
        assert os.listdir(target) == ["keep"]
    finally:
        force_unmount(str(target))


@pytest.mark.parametrize("option", ["--pid-file", "--log-file"])
def test_a_directory_symlink_planted_by_nobody_is_refused(tmp_path, planted, option):
    """/tmp/x/guestfs.pid where nobody made /tmp/x a link to a directory of root's that
    holds a root file of that name (owned by us, one link: it would pass the file check)."""
    require_fuse()
    _, shared = planted
    rootdir = tmp_path / "rootdir"
    rootdir.mkdir()
    victim = rootdir / "guestfs.pid"
    victim.write_text("root only\n")
    victim.chmod(0o600)
    as_nobody("ln", "-s", str(rootdir), str(shared / "x"))
    mp = str(tmp_path / "mnt")
    try:
        out = guestfs("mount", mp, "--daemon", option, str(shared / "x" / "guestfs.pid"))
        one_line_error(out, option, "owned by uid 65534")
        assert mount_entry(mp) is None
    finally:
        force_unmount(mp)
    assert victim.read_text() == "root only\n"


def test_a_cgroup_that_names_nothing_refuses_to_mount(tmp_path):
    """Served anyway, a pinned view of a missing cgroup would be the node's MemTotal with
    no fallback counted."""
    mp = tmp_path / "mnt"
    mp.mkdir()
    out = guestfs("mount", str(mp), "--cgroup", "/no/such/cgroup-guestfs-test")
    one_line_error(out, "--cgroup /no/such/cgroup-guestfs-test", "no such cgroup")
    assert not os.path.ismount(mp)
    # The daemon's own cgroup exists in every hierarchy: accepted (checked, not mounted).
    from guestfs.sources.host_root import HostRoot
    from guestfs.sources.proc_cgroup import parse_proc_cgroup
    from guestfs.sources.snapshot import pinned_cgroup_dirs

    own = parse_proc_cgroup(Path("/proc/self/cgroup").read_text())
    assert any(pinned_cgroup_dirs(HostRoot(), m.path) for m in own)


def test_a_mountpoint_whose_parent_is_missing_is_refused_not_made(tmp_path):
    """A typo must not make a tree of root's directories: only a missing last component
    is made, as mkdir(1) without -p would."""
    mp = tmp_path / "no" / "such" / "mnt"
    out = guestfs("mount", str(mp))
    one_line_error(out, str(tmp_path / "no" / "such"), "does not exist")
    assert not (tmp_path / "no").exists()


def test_a_seccomp_agent_socket_in_a_missing_directory_is_refused(tmp_path):
    out = guestfs("seccomp-agent", "--socket", str(tmp_path / "a" / "b" / "agent.sock"),
                  "--source", str(tmp_path), timeout=30)
    one_line_error(out, "does not exist")
    assert not (tmp_path / "a").exists()


def test_a_fuse_device_this_user_may_not_open_is_named_with_its_mode(tmp_path):
    """What a user without access to /dev/fuse gets: its mode and owner, and the fix, not a
    lock directory's complaint or libfuse's "fuse: device not found" (run as nobody with
    Debian's python3 and this checkout's venv packages on the path)."""
    import stat as stat_mod

    st = os.stat("/dev/fuse")
    if st.st_mode & 0o006 == 0o006:
        pytest.skip("/dev/fuse is open to every user here: nothing to refuse")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": os.pathsep.join(
        [str(REPO),
         *[p for p in sys.path if p.endswith("site-packages")]])}
    os.chmod(tmp_path, 0o777)
    out = subprocess.run(["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY),
                          "--clear-groups", "/usr/bin/python3", "-B",
                          "-m", "guestfs", "mount", str(tmp_path / "m")],
                         capture_output=True, text=True, timeout=60, env=env, cwd="/")
    line = one_line_error(out, "/dev/fuse cannot be opened by uid 65534",
                          stat_mod.filemode(st.st_mode))
    assert "run as root" in line
