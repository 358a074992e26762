"""The engine's rules one at a time, on writable copies of the fixtures."""

from __future__ import annotations

import shutil
from fractions import Fraction

import pytest

from guestfs.engine.explicit import ExplicitLimitError
from guestfs.engine.limits import quota_to_count
from guestfs.sources.proc_cgroup import PidGone
from tests.conftest import GiB, MiB, limits_of

POD = ("/sys/fs/cgroup/kubepods.slice/kubepods-burstable.slice/"
       "kubepods-burstable-poda5d4fbc7_30d6_43e8_8425_8ee6f401decc.slice")
LEAF = (POD + "/cri-containerd-"
        "a991eb3b64a228cb0b269925127c28cb39d482d27c6248540e0e3b41633a907e.scope")
HOST_MEM = 8131768 * 1024


def put(root, path: str, text: str) -> None:
    (root / path.lstrip("/")).write_text(text)


@pytest.fixture
def burstable(copy_fixture):
    return copy_fixture("k8s-systemd-v2-burstable")


def test_minimum_over_levels_not_nearest(burstable):
    # LXCFS's walk-up returns the *nearest* set value; the kernel enforces all of them.
    put(burstable, f"{LEAF}/memory.max", f"{768 * MiB}\n")
    lim = limits_of(burstable)
    assert lim.memory.value == 512 * MiB and lim.memory.source.file == f"{POD}/memory.max"
    put(burstable, f"{LEAF}/memory.max", f"{256 * MiB}\n")
    assert limits_of(burstable).memory.source.file == f"{LEAF}/memory.max"


@pytest.mark.parametrize("text", ["", "\n", "garbage\n", "-5\n", "12 34\n"])
def test_malformed_level_is_ignored_with_a_warning(burstable, text):
    put(burstable, f"{POD}/memory.max", text)
    put(burstable, f"{LEAF}/memory.max", f"{300 * MiB}\n")
    lim = limits_of(burstable)
    assert lim.memory.value == 300 * MiB
    assert any(f"{POD}/memory.max: unparseable" in w for w in lim.warnings)


def test_all_levels_malformed_falls_back_to_host_never_zero(burstable):
    put(burstable, f"{POD}/memory.max", "oops\n")
    put(burstable, "/sys/fs/cgroup/kubepods.slice/memory.max", "\n")
    put(burstable, f"{POD}/cpu.max", "nonsense\n")
    lim = limits_of(burstable)
    assert lim.memory.value == HOST_MEM and not lim.memory.limited
    assert lim.cpu_count.value == 4


def test_zero_limit_is_never_served_and_does_not_erase_the_parents(burstable):
    put(burstable, f"{POD}/memory.max", "0\n")
    lim = limits_of(burstable)
    # The pod's 0 is ignored; kubepods.slice's allocatable (7920943104) still binds.
    assert lim.memory.value == 7920943104
    assert any("limit 0 ignored" in w for w in lim.warnings)
    put(burstable, f"{POD}/memory.max", f"{512 * MiB}\n")
    put(burstable, f"{LEAF}/memory.max", "0\n")
    assert limits_of(burstable).memory.value == 512 * MiB


def test_values_at_or_above_host_ram_mean_no_limit(burstable):
    put(burstable, f"{POD}/memory.max", f"{HOST_MEM}\n")
    lim = limits_of(burstable)
    # kubepods.slice's allocatable (7920943104 < host RAM) now binds.
    assert lim.memory.value == 7920943104
    put(burstable, "/sys/fs/cgroup/kubepods.slice/memory.max", f"{HOST_MEM + 1}\n")
    lim = limits_of(burstable)
    assert lim.memory.value == HOST_MEM and not lim.memory.limited


def test_v1_unlimited_constant(copy_fixture):
    root = copy_fixture("docker-v1")
    put(root, "/sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n")
    stat = (root / "sys/fs/cgroup/memory/memory.stat").read_text()
    put(root, "/sys/fs/cgroup/memory/memory.stat",
        stat.replace(f"hierarchical_memory_limit {512 * MiB}",
                     "hierarchical_memory_limit 9223372036854771712"))
    lim = limits_of(root)
    assert lim.memory.value == 8131768 * 1024 and not lim.memory.limited
    # memsw is 768Mi with memory unlimited: nothing is left for swap.
    assert lim.swap.value == 0


def test_missing_limit_file_is_no_limit_at_that_level(burstable):
    (burstable / f"{POD}/memory.max".lstrip("/")).unlink()
    lim = limits_of(burstable)
    assert lim.memory.value == 7920943104  # kubepods.slice


def test_vanished_cgroup_is_reported_not_raised(burstable):
    shutil.rmtree(burstable / LEAF.lstrip("/"))
    lim = limits_of(burstable)
    assert lim.memory.value == HOST_MEM
    assert any("does not exist" in w for w in lim.warnings)


def test_exited_pid_is_a_clear_error(burstable):
    with pytest.raises(PidGone, match="pid 4242"):
        limits_of(burstable, pid="4242")


def test_usage_unreadable_at_limiting_level_falls_back_to_leaf(burstable):
    (burstable / f"{POD}/memory.current".lstrip("/")).unlink()
    lim = limits_of(burstable)
    assert lim.memory.value == 512 * MiB
    assert lim.memory_usage.usage == 280 * MiB  # leaf
    assert any("memory.current: missing" in w for w in lim.warnings)


def test_swap_min_over_levels_capped_by_host(copy_fixture):
    root = copy_fixture("k8s-systemd-v2-besteffort")
    leaf = next((root / "sys/fs/cgroup/kubepods.slice/kubepods-besteffort.slice").glob(
        "kubepods-besteffort-pod*/cri-containerd-*.scope"))
    (leaf / "memory.swap.max").write_text(f"{GiB}\n")
    (leaf / "memory.swap.current").write_text(f"{100 * MiB}\n")
    lim = limits_of(root)
    assert lim.swap.value == GiB and lim.swap_usage.value == 100 * MiB
    (leaf / "memory.swap.max").write_text(f"{8 * GiB}\n")
    assert limits_of(root).swap.value == 2097148 * 1024  # capped by host SwapTotal


def test_no_swap_accounting_means_zero_swap(copy_fixture):
    root = copy_fixture("k8s-systemd-v2-besteffort")
    for f in (root / "sys/fs/cgroup").rglob("memory.swap.*"):
        f.unlink()
    lim = limits_of(root)
    assert lim.swap.value == 0 and lim.swap_usage.value == 0


def test_cpuset_walks_up_while_empty(copy_fixture):
    root = copy_fixture("k8s-cgroupfs-v1")
    for f in (root / "sys/fs/cgroup/cpuset/kubepods").rglob("cpuset.*"):
        f.write_text("\n")
    put(root, "/sys/fs/cgroup/cpuset/cpuset.effective_cpus", "2-3\n")
    put(root, "/sys/fs/cgroup/cpuset/cpuset.cpus", "2-3\n")
    lim = limits_of(root, cpu_limit="4")
    assert lim.cpuset.value == (2, 3)
    assert lim.cpuset.source.file == "/sys/fs/cgroup/cpuset/cpuset.effective_cpus"
    # Quota 0.5 -> 1 CPU: the first of the cpuset.
    assert lim.visible_cpus == (2,)


def test_a_cpuset_of_offline_cpus_is_skipped_for_the_next_level(copy_fixture):
    """Host online 0-3; the container's cpuset names only CPU 6: no cpuinfo block could be
    shown for it, and the kernel runs such tasks on the parent's CPUs (1-2 here). The
    fixture's quota (0.5 CPU) leaves one of them visible."""
    root = copy_fixture("k8s-cgroupfs-v1")
    pod = root / "sys/fs/cgroup/cpuset/kubepods/burstable/poda5d4fbc7-30d6-43e8-8425-8ee6f401decc"
    for f in (pod / "a991eb3b64a228cb0b269925127c28cb39d482d27c6248540e0e3b41633a907e"
              ).glob("cpuset.*cpus"):
        f.write_text("6\n")
    for f in pod.glob("cpuset.*cpus"):
        f.write_text("1-2\n")
    lim = limits_of(root, cpu_limit="4")
    assert lim.cpuset.value == (1, 2) and lim.visible_cpus == (1,)
    assert any("names no online CPU" in w for w in lim.warnings)
    from guestfs.render.cpu import render_cpuinfo
    host = (root / "proc/cpuinfo").read_text()
    assert render_cpuinfo(host, lim).count("processor") == 1


@pytest.mark.parametrize("q,ceil,floor,rnd", [
    (Fraction(1, 10), 1, 1, 1), (Fraction(1, 2), 1, 1, 1), (Fraction(3, 2), 2, 1, 2),
    (Fraction(5, 4), 2, 1, 1), (Fraction(2), 2, 2, 2), (Fraction(5, 2), 3, 2, 3),
])
def test_quota_rounding(q, ceil, floor, rnd):
    assert quota_to_count(q, "ceil") == ceil
    assert quota_to_count(q, "floor") == floor
    assert quota_to_count(q, "round") == rnd


def test_explicit_sources_take_the_minimum(burstable, tmp_path):
    lim = limits_of(burstable, memory_limit="256Mi")
    assert lim.memory.value == 256 * MiB and lim.memory.source.kind == "option"
    # A tie with a cgroup file is credited to the file (its usage is then known).
    lim = limits_of(burstable, env={"GUESTFS_MEMORY_LIMIT": "512Mi"})
    assert lim.memory.source.kind == "cgroup"
    lim = limits_of(burstable, env={"GUESTFS_MEMORY_LIMIT": "1Gi"})
    assert lim.memory.value == 512 * MiB
    assert any(c.source.kind == "env" for c in lim.memory.considered)


def test_downward_api_volume_and_divisors(copy_fixture, tmp_path):
    root = copy_fixture("docker-v2-private-ns")
    d = tmp_path / "podinfo"
    d.mkdir()
    (d / "limits.memory").write_text("134217728")    # 128Mi, divisor 1
    (d / "limits.cpu").write_text("1")               # 250m rounded up with divisor 1
    lim = limits_of(root, limits_dir=str(d))
    assert lim.memory.value == 128 * MiB and lim.memory.source.kind == "downward-api"
    assert lim.memory.source.file == str(d / "limits.memory")
    # cpu.max at the namespace root is 0.5 -> still 1 CPU; 1 from the downward API ties.
    assert lim.cpu_count.value == 1
    (d / "limits.memory").write_text("64")           # divisor 1Mi
    (d / "limits.cpu").write_text("250")             # divisor 1m
    lim = limits_of(root, limits_dir=str(d), memory_divisor="1Mi", cpu_divisor="1m")
    assert lim.memory.value == 64 * MiB
    assert lim.cpu_quota.value == Fraction(1, 4) and lim.cpu_quota.source.kind == "downward-api"


def test_downward_api_node_allocatable_means_no_limit(copy_fixture, tmp_path):
    root = copy_fixture("hybrid-this-machine")
    d = tmp_path / "podinfo"
    d.mkdir()
    (d / "limits.memory").write_text(str(24684092 * 1024))  # kubelet wrote allocatable/host
    (d / "limits.cpu").write_text("2")
    lim = limits_of(root, limits_dir=str(d))
    assert not lim.memory.limited and not lim.cpu_quota.limited
    assert lim.cpu_count.value == 2


def test_bad_downward_api_file_and_bad_option_are_errors(copy_fixture, tmp_path):
    root = copy_fixture("docker-v2-private-ns")
    d = tmp_path / "podinfo"
    d.mkdir()
    for text in ("", "lots"):
        (d / "limits.memory").write_text(text)
        with pytest.raises(ExplicitLimitError, match="limits.memory"):
            limits_of(root, limits_dir=str(d))
    with pytest.raises(ExplicitLimitError):
        limits_of(root, memory_limit="lots")
    with pytest.raises(ExplicitLimitError):
        limits_of(root, env={"GUESTFS_CPU_LIMIT": "fast"})
