"""The page-cache path on a real mount: fixed views (--cgroup) and per-container
directories are served by the kernel without the daemon, and stay fresh.

Freshness is the one timed bound here, because it is the promise itself: a changed cgroup
limit shows within --cache-ttl + 0.1 s, for a reader holding the file open (pread at 0,
as top and procps do) and for new readers. The daemon's callbacks are counted from its
status file: cached reads must add none."""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time

import pytest

from guestfs.daemon.server import YOUNG
from guestfs.sources.containerdirs import dir_key
from tests.support.fusemount import mounted, private_mountpoint
from tests.support.realcg import v1_cgroup
from tests.support.render_helpers import meminfo_kb

pytestmark = pytest.mark.real
MiB = 1 << 20
TTL = 0.5


def status(mp: str) -> dict:
    """The daemon's status as of now: read twice, because a page-cached file read a moment
    ago keeps its rendering for a few ms (renderings.Generations), and the first read of a
    new status is rendered at its lookup, before its own open is counted."""
    for _ in range(2):
        with open(os.path.join(mp, ".guestfs-status"), "rb") as f:
            data = f.read()
        time.sleep(0.06)
    return json.loads(data)


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def mem_total_kb(data: bytes) -> int:
    return meminfo_kb(data.decode())["MemTotal"]


def set_limit(cg, nbytes: int) -> None:
    with open(os.path.join(cg.dirs["memory"], "memory.limit_in_bytes"), "w") as f:
        f.write(str(nbytes))


def seconds_until(get, want: int, timeout: float = 5.0) -> float:
    """Seconds from now until ``get()`` returns ``want`` (polled every 2 ms)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if get() == want:
            return time.monotonic() - start
        time.sleep(0.002)
    raise AssertionError(f"still not {want} after {timeout}s")


def layout_args(layout: str, cg, mp: str) -> tuple[list[str], str]:
    """(mount args, the meminfo path under the mount) for a page-cached layout."""
    path = cg.paths["memory"]
    if layout == "fixed":
        return ["--cgroup", path], f"{mp}/proc/meminfo"
    return ["--per-container"], f"{mp}/{dir_key(path)}/proc/meminfo"


@pytest.mark.parametrize("layout", ["fixed", "per-container"])
def test_cached_reads_never_reach_the_daemon(layout):
    with v1_cgroup(512 * MiB, 100000, 100000) as cg, private_mountpoint() as mpp:
        mp = str(mpp)
        args, meminfo = layout_args(layout, cg, mp)
        with mounted(mp, *args, "--cache-ttl", "5"):
            st = status(mp)
            assert st["layout"] == layout and st["page_cache"] is True
            assert mem_total_kb(read(meminfo)) == 512 * 1024
            # A cgroup younger than YOUNG may not have its limits yet: its renderings are
            # due at once (server.py); what is cached is a grown-up cgroup's.
            time.sleep(YOUNG)
            read(meminfo)
            before = status(mp)["callbacks"]
            start = time.monotonic()
            for _ in range(5000):
                assert read(meminfo)[:9] == b"MemTotal:"
            elapsed = time.monotonic() - start
            periods = elapsed / 5 + 1   # 5 s freshness periods spanned
            after = status(mp)["callbacks"]
            # The kernel asks for the attributes at most every 10 ms (fusefs.REVALIDATE):
            # the file's, and with default_permissions those of the directories walked
            # (root, proc, the container's). A render and a READ refill happen once per
            # freshness period per file. The status reads themselves add a few of each.
            delta = {k: after[k] - before[k] for k in after}
            assert delta["open"] == 0, delta        # the kernel's no_open: never asked
            assert delta["read"] <= 2 * periods + 2, delta
            assert delta["render"] <= 2 * periods + 4, delta
            assert delta["getattr"] <= 4 * (elapsed / 0.01 + 1) + 20, delta
            assert sum(delta.values()) < 500, delta   # against 5000 reads


@pytest.mark.parametrize("layout", ["fixed", "per-container"])
@pytest.mark.parametrize("binding", ["auto", "guestfs"])   # polled, pushed freshness
def test_a_changed_limit_shows_within_the_ttl(layout, binding):
    with v1_cgroup(512 * MiB, 100000, 100000) as cg, private_mountpoint() as mpp:
        mp = str(mpp)
        args, meminfo = layout_args(layout, cg, mp)
        with mounted(mp, *args, "--cache-ttl", str(TTL), "--fuse-binding", binding):
            held = os.open(meminfo, os.O_RDONLY)
            try:
                assert mem_total_kb(os.pread(held, 1 << 16, 0)) == 512 * 1024
                for mib in (256, 384, 512):
                    assert mem_total_kb(read(meminfo)) != mib * 1024  # cached: warm
                    set_limit(cg, mib * MiB)
                    # Both readers watch from the moment of the change, in parallel.
                    waits: dict[str, float] = {}

                    def new_readers(want: int = mib * 1024,
                                    out: dict[str, float] = waits) -> None:
                        out["new"] = seconds_until(lambda: mem_total_kb(read(meminfo)), want)

                    t = threading.Thread(target=new_readers)
                    t.start()
                    waits["held"] = seconds_until(
                        lambda: mem_total_kb(os.pread(held, 1 << 16, 0)), mib * 1024)
                    t.join()
                    assert waits["held"] <= TTL + 0.1, waits
                    assert waits["new"] <= TTL + 0.1, waits
            finally:
                os.close(held)


def test_every_read_is_one_whole_rendering_while_the_limit_flaps():
    """Four readers read meminfo in one read() call each while its size and content
    change every few ms (the limit flips between two values, the TTL is 0): every read
    must be a whole rendering of one of them, never one cut at the other's size or
    padded with zeros."""
    with v1_cgroup(512 * MiB, 100000, 100000) as cg, private_mountpoint() as mpp:
        mp = str(mpp)
        meminfo = f"{mp}/proc/meminfo"
        with mounted(mp, "--cgroup", cg.paths["memory"], "--cache-ttl", "0"):
            stop = threading.Event()
            bad: list[bytes] = []
            seen: set[int] = set()

            def reader() -> None:
                while not stop.is_set():
                    data = read(meminfo)
                    lines = data.decode(errors="replace").splitlines()
                    whole = (data.endswith(b"\n") and b"\0" not in data
                             and lines[0].startswith("MemTotal:")
                             and all(ln.endswith(" kB") or ln.startswith("HugePages_")
                                     for ln in lines))
                    if not whole:
                        bad.append(data)
                    else:
                        seen.add(mem_total_kb(data))

            threads = [threading.Thread(target=reader) for _ in range(4)]
            for t in threads:
                t.start()
            end = time.monotonic() + 3
            while time.monotonic() < end:
                for mib in (64, 1000):   # 5 and 7 digits: the file's size changes
                    set_limit(cg, mib * MiB)
                    time.sleep(0.003)
            stop.set()
            for t in threads:
                t.join()
            assert not bad, bad[0]
            assert seen >= {64 * 1024, 1000 * 1024}, seen


# ------------------------------------------------------------ the generations, in memory

def test_generations_keep_the_mtime_while_the_bytes_stay_the_same():
    from guestfs.daemon.renderings import Generations

    g = Generations(hold=0.005, max_hold=0.05)
    first, held = g.offer("/proc/meminfo", 10.0, b"a\n", now=9.5)
    assert not held
    again, held = g.offer("/proc/meminfo", 11.0, b"a\n", now=10.5)
    # Same bytes: same generation (the kernel keeps its pages), later deadline.
    assert again is first and again.deadline == 11.0 and not held
    new, held = g.offer("/proc/meminfo", 12.0, b"bb\n", now=11.5)
    assert not held and new.data == b"bb\n" and new.mtime_ns > first.mtime_ns


def test_generations_hold_a_file_being_filled_but_not_past_max_hold():
    from guestfs.daemon.renderings import Generations

    g = Generations(hold=0.005, max_hold=0.05)
    old, _ = g.offer("f", 1.0, b"old\n", now=0.5)
    g.read("f", now=1.001)                       # a READ 1 ms before the next GETATTR
    cur, held = g.offer("f", 2.0, b"new\n", now=1.002)
    assert held and cur is old and g.held == 1
    # Read again and again: still held, but never beyond deadline + max_hold.
    g.read("f", now=1.049)
    cur, held = g.offer("f", 2.0, b"new\n", now=1.0495)
    assert held and cur is old
    g.read("f", now=1.0505)
    cur, held = g.offer("f", 2.0, b"new\n", now=1.051)
    assert not held and cur.data == b"new\n"
    # Not read for longer than hold: replaced at once.
    g.read("f", now=2.0)
    cur, held = g.offer("f", 3.0, b"newer\n", now=2.006)
    assert not held and cur.data == b"newer\n"


def test_generations_are_bounded_by_entries_and_bytes():
    from guestfs.daemon.renderings import Generations

    g = Generations(max_entries=3, max_bytes=10)
    for i in range(5):
        g.offer(f"f{i}", 1.0, b"xx", now=0.0)
    assert len(g) == 3 and g.get("f0") is None and g.get("f4") is not None
    g.offer("big", 1.0, b"x" * 9, now=0.0)
    assert g.get("big") is not None and len(g) == 1   # 9 + 2 > 10: the older ones go


# ------------------------------------------------------------ per-container directories

def test_per_container_directories_are_made_on_demand_for_existing_cgroups_only():
    # Memory only: a directory applies its one cgroup path to every hierarchy, as
    # runtimes lay them out, while these test cgroups sit below this process's own,
    # which differ per controller on this machine.
    with v1_cgroup(512 * MiB, 100000, 100000) as a, \
            v1_cgroup(256 * MiB, 100000, 100000) as b, private_mountpoint() as mpp:
        mp = str(mpp)
        with mounted(mp, "--per-container"):
            ka, kb = dir_key(a.paths["memory"]), dir_key(b.paths["memory"])
            assert os.listdir(mp) == [".guestfs-status"]      # nothing looked up yet
            # Each directory is its own container's, whoever reads it.
            assert mem_total_kb(read(f"{mp}/{ka}/proc/meminfo")) == 512 * 1024
            assert mem_total_kb(read(f"{mp}/{kb}/proc/meminfo")) == 256 * 1024
            assert read(f"{mp}/{ka}/sys/devices/system/cpu/online").endswith(b"\n")
            assert sorted(os.listdir(mp)) == sorted([".guestfs-status", ka, kb])
            assert sorted(os.listdir(f"{mp}/{ka}")) == ["proc", "sys"]
            assert "meminfo" in os.listdir(f"{mp}/{ka}/proc")
            for name in ("proc", "..", "%2F..", dir_key(a.paths["memory"] + "/x"),
                         ka.replace("%2F", "%2f"), ka + "%2F", "%2Fno-such-cgroup"):
                assert not os.path.exists(f"{mp}/{name}/proc/meminfo"), name
            assert not os.path.exists(f"{mp}/{ka}/.guestfs-status")


def test_a_vanished_container_keeps_its_last_numbers():
    with private_mountpoint() as mpp, contextlib.ExitStack() as stack:
        mp = str(mpp)
        with v1_cgroup(512 * MiB, 100000, 100000) as cg:
            stack.enter_context(mounted(mp, "--per-container", "--cache-ttl", "0.1"))
            meminfo = f"{mp}/{dir_key(cg.paths['memory'])}/proc/meminfo"
            assert mem_total_kb(read(meminfo)) == 512 * 1024
        # The cgroup is gone now: its directory keeps the last good numbers (counted as a
        # fallback), never the node's.
        time.sleep(0.3)
        assert mem_total_kb(read(meminfo)) == 512 * 1024
        assert status(mp)["fallback_total"] >= 1


def test_mmap_of_a_page_cached_file_maps_exactly_its_rendering():
    import mmap

    with v1_cgroup(512 * MiB, 100000, 100000) as cg, private_mountpoint() as mpp:
        mp = str(mpp)
        with mounted(mp, "--cgroup", cg.paths["memory"], "--cache-ttl", "5"):
            for name in ("proc/meminfo", "proc/cpuinfo", "proc/stat", "proc/uptime",
                         "sys/devices/system/cpu/online"):
                path = f"{mp}/{name}"
                with open(path, "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    assert size > 0, name
                    for flags in (mmap.MAP_PRIVATE, mmap.MAP_SHARED):
                        with mmap.mmap(f.fileno(), size, flags, mmap.PROT_READ) as m:
                            mapped = m[:]
                        assert len(mapped) == size and mapped.endswith(b"\n"), name
                        assert b"\0" not in mapped, name


def test_a_container_with_controllers_at_different_paths_gets_each_ones_files():
    """On this machine the test cgroup's memory sits below this sandbox's memory cgroup and
    its cpu and cpuset at other paths; its key names each, so its CPU files are its own
    cpuset's and quota's, not the node's (a key of the memory path alone read cpu and cpuset
    where no such cgroup was: all CPUs and the node's counters)."""
    from guestfs.sources.containerdirs import key_of_cgroup_text, path_of_key, split_spec
    from tests.support.realcg import process_in

    with v1_cgroup(512 * MiB, 50000, 100000, cpus="1") as cg, process_in(cg) as proc, \
            private_mountpoint() as mpp:
        if len({cg.paths["memory"], cg.paths["cpu"], cg.paths["cpuset"]}) == 1:
            pytest.skip("every controller at one path here: nothing to tell apart")
        with open(f"/proc/{proc.pid}/cgroup") as f:
            key = key_of_cgroup_text(f.read())
        main, others = split_spec(path_of_key(key))
        assert main == cg.paths["memory"] and cg.paths["cpu"] in others.values()
        mp = str(mpp)
        with mounted(mp, "--per-container"):
            assert read(f"{mp}/{key}/sys/devices/system/cpu/online") == b"0\n"
            assert read(f"{mp}/{key}/proc/cpuinfo").count(b"processor") == 1
            assert mem_total_kb(read(f"{mp}/{key}/proc/meminfo")) == 512 * 1024
            stat = read(f"{mp}/{key}/proc/stat").decode().splitlines()
            assert [ln.split()[0] for ln in stat[:2]] == ["cpu", "cpu0"] and \
                not stat[2].startswith("cpu1")


def test_per_container_keys_have_one_spelling():
    from guestfs.sources.containerdirs import BadKey, dir_key, join_spec, path_of_key

    spec = join_spec("/a/b", {frozenset({"cpuacct", "cpu"}): "/c", frozenset({"cpuset"}): "/"})
    assert spec == "/a/b;cpu,cpuacct=/c;cpuset=/"
    assert path_of_key(dir_key(spec)) == spec
    assert join_spec("/a", {frozenset({"cpu"}): "/a"}) == "/a"    # same path: plain key
    for alias in ("/a/b;cpuset=/;cpu,cpuacct=/c", "/a/b;cpuacct,cpu=/c", "/a;cpu=/a",
                  "/a;cpu=", "/a;=/b", "/a;cpu=/../x", "/a;cpu"):
        with pytest.raises(BadKey):
            path_of_key(dir_key(alias))
    with pytest.raises(BadKey):
        path_of_key("%2F%FF")          # not UTF-8: refused, not a traceback
