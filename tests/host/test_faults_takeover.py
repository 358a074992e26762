"""A held mount (`guestfs mount --hold`) outlives its daemon: 20 kill -9s of whichever
daemon serves, half followed at once by a new `guestfs mount MP` (a restarted DaemonSet
container), half left to the holder, while four readers read files bound into mount
namespaces of their own. No read fails and no bind is replaced."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from guestfs.daemon import held
from guestfs.daemon.mountpoint import is_guestfs_mount, mount_entry
from guestfs.sources.containerdirs import key_of_cgroup_text
from guestfs.system import kernel
from tests.support.fusemount import require_fuse
from tests.support.heldmount import HeldMount, holders_of, kill_in_turn
from tests.support.mounts import wait_for
from tests.support.procs import alive

pytestmark = pytest.mark.real

READER = Path(__file__).parent.parent / "support" / "held_reader.py"
KINDS = ("meminfo", "stat", "uptime", "loadavg")
KILLS = 20


def require_resend() -> None:
    require_fuse()
    if not kernel.kernel_resends():
        # Then --hold serves as without a holder (test_fuse_holder.py::test_hold_*).
        pytest.skip(f"Linux {os.uname().release} has no FUSE_NOTIFY_RESEND (6.9+)")


@pytest.fixture
def held_mount() -> Iterator[HeldMount]:
    require_resend()
    root = Path(tempfile.mkdtemp(prefix="guestfs-held-"))
    m = HeldMount(root)
    try:
        yield m
    finally:
        m.cleanup()
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def reading(m: HeldMount, out_dir: Path, under: str = "") -> Iterator[None]:
    """A reader of each of KINDS, bound in a mount namespace of its own, for the block;
    then each is told to stop and waited for (its results in ``out_dir``)."""
    stop = out_dir / "stop"
    readers = [subprocess.Popen(["unshare", "-m", "--propagation", "private",
                                 sys.executable, str(READER), f"{m.mp}{under}/proc/{k}", k,
                                 str(stop), str(out_dir / f"{k}.json")])
               for k in KINDS]
    try:
        time.sleep(1.0)
        yield
    finally:
        stop.touch()
        for r in readers:
            r.wait(30)


def read_results(out_dir: Path) -> dict[str, dict]:  # type: ignore[type-arg]
    results = {k: json.loads((out_dir / f"{k}.json").read_text()) for k in KINDS}
    seen = {k: {x: v[x] for x in ("reads", "failed", "longest")} for k, v in results.items()}
    print(f"\nheld mount: {seen}")
    for kind, r in results.items():
        assert r["failed"] == 0, (kind, r["errors"])
        assert r["reads"] > 20, (kind, r)
        assert r["before"] is not None and r["before"] == r["after"], (kind, r)
        assert r["longest"] < 10.0, (kind, r)    # no read waited for a hung mount
    return results


def test_killed_daemons_are_succeeded_without_a_failed_read(held_mount: HeldMount,
                                                           tmp_path: Path) -> None:
    m = held_mount
    m.start()
    assert wait_for(lambda: is_guestfs_mount(m.mp) and m.serving_pid() is not None), \
        Path(m.log).read_text()
    with reading(m, tmp_path):
        kill_in_turn(m, KILLS)
        time.sleep(0.5)
    read_results(tmp_path)
    assert len(holders_of(m.mp)) == 1


@pytest.mark.parametrize("layout", [["--per-container"], ["--view", "self"]],
                         ids=["per-container", "fixed-view"])
def test_page_cached_layouts_are_succeeded_too(held_mount: HeldMount, tmp_path: Path,
                                               layout: list[str]) -> None:
    """Their node ids include every running container's directory (per container), and
    their files come from the kernel's page cache, revalidated by the successor."""
    m = held_mount
    m.args = layout
    m.start()
    assert wait_for(lambda: is_guestfs_mount(m.mp) and m.serving_pid() is not None)
    under = ""
    if layout == ["--per-container"]:
        key = key_of_cgroup_text(Path("/proc/self/cgroup").read_text())
        assert key is not None
        under = f"/{key}"
    with reading(m, tmp_path, under):
        kill_in_turn(m, 4)
    read_results(tmp_path)


def test_a_second_mount_is_refused_while_a_daemon_serves(held_mount: HeldMount) -> None:
    m = held_mount
    m.start()
    assert wait_for(lambda: is_guestfs_mount(m.mp) and m.serving_pid() is not None)
    first = m.serving_pid()
    second = m.start()
    assert second.wait(20) == 1
    assert "already served by another guestfs mount" in Path(m.log).read_text()
    assert m.serving_pid() == first


def test_a_clean_stop_unmounts_and_ends_the_holder(held_mount: HeldMount) -> None:
    m = held_mount
    proc = m.start()
    assert wait_for(lambda: is_guestfs_mount(m.mp) and m.serving_pid() is not None)
    [holder] = holders_of(m.mp)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    assert wait_for(lambda: not alive(holder), 10)
    assert not is_guestfs_mount(m.mp)
    assert not os.path.exists(held.socket_path(m.mp, m.lock_dir))


def test_a_clean_stop_whose_holder_died_still_unmounts(held_mount: HeldMount) -> None:
    """The holder killed while its daemon serves: the daemon serves on, and its SIGTERM
    detaches the mount itself (its unmount watcher), leaving no stale mount behind."""
    m = held_mount
    proc = m.start()
    assert wait_for(lambda: is_guestfs_mount(m.mp) and m.serving_pid() is not None)
    [holder] = holders_of(m.mp)
    os.kill(holder, signal.SIGKILL)
    assert wait_for(lambda: "the FUSE holder is gone" in Path(m.log).read_text(), 10)
    with open(f"{m.mp}/proc/meminfo", "rb") as f:     # still served
        assert f.read().startswith(b"MemTotal:")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    assert mount_entry(m.mp) is None, Path(m.log).read_text()[-2000:]
    assert "detaches the mount itself" in Path(m.log).read_text()


def test_a_clean_stop_with_its_holder_alive_leaves_the_unmount_to_the_holder(
        held_mount: HeldMount) -> None:
    m = held_mount
    proc = m.start()
    assert wait_for(lambda: is_guestfs_mount(m.mp) and m.serving_pid() is not None)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    assert wait_for(lambda: mount_entry(m.mp) is None, 10)
    assert "detaches the mount itself" not in Path(m.log).read_text()


def test_an_unmount_by_hand_ends_the_daemon_and_the_holder(held_mount: HeldMount) -> None:
    m = held_mount
    proc = m.start()
    assert wait_for(lambda: is_guestfs_mount(m.mp) and m.serving_pid() is not None)
    [holder] = holders_of(m.mp)
    subprocess.run(["umount", "-l", m.mp], check=True)
    assert proc.wait(20) == 0
    assert wait_for(lambda: not alive(holder), 10)


def test_a_crash_loop_ends_the_connection(held_mount: HeldMount) -> None:
    """Successors that die before they serve (here: each fails on its pid file, now a
    directory) are not restarted for ever: after five the holder ends the connection,
    and a reader gets the old error at once instead of waiting for good."""
    m = held_mount
    m.start()
    assert wait_for(lambda: is_guestfs_mount(m.mp) and m.serving_pid() is not None)
    [holder] = holders_of(m.mp)
    first = m.serving_pid()
    assert first is not None
    os.unlink(m.pid_file)
    os.mkdir(m.pid_file)
    os.kill(first, signal.SIGKILL)
    assert wait_for(lambda: not alive(holder), 60), Path(m.log).read_text()[-3000:]
    log = Path(m.log).read_text()
    assert "5 young deaths in a row; ending the connection" in log
    assert log.count("started pid") == 5
    cat = subprocess.run(["cat", f"{m.mp}/proc/meminfo"], capture_output=True, timeout=20)
    assert cat.returncode != 0 and b"connect" in cat.stderr, cat


@pytest.fixture
def standalone(held_mount: HeldMount) -> Iterator[subprocess.Popen[bytes]]:
    """`guestfs fuse-holder` in a session of its own (a pod of its own), and the held
    mount's daemons told to hand their connection to it."""
    os.makedirs(held_mount.lock_dir, mode=0o700)
    with open(held_mount.log, "ab") as err:
        proc = subprocess.Popen([sys.executable, "-m", "guestfs", "fuse-holder", "--lock-dir",
                                 held_mount.lock_dir, "--orphan-grace", "3"],
                                stderr=err, start_new_session=True)
    held_mount.args = ["--external-holder"]
    try:
        assert wait_for(lambda: os.path.exists(held.handoff_path(held_mount.lock_dir)))
        yield proc
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_daemonset_daemon_restarted_or_updated_takes_its_mount_over(
        held_mount: HeldMount, standalone: subprocess.Popen[bytes], tmp_path: Path) -> None:
    """The DaemonSet's way: the holder in a pod of its own, each daemon container killed
    (-9, then restarted as kubelet restarts it) or stopped for a rolling update
    (SIGTERM, then the new pod's daemon), while readers read all along."""
    m = held_mount
    m.start()
    assert wait_for(lambda: is_guestfs_mount(m.mp) and m.serving_pid() is not None), \
        Path(m.log).read_text()
    assert holders_of(m.mp) == []           # no holder of the daemon's own
    with reading(m, tmp_path):
        for i in range(6):
            victim = m.serving_pid()
            assert victim is not None, Path(m.log).read_text()[-3000:]
            os.kill(victim, signal.SIGTERM if i % 2 else signal.SIGKILL)
            assert wait_for(lambda v=victim: not alive(v), 15)
            time.sleep(0.3)                 # kubelet's restart, a new pod's start
            m.start()
            assert wait_for(lambda v=victim: m.serving_pid() not in (None, v), 15), \
                f"round {i}: no successor\n" + Path(m.log).read_text()[-3000:]
            time.sleep(0.5)
    read_results(tmp_path)
    assert standalone.poll() is None


def test_a_connection_nobody_takes_over_is_ended_after_the_grace(
        held_mount: HeldMount, standalone: subprocess.Popen[bytes]) -> None:
    m = held_mount
    m.start()
    assert wait_for(lambda: is_guestfs_mount(m.mp) and m.serving_pid() is not None)
    pid = m.serving_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    began = time.monotonic()
    cat = subprocess.run(["cat", f"{m.mp}/proc/meminfo"], capture_output=True, timeout=30)
    waited = time.monotonic() - began
    assert cat.returncode != 0 and b"connect" in cat.stderr, cat
    assert 2.0 < waited < 20.0, waited       # held for the grace (3 s), then ended
    assert "within 3s; ending its connection" in Path(m.log).read_text()
    assert standalone.poll() is None          # the holder lives on for other mounts
