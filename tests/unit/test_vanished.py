"""What a --per-container mount keeps of a container whose cgroup is gone (fixture root,
the FUSE operations driven directly): its last good numbers for VANISHED_GRACE, then
nothing; at most MAX_VANISHED kept, the longest gone forgotten first."""

from __future__ import annotations

import errno
import shutil
import types

import pytest

from guestfs.daemon import fusefs
from guestfs.daemon.server import PINNED, ServerConfig, ViewServer
from guestfs.sources.containerdirs import dir_key
from guestfs.sources.host_root import HostRoot
from tests.support.render_helpers import meminfo_kb

SLICE = "/kubepods.slice/kubepods-burstable.slice"
POD = f"{SLICE}/kubepods-burstable-poda5d4fbc7_30d6_43e8_8425_8ee6f401decc.slice"


class FuseOSError(OSError):
    def __init__(self, code: int) -> None:
        super().__init__(code, "")


def mount(root) -> tuple[ViewServer, object]:
    srv = ViewServer(HostRoot(str(root)), ServerConfig(cache_ttl=0))
    fuse = types.SimpleNamespace(FuseOSError=FuseOSError, Operations=object,
                                 fuse_get_context=lambda: (0, 0, 7))
    ops = fusefs.make_operations(fuse, srv, "per-container")  # type: ignore[arg-type]
    ops.page_cache = True          # as libfuse3's init decides on a kernel with no_open
    return srv, ops


def mem_total(ops, key: str) -> int:
    ops.getattr(f"/{key}/proc/meminfo")
    return meminfo_kb(ops.read(f"/{key}/proc/meminfo", 65536, 0, None).decode())["MemTotal"]


def kept(srv: ViewServer, ops, cgroup: str) -> list[str]:
    """What is still held for ``cgroup``'s directory."""
    key, view = dir_key(cgroup), PINNED + cgroup
    out = [n for n in ("meminfo", "stat") if ops.generations.get(f"/{key}/proc/{n}")]
    out += [f"last_good {p}" for k, p in list(srv._last_good.keys()) if k == view]
    out += ["lasting state"] * (view in srv._entries) + ["last view"] * (view in srv._last_view)
    return out


def test_a_vanished_container_is_kept_for_the_grace_period_then_forgotten(copy_fixture):
    root = copy_fixture("k8s-systemd-v2-burstable")
    srv, ops = mount(root)
    key = dir_key(POD)
    assert mem_total(ops, key) == 524288
    ops.getattr(f"/{key}/proc/stat")
    shutil.rmtree(root / f"sys/fs/cgroup{POD}")
    ops.forget_vanished(now=1000.0)                     # first seen gone
    assert mem_total(ops, key) == 524288                # its last good numbers, counted
    assert srv.errors >= 1
    ops.forget_vanished(now=1000.0 + fusefs.VANISHED_GRACE - 1)
    assert mem_total(ops, key) == 524288
    ops.forget_vanished(now=1000.0 + fusefs.VANISHED_GRACE)
    assert kept(srv, ops, POD) == []
    assert ops.vanished["forgotten"] == 1
    with pytest.raises(FuseOSError) as e:
        ops.getattr(f"/{key}/proc/meminfo")
    assert e.value.errno == errno.ENOENT


def test_a_cgroup_made_again_within_the_grace_is_served_on(copy_fixture):
    root = copy_fixture("k8s-systemd-v2-burstable")
    srv, ops = mount(root)
    key = dir_key(POD)
    assert mem_total(ops, key) == 524288
    pod = root / f"sys/fs/cgroup{POD}"
    shutil.move(pod, root / "pod.away")
    ops.forget_vanished(now=1000.0)
    shutil.move(root / "pod.away", pod)
    ops.forget_vanished(now=1010.0)                     # alive again: the mark goes
    ops.forget_vanished(now=1000.0 + fusefs.VANISHED_GRACE + 20)
    assert mem_total(ops, key) == 524288
    assert ops.vanished["forgotten"] == 0


def test_at_most_max_vanished_are_kept_the_longest_gone_forgotten_first(copy_fixture,
                                                                        monkeypatch):
    monkeypatch.setattr(fusefs, "MAX_VANISHED", 1)
    root = copy_fixture("k8s-systemd-v2-burstable")
    pods = [f"{SLICE}/job{i}.slice" for i in range(3)]
    for p in pods:
        shutil.copytree(root / f"sys/fs/cgroup{POD}", root / f"sys/fs/cgroup{p}")
    srv, ops = mount(root)
    for p in pods:
        assert mem_total(ops, dir_key(p)) == 524288
    shutil.rmtree(root / f"sys/fs/cgroup{pods[0]}")
    ops.forget_vanished(now=1000.0)
    assert kept(srv, ops, pods[0]) != []                # one gone: within the bound
    for p in pods[1:]:
        shutil.rmtree(root / f"sys/fs/cgroup{p}")
    ops.forget_vanished(now=1001.0)
    # Three gone, one may stay: job0 (gone longest) and job1 go; job2 keeps its numbers.
    assert kept(srv, ops, pods[0]) == kept(srv, ops, pods[1]) == []
    assert mem_total(ops, dir_key(pods[2])) == 524288
    assert ops.vanished["forgotten"] == 2


class _Notifier:
    """What forget_vanished asks of guestfs's engine (fuse/adapter.py's Notifier):
    inval_entry, answered as the kernel would (0, or ENOENT for an entry it had already
    forgotten)."""

    def __init__(self, answer: int) -> None:
        self.answer, self.sent = answer, []

    def inval_entry(self, parent: str, name: str) -> int:
        self.sent.append((parent, name))
        return self.answer

    def inval_inode(self, path: str, pages: bool = True) -> int:
        return errno.ENOENT


@pytest.mark.parametrize(("answer", "dropped"), [(0, 1), (errno.ENOENT, 0)])
def test_with_the_engine_a_forgotten_containers_entry_is_dropped_by_a_notification(
        copy_fixture, answer: int, dropped: int) -> None:
    root = copy_fixture("k8s-systemd-v2-burstable")
    _srv, ops = mount(root)
    notifier = _Notifier(answer)
    ops._notifier = notifier    # as use_notifier leaves it, without starting the pusher
    key = dir_key(POD)
    assert mem_total(ops, key) == 524288
    shutil.rmtree(root / f"sys/fs/cgroup{POD}")
    ops.forget_vanished(now=1000.0)
    assert notifier.sent == []                          # within the grace: kept
    ops.forget_vanished(now=1000.0 + fusefs.VANISHED_GRACE)
    assert notifier.sent == [("/", key)]                # the root's entry of that directory
    assert ops.vanished == {"forgotten": 1, "entries_dropped": dropped}


def test_a_sweep_that_forgets_hands_the_freed_heap_back_once(copy_fixture) -> None:
    # What the forgotten containers used is freed, but glibc keeps the heap it was in:
    # measured, the daemon's RSS grew ~4.7 KB per vanished container with nothing of
    # them left in it (lowmem.release_free_heap). One trim per sweep that forgot any.
    root = copy_fixture("k8s-systemd-v2-burstable")
    pods = [f"{SLICE}/job{i}.slice" for i in range(2)]
    for p in pods:
        shutil.copytree(root / f"sys/fs/cgroup{POD}", root / f"sys/fs/cgroup{p}")
    _srv, ops = mount(root)
    trims: list[float] = []
    ops.release_heap = lambda: trims.append(1.0)
    for p in pods:
        assert mem_total(ops, dir_key(p)) == 524288
    ops.forget_vanished(now=1000.0)
    assert trims == []                                  # nothing gone
    for p in pods:
        shutil.rmtree(root / f"sys/fs/cgroup{p}")
    ops.forget_vanished(now=1000.0)
    assert trims == []                                  # gone, within the grace: kept
    ops.forget_vanished(now=1000.0 + fusefs.VANISHED_GRACE)
    assert ops.vanished["forgotten"] == 2
    assert trims == [1.0]                               # two forgotten, one trim
    ops.forget_vanished(now=1000.0 + 2 * fusefs.VANISHED_GRACE)
    assert trims == [1.0]                               # nothing more forgotten


def test_the_free_heap_is_handed_back_where_glibc_is() -> None:
    from guestfs.daemon.lowmem import release_free_heap
    from guestfs.system import libc

    assert release_free_heap() is (libc.malloc_trim is not None)
