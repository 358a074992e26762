"""Every served file on the fixtures, with values worked out by hand from the fixture
files (see the comments), not copied from guestfs's output."""

from __future__ import annotations

import pytest

from tests.conftest import FIXTURE_NAMES, MiB, fixture_root
from tests.support.render_helpers import meminfo_kb, render_all


@pytest.fixture(scope="module")
def burstable():
    return render_all(fixture_root("k8s-systemd-v2-burstable"))


@pytest.fixture(scope="module")
def docker_v1():
    return render_all(fixture_root("docker-v1"))


def host(name: str, path: str) -> str:
    return (fixture_root(name) / path.lstrip("/")).read_text()


def test_meminfo_v2_k8s_systemd_burstable(burstable):
    text = burstable["/proc/meminfo"]
    # Kernel format: "Name:" padded to 16, value right-aligned to 8, " kB".
    assert text.startswith("MemTotal:         524288 kB\nMemFree:          217088 kB\n")
    got = meminfo_kb(text)
    # The pod slice (where 512Mi is set) uses 300 MiB = 307200 kB; its memory.stat has
    # file = 100 MiB split evenly into active/inactive (51200 kB each) and
    # slab_reclaimable = 300 pages = 1200 kB.
    assert got["MemTotal"] == 524288
    assert got["MemFree"] == 524288 - 307200
    assert got["MemAvailable"] == 217088 + 51200 + 51200 + 1200
    assert got["Buffers"] == 0 and got["Cached"] == 102400
    assert got["Active(file)"] == got["Inactive(file)"] == 51200
    assert got["Active(anon)"] == 110 * 4 and got["Inactive(anon)"] == 153600 - 100 * 4
    assert got["Active"] == 440 + 51200 and got["Inactive"] == 153200 + 51200
    assert got["AnonPages"] == 153600            # anon = usage / 2
    assert got["Mapped"] == 1200 * 4             # file_mapped, which LXCFS zeroes on v2
    assert got["Dirty"] == 30 * 4 and got["Writeback"] == 2 * 4
    assert got["AnonHugePages"] == 2048          # anon_thp
    assert got["Shmem"] == 40
    assert (got["Slab"], got["SReclaimable"], got["SUnreclaim"]) == (2000, 1200, 800)
    assert got["SwapTotal"] == 0 and got["SwapFree"] == 0
    # Lines guestfs cannot compute are the host's, in host order.
    assert "CommitLimit:     4065884 kB" in text and "HugePages_Total:       0" in text
    host_names = [ln.split(":")[0] for ln in host("k8s-systemd-v2-burstable",
                                                   "/proc/meminfo").splitlines()]
    assert [ln.split(":")[0] for ln in text.splitlines()] == host_names


def test_meminfo_and_swaps_v1_with_memsw(docker_v1):
    got = meminfo_kb(docker_v1["/proc/meminfo"])
    # usage 64 MiB; total_cache = usage // 3 = 22369621 B -> 21845 kB, half active and half
    # inactive file: (11184811 + 11184810) // 1024 = 21845 kB reclaimable.
    assert got["MemTotal"] == 524288 and got["MemFree"] == 524288 - 65536
    assert got["Cached"] == 21845
    assert got["MemAvailable"] == 458752 + 21845
    assert got["AnonHugePages"] == 2048          # total_rss_huge, not total_rss
    assert got["Slab"] == got["SReclaimable"] == 0
    # memsw 768 MiB - memory 512 MiB = 256 MiB of swap, nothing swapped.
    assert got["SwapTotal"] == 262144 and got["SwapFree"] == 262144
    swaps = docker_v1["/proc/swaps"]
    assert swaps == ("Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
                     "none" + " " * 36 + "virtual\t262144\t\t0\t\t-2\n")


def test_swaps_header_only_without_swap(burstable):
    assert burstable["/proc/swaps"] == "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"


def test_cpuinfo_keeps_visible_blocks_renumbered_x86(docker_v1):
    text = docker_v1["/proc/cpuinfo"]
    blocks = [b for b in text.split("\n\n") if b.strip()]
    # cpuset 1-2: host processors 1 and 2, renumbered 0 and 1, apicid kept.
    assert len(blocks) == 2
    assert blocks[0].startswith("processor\t: 0\n") and "apicid\t\t: 1\n" in blocks[0]
    assert blocks[1].startswith("processor\t: 1\n") and "apicid\t\t: 2\n" in blocks[1]
    assert text.endswith("power management:\n\n")


def test_cpuinfo_arm64_layout():
    files = render_all(fixture_root("lxc-init-scope"))
    blocks = [b for b in files["/proc/cpuinfo"].split("\n\n") if b.strip()]
    assert [b.splitlines()[0] for b in blocks] == ["processor\t: 0", "processor\t: 1"]
    assert all("CPU part\t: 0xd0c" in b for b in blocks)
    assert files["/sys/devices/system/cpu/online"] == "0-1\n"


def test_cpu_lists(burstable, docker_v1):
    for name in ("online", "possible", "present"):
        assert burstable[f"/sys/devices/system/cpu/{name}"] == "0\n"
        assert docker_v1[f"/sys/devices/system/cpu/{name}"] == "0-1\n"


def test_stat_v2_container_time(burstable):
    lines = burstable["/proc/stat"].splitlines()
    # Pod slice cpu.stat: user_usec 2097152 -> 209 ticks, system_usec 1048576 -> 104.
    # Age: host uptime 356512.43 - init start 35600000/100 = 512.43 s -> 51243 ticks;
    # The busy 3.145728 s fit in 512.43 s x 1 CPU, so the clock starts "since the container
    # began": idle = 512.43 - 3.145728 = 509.284272 s -> 50928 ticks.
    assert lines[0] == "cpu  209 0 104 50928 0 0 0 0 0 0"
    assert lines[1] == "cpu0 209 0 104 50928 0 0 0 0 0 0"
    assert lines[2].startswith("intr ")
    # Threads of the pod slice subtree: 7 and 9 running, 8 in D.
    assert "procs_running 2" in lines and "procs_blocked 1" in lines
    assert "btime 1764490000" in lines and lines[-1].startswith("softirq ")


def test_stat_v1_usage_all_spread_over_visible_cpus(docker_v1):
    lines = docker_v1["/proc/stat"].splitlines()
    # cpuacct.usage_all sums to 30 s user, 12 s system: 3000 and 1200 ticks over 2 CPUs.
    assert lines[:3] == ["cpu  3000 0 1200 98286 0 0 0 0 0 0",
                         "cpu0 1500 0 600 49143 0 0 0 0 0 0",
                         "cpu1 1500 0 600 49143 0 0 0 0 0 0"]


def test_uptime(burstable, docker_v1):
    # 512.43 s old; idle = 512.43 * N - CPU seconds (3.145728 s; 42 s on docker-v1).
    assert burstable["/proc/uptime"] == "512.43 509.28\n"
    assert docker_v1["/proc/uptime"] == f"512.43 {512.43 * 2 - 42:.2f}\n"


def test_loadavg_single_sample(burstable):
    # 2 running + 1 blocked threads, 4 threads in all; last pid from the host file.
    assert burstable["/proc/loadavg"] == "3.00 3.00 3.00 2/4 48213\n"


def test_diskstats_v2_io_stat(burstable):
    rows = [ln.split() for ln in burstable["/proc/diskstats"].splitlines()]
    # Leaf io.stat: rbytes 70 MiB -> 143360 sectors, wbytes 140 MiB -> 286720 sectors.
    nvme = next(r for r in rows if r[2] == "nvme0n1")
    assert nvme[3:] == ["1200", "0", "143360", "0", "3400", "0", "286720"] + ["0"] * 10
    assert all(len(r) == 20 for r in rows)  # the host's column count
    assert [r[2] for r in rows] == ["loop0", "nvme0n1", "nvme0n1p1"]
    assert burstable["/proc/diskstats"].splitlines()[1].startswith(" 259       0 nvme0n1 ")


def test_diskstats_v1_blkio(docker_v1):
    nvme = next(ln.split() for ln in docker_v1["/proc/diskstats"].splitlines()
                if " nvme0n1 " in ln)
    assert nvme[3:10] == ["1000", "0", "80000", "0", "2000", "0", "160000"]


def test_pressure_from_the_cgroup_or_host(burstable, docker_v1):
    # cpu and memory at the pod slice (300 MiB fixture: total = 314572800 // 1000).
    assert burstable["/proc/pressure/cpu"].startswith("some avg10=12.50 avg60=1.00 ")
    assert "total=314572\n" in burstable["/proc/pressure/memory"]
    assert burstable["/proc/pressure/memory"].startswith("some avg10=3.25")
    assert "total=293601\n" in burstable["/proc/pressure/io"]  # leaf: 280 MiB
    assert docker_v1["/proc/pressure/cpu"] == host("docker-v1", "/proc/pressure/cpu")


def test_unlimited_process_sees_the_host_unchanged():
    files = render_all(fixture_root("hybrid-this-machine"))
    for path, text in files.items():
        assert text == host("hybrid-this-machine", path), path


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_every_file_renders_on_every_fixture(name):
    files = render_all(fixture_root(name))
    n = int(files["/sys/devices/system/cpu/online"].strip().rsplit("-", 1)[-1]) + 1
    mem = meminfo_kb(files["/proc/meminfo"])
    assert 0 < mem["MemFree"] <= mem["MemAvailable"] <= mem["MemTotal"]
    assert files["/proc/cpuinfo"].count("processor\t:") == n
    stat_cpus = [ln for ln in files["/proc/stat"].splitlines() if ln[:3] == "cpu" and ln[3] != " "]
    assert len(stat_cpus) == n


def test_explicit_limit_applies_to_rendering():
    files = render_all(fixture_root("sandbox-outside-ns"), pid="274", memory_limit="256Mi",
                       cpu_limit="1")
    assert meminfo_kb(files["/proc/meminfo"])["MemTotal"] == 256 * MiB // 1024
    assert files["/sys/devices/system/cpu/online"] == "0\n"
