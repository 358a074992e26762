"""Properties over random limits and usages (hypothesis)."""

from __future__ import annotations

from types import MappingProxyType

from hypothesis import example, given, settings
from hypothesis import strategies as st

from guestfs.daemon.file_table import ViewState
from guestfs.engine.limits import EffectiveLimits
from guestfs.engine.provenance import Resolved
from guestfs.render.cpu import render_cpu_list, render_cpuinfo
from guestfs.render.meminfo import render_meminfo, render_swaps
from guestfs.render.stat import CpuClock, cpu_lines, render_stat
from guestfs.sources.host_proc import HostInfo
from guestfs.sources.memory_usage import MemoryUsage
from guestfs.sources.provenance import CGROUP, HOST, Source
from guestfs.sources.usage_parsers import CpuUsage
from tests.conftest import fixture_root
from tests.support.fuzzing import examples
from tests.support.render_helpers import meminfo_kb

HOST_MEMINFO = (fixture_root("k8s-systemd-v2-besteffort") / "proc/meminfo").read_text()
HOST_MEM = 16309852 * 1024
HOST_SWAP = 2097148 * 1024
HOST_CPUINFO = (fixture_root("k8s-systemd-v2-besteffort") / "proc/cpuinfo").read_text()
HOST_STAT = (fixture_root("k8s-systemd-v2-besteffort") / "proc/stat").read_text()
SRC = Source(CGROUP, "/sys/fs/cgroup/x/memory.max", "/x")
U64 = 2**64 - 1

stat_keys = ["anon", "file", "active_anon", "inactive_anon", "active_file", "inactive_file",
             "slab_reclaimable", "slab_unreclaimable", "slab", "shmem", "file_mapped",
             "file_dirty", "file_writeback", "anon_thp", "unevictable"]


def make_limits(limit: int, usage: int, stat: dict[str, int], swap: int, swap_used: int,
                version: int, cpus: tuple[int, ...] = tuple(range(8)), n: int = 8
                ) -> EffectiveLimits:
    mu = MemoryUsage(usage, MappingProxyType(stat), SRC)
    return EffectiveLimits(
        pid="self", host=HostInfo(HOST_MEM, HOST_SWAP, tuple(range(8))),
        memory=Resolved(min(limit, HOST_MEM), SRC, limit < HOST_MEM),
        memory_usage=mu, leaf_memory_usage=mu,
        swap=Resolved(min(swap, HOST_SWAP), SRC, True),
        swap_usage=Resolved(swap_used, SRC, True),
        cpu_quota=Resolved(None, Source(HOST), False),
        cpuset=Resolved(cpus, SRC, True), cpu_count=Resolved(n, SRC, True),
        visible_cpus=cpus[:n], cpu_rounding="ceil",
        cgroup_versions=MappingProxyType({"memory": version, "cpu": version,
                                          "cpuset": version}),
        warnings=())


@settings(max_examples=examples(300), deadline=None)
@given(limit=st.integers(1, 2 * HOST_MEM), usage=st.integers(0, 4 * HOST_MEM),
       values=st.lists(st.integers(0, 4 * HOST_MEM), min_size=len(stat_keys),
                       max_size=len(stat_keys)),
       swap=st.integers(0, 2 * HOST_SWAP), swap_used=st.integers(0, 4 * HOST_SWAP),
       version=st.sampled_from([1, 2]))
# Nothing limited: both files are the host's, and must agree on the swap.
@example(limit=2 * HOST_MEM, usage=0, values=[0] * len(stat_keys), swap=2 * HOST_SWAP,
         swap_used=0, version=2)
def test_meminfo_is_ordered_bounded_and_never_wraps(limit, usage, values, swap, swap_used,
                                                    version):
    stat = dict(zip(stat_keys, values, strict=True))
    if version == 1:
        stat = {"total_" + k: v for k, v in stat.items()}
    lim = make_limits(limit, usage, stat, swap, swap_used, version)
    got = meminfo_kb(render_meminfo(HOST_MEMINFO, lim))
    assert 0 < got["MemTotal"] <= HOST_MEM // 1024
    assert 0 <= got["MemFree"] <= got["MemAvailable"] <= got["MemTotal"]
    assert 0 <= got["SwapFree"] <= got["SwapTotal"] <= HOST_SWAP // 1024
    assert all(0 <= v < U64 for v in got.values())
    # Where nothing is limited the host's file is served as it is: give it the host's swap.
    host_swaps = ("Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
                  f"/dev/sda2  partition\t{HOST_SWAP // 1024}\t0\t-2\n")
    swaps = render_swaps(host_swaps, lim).splitlines()
    if got["SwapTotal"] > 0:
        assert int(swaps[1].split()[2]) == got["SwapTotal"]
    else:
        assert len(swaps) == 1


@settings(max_examples=examples(200), deadline=None)
@given(start=st.integers(0, 10**13),
       steps=st.lists(st.tuples(st.integers(-5_000_000, 5_000_000),
                                st.integers(-5_000_000, 5_000_000),
                                st.floats(0, 30), st.integers(1, 8)),
                      min_size=1, max_size=25))
def test_stat_counters_are_monotonic_whatever_the_cgroup_does(start, steps):
    # Counters going backwards or running past what the CPUs can give, N changing: within
    # one incarnation no served counter decreases, busy grows by at most elapsed x N and
    # idle stays within age x N (the container is 100 s old at the first reading).
    clock = CpuClock()
    user = system = start
    now = 100.0
    prev: dict[str, list[int]] = {}
    clock.advance(CpuUsage(user, system, "cpu.stat"), 2, now, 100.0)
    for du, ds, dt, n in steps:
        user, system, now = max(0, user + du), max(0, system + ds), now + dt
        busy_before = clock.total[0] + clock.total[1]
        clock.advance(CpuUsage(user, system, "cpu.stat"), n, now, 100.0)
        assert clock.total[0] + clock.total[1] - busy_before <= round(dt * n * 1e6)
        assert clock.idle_seconds <= now * 8 + 1e-6        # age = now here, N <= 8
        lines = cpu_lines(n, clock)
        for name, fields in lines:
            assert all(f >= 0 for f in fields)
            if name in prev:
                assert all(a >= b for a, b in zip(fields, prev[name], strict=True)), name
            prev[name] = fields
        assert [name for name, _ in lines] == ["cpu"] + [f"cpu{i}" for i in range(n)]


def test_long_lived_cgroup_idle_container_reads_idle():
    # 2 CPUs; the cgroup burnt 500 s before a container that is 100 s old: more than
    # 2 x 100 s, so the clock starts "since the view began": busy 0, idle 200 s.
    clock = CpuClock()
    clock.advance(CpuUsage(400_000_000, 100_000_000, "cpu.stat"), 2, 1000.0, 100.0)
    assert cpu_lines(2, clock)[0][1][:4] == [0, 0, 0, 20000]
    # 10 s later, 0.2 s more CPU (an idle pod): idle grows by 2 x 10 - 0.2 = 19.8 s.
    clock.advance(CpuUsage(400_100_000, 100_100_000, "cpu.stat"), 2, 1010.0, 110.0)
    total = cpu_lines(2, clock)[0][1]
    assert total[:4] == [10, 0, 10, 20000 + 1980]
    assert cpu_lines(2, clock)[1][1][:4] == [5, 0, 5, 10000 + 990]


def test_busy_loop_reads_its_share_of_the_view():
    # 1 busy thread in a 2-CPU view for 10 s: busy +10 s, idle +10 s: top shows 50 %.
    clock = CpuClock()
    clock.advance(CpuUsage(0, 0, "cpu.stat"), 2, 50.0, 0.0)
    clock.advance(CpuUsage(9_000_000, 1_000_000, "cpu.stat"), 2, 60.0, 10.0)
    user, _, system, idle = cpu_lines(2, clock)[0][1][:4]
    assert (user, system, idle) == (900, 100, 1000)


def test_counter_reset_in_place_rebases_instead_of_freezing():
    # The cgroup had burnt 100 s; its counter is reset (a write of 0 to cpuacct.usage)
    # and it burns 2 s in the next 2 s: the served busy time moves by 2 s (not 0, as with
    # a max()) and nothing served goes backwards.
    clock = CpuClock()
    clock.advance(CpuUsage(100_000_000, 0, "cpu.stat"), 1, 500.0, 400.0)
    before = cpu_lines(1, clock)[0][1]
    clock.advance(CpuUsage(0, 0, "cpu.stat"), 1, 501.0, 401.0)
    clock.advance(CpuUsage(2_000_000, 0, "cpu.stat"), 1, 503.0, 403.0)
    after = cpu_lines(1, clock)[0][1]
    assert after[0] - before[0] == 200
    assert after[3] - before[3] == 100  # the second in which it was reset


def test_recreated_cgroup_gets_a_fresh_clock_that_moves_from_its_first_second():
    # A 2-CPU view: the old cgroup (400 s old) burnt 100 s. A new directory at the same
    # path, 1 s old at its first reading, has burnt 0.5 s: its clock starts "since the
    # container began": busy 50 ticks, idle 1 x 2 - 0.5 = 1.5 s = 150 ticks. One second
    # later it has burnt 1.5 s: busy 150 ticks, idle 150 + (2 - 1) x 100 = 250 ticks,
    # and uptime's idle (2.5 s) is within age x N = 2 x 2 s. The old clock carried over
    # held busy at 10000 ticks and kept idle at 700 s against an age of 2 s.
    state = ViewState()
    state.follow("old")
    state.clock.advance(CpuUsage(100_000_000, 0, "cpu.stat"), 2, 500.0, 400.0)
    state.follow("new")
    state.clock.advance(CpuUsage(400_000, 100_000, "cpu.stat"), 2, 501.0, 1.0)
    assert cpu_lines(2, state.clock)[0][1][:4] == [40, 0, 10, 150]
    state.clock.advance(CpuUsage(1_200_000, 300_000, "cpu.stat"), 2, 502.0, 2.0)
    assert cpu_lines(2, state.clock)[0][1][:4] == [120, 0, 30, 250]
    assert [f[:4] for _, f in cpu_lines(2, state.clock)[1:]] == [[60, 0, 15, 125]] * 2
    assert state.clock.idle_seconds == 2.5
    state.follow("new")                     # the same incarnation keeps its clock
    assert state.clock.idle_seconds == 2.5


def test_busy_is_capped_at_what_the_visible_cpus_can_give():
    # A 1-CPU view (a 1-CPU cpuset under a 2-CPU quota or no quota) whose counter is read
    # at a cgroup burning 2 CPUs: 10 s burn 20 s (15 user, 5 system). One CPU gives at
    # most 10 s = 1000 ticks: busy 1000 ticks in the same 3:1 proportion (750 user, 250
    # system), idle 0, per-CPU line the same; uptime's idle stays what it was (50 s, the
    # container being 60 s old with 10 s burnt at the first reading).
    clock = CpuClock()
    clock.advance(CpuUsage(8_000_000, 2_000_000, "cpu.stat"), 1, 1000.0, 60.0)
    clock.advance(CpuUsage(23_000_000, 7_000_000, "cpu.stat"), 1, 1010.0, 70.0)
    total, cpu0 = (f[:4] for _, f in cpu_lines(1, clock))
    assert total == [800 + 750, 0, 200 + 250, 5000]
    assert cpu0 == total
    assert clock.idle_seconds == 50.0
    # Of the 10 s cut, 50 ms (CARRY_USEC x 1 CPU) is kept in the same split: 37.5 ms user,
    # 12.5 ms system. The next 10 s it burns 4 s: busy +4.05 s (user 3.0375 s, system
    # 1.0125 s), idle +5.95 s.
    clock.advance(CpuUsage(26_000_000, 8_000_000, "cpu.stat"), 1, 1020.0, 80.0)
    assert cpu_lines(1, clock)[0][1][:4] == [1853, 0, 551, 5595]


@settings(max_examples=examples(100), deadline=None)
@given(cpus=st.lists(st.integers(0, 7), min_size=1, max_size=8, unique=True),
       n=st.integers(1, 8))
def test_cpuinfo_stat_and_online_agree_on_n(cpus, n):
    cpus_t = tuple(sorted(cpus))
    n = min(n, len(cpus_t))
    lim = make_limits(HOST_MEM // 2, 0, {}, 0, 0, 2, cpus_t, n)
    info = render_cpuinfo(HOST_CPUINFO, lim)
    online = render_cpu_list("0-7\n", lim)
    clock = CpuClock()
    clock.advance(CpuUsage(10**6, 10**6, "x"), n, 50.0, 50.0)
    stat = render_stat(HOST_STAT, n, clock)
    if cpus_t[:n] == tuple(range(8)):
        assert online == "0-7\n"
    else:
        assert online == ("0\n" if n == 1 else f"0-{n - 1}\n")
    shown = info.count("processor\t:")
    stat_n = sum(1 for ln in stat.splitlines() if ln.startswith("cpu") and ln[3] != " ")
    assert shown == stat_n == n
