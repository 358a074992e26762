"""Smoke tests of the Kubernetes runtime path: the private containerd node, the kubelet
stand-in and the translator, end to end with real pods."""

from __future__ import annotations

import os
import statistics
import textwrap
import time
from pathlib import Path

import pytest

from tests.support.cri.images import REPO
from tests.support.cri.translate import translate

pytestmark = pytest.mark.real

MiB = 1 << 20
IMAGES = {"registry.example/app:1.0": "busybox", "registry.example/guestfs:0.1": "guestfs"}
TIMINGS: dict[str, list[float]] = {"up": [], "teardown": [], "rss": []}


@pytest.fixture(scope="module", autouse=True)
def report_timings():
    """Prints the medians of the pods of this module at its end (visible with -s)."""
    yield
    if TIMINGS["up"]:
        print(f"\npods {len(TIMINGS['up'])}: up median {statistics.median(TIMINGS['up']):.3f}s,"
              f" teardown median {statistics.median(TIMINGS['teardown']):.3f}s, containerd "
              f"RSS peak {max(TIMINGS['rss']) / MiB:.1f} MiB")


def run_yaml(node, tmp_path: Path, text: str, files: dict[str, str] | None = None,
             images: dict[str, str] | None = None):
    """Write a kustomization of the given documents to tmp_path and run its one pod."""
    (tmp_path / "pod.yaml").write_text(textwrap.dedent(text))
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        "resources: [pod.yaml]\n")
    for name, content in (files or {}).items():
        node.fs.write_text(name, content)
    return node.run(translate(tmp_path, images=images or IMAGES))


def finish(pod) -> None:
    TIMINGS["rss"].append(pod.node.rss())          # with this pod still running
    pod.remove()
    TIMINGS["up"].append(pod.timings["up"])
    TIMINGS["teardown"].append(pod.timings["teardown"])


LIMITED = """
apiVersion: v1
kind: Pod
metadata: {name: limited}
spec:
  containers:
    - name: app
      image: registry.example/app:1.0
      command: ["sleep", "3600"]
      resources:
        limits: {cpu: "1", memory: 512Mi}
"""


def test_containerd_answers_version(cri_node):
    v = cri_node.version()
    assert (v.runtime_name, v.runtime_api_version) == ("containerd", "v1")
    listed = cri_node.image.ListImages(cri_node.pb.ListImagesRequest(), timeout=30).images
    tags = {t for i in listed for t in i.repo_tags}
    assert {i.ref for i in cri_node.images.values()} <= tags
    print(f"containerd {v.runtime_version}: start {cri_node.timings['containerd_start']:.3f}s"
          f", image build {cri_node.timings['image_build']:.3f}s, import "
          f"{cri_node.timings['image_import']:.3f}s, RSS {cri_node.rss() / MiB:.1f} MiB")


def test_limited_pod_gets_its_cgroups(cri_node, tmp_path):
    pod = run_yaml(cri_node, tmp_path, LIMITED)
    try:
        # limits only: requests default to them, so the pod is Guaranteed.
        assert pod.plan.qos == "Guaranteed"
        status = pod.sandbox_status()
        assert status.state == cri_node.pb.SANDBOX_READY
        assert status.metadata.uid == pod.plan.uid
        assert pod.cgroup() == f"{cri_node.cgroup_root}/kubepods/pod{pod.plan.uid}"
        rc, out, _ = pod.exec("app", ["cat", "/proc/self/cgroup"])
        assert rc == 0
        lines = out.splitlines()
        assert len(lines) == len(cri_node.hierarchies)
        for line in lines:
            assert line.split(":", 2)[2].startswith(pod.cgroup() + "/"), line
        assert pod.cgroup("app") in out
        mem = Path(pod.cgroup_dir("memory", "app"), "memory.limit_in_bytes")
        cpu = Path(pod.cgroup_dir("cpu", "app"))
        assert int(mem.read_text()) == 512 * MiB
        assert int((cpu / "cpu.cfs_quota_us").read_text()) == 100000
        assert int((cpu / "cpu.cfs_period_us").read_text()) == 100000
        # The pod cgroup, written by the stand-in as kubelet's pod container manager does.
        pmem = Path(pod.cgroup_dir("memory"), "memory.limit_in_bytes")
        pcpu = Path(pod.cgroup_dir("cpu"))
        assert int(pmem.read_text()) == 512 * MiB
        assert int((pcpu / "cpu.cfs_quota_us").read_text()) == 100000
        assert int((pcpu / "cpu.shares").read_text()) == 1024
        rc, out, _ = pod.exec("app", ["cat", "/sys/fs/cgroup/memory/memory.limit_in_bytes"])
        assert int(out) == 512 * MiB
    finally:
        finish(pod)
    for h in cri_node.hierarchies:                 # the pod's cgroup went with it
        assert not os.path.exists(h.dir(pod.cgroup())), h
    assert cri_node.fs.kind(pod.plan.volume_dir()) is None


VOLUMES = """
apiVersion: v1
kind: ConfigMap
metadata: {name: settings}
data:
  greeting: hello from the configmap
---
apiVersion: v1
kind: Pod
metadata: {name: volumes, labels: {tier: smoke}}
spec:
  containers:
    - name: writer
      image: registry.example/app:1.0
      command: ["sh", "-c", "echo shared > /scratch/note && exec sleep 3600"]
      volumeMounts:
        - {name: scratch, mountPath: /scratch}
    - name: app
      image: registry.example/app:1.0
      command: ["sleep", "3600"]
      resources:
        requests: {cpu: 250m, memory: 128Mi}
        limits: {cpu: 500m, memory: 256Mi}
      volumeMounts:
        - {name: node-file, mountPath: /etc/node-file, readOnly: true}
        - {name: scratch, mountPath: /scratch}
        - {name: podinfo, mountPath: /podinfo}
        - {name: settings, mountPath: /settings}
  volumes:
    - name: node-file
      hostPath: {path: /var/lib/guestfs-smoke/file, type: File}
    - name: scratch
      emptyDir: {}
    - name: podinfo
      downwardAPI:
        items:
          - path: name
            fieldRef: {fieldPath: metadata.name}
          - path: labels
            fieldRef: {fieldPath: metadata.labels}
          - path: mem_mib
            resourceFieldRef: {containerName: app, resource: limits.memory, divisor: 1Mi}
          - path: cpu/milli
            resourceFieldRef: {containerName: app, resource: limits.cpu, divisor: 1m}
    - name: settings
      configMap: {name: settings}
"""


def test_volumes_are_visible_with_their_content(cri_node, tmp_path):
    pod = run_yaml(cri_node, tmp_path, VOLUMES,
                   files={"/var/lib/guestfs-smoke/file": "from the node\n"})
    try:
        assert pod.plan.qos == "Burstable"

        def cat(path: str) -> str:
            rc, out, err = pod.exec("app", ["cat", path])
            assert rc == 0, err
            return out

        assert cat("/etc/node-file") == "from the node\n"
        assert cat("/scratch/note") == "shared\n"
        assert cat("/podinfo/name") == pod.plan.name
        assert cat("/podinfo/labels") == 'tier="smoke"'
        assert cat("/podinfo/mem_mib") == "256"
        assert cat("/podinfo/cpu/milli") == "500"
        assert cat("/settings/greeting") == "hello from the configmap"
        # The QoS level above the pod, as kubelet's QoS container manager writes it: the
        # burstable shares are those of this pod's requests (250m + the writer's none).
        qos = Path(pod.cgroup_dir("cpu")).parent
        assert qos.name == "burstable"
        assert int((qos / "cpu.shares").read_text()) == 256
        assert int((qos.parent / "cpu.shares").read_text()) == (os.cpu_count() or 1) * 1024
        assert int((qos.parent / "besteffort" / "cpu.shares").read_text()) == 2
        # The atomic writer's layout, on the node.
        vol = pod.plan.volumes[2].node_path
        data = os.readlink(cri_node.fs.path(f"{vol}/..data"))
        assert data.startswith("..") and data != "..data"
        assert os.readlink(cri_node.fs.path(f"{vol}/mem_mib")) == "..data/mem_mib"
        assert os.readlink(cri_node.fs.path(f"{vol}/cpu")) == "..data/cpu"
        rc, _, err = pod.exec("app", ["sh", "-c", "echo x > /podinfo/name"])
        assert rc != 0 and "Read-only" in err
        # The node's file is the node's: the host has no /var/lib/guestfs-smoke.
        assert not os.path.exists("/var/lib/guestfs-smoke")
    finally:
        finish(pod)


FUSE = """
apiVersion: v1
kind: Pod
metadata: {name: fuse}
spec:
  containers:
    - name: with-device
      image: registry.example/app:1.0
      command: ["sleep", "3600"]
      resources:
        limits: {squat.ai/fuse: 1}
    - name: hostpath-only
      image: registry.example/app:1.0
      command: ["sleep", "3600"]
      volumeMounts:
        - {name: fuse, mountPath: /dev/fuse}
  volumes:
    - name: fuse
      hostPath: {path: /dev/fuse, type: CharDevice}
"""


def test_fuse_needs_the_device_plugin_resource(cri_node, tmp_path):
    pod = run_yaml(cri_node, tmp_path, FUSE)
    try:
        opener = ["sh", "-c", "exec 3<>/dev/fuse && echo opened"]
        assert pod.exec("with-device", opener)[:2] == (0, "opened\n")
        rc, out, err = pod.exec("hostpath-only", opener)
        assert rc != 0 and "Operation not permitted" in err, (out, err)
        devices = Path(pod.cgroup_dir("devices", "with-device"), "devices.list").read_text()
        assert "c 10:229 rwm" in devices.splitlines()
        devices = Path(pod.cgroup_dir("devices", "hostpath-only"), "devices.list").read_text()
        assert "c 10:229 rwm" not in devices.splitlines()
    finally:
        finish(pod)


BIDI = """
apiVersion: v1
kind: Pod
metadata: {name: %(name)s}
spec:
  containers:
    - name: app
      image: registry.example/app:1.0
      command: ["sleep", "3600"]
      securityContext: {privileged: %(privileged)s}
      volumeMounts:
        - {name: shared, mountPath: /mnt/shared, mountPropagation: %(propagation)s}
  volumes:
    - name: shared
      hostPath: {path: /var/lib/guestfs-bidi, type: DirectoryOrCreate}
"""


def test_bidirectional_mount_reaches_the_node_and_other_pods(cri_node, tmp_path):
    for d in ("r", "m"):
        (tmp_path / d).mkdir()
    reader = run_yaml(cri_node, tmp_path / "r", BIDI % {
        "name": "reader", "privileged": "false", "propagation": "HostToContainer"})
    mounter = run_yaml(cri_node, tmp_path / "m", BIDI % {
        "name": "mounter", "privileged": "true", "propagation": "Bidirectional"})
    try:
        rc, _, err = mounter.exec("app", ["sh", "-c", "mkdir -p /mnt/shared/sub && "
                                          "mount -t tmpfs bidi /mnt/shared/sub && "
                                          "echo through > /mnt/shared/sub/x"])
        assert rc == 0, err
        # Mounted after the reader started: propagation, not a copy at its start.
        assert reader.exec("app", ["cat", "/mnt/shared/sub/x"])[:2] == (0, "through\n")
        assert cri_node.fs.read_text("/var/lib/guestfs-bidi/sub/x") == "through\n"
        assert not os.path.exists("/var/lib/guestfs-bidi")
        assert mounter.exec("app", ["umount", "/mnt/shared/sub"])[0] == 0
    finally:
        finish(mounter)
        finish(reader)


def test_update_resources_resizes_in_place(cri_node, tmp_path):
    text = LIMITED.rstrip() + """
      volumeMounts:
        - {name: podinfo, mountPath: /podinfo}
  volumes:
    - name: podinfo
      downwardAPI:
        items:
          - path: mem
            resourceFieldRef: {containerName: app, resource: limits.memory, divisor: 1Mi}
"""
    pod = run_yaml(cri_node, tmp_path, text)
    try:
        pod.update_resources("app", memory=256 * MiB, cpu_milli=500)
        mem = Path(pod.cgroup_dir("memory", "app"), "memory.limit_in_bytes")
        assert int(mem.read_text()) == 256 * MiB
        quota = Path(pod.cgroup_dir("cpu", "app"), "cpu.cfs_quota_us")
        assert int(quota.read_text()) == 50000
        assert int(Path(pod.cgroup_dir("memory"), "memory.limit_in_bytes").read_text()) \
            == 256 * MiB
        assert int(Path(pod.cgroup_dir("cpu"), "cpu.cfs_quota_us").read_text()) == 50000
        assert pod.exec("app", ["cat", "/podinfo/mem"])[1] == "256"
        pod.update_resources("app", memory=768 * MiB)
        assert int(mem.read_text()) == 768 * MiB
        assert int(Path(pod.cgroup_dir("memory"), "memory.limit_in_bytes").read_text()) \
            == 768 * MiB
        assert pod.exec("app", ["cat", "/podinfo/mem"])[1] == "768"
    finally:
        finish(pod)


USERNS = """
apiVersion: v1
kind: Pod
metadata: {name: userns}
spec:
  hostUsers: false
  containers:
    - name: app
      image: registry.example/app:1.0
      command: ["sleep", "3600"]
"""


def test_containerd_1_6_ignores_userns_options(cri_node, tmp_path):
    """containerd 1.6's CRI has NamespaceOption.userns_options but reads nothing of it: a
    pod asking for a user namespace (hostUsers: false) gets the host's. A containerd >= 2.0
    would map it; the assertion follows the version."""
    pod = run_yaml(cri_node, tmp_path, USERNS)
    try:
        sent = pod.sandbox_config.linux.security_context.namespace_options.userns_options
        assert sent.mode == cri_node.pb.POD and sent.uids[0].length == 65536
        rc, out, _ = pod.exec("app", ["cat", "/proc/self/uid_map"])
        assert rc == 0
        identity = out.split() == ["0", "0", "4294967295"]
        if cri_node.version().runtime_version.startswith("1."):
            assert identity, f"containerd 1.x did make a user namespace: {out!r}"
        else:
            assert not identity, f"containerd 2 ran the pod in the host user namespace: {out}"
    finally:
        finish(pod)


def test_logs_and_init_containers_run_in_order(cri_node, tmp_path):
    pod = run_yaml(cri_node, tmp_path, """
        apiVersion: v1
        kind: Pod
        metadata: {name: ordered}
        spec:
          initContainers:
            - name: first
              image: registry.example/app:1.0
              command: ["sh", "-c", "echo one; echo first > /shared/order"]
              volumeMounts: [{name: shared, mountPath: /shared}]
            - name: sidecar
              image: registry.example/app:1.0
              restartPolicy: Always
              command: ["sh", "-c", "echo sidecar >> /shared/order; touch /tmp/up; exec sleep 3600"]
              startupProbe:
                exec: {command: [cat, /tmp/up]}
                periodSeconds: 1
              volumeMounts: [{name: shared, mountPath: /shared}]
          containers:
            - name: app
              image: registry.example/app:1.0
              command: ["sh", "-c", "echo app >> /shared/order; exec sleep 3600"]
              volumeMounts: [{name: shared, mountPath: /shared}]
          volumes:
            - {name: shared, emptyDir: {}}
    """)
    try:
        assert [c.role for c in pod.plan.containers] == ["init", "sidecar", "main"]
        assert pod.logs("first") == "one\n"
        assert pod.status("first").state == cri_node.pb.CONTAINER_EXITED
        assert pod.status("sidecar").state == cri_node.pb.CONTAINER_RUNNING
        for _ in range(200):                      # the app may not have written yet
            out = pod.exec("sidecar", ["cat", "/shared/order"])[1]
            if out.count("\n") == 3:
                break
            time.sleep(0.05)
        assert out == "first\nsidecar\napp\n"
        assert pod.pid("app") > 1 and os.path.exists(f"/proc/{pod.pid('app')}")
        assert pod.probe("sidecar", "startup")
        old = pod.cid("sidecar")
        pod.restart("sidecar")                    # the next attempt, as after a crash
        assert pod.cid("sidecar") != old and pod.attempts["sidecar"] == 1
        assert pod.status("sidecar").state == cri_node.pb.CONTAINER_RUNNING
        assert pod.status("sidecar").metadata.attempt == 1
        assert pod.exec("app", ["cat", "/shared/order"])[1].endswith("app\nsidecar\n")
    finally:
        finish(pod)


def test_local_images_and_variants(cri_node, tmp_path):
    """guestfs runs this checkout (the image's entrypoint, as container/Dockerfile's); the
    -norun-tmp-ro variant has no /run and a read-only /tmp; busybox has no /run."""
    pod = run_yaml(cri_node, tmp_path, """
        apiVersion: v1
        kind: Pod
        metadata: {name: images}
        spec:
          initContainers:
            - name: entrypoint
              image: registry.example/guestfs:0.1
              args: ["--version"]
          containers:
            - name: bare
              image: registry.example/guestfs-bare:0.1
              command: ["sleep", "3600"]
            - name: busybox
              image: registry.example/app:1.0
              command: ["sleep", "3600"]
    """, images={**IMAGES, "registry.example/guestfs-bare:0.1": "guestfs-norun-tmp-ro"})
    try:
        assert pod.logs("entrypoint").startswith("guestfs ")
        rc, out, _ = pod.exec("bare", ["sh", "-c", "command -v guestfs; test -e /run; echo $?; "
                                       "touch /tmp/x 2>/dev/null; echo $?"])
        assert (rc, out) == (0, f"{REPO}/.venv/bin/guestfs\n1\n1\n")
        rc, out, _ = pod.exec("busybox", ["sh", "-c", "readlink /bin/cat; test -e /run; "
                                          "echo $?; touch /tmp/x; echo $?"])
        assert (rc, out) == (0, "/bin/busybox\n1\n0\n")
    finally:
        finish(pod)


def test_resize_keeps_requests_within_limits(cri_node, tmp_path):
    pod = run_yaml(cri_node, tmp_path, VOLUMES)        # Burstable: requests 250m/128Mi
    try:
        with pytest.raises(ValueError, match="may not exceed"):
            pod.update_resources("app", memory=64 * MiB)
        pod.update_resources("app", memory=64 * MiB, memory_request=64 * MiB)
        mem = Path(pod.cgroup_dir("memory", "app"), "memory.limit_in_bytes")
        assert int(mem.read_text()) == 64 * MiB
        assert pod.exec("app", ["cat", "/podinfo/mem_mib"])[1] == "64"
        # The writer declares no limits: the pod cgroup has none to rewrite.
        assert int(Path(pod.cgroup_dir("memory"), "memory.limit_in_bytes").read_text()) \
            > 1 << 40
    finally:
        finish(pod)


def test_hostpath_type_is_checked_on_the_node(cri_node, tmp_path):
    """type: File must exist in the node (the host's /etc/hostname is not the node's
    /var/lib); the failed pod leaves no cgroup, directory or sandbox behind."""
    from tests.support.cri.kubelet import PodFailed

    text = VOLUMES.replace("/var/lib/guestfs-smoke/file", "/var/lib/guestfs-absent/file")
    before = len(cri_node.runtime.ListPodSandbox(cri_node.pb.ListPodSandboxRequest()).items)
    with pytest.raises(PodFailed, match="guestfs-absent/file is missing, type File"):
        run_yaml(cri_node, tmp_path, text)
    assert len(cri_node.runtime.ListPodSandbox(
        cri_node.pb.ListPodSandboxRequest()).items) == before
    assert cri_node.pods == []
    kubepods = Path(cgroups_dir(cri_node, "memory"), "kubepods", "burstable")
    assert [p.name for p in kubepods.iterdir() if p.name.startswith("pod")] == []
    pods_dir = cri_node.fs.path("/var/lib/kubelet/pods")
    assert not pods_dir.exists() or os.listdir(pods_dir) == []


def cgroups_dir(node, controller: str) -> str:
    from tests.support.cri import cgroups

    h = cgroups.find(node.hierarchies, controller)
    assert h is not None
    return h.dir(node.cgroup_root)
