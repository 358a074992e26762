"""What a user who gets something wrong reads: the real CLI, as root and as nobody, given a
bad path, a missing file, a directory it may not use, a busy mount point or a bad value.
Each failure is one line on stderr naming the cause and the fix, never Python's own text
("[Errno 2] No such file or directory: '/x'") or a traceback; exit status 1 for a
failure found at run time, 127 for a CMD that cannot be executed (as a shell's)."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from guestfs.cli import explain
from guestfs.cli import main as cli
from guestfs.system import sysmount
from tests.support.fusemount import force_unmount, require_fuse

pytestmark = pytest.mark.real
NOBODY = 65534
MAX_SOCKET_PATH = 107   # sockaddr_un.sun_path is 108 bytes with its terminating NUL
REPO = Path(__file__).resolve().parents[2]


def guestfs(*argv: str, stdin: str = "", timeout: float = 60
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "guestfs", *argv], input=stdin,
                          capture_output=True, text=True, timeout=timeout)


def guestfs_as_nobody(*argv: str) -> subprocess.CompletedProcess[str]:
    """As uid 65534, with Debian's python3 and this checkout's packages on the path (the
    venv's interpreter lives under /root, which nobody may not enter)."""
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": os.pathsep.join(
        [str(REPO), *[p for p in sys.path if p.endswith("site-packages")]])}
    return subprocess.run(["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY),
                           "--clear-groups", "/usr/bin/python3", "-B", "-m", "guestfs",
                           *argv], capture_output=True, text=True, timeout=60, env=env,
                          cwd="/", stdin=subprocess.DEVNULL)


def error_line(out: subprocess.CompletedProcess[str], code: int, *words: str) -> str:
    assert "Traceback" not in out.stderr, out.stderr
    assert "[Errno" not in out.stderr, out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert out.returncode == code, (out.returncode, out.stderr)
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory every user may enter (pytest's tmp_path is under a 0700 directory of
    root's), removed at the end."""
    d = Path(tempfile.mkdtemp(prefix="guestfs-errlines-"))
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def root_only(open_dir: Path) -> Path:
    d = open_dir / "rootonly"
    d.mkdir(mode=0o700)
    return d


def require_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("the case is root's (it writes where only root may)")


# --------------------------------------------------------------------- explain and show

def test_explain_mount_on_a_directory_no_daemon_serves(tmp_path):
    out = guestfs("explain", "--mount", str(tmp_path))
    error_line(out, 1, f"--mount {tmp_path}", "no guestfs daemon serves it",
               "give the mount point of a running guestfs mount")


def test_a_pid_that_exited_is_named_once(tmp_path):
    gone = subprocess.Popen(["true"])
    gone.wait()
    out = guestfs("explain", "--pid", str(gone.pid))
    line = error_line(out, 1, f"pid {gone.pid}: no such process", "has it exited?")
    assert line.count(f"/proc/{gone.pid}/cgroup") == 1, line


def test_show_of_a_file_not_served_is_one_usage_line():
    """It printed the served files one a line: thirteen lines for one mistake."""
    out = guestfs("show", "/proc/vmstat")
    line = error_line(out, 2, "show: /proc/vmstat: not a served file; give one of")
    assert "/proc/meminfo, " in line and line.endswith("/sys/devices/system/cpu/present")


@pytest.mark.parametrize("pid", ["0", "-5"])
def test_attach_pid_that_cannot_be_one_is_a_usage_error(pid):
    """It was taken, and failed as "cannot open its mount namespace: No such file"."""
    out = guestfs("attach", "--pid", pid)
    error_line(out, 2, "argument --pid: not a process id", f"'{pid}'")


def test_a_root_without_meminfo_names_the_file(tmp_path):
    (tmp_path / "proc" / "self").mkdir(parents=True)
    (tmp_path / "proc" / "self" / "cgroup").write_text("0::/\n")
    out = guestfs("show", "/proc/meminfo", "--root", str(tmp_path))
    error_line(out, 1, "/proc/meminfo: No such file or directory")


def test_a_root_this_user_may_not_enter_is_not_called_empty(root_only):
    """It said "no proc directory there" of a directory it could not look into."""
    out = guestfs_as_nobody("explain", "--root", str(root_only))
    error_line(out, 1, f"--root {root_only}: cannot look into it (Permission denied)")


def test_a_limits_dir_that_is_a_file_is_an_error(tmp_path):
    """It said "does not exist; ignored" and served no limit."""
    (tmp_path / "podinfo").write_text("512Mi\n")
    out = guestfs("show", "/proc/meminfo", "--limits-dir", str(tmp_path / "podinfo"))
    error_line(out, 1, f"{tmp_path}/podinfo: not a directory")
    assert out.stdout == ""


def test_a_limits_dir_this_user_may_not_search_is_an_error(root_only):
    """Its files looked absent, and the limit in them was silently lost."""
    (root_only / "limits.memory").write_text("536870912\n")
    out = guestfs_as_nobody("show", "/proc/meminfo", "--limits-dir", str(root_only))
    error_line(out, 1, f"{root_only}/limits.memory", "Permission denied")
    assert out.stdout == ""


# ------------------------------------------------------------------------ mount and run

def test_mount_on_a_regular_file_is_refused(tmp_path):
    """libfuse mounted over the file (mount(2) said ENOTDIR, logged with its [Errno])."""
    require_fuse()
    f = tmp_path / "afile"
    f.write_text("")
    try:
        out = guestfs("mount", str(f), timeout=30)
    finally:
        force_unmount(str(f))
    error_line(out, 1, f"{f} is not a directory", "give a directory")


def test_mount_ready_fd_not_open_says_what_to_give(tmp_path):
    require_fuse()
    try:
        out = guestfs("mount", str(tmp_path / "mnt"), "--ready-fd", "99")
    finally:
        force_unmount(str(tmp_path / "mnt"))
    error_line(out, 1, "--ready-fd 99: Bad file descriptor", "open for writing")


@contextlib.contextmanager
def tmpfs_at(path: Path) -> Iterator[Path]:
    path.mkdir()
    sysmount.mount("tmpfs", str(path), "tmpfs", 0, "size=1m")
    try:
        yield path
    finally:
        force_unmount(str(path))


def test_run_on_a_regular_file_is_one_line(tmp_path):
    """run waited for a daemon that had mounted over the file, for good."""
    require_fuse()
    f = tmp_path / "afile"
    f.write_text("")
    try:
        out = guestfs("run", "--mountpoint", str(f), "--", "true", timeout=30)
    finally:
        force_unmount(str(f))
    error_line(out, 1, f"run: {f} is not a directory")


def test_run_on_another_filesystems_mount_is_one_line(tmp_path):
    """The daemon's refusal and run's "did not come up" were two lines."""
    require_fuse()
    with tmpfs_at(tmp_path / "t") as mp:
        out = guestfs("run", "--mountpoint", str(mp), "--", "true")
    error_line(out, 1, f"{mp} is already a mount point (tmpfs)",
               "give a directory nothing is mounted on")


def test_run_with_a_missing_cgroup_is_one_line(tmp_path):
    require_fuse()
    try:
        out = guestfs("run", "--mountpoint", str(tmp_path / "mnt"), "--cgroup",
                      "/no/such/cgroup", "--", "true")
    finally:
        force_unmount(str(tmp_path / "mnt"))
    error_line(out, 1, "run: --cgroup /no/such/cgroup: no such cgroup")


@pytest.mark.parametrize("what", ["missing", "not executable"])
def test_a_cmd_run_cannot_execute_is_one_line(tmp_path, what):
    require_fuse()
    cmd = tmp_path / "cmd"
    if what == "not executable":
        cmd.write_text("#!/bin/sh\n")
        cmd.chmod(0o644)
    try:
        out = guestfs("run", "--mountpoint", str(tmp_path / "mnt"), "--", str(cmd))
    finally:
        force_unmount(str(tmp_path / "mnt"))
    why = "No such file or directory" if what == "missing" else "Permission denied"
    error_line(out, 127, f"guestfs run: {cmd}: {why}", "CMD must be a program")


# ---------------------------------------------------------------- seccomp agent, guard

def long_dir(base: Path) -> Path:
    return base / ("d" * max(1, MAX_SOCKET_PATH + 1 - len(str(base))))


def test_an_agent_socket_path_too_long_names_the_limit(tmp_path):
    sock = long_dir(tmp_path) / "agent.sock"
    out = guestfs("seccomp-agent", "--socket", str(sock), "--source", str(tmp_path))
    error_line(out, 1, f"{sock}:", f"longer than the {MAX_SOCKET_PATH}")
    assert not sock.parent.exists()


def test_a_guard_directory_too_long_names_the_limit(tmp_path):
    d = long_dir(tmp_path)
    out = guestfs("seccomp-guard", "--dir", str(d))
    error_line(out, 1, f"{d}/guard.sock:", f"longer than the {MAX_SOCKET_PATH}")


@pytest.mark.parametrize("command", ["seccomp-agent", "seccomp-guard"])
def test_a_socket_directory_nobody_cannot_make(root_only, command):
    d = root_only / "sock"
    argv = ["--socket", str(d / "agent.sock")] if command == "seccomp-agent" else \
        ["--dir", str(d)]
    out = guestfs_as_nobody(command, *argv)
    error_line(out, 1, f"{command}: {d}: cannot make it (Permission denied)")


@pytest.mark.parametrize("shared", ["sticky", "holds other files"])
def test_the_agent_never_makes_a_shared_directory_private(open_dir, shared):
    """--socket /tmp/agent.sock made /tmp 0700 for root alone."""
    require_root()
    d = open_dir / "shared"
    d.mkdir()
    if shared == "sticky":
        os.chmod(d, 0o1777)
    else:
        os.chmod(d, 0o755)
        (d / "someone-elses").write_text("")
    before = stat.S_IMODE(os.stat(d).st_mode)
    out = guestfs("seccomp-agent", "--socket", str(d / "agent.sock"), "--source",
                  str(open_dir), timeout=30)
    assert stat.S_IMODE(os.stat(d).st_mode) == before
    error_line(out, 1, f"{d} ", "give the socket a directory of its own")


# ---------------------------------------------------------------------------- oci-hook

def test_oci_hook_with_nothing_on_stdin_says_what_it_expects():
    out = guestfs("oci-hook", "--strict")
    error_line(out, 1, "stdin is empty", "createContainer hook")


def test_oci_hook_bundle_config_that_is_not_json_says_where(tmp_path):
    (tmp_path / "config.json").write_text("{oops")
    state = f'{{"ociVersion": "1.0.2", "id": "c1", "pid": {os.getpid()}, ' \
            f'"bundle": "{tmp_path}"}}'
    out = guestfs("oci-hook", "--strict", stdin=state)
    error_line(out, 1, f"{tmp_path}/config.json: not JSON at line 1 column 2")


def test_oci_hook_log_file_failure_names_the_option_once(tmp_path):
    log = tmp_path / "missing" / "hook.log"
    out = guestfs("oci-hook", "--log-file", str(log), stdin="{}")
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    hook_line, log_line = out.stderr.splitlines()     # the hook's reason, then the log's
    assert "no bundle" in hook_line, hook_line
    assert log_line.count("--log-file") == 1 and f"{log.parent} does not exist" in log_line, \
        log_line


# ------------------------------------------------------------------ the CLI's last word

def test_an_os_error_no_command_caught_is_still_one_line(monkeypatch, capsys):
    def fails(_args: object) -> int:
        raise FileNotFoundError(2, "No such file or directory", "/x/y")

    monkeypatch.setattr(explain, "command", fails)
    assert cli.main(["explain"]) == 1
    assert capsys.readouterr().err == "guestfs: explain: /x/y: No such file or directory\n"
