"""A per-caller daemon in a sidecar finds the app's cgroup through the app's own mounts
(/proc/<pid>/root + /proc/<pid>/mountinfo), and trusts only a real cgroup mount of a
hierarchy it has itself: fixture k8s-v1-sidecar-reader-root (containerd 1.6, cgroup v1, no
cgroup namespace; see its builder in tests/fixtures/make_fixtures.py).

Hand-worked values: the app's container cgroup holds memory.limit_in_bytes 536870912
(512 MiB, also its hierarchical_memory_limit: the pod cgroup has none) and cfs
100000/100000 (1 CPU) over cpuset 0-3, so 1 CPU, cpu 0; usage 300 MiB. The host has
8131768 kB and 4 CPUs. The fakes planted below say 64 MiB (65536 kB): never served.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from guestfs.daemon.server import ServerConfig, ViewServer
from guestfs.sources.host_root import HostRoot
from guestfs.sources.snapshot import read_snapshot
from tests.conftest import MiB, fixture_root, limits_of
from tests.support.render_helpers import meminfo_kb

NAME = "k8s-v1-sidecar-reader-root"
APP = "/kubepods/burstable/poda5d4fbc7-30d6-43e8-8425-8ee6f401decc/" \
      "a991eb3b64a228cb0b269925127c28cb39d482d27c6248540e0e3b41633a907e"
MEM = "proc/7/root/sys/fs/cgroup/memory"
HOST_KB = 8131768
FAKE = 64 * MiB


def plant_fake_memory(d: Path) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / "memory.limit_in_bytes").write_text(f"{FAKE}\n")
    (d / "memory.usage_in_bytes").write_text(f"{MiB}\n")
    (d / "memory.stat").write_text(f"hierarchical_memory_limit {FAKE}\n")


def mountinfo(root: Path, pid: int = 7) -> Path:
    return root / f"proc/{pid}/mountinfo"


def edit_mountinfo(root: Path, old: str, new: str) -> None:
    for pid in (7, 8, 9):
        p = mountinfo(root, pid)
        text = p.read_text()
        assert old in text
        p.write_text(text.replace(old, new))


def append_mount(root: Path, line: str) -> None:
    for pid in (7, 8, 9):
        with mountinfo(root, pid).open("a") as f:
            f.write(line + "\n")


def assert_memory_refused(root: Path, why: str) -> None:
    lim = limits_of(root, pid="7")
    assert lim.memory.value == HOST_KB * 1024 and not lim.memory.limited
    assert any(w.startswith("memory:") and why in w for w in lim.warnings), lim.warnings
    # The other hierarchies are untouched: the app's quota still gives 1 CPU.
    assert lim.cpu_count.value == 1 and lim.visible_cpus == (0,)


def test_the_apps_limits_come_through_its_own_root():
    lim = limits_of(fixture_root(NAME), pid="7")
    assert lim.memory.value == 512 * MiB and lim.memory.limited
    assert lim.memory.source.cgroup == APP
    assert lim.memory.source.file == f"/{MEM}/memory.limit_in_bytes"
    assert lim.memory_usage.usage == 300 * MiB
    assert lim.cpu_quota.value == 1
    assert lim.cpu_quota.source.file == \
        "/proc/7/root/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us"
    assert lim.cpu_count.value == 1 and lim.visible_cpus == (0,)
    assert lim.cpuset.value == (0, 1, 2, 3)
    # Only the container's level is visible: the pod cgroup above it is not walked.
    snap = read_snapshot(HostRoot(str(fixture_root(NAME))), "7")
    assert [lv.cgroup for lv in snap.hierarchies["memory"].levels] == [APP]
    assert not any(h.unseen for h in snap.hierarchies.values())


def test_the_daemons_own_view_is_the_sidecars():
    lim = limits_of(fixture_root(NAME))  # pid self: the sidecar, no limits
    assert lim.memory.value == HOST_KB * 1024 and lim.cpu_count.value == 4
    assert lim.memory.source.kind == "host"


def test_the_daemon_serves_the_app_its_limits_and_counts_no_fallback():
    srv = ViewServer(HostRoot(str(fixture_root(NAME))), ServerConfig(cache_ttl=0))
    try:
        assert meminfo_kb(srv.render("/proc/meminfo", 7).decode())["MemTotal"] == 524288
        assert srv.render("/proc/cpuinfo", 8).decode().count("processor\t:") == 1
        assert srv.render("/sys/devices/system/cpu/online", 9) == b"0\n"
        # CPU time and tasks are read again per read, through the same checked walk.
        stat = srv.render("/proc/stat", 7).decode()
        assert [ln.split()[0] for ln in stat.splitlines() if ln.startswith("cpu")] == \
            ["cpu", "cpu0"]
        assert srv.render("/proc/loadavg", 7).decode().split()[3] == "2/3"
        assert srv.errors == 0 and srv.fallbacks == {}
    finally:
        srv.stop()


def test_a_reader_whose_cgroup_nobody_shows_is_a_counted_fallback():
    """The pause process (pid 1) sits in the sandbox's cgroup; its mounts are not in the
    fixture: the node's numbers are served, counted and said."""
    srv = ViewServer(HostRoot(str(fixture_root(NAME))), ServerConfig(cache_ttl=0))
    try:
        assert meminfo_kb(srv.render("/proc/meminfo", 1).decode())["MemTotal"] == HOST_KB
        status = json.loads(srv.status_json())
    finally:
        srv.stop()
    assert status["fallbacks"]["memory cgroup of a reader not visible"] >= 1, status
    assert status["fallbacks"]["cpu cgroup of a reader not visible"] >= 1, status
    assert status["fallback_total"] >= 3
    lim = limits_of(fixture_root(NAME), pid="1")
    assert any("nor through pid 1's own mounts: cannot read /proc/1/mountinfo" in w
               for w in lim.warnings), lim.warnings


def test_explain_names_the_path_through_the_readers_root():
    out = subprocess.run([sys.executable, "-m", "guestfs", "explain", "--json", "--root",
                          str(fixture_root(NAME)), "--pid", "7"], capture_output=True,
                         text=True, check=True)
    doc = json.loads(out.stdout)
    assert doc["memory"]["limit_bytes"] == 512 * MiB
    assert doc["memory"]["source"]["file"] == f"/{MEM}/memory.limit_in_bytes"
    assert doc["memory"]["source"]["cgroup"] == APP


def test_v2_private_namespaces_the_apps_scope_is_a_sibling_outside_ours():
    """k8s-v2-sidecar-reader-root: the app's path and its mount's root both read
    /../cri-containerd-<id>.scope from the daemon's namespace; memory.max 536870912 and
    cpu.max "100000 100000" on the app's scope."""
    root = fixture_root("k8s-v2-sidecar-reader-root")
    scope = "/../cri-containerd-" + APP.rsplit("/", 1)[1] + ".scope"
    lim = limits_of(root, pid="8")
    assert lim.memory.value == 512 * MiB and lim.memory.source.cgroup == scope
    assert lim.memory.source.file == "/proc/8/root/sys/fs/cgroup/memory.max"
    assert lim.cpu_quota.value == 1 and lim.cpu_count.value == 1
    srv = ViewServer(HostRoot(str(root)), ServerConfig(cache_ttl=0))
    try:
        assert meminfo_kb(srv.render("/proc/meminfo", 9).decode())["MemTotal"] == 524288
        assert srv.render("/sys/devices/system/cpu/online", 7) == b"0\n"
        assert srv.fallbacks == {}
    finally:
        srv.stop()


def test_the_load_sampler_skips_a_view_whose_reader_exited(copy_fixture):
    """Outside a read the sampler rebuilds an expired view through the pid that built it;
    once that pid is gone it waits for the next reader rather than lose the view's
    cgroup (no fallback counted)."""
    root = copy_fixture(NAME)
    srv = ViewServer(HostRoot(str(root)), ServerConfig(cache_ttl=0))
    try:
        srv.render("/proc/loadavg", 7)
        srv.sample_loads()            # pid 7 lives: sampled through its root
        stat = root / "proc/7/stat"
        stat.write_text(stat.read_text().replace(" 35601000 ", " 35609999 "))
        srv.sample_loads()
        assert srv.errors == 0 and srv.fallbacks == {}, srv.fallbacks
        assert meminfo_kb(srv.render("/proc/meminfo", 8).decode())["MemTotal"] == 524288
    finally:
        srv.stop()


# ------------------------------------------------------------------ hostile readers

def test_a_tmpfs_pretending_to_be_the_memory_mount_is_not_read(copy_fixture):
    root = copy_fixture(NAME)
    shutil.rmtree(root / MEM)
    plant_fake_memory(root / MEM)
    edit_mountinfo(root, "- cgroup cgroup rw,memory", "- tmpfs tmpfs rw,mode=755")
    assert_memory_refused(root, "no mount of this hierarchy")


def test_a_cgroup_mount_of_another_superblock_is_not_the_memory_hierarchy(copy_fixture):
    root = copy_fixture(NAME)
    plant_fake_memory(root / MEM)
    # A cgroupfs the tenant mounted itself (a named v1 hierarchy) claiming "memory".
    edit_mountinfo(root, " 0:31 ", " 0:99 ")
    assert_memory_refused(root, "no mount of this hierarchy")


@pytest.mark.parametrize("line", [
    "1190 1179 0:77 / /sys/fs/cgroup/memory rw,relatime - tmpfs tmpfs rw",
    "1191 1179 254:0 /tmp/fake /sys/fs/cgroup/memory/memory.limit_in_bytes ro - ext4 "
    "/dev/vda rw",
], ids=["tmpfs-over-the-mount", "file-bound-over-a-limit"])
def test_a_mount_over_the_cgroup_mount_refuses_it(copy_fixture, line):
    root = copy_fixture(NAME)
    plant_fake_memory(root / MEM)
    append_mount(root, line)
    assert_memory_refused(root, "has a mount at /sys/fs/cgroup/memory")


@pytest.mark.parametrize("absolute", [False, True], ids=["relative", "absolute"])
def test_a_symlink_inside_the_readers_root_is_not_followed(copy_fixture, tmp_path, absolute):
    root = copy_fixture(NAME)
    fake = tmp_path / "planted" if absolute else root / "proc/7/root/fake-memory"
    plant_fake_memory(fake)
    shutil.rmtree(root / MEM)
    (root / MEM).symlink_to(fake if absolute else "../../../fake-memory")
    assert (root / MEM / "memory.limit_in_bytes").read_text() == f"{FAKE}\n"
    assert_memory_refused(root, "cannot be opened safely")


def test_a_symlinked_ancestor_directory_is_not_followed(copy_fixture):
    root = copy_fixture(NAME)
    real = root / "proc/7/root/sys"
    real.rename(root / "proc/7/root/elsewhere")
    real.symlink_to("elsewhere")   # /sys -> elsewhere: the files are there, behind a link
    lim = limits_of(root, pid="7")
    assert lim.memory.value == HOST_KB * 1024 and lim.cpu_count.value == 4
    assert any(w.startswith("memory:") and "cannot be opened safely" in w
               for w in lim.warnings), lim.warnings


def test_a_mount_table_past_the_bound_is_refused_not_parsed(copy_fixture):
    from guestfs.sources.reader_root import MAX_FILE

    root = copy_fixture(NAME)
    line = "1300 1179 0:80 / /mnt/x rw,relatime - tmpfs tmpfs rw\n"
    with mountinfo(root).open("a") as f:
        f.write(line * (MAX_FILE // len(line) + 1))
    lim = limits_of(root, pid="7")
    assert lim.memory.value == HOST_KB * 1024
    assert any("cannot read /proc/7/mountinfo (longer than 4 MiB)" in w
               for w in lim.warnings), lim.warnings


def test_a_fifo_for_a_limit_file_does_not_block(copy_fixture):
    root = copy_fixture(NAME)
    (root / MEM / "memory.limit_in_bytes").unlink()
    os.mkfifo(root / MEM / "memory.limit_in_bytes")
    lim = limits_of(root, pid="7")
    # The file is skipped; the same level's hierarchical_memory_limit still says 512 MiB.
    assert lim.memory.value == 512 * MiB and lim.memory.source.kind == "cgroup-hierarchical"


def test_reads_stop_once_the_reader_exits_and_its_pid_is_reused(copy_fixture):
    from guestfs.sources.snapshot import level_text

    root = copy_fixture(NAME)
    host = HostRoot(str(root))
    leaf = read_snapshot(host, "7").hierarchies["cpuacct"].leaf
    assert leaf is not None and level_text(host, leaf, "cpuacct.usage") is not None
    stat = root / "proc/7/stat"
    stat.write_text(stat.read_text().replace(" 35601000 ", " 35609999 "))
    assert level_text(host, leaf, "cpuacct.usage") is None


def test_one_container_has_one_identity_whichever_readers_root_reached_it():
    """Pids 7, 8 and 9 share the app container's cgroup; each reaches it through its own
    /proc/<pid>/root. A view built again by another reader (its first reader exited) is
    the same container: an identity taken from the directory string restarted the CPU
    clock and the age at every rebuild (the sidecar's /proc/stat went from (2, 0, 9, 132)
    to (0, 0, 0, 641678), measured through containerd)."""
    from guestfs.engine.limits import effective_limits
    from guestfs.sources.usage import container_incarnation
    host = HostRoot(str(fixture_root(NAME)))
    ids = set()
    for pid in ("7", "8", "9"):
        snap = read_snapshot(host, pid)
        assert all(lv.anchor is not None and lv.directory.startswith(f"/proc/{pid}/root/")
                   for h in snap.hierarchies.values() for lv in h.levels)
        ids.add(container_incarnation(host, snap, effective_limits(snap).cpu_cgroup))
    assert len(ids) == 1 and None not in ids
