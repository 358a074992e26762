"""The three deployment patterns, deployed from the shipped manifests (container/k8s/)
through containerd's CRI as a kubelet would, with apps from a busybox image (what Alpine
images are) and from a Debian userland: what the app reads of its limits, whether every
bound file reads whole through busybox cat (sendfile), whether an idle pod looks idle, and
an in-place resize (kubelet's UpdateContainerResources, 512Mi -> 768Mi, 1 -> 2 CPUs).

Only the images and the app's own program are substituted (tests/support/cri/translate.py);
the app's program is tests/support/cri/probe.py's, which prints what the app reads.

What each pattern answers: the wrapper (`guestfs run`) and the DaemonSet (its seccomp
agent) answer sysinfo(2) and sched_getaffinity(2) too (busybox free, nproc, SC_PHYS_PAGES);
the sidecar can only put files in place, so those two system calls keep the node's
answers there, which the sidecar test states.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from tests.support.cri import probe
from tests.support.cri.images import REPO
from tests.support.cri.probe import Reading, wait_for_reading
from tests.support.cri.translate import translate

pytestmark = pytest.mark.real

K8S = REPO / "container" / "k8s"
MiB = 1 << 20
LIMIT, RESIZED = 512 * MiB, 768 * MiB
NODE_CPUS = len(os.sched_getaffinity(0))
TIMINGS: dict[str, list[float]] = {"up": [], "teardown": [], "resize": []}


def node_memtotal_kb() -> int:
    with open("/proc/meminfo") as f:
        return int(f.readline().split()[1])


@pytest.fixture(scope="module", autouse=True)
def report_timings():
    yield
    if TIMINGS["up"]:
        print(f"\npattern pods {len(TIMINGS['up'])}: up median "
              f"{statistics.median(TIMINGS['up']):.3f}s, teardown median "
              f"{statistics.median(TIMINGS['teardown']):.3f}s; resize shown after "
              f"{', '.join(f'{t:.2f}' for t in TIMINGS['resize'])} s")


def finish(pod) -> None:
    pod.remove()
    TIMINGS["up"].append(pod.timings["up"])
    TIMINGS["teardown"].append(pod.timings["teardown"])


def sees(limit: int, cpus: int, syscalls: bool, sysinfo_free: bool):
    """The predicate of a reading that shows ``limit`` bytes and ``cpus`` CPUs in every
    file (and in the system calls when the pattern answers them)."""
    def ok(r: Reading) -> bool:
        files = (r.memtotal_kb == limit // 1024 and r.processors == cpus
                 and r.online == ("0" if cpus == 1 else f"0-{cpus - 1}"))
        free_from_file = not sysinfo_free and r.free_total_mib == limit // MiB
        if not syscalls:
            return files and (free_from_file or sysinfo_free)
        return files and r.nproc == cpus and r.free_total_mib == limit // MiB
    return ok


def check_reading(r: Reading, limit: int, cpus: int, syscalls: bool, sysinfo_free: bool,
                  python: bool) -> None:
    assert r.memtotal_kb == limit // 1024, r
    assert r.processors == cpus and r.online == ("0" if cpus == 1 else f"0-{cpus - 1}"), r
    assert r.unwhole_files() == [], r.unwhole_files()
    if python:
        assert r.py_cpu_count == cpus and r.py_memtotal_kb == limit // 1024, r
    if syscalls:
        assert r.nproc == cpus and r.free_total_mib == limit // MiB, r
        if python:
            assert r.py_phys_bytes == limit, r
    else:
        # No agent in the pod's path: sysinfo(2) and sched_getaffinity(2) are the node's.
        assert r.nproc == NODE_CPUS, r
        node_mib = node_memtotal_kb() // 1024
        if sysinfo_free:
            assert abs(r.free_total_mib - node_mib) <= 1, r
        else:
            assert r.free_total_mib == limit // MiB, r
        if python:
            assert r.py_phys_bytes // MiB in (node_mib, node_mib - 1), r


def check_idle(logs, first: Reading) -> None:
    """An idle pod looks idle: over a few seconds its /proc/stat shows what the
    container's own CPU time (cpuacct.usage, the kernel's) leaves idle, within 10 points
    (vmstat and mpstat print it; the probe itself, some 30 processes every 0.5 s, and the
    daemon under the wrapper cost 8-18 % here), else >= 80 % idle where that time is not
    visible; and top's first frame, which covers the container's life, gets there as the
    start-up's share fades."""
    later, _ = wait_for_reading(logs, lambda r: r.n >= first.n + 4)
    share = probe.idle_share(first, later)
    own = probe.own_idle_share(first, later)
    print(f"idle share {share:.3f}, left by the container's own CPU time "
          f"{'unseen' if own is None else f'{own:.3f}'} ({first.cg_usage_ns} -> "
          f"{later.cg_usage_ns} ns; /proc/stat {first.cpu_ticks[:4]} -> "
          f"{later.cpu_ticks[:4]})")
    # Counters that only grow (a restarted clock went backwards: top and vmstat take
    # that for a reboot).
    assert all(y >= x for x, y in zip(first.cpu_ticks, later.cpu_ticks, strict=True)), \
        (first.cpu_ticks, later.cpu_ticks)
    # Where the container's own CPU time is visible, the view follows it within 10
    # points whichever way (a view holding its CPU time still reads 100 % idle).
    assert (share >= 0.8 if own is None else abs(share - own) <= 0.1), \
        (share, own, first.cpu_ticks, later.cpu_ticks)
    goal = 80 if own is None else min(80, own * 100 - 10)
    r, _ = wait_for_reading(logs, lambda r: (r.top_idle or 0) >= goal, after=later.n)
    assert r.top_idle is not None


def resize_and_wait(pod, logs, syscalls: bool, sysinfo_free: bool) -> Reading:
    before = probe.parse(logs())[-1].n
    t = time.monotonic()
    pod.update_resources("app", memory=RESIZED, cpu_milli=2000)
    r, _ = wait_for_reading(logs, sees(RESIZED, 2, syscalls, sysinfo_free), after=before,
                            timeout=20)
    TIMINGS["resize"].append(time.monotonic() - t)
    return r


def exercise(pod, syscalls: bool, sysinfo_free: bool, python: bool,
             first_is_right: bool) -> tuple[Reading, Callable[[], str]]:
    """What every pattern test checks of the app's readings: its limits (in its very first
    reading too where the files are in place before the app starts: a JVM sizes its heap
    at once), an idle pod idle, and an in-place resize shown."""
    def logs() -> str:
        return pod.logs("app")
    r, _ = wait_for_reading(logs, sees(LIMIT, 1, syscalls, sysinfo_free))
    if first_is_right:
        check_reading(probe.parse(logs())[0], LIMIT, 1, syscalls, sysinfo_free, python)
    check_reading(r, LIMIT, 1, syscalls, sysinfo_free, python)
    check_idle(logs, r)
    resized = resize_and_wait(pod, logs, syscalls, sysinfo_free)
    check_reading(resized, RESIZED, 2, syscalls, sysinfo_free, python)
    return r, logs


# (local image of the app, tool prefix, whose tools those are)
APPS = {"busybox": ("busybox", ""), "debian": ("debian", "")}


@pytest.mark.parametrize("image,tools", [("guestfs", ""), ("guestfs-norun-tmp-ro", "busybox ")],
                         ids=["debian-tools", "busybox-tools-no-run-read-only"])
def test_wrapper_pattern(cri_node, image, tools):
    """`guestfs run` as the app's entrypoint, non-privileged, with the manifest's
    capability set (drop ALL + SYS_ADMIN, SETPCAP, SYS_CHROOT), a read-only root, /dev/fuse
    from the device plugin's resource and the limits from a downward-API volume."""
    sysinfo_free = tools == "busybox "
    plan = translate(K8S / "wrapper", images={"registry.example/app-with-guestfs:1.0": image},
                     programs={"app": probe.program(tools)})
    pod = cri_node.run(plan)
    try:
        r, logs = exercise(pod, True, sysinfo_free, python=True, first_is_right=True)
        # The manifest's set less CAP_SYS_ADMIN: CAP_SETPCAP (8) and CAP_SYS_CHROOT (18).
        assert r.cap_eff == (1 << 8) | (1 << 18), hex(r.cap_eff or 0)
        # Nothing but the app's output reaches the pod's log: no daemon chatter.
        assert not [ln for ln in logs().splitlines() if "guestfs" in ln.lower()], logs()
    finally:
        finish(pod)


@pytest.mark.parametrize("app", ["busybox", "debian"])
def test_sidecar_pattern(cri_node, app):
    """A native sidecar (an init container with restartPolicy: Always) mounts guestfs in
    its own namespace and moves the files into the app's (attach --watch); the app's image
    and spec are untouched. The daemon finds the app's cgroup through the app's own root."""
    image, tools = APPS[app]
    plan = translate(K8S / "sidecar", images={"registry.example/guestfs:0.1": "guestfs",
                                              "registry.example/app:1.0": image},
                     programs={"app": probe.program(tools)})
    pod = cri_node.run(plan)
    try:
        # attach --watch binds into an app already running (within its 2 s round): the
        # app's first readings may be the kernel's.
        exercise(pod, False, app == "busybox", python=app == "debian", first_is_right=False)
    finally:
        finish(pod)


def node_ready(cri_node, pod) -> bool:
    try:
        return (cri_node.fs.kind("/run/guestfs-seccomp/agent.sock") == "socket"
                and pod.probe("guestfs", "liveness")
                and pod.probe("guestfs-containers", "liveness"))
    except grpc.RpcError:
        return False      # a probe past its timeout: a mount not served yet


@contextlib.contextmanager
def daemonset_deployed(cri_node) -> Iterator[Any]:
    """The node's guestfs from container/k8s/daemonset: the FUSE holder's and the seccomp
    guard's DaemonSet pods, then guestfs's (two mounts and the seccomp agent). Removed in
    the reverse order: the holder last, ending the connections it kept."""
    images = {"registry.example/guestfs:0.1": "guestfs"}
    pods = []
    try:
        for workload in ("guestfs-fuse-holder", "guestfs-seccomp-guard", "guestfs"):
            pods.append(cri_node.run(translate(K8S / "daemonset", images=images,
                                               workload=workload)))
        node = pods[-1]
        deadline = time.monotonic() + 30
        while not node_ready(cri_node, node):
            assert time.monotonic() < deadline, (node.logs("guestfs")[-2000:],
                                                 pods[0].logs("fuse-holder")[-2000:])
            time.sleep(0.2)
        yield node
    finally:
        for pod in reversed(pods):
            finish(pod)


@pytest.fixture(scope="module")
def guestfs_daemonset(cri_node_session):
    with daemonset_deployed(cri_node_session) as node:
        yield node


@pytest.mark.parametrize("app", ["busybox", "debian"])
def test_daemonset_pattern(cri_node, guestfs_daemonset, app):
    """An app pod with the pod snippet (hostPath binds of the node's per-caller files and
    the seccomp profile that routes sysinfo and sched_getaffinity to the node's agent)."""
    image, tools = APPS[app]
    plan = translate(K8S / "daemonset" / "pod-snippet.yaml",
                     images={"registry.example/app:1.0": image},
                     programs={"app": probe.program(tools)})
    pod = cri_node.run(plan)
    try:
        exercise(pod, True, app == "busybox", python=app == "debian", first_is_right=True)
    finally:
        finish(pod)


IDENTITY_MAP = ["0", "0", "4294967295"]
NO_USERNS = ("containerd {} ignores CRI userns_options (uid_map is the node's identity "
             "map): user-namespaced pods need containerd >= 2.0 with runc >= 1.2, or "
             "CRI-O >= 1.25, and Linux >= 6.3")


def test_daemonset_pattern_from_a_user_namespaced_pod(cri_node, guestfs_daemonset,
                                                      tmp_path: Path):
    """The pod snippet with hostUsers: false: its runtime binds the node's files idmapped
    by the pod's user namespace, which the DaemonSet's held mounts accept (guestfs's
    engine negotiates FUSE_ALLOW_IDMAP), and the app reads its own limit. Skipped, with the
    reason, where the runtime makes no user namespace (checked here: the app's uid_map)."""
    doc = yaml.safe_load((K8S / "daemonset" / "pod-snippet.yaml").read_text())
    doc["spec"]["hostUsers"] = False
    manifest = tmp_path / "pod-snippet-userns.yaml"
    manifest.write_text(yaml.safe_dump(doc))
    plan = translate(manifest, images={"registry.example/app:1.0": "busybox"},
                     programs={"app": ["sh", "-c", "cat /proc/self/uid_map; sleep 3600"]})
    userns = plan.sandbox.linux.security_context.namespace_options.userns_options
    assert list(userns.uids) and userns.mode == cri_node.pb.POD   # what kubelet sends
    status = json.loads(cri_node.fs.read_text(
        "/var/lib/guestfs/by-caller/.guestfs-status"))
    assert status["idmapped_binds"] is True, status
    pod = cri_node.run(plan)
    try:
        deadline = time.monotonic() + 20
        while not pod.logs("app").strip():
            assert time.monotonic() < deadline
            time.sleep(0.1)
        uid_map = pod.logs("app").split()
        version = cri_node.version().runtime_version
        if uid_map != IDENTITY_MAP:
            assert uid_map[0] == "0" and uid_map[1] != "0", uid_map
            rc, out, err = pod.exec("app", ["cat", "/proc/meminfo"])
            assert rc == 0, err
            assert out.splitlines()[0].split()[1] == str(LIMIT // 1024), out
    finally:
        finish(pod)
    if uid_map == IDENTITY_MAP:
        pytest.skip(NO_USERNS.format(version))


def test_user_namespaces_are_not_faked(cri_node, tmp_path: Path):
    """A pod with hostUsers: false must really get a user namespace; containerd 1.6
    accepts CRI's userns_options and ignores them, and the shipped wrapper and sidecar ask
    for one. Skipped, with the reason, where the runtime ignores them (checked here)."""
    plan = translate(K8S / "sidecar", images={"registry.example/guestfs:0.1": "guestfs",
                                              "registry.example/app:1.0": "busybox"},
                     programs={"app": ["sh", "-c", "cat /proc/self/uid_map; sleep 3600"]})
    userns = plan.sandbox.linux.security_context.namespace_options.userns_options
    assert list(userns.uids) and userns.mode == cri_node.pb.POD   # what kubelet sends
    pod = cri_node.run(plan)
    try:
        deadline = time.monotonic() + 20
        while not pod.logs("app").strip():
            assert time.monotonic() < deadline
            time.sleep(0.1)
        uid_map = pod.logs("app").split()
        version = cri_node.version().runtime_version
    finally:
        finish(pod)
    if uid_map == IDENTITY_MAP:
        pytest.skip(NO_USERNS.format(version))
    assert uid_map[0] == "0" and uid_map[1] != "0", uid_map
