"""ViewServer on fixture roots: views, fallbacks, caching and persistent state."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import pytest

from guestfs.daemon.server import ServerConfig, UnseenReader, ViewServer
from guestfs.engine.explicit import ExplicitLimits, ExplicitSettings, collect_explicit
from guestfs.sources.host_root import HostRoot
from tests.conftest import fixture_root
from tests.support.render_helpers import meminfo_kb


@dataclass(frozen=True)
class CountingHost(HostRoot):
    reads: list[str] = field(default_factory=list)

    def read_text(self, host_path: str) -> str:
        self.reads.append(host_path)
        return super().read_text(host_path)


def server(root, **kw) -> tuple[ViewServer, CountingHost]:
    host = CountingHost(str(root))
    return ViewServer(host, ServerConfig(**kw)), host


def test_a_cache_hit_reads_no_cgroup_file():
    srv, host = server(fixture_root("k8s-systemd-v2-burstable"), cache_ttl=60)
    first = srv.render("/proc/meminfo", 7)
    assert any(p.startswith("/sys/fs/cgroup/") for p in host.reads)
    host.reads.clear()
    assert srv.render("/proc/meminfo", 7) == first
    assert host.reads == []
    # Another file of the same view reuses the view: only the host's own file is read.
    srv.render("/proc/cpuinfo", 7)
    assert host.reads == ["/proc/cpuinfo"]


def test_an_unseen_reader_is_refused_not_served_the_daemons_view():
    srv, _ = server(fixture_root("k8s-systemd-v2-burstable"))
    for pid in (4242, 0):  # no /proc/4242 in the fixture; 0 is FUSE's "not in our pidns"
        with pytest.raises(UnseenReader, match=f"pid {pid}"):
            srv.render("/proc/meminfo", pid)
    assert sum(srv.refusals.values()) == 2 and srv.errors == 0
    # A fixed view needs no reader: it is served whoever asks.
    fixed, _ = server(fixture_root("k8s-systemd-v2-burstable"), view="self")
    assert meminfo_kb(fixed.render("/proc/meminfo", 0).decode())["MemTotal"] == 524288


def test_a_reused_pid_gets_its_own_cgroups_view_within_the_ttl(copy_fixture):
    root = copy_fixture("k8s-systemd-v2-burstable")
    pod = ("/kubepods.slice/kubepods-burstable.slice/"
           "kubepods-burstable-poda5d4fbc7_30d6_43e8_8425_8ee6f401decc.slice")
    srv, _ = server(root, cache_ttl=60)
    assert meminfo_kb(srv.render("/proc/meminfo", 7).decode())["MemTotal"] == 524288
    # pid 7 exits; a new process gets pid 7 in the root cgroup (a later start time).
    stat = (root / "proc/7/stat").read_text()
    (root / "proc/7/stat").write_text(stat.replace(" 35601000 ", " 35609999 "))
    (root / "proc/7/cgroup").write_text("0::/\n")
    assert meminfo_kb(srv.render("/proc/meminfo", 7).decode())["MemTotal"] == 8131768
    (root / "proc/7/stat").write_text(stat)
    (root / "proc/7/cgroup").write_text(f"0::{pod}\n")
    assert meminfo_kb(srv.render("/proc/meminfo", 7).decode())["MemTotal"] == 524288


def test_views_caller_init_self_and_pinned(copy_fixture):
    root = copy_fixture("k8s-systemd-v2-burstable")
    besteffort = ("/kubepods.slice/kubepods-burstable.slice/"
                  "kubepods-burstable-poda5d4fbc7_30d6_43e8_8425_8ee6f401decc.slice")
    # pid 7 sits in the pod slice itself (512Mi); pid 1 and the daemon in the root cgroup.
    (root / "proc/7/cgroup").write_text(f"0::{besteffort}\n")
    (root / "proc/1/cgroup").write_text("0::/\n")
    (root / "proc/self/cgroup").write_text("0::/\n")
    host_total = 8131768

    def total(**kw) -> int:
        srv, _ = server(root, **kw)
        return meminfo_kb(srv.render("/proc/meminfo", 7).decode())["MemTotal"]

    assert total(view="caller") == 524288
    assert total(view="init") == host_total      # pid 7's namespace init is pid 1
    assert total(view="self") == host_total
    assert total(view="self", cgroup=besteffort) == 524288


def test_bad_input_serves_the_host_file_and_the_daemon_lives(copy_fixture):
    root = copy_fixture("k8s-systemd-v2-burstable")
    (root / "proc/self/mountinfo").write_text("garbage\n")
    srv, _ = server(root)
    # No cgroup mount is found: the host's meminfo, unchanged.
    assert srv.render("/proc/meminfo", 7) == (root / "proc/meminfo").read_bytes()
    meminfo = (root / "proc/meminfo").read_text()
    (root / "proc/meminfo").write_text(meminfo.replace("MemTotal:", "MemTotal: x"))
    srv2, _ = server(root, cache_ttl=0)
    assert srv2.render("/proc/meminfo", 7).startswith(b"MemTotal: x")
    assert srv2.errors == 1


def test_stat_stays_monotonic_across_cache_expiry_and_usage_going_back(copy_fixture):
    root = copy_fixture("k8s-systemd-v2-burstable")
    pod = next((root / "sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice").glob("*pod*"))
    srv, _ = server(root, cache_ttl=0)
    first = [int(x) for x in srv.render("/proc/stat", 7).split(b"\n")[0].split()[1:]]
    # The cgroup is recreated (a new container, a limit change): its counter restarts.
    (pod / "cpu.stat").write_text("usage_usec 10\nuser_usec 5\nsystem_usec 5\n")
    second = [int(x) for x in srv.render("/proc/stat", 7).split(b"\n")[0].split()[1:]]
    assert all(b >= a for a, b in zip(first, second, strict=True))


def test_loadavg_state_is_sampled():
    srv, _ = server(fixture_root("k8s-systemd-v2-burstable"), cache_ttl=0,
                    explicit=ExplicitLimits())
    # Like the kernel's avenrun the average starts at 0; the first read folds in one
    # sample of the 3 active threads: 1-min (3 * 2048 * (2048 - 1884) + 2047) // 2048 =
    # 492 -> 0.24; 5-min (3 * 2048 * 34 + 2047) // 2048 = 103 -> 0.05; 15-min 33 -> 0.02.
    assert srv.render("/proc/loadavg", 7).startswith(b"0.24 0.05 0.02 2/4 ")
    for _ in range(12):     # one minute of 5 s samples at a constant 3 active threads
        srv.sample_loads()
    # 13 samples: 3 * (1 - (1884/2048)^13) = 3 * (1 - 0.338) = 1.99 (the 1-min average
    # after a minute is about 1 - 1/e of the load, as in the kernel).
    one, five, _ = (float(x) for x in srv.render("/proc/loadavg", 7).split()[:3])
    assert 1.95 <= one <= 2.05 and 0.5 < five < one


def test_open_renderings_are_bounded_by_entries_whatever_their_size():
    from guestfs.daemon.renderings import OpenRenderings

    snaps = OpenRenderings(max_entries=100)
    for fh in range(1, 100_001):       # 10^5 opens of a 4-byte file, never closed
        snaps.put(fh, b"0-1\n")
        assert len(snaps) <= 100
    assert snaps.get(100_000) == b"0-1\n" and snaps.get(99_901) == b"0-1\n"
    assert snaps.get(99_900) is None   # oldest first
    assert snaps.nbytes == 100 * (4 + OpenRenderings.ENTRY_OVERHEAD)


def test_open_renderings_are_bounded_oldest_first():
    from guestfs.daemon.renderings import OpenRenderings

    snaps = OpenRenderings(max_bytes=10 + 2 * OpenRenderings.ENTRY_OVERHEAD)
    snaps.put(1, b"aaaa")
    snaps.put(2, b"bbbb")
    assert snaps.get(1) == b"aaaa"
    snaps.put(3, b"cccc")          # 12 bytes > 10: handle 1, the oldest, goes
    assert snaps.get(1) is None and snaps.get(2) == b"bbbb" and snaps.get(3) == b"cccc"
    snaps.put(2, b"b")             # re-rendered at offset 0: replaced, not added
    assert snaps.get(2) == b"b"
    snaps.put(4, b"x" * 50)        # a single large rendering is kept whole
    assert snaps.get(4) == b"x" * 50 and snaps.get(2) is None


def test_no_cgroup_in_sight_gvisor_style(copy_fixture):
    """Inside gVisor /proc/self/cgroup is empty and no cgroup is mounted: an explicit limit
    still applies, usage comes from the (sandbox's) own meminfo, nothing falls back."""
    root = copy_fixture("k8s-systemd-v2-burstable")
    (root / "proc/self/mountinfo").write_text(
        "10 10 0:10 / / rw - overlay none rw\n13 10 0:12 / /proc rw - proc none rw\n")
    for pid in ("self", "7"):
        (root / f"proc/{pid}/cgroup").write_text("")
    explicit = collect_explicit(ExplicitSettings(memory_limit="6Gi"))
    srv, _ = server(root, explicit=explicit)
    got = meminfo_kb(srv.render("/proc/meminfo", 7).decode())
    assert srv.errors == 0
    host_used = 8131768 - 8131768 * 6 // 10     # fixture host: MemFree is 60% of MemTotal
    assert got["MemTotal"] == 6 * 1024 * 1024
    assert got["MemFree"] == 6 * 1024 * 1024 - host_used
    assert got["Cached"] == 4704368             # the host's Cached, as a v2 "file"


def test_stat_reads_cpu_counters_now_within_the_cache_ttl(copy_fixture):
    """Rates from /proc/stat (vmstat, a Prometheus rate()) need counters of the moment of
    the read: a 60 s cache of the limits must not hold the CPU counters back."""
    root = copy_fixture("k8s-systemd-v2-burstable")
    pod = next((root / "sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice").glob("*pod*"))
    srv, _ = server(root, cache_ttl=60)
    busy = lambda: sum(int(x) for x in  # noqa: E731 - user + system ticks of the cpu line
                       srv.render("/proc/stat", 7).split(b"\n")[0].split()[1:4:2])
    before = busy()
    stat = dict(line.split() for line in (pod / "cpu.stat").read_text().splitlines())
    user = int(stat["user_usec"]) + 1_500_000      # 1.5 s more user time: 150 ticks
    (pod / "cpu.stat").write_text("".join(
        f"{k} {user if k == 'user_usec' else v}\n" for k, v in stat.items()))
    # 2 s later (1 CPU: at most 200 ticks of busy time in them).
    (root / "proc/uptime").write_text("356514.43 1401203.77\n")
    assert busy() - before == 150


def test_load_average_begins_with_the_first_read_of_any_file():
    """A view first read through meminfo (what `guestfs run` does at start) samples its
    load from then on: a loadavg read a minute later shows the minute's load."""
    srv, _ = server(fixture_root("k8s-systemd-v2-burstable"), cache_ttl=0,
                    explicit=ExplicitLimits())
    srv.render("/proc/meminfo", 7)
    for _ in range(12):     # one minute of 5 s samples at a constant 3 active threads
        srv.sample_loads()
    # 13 samples as in test_loadavg_state_is_sampled (meminfo's read took the first),
    # plus none at the loadavg read itself: 3 * (1 - (1884/2048)^13) = 1.99.
    one = float(srv.render("/proc/loadavg", 7).split()[0])
    assert 1.95 <= one <= 2.05, one


def test_thread_states_are_read_once_per_view_not_per_read():
    """procs_running/blocked and the load need /proc/<tid>/stat of every container thread:
    read once per cached view, while the CPU counter is read on every /proc/stat read."""
    srv, host = server(fixture_root("k8s-systemd-v2-burstable"), cache_ttl=60,
                       explicit=ExplicitLimits())
    srv.render("/proc/stat", 7)
    host.reads.clear()
    srv.render("/proc/stat", 7)
    srv.render("/proc/loadavg", 7)
    tid_reads = [p for p in host.reads if p.startswith("/proc/") and p.endswith("/stat")
                 and p != "/proc/stat"]
    assert tid_reads == []
    assert any(p.endswith("/cpu.stat") for p in host.reads)


class FakeServer:
    """The view server as fusefs.make_operations uses it: every rendering ``data``, one
    view for every reader; ``keyed``: render_for names that view (else the caller asks
    view_key). ``renders`` counts render_for's calls."""

    VIEW = "0::/the-readers-cgroup\n"

    def __init__(self, host: HostRoot, keyed: bool = False) -> None:
        self.host, self.data, self.keyed, self.renders = host, b"x\n", keyed, 0
        self.serving: dict[str, object] = {}

    def render_until(self, path: str, pid: int,
                     cgroup: str | None = None) -> tuple[float, bytes]:
        return 0.0, self.data

    def render_for(self, path: str, pid: int, cgroup: str | None = None,
                   who: object = None) -> tuple[float, bytes, str | None]:
        self.renders += 1
        return 0.0, self.data, self.VIEW if self.keyed else None

    def reader(self, pid: int) -> tuple[int, None]:
        return (pid, None)

    def view_key(self, pid: int, who: object = None) -> str:
        return self.VIEW


def fake_fuse():  # type: ignore[no-untyped-def]
    """The fuse module as make_operations uses it; every reader is pid 7."""
    import types

    class FuseOSError(OSError):
        def __init__(self, errno: int) -> None:
            super().__init__(errno, "")

    return types.SimpleNamespace(FuseOSError=FuseOSError, Operations=object,
                                 fuse_get_context=lambda: (0, 0, 7))


def test_a_size_holds_the_rendering_that_the_open_after_it_serves(copy_fixture):
    """Served through the daemon, a LOOKUP renders the file for its reader and reports
    that rendering's length in whole pages; the open that follows serves exactly that
    rendering at its first read (whatever the server renders meanwhile), an fstat of the
    open handle reports its size, and a later read at offset 0 renders afresh."""
    import types

    from guestfs.daemon.fusefs import PAGE, make_operations

    srv = FakeServer(HostRoot(str(copy_fixture("k8s-systemd-v2-burstable"))))
    ops = make_operations(fake_fuse(), srv)  # type: ignore[arg-type]
    srv.data = b"y" * (PAGE + 1)
    assert ops.getattr("/proc/stat")["st_size"] == 2 * PAGE        # 4097 bytes: two pages
    fi = types.SimpleNamespace(flags=os.O_RDONLY, fh=0, direct_io=0, lock_owner=1)
    ops.open("/proc/stat", fi)
    srv.data = b"z" * 10                                            # renders differ now
    assert ops.getattr("/proc/stat", fi)["st_size"] == 2 * PAGE     # fstat: the handle's
    assert ops.read("/proc/stat", 100, PAGE, fi) == b"y"            # first read: its size's
    assert ops.read("/proc/stat", 65536, 0, fi) == b"z" * 10        # offset 0 again: fresh
    assert ops.read("/proc/stat", 65536, 5, fi) == b"z" * 5
    assert ops.getattr("/proc/stat", fi)["st_size"] == PAGE
    other = types.SimpleNamespace(flags=os.O_RDONLY, fh=0, direct_io=0, lock_owner=1)
    ops.open("/proc/uptime", other)                     # no LOOKUP before it: rendered at
    assert ops.read("/proc/uptime", 65536, 0, other) == b"z" * 10   # its first read
    assert ops.getattr("/proc/meminfo")["st_size"] == PAGE   # never 0: sendfile reads it


def test_an_fstat_between_open_and_read_reports_the_handles_rendering(copy_fixture):
    """The kernel sends an fstat's GETATTR without the handle (vfs_getattr passes no file):
    between an open and its first read it reports the size of the rendering that read
    will serve, without rendering again (open + fstat + read rendered /proc/stat twice);
    once read, a GETATTR renders afresh."""
    import types

    from guestfs.daemon.fusefs import PAGE, make_operations

    srv = FakeServer(HostRoot(str(copy_fixture("k8s-systemd-v2-burstable"))), keyed=True)
    srv.data = b"y" * (PAGE + 1)
    ops = make_operations(fake_fuse(), srv)  # type: ignore[arg-type]
    assert ops.getattr("/proc/stat")["st_size"] == 2 * PAGE       # the open's permission
    fi = types.SimpleNamespace(flags=os.O_RDONLY, fh=0, direct_io=0, lock_owner=1)
    ops.open("/proc/stat", fi)
    srv.data = b"z" * 10
    assert ops.getattr("/proc/stat")["st_size"] == 2 * PAGE       # fstat, no handle
    assert srv.renders == 1
    assert ops.read("/proc/stat", 65536, 0, fi) == b"y" * (PAGE + 1)
    assert ops.getattr("/proc/stat")["st_size"] == PAGE           # read: a fresh one
    assert srv.renders == 2
    # A second open right after such a GETATTR serves what it reported.
    second = types.SimpleNamespace(flags=os.O_RDONLY, fh=0, direct_io=0, lock_owner=1)
    ops.open("/proc/stat", second)
    srv.data = b"w" * 3
    assert ops.read("/proc/stat", 65536, 0, second) == b"z" * 10


POD = ("sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/"
       "kubepods-burstable-poda5d4fbc7_30d6_43e8_8425_8ee6f401decc.slice")
LEAF = (f"{POD}/cri-containerd-"
        "a991eb3b64a228cb0b269925127c28cb39d482d27c6248540e0e3b41633a907e.scope")


def cpu_fields(srv: ViewServer) -> list[list[int]]:
    """user, nice, system, idle of the ``cpu`` line and each ``cpuN`` line pid 7 reads."""
    lines = srv.render("/proc/stat", 7).decode().splitlines()
    return [[int(x) for x in ln.split()[1:5]] for ln in lines if ln.startswith("cpu")]


def set_cpu_stat(d, user_usec: int, system_usec: int) -> None:
    (d / "cpu.stat").write_text(f"usage_usec {user_usec + system_usec}\n"
                                f"user_usec {user_usec}\nsystem_usec {system_usec}\n")


def test_a_recreated_cgroup_gets_a_fresh_clock_and_idle_within_its_age(copy_fixture):
    """The pod slice (where the quota, so the clock, sits) is removed and made again at
    the same path while the daemon runs: its clock starts again with the new cgroup."""
    import shutil

    root = copy_fixture("k8s-systemd-v2-burstable")
    srv, _ = server(root, cache_ttl=0)
    # 1 CPU (the pod's 100000/100000), init 512.43 s old, the pod burnt 2097152 + 1048576
    # usec: busy fits, so user 209, system 104, idle 512.43 - 3.145728 s = 50928 ticks.
    assert cpu_fields(srv) == [[209, 0, 104, 50928]] * 2
    shutil.copytree(root / POD, root / (POD + ".new"))
    shutil.rmtree(root / POD)
    os.rename(root / (POD + ".new"), root / POD)       # another directory inode
    set_cpu_stat(root / POD, 400_000, 100_000)
    # The new pod's only process is a shell started at 356610.00 s (init lives elsewhere).
    (root / "proc/1/cgroup").write_text("0::/\n")
    (root / LEAF / "cgroup.procs").write_text("7\n")
    stat7 = (root / "proc/7/stat").read_text()
    (root / "proc/7/stat").write_text(stat7.replace(" 35601000 ", " 35661000 "))
    (root / "proc/uptime").write_text("356612.43 1401203.77\n")
    # Age 2.43 s, 0.5 s burnt: user 40, system 10, idle 2.43 - 0.5 = 1.93 s. Carried
    # over, the old clock held busy at 313 ticks and idle at 609 s against an age of 2.43.
    assert cpu_fields(srv) == [[40, 0, 10, 193]] * 2
    assert srv.render("/proc/uptime", 7) == b"2.43 1.93\n"
    # One second later 0.8 s more: busy +80 ticks, idle +20, from its first second.
    set_cpu_stat(root / POD, 1_000_000, 300_000)
    (root / "proc/uptime").write_text("356613.43 1401203.77\n")
    assert cpu_fields(srv) == [[100, 0, 30, 213]] * 2
    assert srv.render("/proc/uptime", 7) == b"3.43 2.13\n"


@pytest.mark.parametrize(("cpu_max", "counter", "start", "after"), [
    # A 2-CPU quota at the pod, whose counter the clock follows: user 2097152, system
    # 1048576 usec at first (209, 104 ticks; idle 512.43 - 3.145728 s = 50928 ticks).
    ("200000 100000", POD, [209, 0, 104, 50928], [959, 0, 354, 50928]),
    # No quota: the counter is the container's own, user 1957341, system 978670 usec
    # (195, 97; idle 512.43 - 2.936011 s = 50949 ticks).
    ("max 100000", LEAF, [195, 0, 97, 50949], [945, 0, 347, 50949]),
])
def test_busy_is_capped_at_the_visible_cpus_when_the_cpu_cgroup_is_wider(
        copy_fixture, cpu_max, counter, start, after):
    """A 1-CPU cpuset under a cpu cgroup that burns 2 CPUs (a pod whose other container
    runs on another CPU): 10 s later the counter has moved 15 s user + 5 s system, but
    one CPU gives 10 s at most: busy +10 s in the same 3:1 split (+750 user, +250 system
    ticks, from the usec sums), idle +0, and uptime's idle stays 509.28 or 509.49 s."""
    root = copy_fixture("k8s-systemd-v2-burstable")
    (root / POD / "cpu.max").write_text(cpu_max + "\n")
    (root / LEAF / "cpuset.cpus.effective").write_text("0\n")
    srv, _ = server(root, cache_ttl=0)
    assert cpu_fields(srv) == [start] * 2
    idle = srv.render("/proc/uptime", 7).split()[1]
    text = (root / counter / "cpu.stat").read_text().split()
    user, system = int(text[text.index("user_usec") + 1]), int(text[text.index("system_usec") + 1])
    set_cpu_stat(root / counter, user + 15_000_000, system + 5_000_000)
    (root / "proc/uptime").write_text("356522.43 1401203.77\n")
    assert cpu_fields(srv) == [after] * 2     # was 200 ticks/s of busy on one CPU
    assert srv.render("/proc/uptime", 7) == b"522.43 " + idle + b"\n"


def test_a_cgroup_directory_that_cannot_be_looked_at_is_no_new_container(copy_fixture,
                                                                          monkeypatch):
    """A stat of the pod's directory that fails (gone between the snapshot and the stat)
    says nothing of a new container: the clock carries on rather than start again."""
    from guestfs.sources import usage

    root = copy_fixture("k8s-systemd-v2-burstable")
    # The pod burnt 600 s before its 512.43 s old init: the clock starts "since the view
    # began": busy 0, idle 512.43 s.
    set_cpu_stat(root / POD, 600_000_000, 0)
    srv, _ = server(root, cache_ttl=0)
    assert cpu_fields(srv) == [[0, 0, 0, 51243]] * 2
    monkeypatch.setattr(usage, "level_stat", lambda host, level: None)
    set_cpu_stat(root / POD, 600_500_000, 0)
    (root / "proc/uptime").write_text("356513.43 1401203.77\n")
    # 1 s later, 0.5 s more user time: +50 user ticks, +50 idle. A fresh clock would
    # have started again: busy 0, idle 513.43 s.
    assert cpu_fields(srv) == [[50, 0, 0, 51293]] * 2


def test_a_young_cgroups_view_is_checked_against_its_limit_files(copy_fixture, monkeypatch):
    """runc makes a container's cgroup, lets its init bind our files (whose sizes we render
    for), and only then writes the limits into it: a view of a cgroup younger than YOUNG
    must not be kept for a TTL as it was, or the app's first reads get the limits of
    before."""
    from guestfs.daemon import server as server_mod

    root = copy_fixture("k8s-systemd-v2-burstable")
    text = (root / "proc/7/cgroup").read_text()
    pod = root / "sys/fs/cgroup" / text.strip().split("::", 1)[1].lstrip("/")  # the leaf
    monkeypatch.setattr(server_mod, "YOUNG", 3600.0)   # every cgroup here is young
    srv, _ = server(root, cache_ttl=60)
    assert meminfo_kb(srv.render("/proc/meminfo", 7).decode())["MemTotal"] == 524288
    (pod / "memory.max").write_text(f"{256 << 20}\n")
    assert meminfo_kb(srv.render("/proc/meminfo", 7).decode())["MemTotal"] == 256 * 1024
    monkeypatch.setattr(server_mod, "YOUNG", 0.0)      # and now none is
    srv2, _ = server(root, cache_ttl=60)
    assert meminfo_kb(srv2.render("/proc/meminfo", 7).decode())["MemTotal"] == 256 * 1024
    (pod / "memory.max").write_text(f"{512 << 20}\n")
    # Cached for the TTL, as any view of a grown-up cgroup is.
    assert meminfo_kb(srv2.render("/proc/meminfo", 7).decode())["MemTotal"] == 256 * 1024


def test_an_unchanged_rendering_is_the_same_object_as_the_last():
    # The per-open store keeps one rendering per open handle: equal renderings must be
    # one object there, not one copy per open (docs/performance.md, "Daemon memory").
    srv, _ = server(fixture_root("k8s-systemd-v2-burstable"), cache_ttl=0)
    first = srv.render("/proc/meminfo", 7)
    again = srv.render("/proc/meminfo", 7)
    assert again == first and again is first
