"""A private containerd, "the node", driven over CRI v1 gRPC as kubelet drives it.

containerd runs in a mount namespace of its own (unshare -m --propagation private) in which
scratch directories are bound over the node's /var/lib, /run and /var/log and made shared
mounts, as / is rshared on a real node: every hostPath the manifests name under /var/lib or
/run (/var/lib/guestfs, /var/lib/guestfs/by-container, /run/guestfs-locks,
/run/guestfs-seccomp, /var/lib/kubelet/seccomp, ...) is a real path inside the node, a
container's Bidirectional mount propagates back to the node and into other pods' hostPath
binds, and the host machine's directories are never touched. /dev (/dev/fuse), /sys
(/sys/fs/cgroup), /usr, /etc and /tmp stay the host's. The test process reaches node paths
through /proc/<containerd pid>/root (CriNode.fs).

Pods get a cgroup root of their own (kubelet's --cgroup-root): /<guestfs-cri-XXXXXXXX>/
kubepods/... in every hierarchy. close() stops and removes every pod, then containerd
(stopping containerd first would leave the pods running), then checks that no process of
the node's mount namespace is left, removes the cgroup root and the scratch directory.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.support.cri import cgroups, stubs
from tests.support.cri import images as local_images
from tests.support.cri.nodefs import NodeFS

NODE_DIRS = {"var-lib": "/var/lib", "run": "/run", "var-log": "/var/log"}
START_TIMEOUT = 20.0

CONFIG = """\
version = 2
root = "{scratch}/root"
state = "{scratch}/state"
# Plugins that would write on the host (/opt/containerd) or probe absent backends.
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{scratch}/containerd.sock"
[ttrpc]
  address = "{scratch}/containerd-ttrpc.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  disable_apparmor = true
  # root here lacks CAP_SYS_RESOURCE: the pause's oom_score_adj -998 would fail.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "/usr/sbin/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    conf_dir = "{scratch}/cni"
    bin_dir = "{scratch}/cni-bin"
"""

# The node's mounts, made inside its namespace before containerd starts: arguments are
# pairs (scratch dir, node path), then the config.
NODE_SCRIPT = """
while [ $# -gt 1 ]; do mount --bind "$1" "$2" && mount --make-shared "$2"; shift 2; done
exec containerd --config "$1"
"""


class NodeError(RuntimeError):
    pass


class CriNode:
    """One containerd node. Use start(), then run(plan) per pod; close() on every exit.

    Attributes once started: pb (runtime.v1 messages), runtime and image (gRPC stubs),
    fs (NodeFS of the node's mount namespace), images (key -> LocalImage), cgroup_root,
    hierarchies, timings (seconds: containerd_start, image_import, image_build).
    """

    def __init__(self, image_variants: tuple[tuple[str, bool, str], ...] = (
            ("busybox", False, "ro"), ("guestfs", False, "ro"))) -> None:
        self.image_variants = image_variants
        self.scratch = Path(tempfile.mkdtemp(prefix="guestfs-cri-"))
        self.cgroup_root = f"/guestfs-cri-{secrets.token_hex(4)}"
        self.hierarchies = cgroups.hierarchies()
        self.timings: dict[str, float] = {}
        self.pods: list[Any] = []           # kubelet.Pod handles not yet removed
        self.proc: subprocess.Popen[bytes] | None = None
        self.mntns = ""
        self.closed = False
        self.pb, self._grpc = stubs.load()
        atexit.register(self.close)

    # -- lifecycle
    def start(self) -> CriNode:
        import grpc

        s = self.scratch
        for d in ("root", "state", "cni", "cni-bin", "images", "ro-tmp",
                  *(f"node/{k}" for k in NODE_DIRS)):
            (s / d).mkdir(parents=True)
        os.chmod(s / "ro-tmp", 0o555)
        t = time.monotonic()
        self.images, content = local_images.build(s / "images", s / "ro-tmp",
                                                  self.image_variants)
        archive = s / "images" / "images.tar"
        local_images.write_archive(archive, content)
        self.timings["image_build"] = time.monotonic() - t
        self.by_ref = {i.ref: i for i in self.images.values()}
        config = s / "config.toml"
        config.write_text(CONFIG.format(scratch=s, pause=self.images["pause"].ref))
        binds = [str(x) for k, node in NODE_DIRS.items() for x in (s / "node" / k, node)]
        t = time.monotonic()
        with open(s / "containerd.log", "wb") as log:
            self.proc = subprocess.Popen(
                ["unshare", "-m", "--propagation", "private", "sh", "-ec", NODE_SCRIPT, "sh",
                 *binds, str(config)], stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        self.fs = NodeFS(self.proc.pid)
        self.channel = grpc.insecure_channel(f"unix://{s}/containerd.sock")
        self.runtime = self._grpc.RuntimeServiceStub(self.channel)
        self.image = self._grpc.ImageServiceStub(self.channel)
        self._wait_ready(t)
        self.timings["containerd_start"] = time.monotonic() - t
        self.mntns = os.readlink(f"/proc/{self.proc.pid}/ns/mnt")
        if self.mntns == os.readlink("/proc/self/ns/mnt"):
            raise NodeError("containerd runs in the host's mount namespace")
        t = time.monotonic()
        subprocess.run(["ctr", "--address", f"{s}/containerd.sock", "-n", "k8s.io", "images",
                        "import", str(archive)], check=True, capture_output=True, timeout=120)
        self.timings["image_import"] = time.monotonic() - t
        for img in self.images.values():       # what the CRI plugin itself sees
            status = self.image.ImageStatus(self.pb.ImageStatusRequest(
                image=self.pb.ImageSpec(image=img.ref)), timeout=30)
            if not status.image.id:
                raise NodeError(f"CRI does not see the imported image {img.ref}")
        cgroups.ensure(self.hierarchies, self.cgroup_root)
        return self

    def _wait_ready(self, t0: float) -> None:
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise NodeError(f"containerd exited {self.proc.returncode}: {self.log_tail()}")
            if (self.scratch / "containerd.sock").exists():
                with contextlib.suppress(Exception):
                    self.version()
                    return
            if time.monotonic() - t0 > START_TIMEOUT:
                raise NodeError(f"containerd not ready in {START_TIMEOUT}s: {self.log_tail()}")
            time.sleep(0.02)

    def log_tail(self, lines: int = 20) -> str:
        with contextlib.suppress(OSError):
            return "\n".join((self.scratch / "containerd.log").read_text().splitlines()[-lines:])
        return ""

    # -- use
    def version(self) -> Any:
        return self.runtime.Version(self.pb.VersionRequest(version="v1"), timeout=5)

    def run(self, plan: Any, wait: bool = True) -> Any:
        """Run a translate.PodPlan as the kubelet would; returns a kubelet.Pod."""
        from tests.support.cri.kubelet import run_pod

        return run_pod(self, plan, wait=wait)

    def image_of(self, ref: str) -> local_images.LocalImage:
        if ref not in self.by_ref:
            raise NodeError(f"image {ref!r} is not on the node; it has {sorted(self.by_ref)}")
        return self.by_ref[ref]

    def rss(self) -> int:
        """containerd's resident set, bytes."""
        assert self.proc is not None
        with open(f"/proc/{self.proc.pid}/status") as f:
            kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
        return kb * 1024

    # -- teardown
    def remove_all_pods(self) -> None:
        """Every pod the node runs, tracked or not, stopped and removed."""
        for pod in list(self.pods):
            with contextlib.suppress(Exception):
                pod.remove()
        pb = self.pb
        for box in self.runtime.ListPodSandbox(pb.ListPodSandboxRequest(), timeout=30).items:
            conts = self.runtime.ListContainers(pb.ListContainersRequest(
                filter=pb.ContainerFilter(pod_sandbox_id=box.id)), timeout=30).containers
            for c in conts:
                self.runtime.StopContainer(pb.StopContainerRequest(container_id=c.id, timeout=0),
                                           timeout=60)
                self.runtime.RemoveContainer(pb.RemoveContainerRequest(container_id=c.id),
                                             timeout=60)
            self.runtime.StopPodSandbox(pb.StopPodSandboxRequest(pod_sandbox_id=box.id),
                                        timeout=60)
            self.runtime.RemovePodSandbox(pb.RemovePodSandboxRequest(pod_sandbox_id=box.id),
                                          timeout=60)

    def close(self) -> list[str]:
        """Tear the node down (idempotent); returns what had to be forced (should be [])."""
        if self.closed:
            return []
        self.closed = True
        forced: list[str] = []
        try:
            if self.proc is not None and self.proc.poll() is None:
                try:
                    self.remove_all_pods()
                except Exception as e:              # still stop containerd and clean up
                    forced.append(f"removing pods: {e}")
            forced += self._stop_containerd()
            forced += self._kill_namespace()
            forced += cgroups.remove_tree(self.hierarchies, self.cgroup_root)
        finally:
            with contextlib.suppress(Exception):
                self.channel.close()
            if not _mounts_under(self.scratch):
                shutil.rmtree(self.scratch, ignore_errors=True)
            atexit.unregister(self.close)
        return forced

    def _stop_containerd(self) -> list[str]:
        if self.proc is None or self.proc.poll() is not None:
            return []
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
            return []
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return [f"containerd {self.proc.pid} ignored SIGTERM for 15 s"]

    def _kill_namespace(self) -> list[str]:
        """Processes still in the node's mount namespace (shims of a pod that could not be
        removed): killed by pid, named in the result."""
        forced = []
        for _ in range(100):
            pids = self.namespace_pids()
            if not pids:
                return forced
            for pid in pids:
                forced.append(f"process {pid} left in the node namespace")
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        return forced + [f"processes {self.namespace_pids()} would not die"]

    def namespace_pids(self) -> list[int]:
        """Processes in the node's mount namespace. Once the namespace is gone the kernel
        may give its inode number to a new one (another user's container, seen here), so a
        match counts only if that namespace also has this node's bind of its scratch
        /var/lib: never someone else's process."""
        if not self.mntns:
            return []
        # mountinfo's root field is relative to the filesystem: end with the scratch name.
        marker = f"/{self.scratch.name}/node/var-lib /var/lib "
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{entry}/ns/mnt") != self.mntns:
                        continue
                    with open(f"/proc/{entry}/mountinfo") as f:
                        if marker in f.read():
                            pids.append(int(entry))
        return pids

    def leftovers(self) -> list[str]:
        """Anything of this node still on the machine: processes, cgroups, mounts, files."""
        out = [f"process {p}" for p in self.namespace_pids()]
        out += [f"cgroup {d}" for d in cgroups.leftovers(self.hierarchies, self.cgroup_root)]
        out += [f"mount {m}" for m in _mounts_under(self.scratch)]
        if self.scratch.exists():
            out.append(f"directory {self.scratch}")
        return out


def _mounts_under(path: Path) -> list[str]:
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    return [p for p in points if p == str(path) or p.startswith(f"{path}/")]


def container_info(node: CriNode, container_id: str) -> dict:
    """The verbose ContainerStatus info (containerd's JSON: pid, runtimeSpec, ...)."""
    resp = node.runtime.ContainerStatus(node.pb.ContainerStatusRequest(
        container_id=container_id, verbose=True), timeout=30)
    return json.loads(resp.info.get("info", "{}"))


def node_session() -> Iterator[CriNode]:
    """The body of the cri_node_session fixture: skip where the machine cannot run it."""
    import pytest

    if os.geteuid() != 0:
        pytest.skip("the CRI node needs root")
    for tool in ("containerd", "ctr", "runc", "unshare", "gcc", "busybox"):
        if shutil.which(tool) is None and not os.path.exists(f"/usr/sbin/{tool}"):
            pytest.skip(f"{tool} is not installed (.ci/setup installs it)")
    pytest.importorskip("grpc_tools")
    node = CriNode()
    try:
        node.start()
        yield node
    finally:
        forced = node.close()
        left = node.leftovers()
    assert not forced, f"teardown had to force: {forced}"
    assert not left, f"left on the machine after the session: {left}"
