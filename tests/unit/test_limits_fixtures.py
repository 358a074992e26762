"""Every fixture layout gives the limit a person reading the cgroup files by hand finds.

Expected values are worked out from the layout each fixture copies (see the docstrings in
tests/fixtures/make_fixtures.py), not from guestfs's output.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from tests.conftest import FIXTURE_NAMES, GiB, MiB, fixture_root, limits_of

POD = "kubepods-burstable-poda5d4fbc7_30d6_43e8_8425_8ee6f401decc.slice"
CID = "a991eb3b64a228cb0b269925127c28cb39d482d27c6248540e0e3b41633a907e"


def test_leaf_max_under_512mi_pod_slice():
    lim = limits_of(fixture_root("k8s-systemd-v2-burstable"))
    pod = f"/kubepods.slice/kubepods-burstable.slice/{POD}"
    # The scope says max; the pod slice says 536870912 = 512Mi and "100000 100000" = 1 CPU.
    assert lim.memory.value == 512 * MiB and lim.memory.limited
    assert lim.memory.source.cgroup == pod
    assert lim.memory.source.file == f"/sys/fs/cgroup{pod}/memory.max"
    # Usage is read where the limit is: the pod slice's memory.current (300 MiB), and the
    # leaf's own (280 MiB) is kept beside it.
    assert lim.memory_usage.usage == 300 * MiB
    assert lim.leaf_memory_usage.usage == 280 * MiB
    assert lim.cpu_quota.value == 1 and lim.cpu_quota.source.file == f"/sys/fs/cgroup{pod}/cpu.max"
    assert lim.cpu_count.value == 1 and lim.visible_cpus == (0,)
    assert lim.cpuset.value == (0, 1, 2, 3)
    assert lim.swap.value == 0  # the host has no swap


def test_guaranteed_crio_leaf_binds_tighter_than_pod_sum():
    lim = limits_of(fixture_root("k8s-systemd-v2-guaranteed-crio"))
    # Leaf 1Gi < pod 1Gi+256Mi < kubepods.slice allocatable; cpu 2 < 2.5.
    assert lim.memory.value == GiB
    assert lim.memory.source.cgroup.endswith(f"/crio-{CID}.scope")
    assert lim.cpu_quota.value == 2 and lim.cpu_count.value == 2
    assert lim.visible_cpus == (0, 1)
    assert lim.memory_usage.usage == 400 * MiB


def test_besteffort_is_bounded_by_node_allocatable_only():
    lim = limits_of(fixture_root("k8s-systemd-v2-besteffort"))
    assert lim.memory.value == 15032385536 and lim.memory.source.cgroup == "/kubepods.slice"
    assert lim.cpu_quota.value is None and not lim.cpu_count.limited
    assert lim.cpu_count.value == 8
    # memory.swap.max is max everywhere: the host's 2097148 kB of swap is reachable.
    assert lim.swap.value == 2097148 * 1024 and not lim.swap.limited


def test_cgroupfs_driver_v1_joined_cpu_cpuacct():
    lim = limits_of(fixture_root("k8s-cgroupfs-v1"))
    leaf = f"/kubepods/burstable/poda5d4fbc7-30d6-43e8-8425-8ee6f401decc/{CID}"
    assert lim.cgroup_versions == {"memory": 1, "cpu": 1, "cpuset": 1}
    assert lim.memory.value == 256 * MiB and lim.memory.source.cgroup == leaf
    assert lim.memory.source.file == f"/sys/fs/cgroup/memory{leaf}/memory.limit_in_bytes"
    # Leaf quota 50000/100000 beats the pod's 60000/100000; ceil(0.5) = 1.
    assert lim.cpu_quota.value == Fraction(1, 2)
    assert lim.cpu_quota.source.file == f"/sys/fs/cgroup/cpu,cpuacct{leaf}/cpu.cfs_quota_us"
    assert lim.cpu_count.value == 1 and lim.visible_cpus == (0,)
    # memsw 256Mi - memory 256Mi = no room for swap.
    assert lim.swap.value == 0 and lim.swap.limited


@pytest.mark.parametrize("rounding,count", [("ceil", 2), ("floor", 1), ("round", 2)])
def test_minikube_nested_150000_quota(rounding, count):
    lim = limits_of(fixture_root("minikube-nested-v2"), rounding=rounding)
    # 600M on the container and its pod (a tie goes to the pod slice, whose usage
    # contains the container's); 1.5 CPUs.
    assert lim.memory.value == 600_000_000
    assert lim.memory.source.cgroup.endswith(POD)
    assert lim.cpu_quota.value == Fraction(3, 2)
    assert lim.cpu_count.value == count
    assert lim.visible_cpus == tuple(range(count))


def test_docker_v2_private_namespace_reads_the_namespace_root():
    lim = limits_of(fixture_root("docker-v2-private-ns"))
    assert lim.memory.value == 256 * MiB and lim.memory.source.cgroup == "/"
    assert lim.memory.source.file == "/sys/fs/cgroup/memory.max"
    assert lim.cpu_count.value == 1
    assert any("not the host's root" in w and w.startswith("memory") for w in lim.warnings)


def test_docker_v1_mount_root_is_the_container():
    lim = limits_of(fixture_root("docker-v1"))
    assert lim.memory.value == 512 * MiB
    assert lim.memory.source.file == "/sys/fs/cgroup/memory/memory.limit_in_bytes"
    assert lim.memory.source.cgroup == f"/docker/{CID}"
    # memsw 768Mi - 512Mi = 256Mi of swap, below the host's 1 GiB.
    assert lim.swap.value == 256 * MiB
    # cpuset 1-2 and quota 1.5 -> 2 CPUs, the first two of the cpuset.
    assert lim.cpu_count.value == 2 and lim.visible_cpus == (1, 2)


def test_docker_v1_limit_on_invisible_parent_comes_from_hierarchical_memory_limit():
    lim = limits_of(fixture_root("docker-v1-cgroup-parent"))
    assert lim.memory.value == GiB
    assert lim.memory.source.kind == "cgroup-hierarchical"
    assert lim.memory.source.note == "hierarchical_memory_limit"
    # No memsw files: swap accounting is off, so no swap.
    assert lim.swap.value == 0


def test_dotdot_path_falls_back_without_crashing():
    root = fixture_root("sandbox-outside-ns")
    lim = limits_of(root, pid="274")
    assert lim.memory.value == 16381756 * 1024 and not lim.memory.limited
    assert lim.cpu_count.value == 4
    assert any("outside this cgroup namespace" in w for w in lim.warnings)
    # ... and the next source, an explicit limit, applies.
    lim = limits_of(root, pid="274", memory_limit="512Mi", cpu_limit="1500m")
    assert lim.memory.value == 512 * MiB and lim.memory.source.kind == "option"
    assert lim.cpu_count.value == 2


def test_lxc_init_scope_walks_up_to_the_container_root():
    lim = limits_of(fixture_root("lxc-init-scope"))
    assert lim.memory.value == GiB and lim.memory.source.cgroup == "/"
    assert lim.memory_usage.usage == 300 * MiB  # the container's, not init.scope's 30 MiB
    assert lim.cpu_count.value == 2 and lim.visible_cpus == (4, 5)


def test_this_machines_hybrid_layout_uses_v1_controllers():
    lim = limits_of(fixture_root("hybrid-this-machine"))
    assert lim.cgroup_versions == {"memory": 1, "cpu": 1, "cpuset": 1}
    assert lim.memory.value == 24684092 * 1024 and not lim.memory.limited
    assert lim.leaf_memory_usage.usage == 40 * MiB
    assert lim.cpu_count.value == 2


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_invariants_on_every_fixture(name):
    lim = limits_of(fixture_root(name))
    assert 0 < lim.memory.value <= lim.host.mem_total
    assert 0 <= lim.swap.value <= lim.host.swap_total
    assert lim.swap_usage.value >= 0
    assert 1 <= lim.cpu_count.value == len(lim.visible_cpus)
    assert set(lim.visible_cpus) <= set(lim.cpuset.value)
