"""guestfs's own FUSE engine (guestfs/fuse/) on this kernel: `guestfs mount
--fuse-binding guestfs` serving the daemon's operations, and the engine used directly
(mountfd + Session) by tests/support/engine_serve.py, as root and as an unprivileged user
through fusermount3."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from guestfs.daemon.mountpoint import is_guestfs_mount
from guestfs.fuse import mountfd
from guestfs.render.served import PRESSURE_FILES, SERVED_FILES
from guestfs.system import sysmount
from tests.host.test_faults_lookup_memory import rss_kb, stat_missing
from tests.support.fusemount import force_unmount, mounted, require_fuse, wait_for
from tests.support.paths import REPO

pytestmark = pytest.mark.real
ENGINE = ("--fuse-binding", "guestfs")
NOBODY = 65534
# The files whose bytes do not move between two reads a moment apart.
STABLE = ("/sys/devices/system/cpu/online", "/sys/devices/system/cpu/possible",
          "/sys/devices/system/cpu/present", "/proc/swaps")


@pytest.fixture
def mp(tmp_path):
    path = str(tmp_path / "mnt")
    yield path
    force_unmount(path)


def show(path: str, *args: str) -> str:
    return subprocess.run([sys.executable, "-m", "guestfs", "show", path, *args],
                          check=True, capture_output=True, text=True).stdout


def labels(text: str) -> list[str]:
    """A file's shape: each line with its numbers, and the padding before them, taken out
    (meminfo pads a value to a width: one more digit, one space fewer)."""
    return [re.sub(r"\s*\d+", " N", line) for line in text.splitlines()]


def read_all(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


# ------------------------------------------------------------------ guestfs mount

def test_every_file_reads_through_the_engine(mp, tmp_path):
    log = tmp_path / "log"
    with mounted(mp, *ENGINE, log=str(log)):
        assert sorted(os.listdir(mp)) == [".guestfs-status", "proc", "sys"]
        assert {e.name for e in os.scandir(f"{mp}/sys/devices/system/cpu")} == {
            "online", "possible", "present"}
        for f in SERVED_FILES:
            st = os.stat(mp + f)
            # The pressure files take PSI triggers here (tests/host/test_psi_triggers.py).
            mode = 0o666 if f in PRESSURE_FILES else 0o444
            assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == mode, f
            data = read_all(mp + f)
            cat = subprocess.run(["cat", mp + f], capture_output=True, check=True).stdout
            # Per-caller sizes: the rendering in whole pages, at least one.
            assert st.st_size % 4096 == 0 and 0 <= st.st_size - len(data) < 4096, (f, st)
            assert labels(cat.decode()) == labels(data.decode()) == labels(show(f)), f
        for f in STABLE:
            assert read_all(mp + f).decode() == show(f)
        status = json.loads(read_all(f"{mp}/.guestfs-status"))
        assert status["fallback_total"] == 0
    assert "with guestfs's FUSE engine (no libfuse" in log.read_text()


def test_free_reads_the_served_meminfo(mp):
    with mounted(mp, *ENGINE):
        total_kb = int(read_all(f"{mp}/proc/meminfo").split(b"\n")[0].split()[1])
        out = subprocess.run(
            ["unshare", "-m", "--propagation", "private", "sh", "-c",
             f"mount --bind {mp}/proc/meminfo /proc/meminfo && free -b"],
            capture_output=True, text=True, check=True).stdout
        mem = next(line.split() for line in out.splitlines() if line.startswith("Mem:"))
        assert int(mem[1]) == total_kb * 1024


def test_statfs_and_read_only(mp):
    with mounted(mp, *ENGINE):
        st = os.statvfs(mp)
        assert (st.f_bsize, st.f_frsize, st.f_namemax) == (4096, 4096, 255)
        # Writable for the PSI triggers' sake (the pressure files' writes reach the
        # daemon); every other change is refused by the daemon itself.
        assert not st.f_flag & os.ST_RDONLY
        f = f"{mp}/proc/meminfo"
        for attempt in (lambda: os.open(f, os.O_WRONLY), lambda: os.open(f, os.O_RDWR),
                        lambda: os.open(f"{mp}/proc/new", os.O_WRONLY | os.O_CREAT),
                        lambda: os.chmod(f, 0o666),
                        lambda: os.truncate(f, 0), lambda: os.mkdir(f"{mp}/proc/x"),
                        lambda: os.unlink(f), lambda: os.rmdir(f"{mp}/proc"),
                        lambda: os.rename(f, f"{mp}/proc/y"), lambda: os.utime(f, (0, 0)),
                        lambda: os.symlink("x", f"{mp}/l"), lambda: os.link(f, f"{mp}/h"),
                        lambda: os.setxattr(f, "user.x", b"1")):
            with pytest.raises(OSError) as e:
                attempt()
            assert e.value.errno == errno.EROFS, attempt
        with pytest.raises(FileNotFoundError):
            os.stat(f"{mp}/proc/nosuchfile")
        with pytest.raises(NotADirectoryError):
            os.listdir(f)


def test_failed_lookups_leave_no_memory_behind(mp):
    with mounted(mp, *ENGINE) as daemon:
        stat_missing(f"{mp}/proc", 0, 5_000)
        before = rss_kb(daemon.pid)
        stat_missing(f"{mp}/proc", 5_000, 100_000)
        grown = rss_kb(daemon.pid) - before
        assert grown <= 5 * 1024, f"10^5 failed lookups grew the daemon by {grown} kB"


@contextlib.contextmanager
def two_mounts(tmp: Path, *args: str) -> Iterator[tuple[str, str]]:
    """The same view served by mfusepy (libfuse3) and by the engine, side by side."""
    a, b = str(tmp / "mfusepy"), str(tmp / "engine")
    try:
        with mounted(a, "--fuse-binding", "mfusepy3", *args), mounted(b, *ENGINE, *args):
            yield a, b
    finally:
        force_unmount(a)
        force_unmount(b)


def test_concurrent_readers_get_what_mfusepy_gives(tmp_path):
    """4 threads x 2000 reads of meminfo and stat through the engine: every read is one
    whole rendering of the shape the mfusepy binding serves for the same view."""
    with two_mounts(tmp_path) as (lib, eng):
        for f in STABLE:
            assert read_all(eng + f) == read_all(lib + f)
        want = {f: labels(read_all(lib + f).decode()) for f in ("/proc/meminfo", "/proc/stat")}
        bad: list[str] = []

        def reader(f: str) -> None:
            for _ in range(2000):
                got = read_all(eng + f).decode()
                if labels(got) != want[f]:
                    bad.append(got)

        threads = [threading.Thread(target=reader, args=(f,))
                   for f in ("/proc/meminfo", "/proc/stat") * 2]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert bad == []


def test_a_fixed_view_is_served_from_the_page_cache(tmp_path):
    """--view self: no_open and exact sizes through the engine as through libfuse3; a
    thousand reads reach the daemon a handful of times."""
    with two_mounts(tmp_path, "--view", "self") as (lib, eng):
        for f in ("/proc/meminfo", "/proc/cpuinfo", "/sys/devices/system/cpu/online"):
            assert os.stat(eng + f).st_size == len(read_all(eng + f))
        def status() -> dict[str, int]:
            # The status is page-cached too: a rendering is at most 10 ms old (plus the
            # 50 ms a rendering being read may be held), as with libfuse3.
            time.sleep(0.1)
            return json.loads(read_all(f"{eng}/.guestfs-status"))["callbacks"]

        before = status()
        for _ in range(1000):
            read_all(f"{eng}/sys/devices/system/cpu/online")
        after = status()
        assert after["open"] == before["open"] == 1, (before, after)  # the ENOSYS: no_open
        assert after["read"] - before["read"] <= 10
        assert labels(read_all(eng + "/proc/meminfo").decode()) == \
            labels(read_all(lib + "/proc/meminfo").decode())


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP,
                                 signal.SIGQUIT])
def test_stop_signals_unmount_cleanly(mp, sig):
    with mounted(mp, *ENGINE) as proc:
        read_all(f"{mp}/proc/uptime")
        proc.send_signal(sig)
        assert proc.wait(10) == 0
        assert not os.path.ismount(mp) and not sysmount.is_stale_mount(mp)


def test_a_killed_daemon_leaves_enotconn_and_is_replaced(mp, tmp_path):
    with mounted(mp, *ENGINE) as proc:
        proc.kill()
        proc.wait()
        assert wait_for(lambda: sysmount.is_stale_mount(mp), 5)
        with pytest.raises(OSError) as e:
            os.stat(f"{mp}/proc/meminfo")
        assert e.value.errno == errno.ENOTCONN
        with mounted(mp, *ENGINE, log=str(tmp_path / "log2")):
            assert is_guestfs_mount(mp)
            assert read_all(f"{mp}/proc/meminfo").startswith(b"MemTotal:")
        assert "stale FUSE mount" in (tmp_path / "log2").read_text()


def test_auto_chooses_the_engine_and_libfuse_is_there_by_name(mp, tmp_path):
    with mounted(mp, log=str(tmp_path / "log")):
        read_all(f"{mp}/proc/meminfo")
    assert re.search(r"with guestfs's FUSE engine \(no libfuse", (tmp_path / "log").read_text())
    with mounted(mp, "--fuse-binding", "mfusepy3", log=str(tmp_path / "log3")):
        assert read_all(f"{mp}/proc/meminfo").startswith(b"MemTotal:")
    assert re.search(r"with mfusepy [\d.]+ \(libfuse3", (tmp_path / "log3").read_text())


# ------------------------------------------------------------------ the engine directly

# /dev/fuse is 0600 on some machines (this one): an unprivileged server is given a node
# of its own, 0666, bound over /dev/fuse inside a private mount namespace, and its
# readers join that namespace (nsenter).
PRIVATE_DEV_FUSE = (
    "set -e; d=$(mktemp -d); mount -t tmpfs -o mode=0755 tmpfs \"$d\"; "
    "mknod -m 0666 \"$d/fuse\" c 10 229; mount --bind \"$d/fuse\" /dev/fuse; "
    'exec "$@"')


@contextlib.contextmanager
def engine_serving(mp: str, *args: str, user: int | None = None) -> Iterator[
        tuple[subprocess.Popen[str], dict]]:
    require_fuse()
    os.makedirs(mp, exist_ok=True)
    argv = [sys.executable, str(REPO / "tests" / "support" / "engine_serve.py"), mp, *args]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if user is not None:
        os.chown(mp, user, user)
        argv = ["unshare", "-m", "--propagation", "private", "sh", "-c", PRIVATE_DEV_FUSE,
                "sh", "setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups",
                *argv]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env,
                            cwd=tempfile.gettempdir())
    try:
        line = proc.stdout.readline()   # type: ignore[union-attr]
        assert line, f"engine_serve.py exited with {proc.wait(5)}"
        yield proc, json.loads(line)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        force_unmount(mp)


def inside(pid: int, user: int | None, *argv: str) -> subprocess.CompletedProcess[str]:
    """``argv`` in the mount namespace of ``pid``, as ``user`` (None: root)."""
    who = [] if user is None else ["setpriv", f"--reuid={user}", f"--regid={user}",
                                   "--clear-groups"]
    return subprocess.run(["nsenter", "-t", str(pid), "-m", *who, *argv],
                          capture_output=True, text=True, check=False)


def test_engine_api_mounts_negotiates_and_serves(mp):
    with engine_serving(mp) as (proc, hello):
        neg = json.loads(hello["negotiated"])
        assert hello["via"] == "mount(2)" and neg["major"] == 7 and neg["minor"] >= 31
        if neg["kernel_minor"] >= 41:   # Linux >= 6.12 offers it; asked for, not required
            assert neg["flags"] & (1 << 40)
        assert sorted(os.listdir(mp)) == ["a", "d"]
        assert read_all(f"{mp}/a") == b"alpha\n" and read_all(f"{mp}/d/b") == b"bravo\n"
        assert os.stat(f"{mp}/a").st_size == 6
        assert os.statvfs(mp).f_namemax == 255
        entry = next(e for e in Path("/proc/self/mountinfo").read_text().splitlines()
                     if f" {mp} " in e)
        assert " ro," in entry and "fuse.guestfs-test" in entry
    assert not os.path.ismount(mp)


def test_notify_inval_inode_makes_the_kernel_read_anew(mp):
    """Page-cached with hour-long attributes, the kernel keeps serving /a's old bytes
    after the server changed them, until the server sends FUSE_NOTIFY_INVAL_INODE."""
    with engine_serving(mp, "--page-cache") as (proc, _):
        assert read_all(f"{mp}/a") == b"alpha\n"
        assert read_all(f"{mp}/a") == b"alpha\n"
        proc.send_signal(signal.SIGUSR1)
        assert json.loads(proc.stdout.readline()) == {"notified": 0}   # type: ignore[union-attr]
        assert read_all(f"{mp}/a") == b"changed, and longer\n"


def test_the_cache_holds_without_the_notification(mp):
    """The control for the test above: the same change, no notification, old bytes."""
    with engine_serving(mp, "--page-cache") as (proc, _):
        assert read_all(f"{mp}/a") == b"alpha\n"
        proc.send_signal(signal.SIGUSR2)
        assert json.loads(proc.stdout.readline()) == {"notified": None}  # type: ignore[union-attr]
        assert read_all(f"{mp}/a") == b"alpha\n"


def test_an_unprivileged_user_mounts_through_fusermount3(tmp_path):
    if shutil.which("fusermount3", path="/usr/bin:/bin") is None:
        pytest.fail("fusermount3 missing: .ci/setup installs fuse3")
    base = Path(tempfile.mkdtemp(prefix="guestfs-engine-user-"))
    os.chmod(base, 0o755)
    mp = str(base / "mnt")
    try:
        with engine_serving(mp, user=NOBODY) as (proc, hello):
            assert hello["via"].endswith("fusermount3")
            got = inside(proc.pid, NOBODY, "cat", f"{mp}/a", f"{mp}/d/b")
            assert (got.returncode, got.stdout) == (0, "alpha\nbravo\n"), got.stderr
            assert inside(proc.pid, NOBODY, "sh", "-c", f": > {mp}/new").returncode != 0
            mounts = inside(proc.pid, None, "cat", "/proc/self/mountinfo").stdout
            entry = next(e for e in mounts.splitlines() if f" {mp} " in e)
            assert " ro," in entry and "nosuid" in entry and "nodev" in entry
            assert f"user_id={NOBODY}" in entry
            # Not allow_other: nobody but its user gets in, root included.
            denied = inside(proc.pid, None, "stat", f"{mp}/a")
            assert denied.returncode != 0 and "Permission denied" in denied.stderr
            assert proc.poll() is None
        assert proc.returncode == 0
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_successor_serves_the_same_connection_and_gets_the_lost_request(tmp_path):
    """What the takeover step builds on: this test holds the /dev/fuse descriptor (the
    holder's part); a first server negotiates INIT and is killed with -9 in the middle of
    a READ; a second one, given only the descriptor and the first one's Negotiated, serves
    the same mount, and FUSE_NOTIFY_RESEND brings it the READ the first one took with it."""
    require_fuse()
    mp = str(tmp_path / "mnt")
    os.makedirs(mp)
    m = mountfd.mount_direct(mountfd.MountSpec(mp, fsname="guestfs-test",
                                               subtype="guestfs-test"))
    procs: list[subprocess.Popen[str]] = []

    def server(*args: str) -> dict:
        p = subprocess.Popen([sys.executable, str(REPO / "tests" / "support" / "engine_serve.py"),
                              mp, "--fd", str(m.fd), *args], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(REPO)}, pass_fds=(m.fd,),
                             cwd=tempfile.gettempdir())
        procs.append(p)
        line = p.stdout.readline()    # type: ignore[union-attr]
        assert line, f"engine_serve.py exited with {p.wait(5)}"
        return json.loads(line)

    try:
        first = json.loads(server("--stall")["negotiated"])
        if first["kernel_minor"] < 40:
            pytest.skip(f"FUSE_NOTIFY_RESEND needs protocol 7.40 (Linux 6.9); this kernel "
                        f"speaks 7.{first['kernel_minor']}")
        assert subprocess.run(["cat", f"{mp}/a"], capture_output=True, timeout=10).stdout \
            == b"alpha\n"
        stuck = subprocess.Popen(["cat", f"{mp}/slow"], stdout=subprocess.PIPE)
        procs.append(stuck)   # type: ignore[arg-type]
        with pytest.raises(subprocess.TimeoutExpired):
            stuck.wait(1)          # the first server holds its READ
        procs[0].kill()
        procs[0].wait()
        assert stuck.poll() is None   # the connection lives on in our descriptor
        hello = server("--negotiated", json.dumps(first))
        assert hello["resend"] == 0 and hello["adopted"] >= 3
        assert stuck.communicate(timeout=10)[0] == b"answered by the successor\n"
        assert subprocess.run(["cat", f"{mp}/d/b"], capture_output=True, timeout=10).stdout \
            == b"bravo\n"
    finally:
        # The servers first, then the connection: a reader whose request was sent waits
        # for its answer uninterruptibly, until the last descriptor closes and the
        # kernel aborts the connection.
        for p in procs:
            p.kill()
        mountfd.unmount(m)
        os.close(m.fd)
        for p in procs:
            p.wait()


def test_a_mount_that_fails_is_a_runtime_error_as_with_libfuse(tmp_path):
    """serve() turns FUSE()'s RuntimeError into one logged line and exit status 1."""
    from guestfs.fuse import adapter

    require_fuse()
    with pytest.raises(RuntimeError, match=r"cannot mount .*/absent: "):
        adapter.FUSE(adapter.Operations(), str(tmp_path / "absent"), raw_fi=True,
                     default_permissions=True)
    assert not (tmp_path / "absent").exists()


def test_per_container_directories_through_the_engine(tmp_path):
    """--per-container: a directory per cgroup, made when looked up, page-cached, the
    same files as libfuse3 serves."""
    from guestfs.sources.containerdirs import dir_key

    own = Path("/proc/self/cgroup").read_text()
    path = next(line.split(":", 2)[2] for line in own.splitlines()
                if line.split(":")[1] in ("memory", ""))
    with two_mounts(tmp_path, "--per-container") as (lib, eng):
        key = dir_key(path)
        for f in ("/proc/meminfo", "/sys/devices/system/cpu/online"):
            data = read_all(f"{eng}/{key}{f}")
            assert os.stat(f"{eng}/{key}{f}").st_size == len(data)   # page-cached: exact
            assert labels(data.decode()) == labels(read_all(f"{lib}/{key}{f}").decode())
        assert key in os.listdir(eng) and ".guestfs-status" in os.listdir(eng)
        with pytest.raises(FileNotFoundError):
            os.stat(f"{eng}/%2Fno-such-cgroup-here/proc/meminfo")
